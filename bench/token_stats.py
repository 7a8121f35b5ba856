"""How predictable are an image tokenizer's codes? Codes used on validation images, and on *flat* patches alone.

A flat patch (every pixel of the 8×8 patch one colour: background or the inside of a shape) can only show one of a
handful of colours, so a tokenizer that gives equal content equal codes needs about that many codes for them. Many
more means the code of a patch depends on its surroundings — something the sequence model has to guess.

    python bench/token_stats.py --model dalle_nb/assets/default --model runs/dd/model [--n 500]

Each model directory is measured with the tokenizer its config names (`image_tokenizer`: vqgan or dvae).
"""
import argparse, json
import numpy as np


def code_stats(ids, images, factor: int):
    "Codes used and their perplexity, over all positions and over flat patches; `ids` `[n, g, g]`, uint8 `images` `[n, H, W, 3]`."
    n, g = ids.shape[0], ids.shape[1]
    patches = images.reshape(n, g, factor, g, factor, 3).transpose(0, 1, 3, 2, 4, 5).reshape(n, g, g, factor * factor, 3)
    flat = (patches == patches[..., :1, :]).all((-1, -2))          # every pixel the colour of the first
    def stats(x):
        _, c = np.unique(x, return_counts=True); p = c / c.sum()
        return int(len(c)), float(np.exp(-(p * np.log(p)).sum()))
    colours = len(np.unique(patches[flat][:, 0], axis=0))
    (all_n, all_ppl), (flat_n, flat_ppl) = stats(ids), stats(ids[flat])
    return dict(codes_used=all_n, perplexity=round(all_ppl, 1), flat_fraction=round(float(flat.mean()), 3),
                flat_colours=colours, flat_codes_used=flat_n, flat_perplexity=round(flat_ppl, 1))


def main(argv=None):
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--model", action="append", required=True, help="model directory (repeatable)")
    a.add_argument("--n", type=int, default=500, help="validation images")
    a = a.parse_args(argv)
    import jax.numpy as jnp
    from flax import nnx
    from dalle_nb.modeldir import load_models
    from dalle_nb.shapes import make_split
    from dalle_nb.images import to_float
    imgs, _ = make_split("val", a.n, seed=0)
    rows = ["| model | tokenizer | codes used | perplexity | flat patches | their colours | codes on flat patches | their perplexity |",
            "|---|---|---|---|---|---|---|---|"]
    for path in a.model:
        m = load_models(path)
        tok = m.image_tokenizer
        ids = np.asarray(nnx.jit(lambda t, x: t.encode(x))(tok, jnp.asarray(to_float(imgs))))
        g = m.cfg.tokenizer_cfg.grid
        s = code_stats(ids.reshape(len(imgs), g, g), imgs, imgs.shape[1] // g)
        print(json.dumps({"model": path, "tokenizer": m.cfg.image_tokenizer, **s}))
        rows.append(f"| {path} | {m.cfg.image_tokenizer} | {s['codes_used']} | {s['perplexity']} | {s['flat_fraction']:.0%} | "
                    f"{s['flat_colours']} | {s['flat_codes_used']} | {s['flat_perplexity']} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
