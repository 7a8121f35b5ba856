"""Which VQGAN makes tokens a BART can predict? Train VQGAN variants (the tiny preset's stage 1 with `--set`s) and measure each.

For every variant: reconstruction PSNR, codes used and their perplexity, the same on *flat* patches (one colour, 92% of
the shapes images; see bench/token_stats.py), and how often `caption_match` accepts the reconstruction (one / two
objects) — the ceiling a generated token grid can reach through this decoder (before the decoder fine-tune stage).

    python bench/vqgan_tokens.py [--variant NAME=set,set ...] [--n_train 40000] [--workdir runs/vqgan_tokens]

Each variant trains in WORKDIR/NAME and resumes from its checkpoints, so a second call only measures.
"""
import argparse, json, platform, sys, time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from token_stats import code_stats          # noqa: E402
from dvae import tokenizer_metrics          # noqa: E402

VARIANTS = {                                # name -> overrides of the tiny preset (which has 1024 codes, attention at 8×8)
    "1024-attn": [],
    "256": ["vqgan.n_embed=256", "vqgan.attn_resolutions="],
    "128": ["vqgan.n_embed=128", "vqgan.attn_resolutions="],
    "256-early-restarts": ["vqgan.n_embed=256", "vqgan.attn_resolutions=", "vqgan.restart_until=400"],
}


def main(argv=None):
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--variant", action="append", help="NAME=override,override (repeatable; default: the four above)")
    a.add_argument("--n_train", type=int, default=40_000)
    a.add_argument("--n", type=int, default=500, help="validation images measured")
    a.add_argument("--workdir", default="runs/vqgan_tokens")
    a = a.parse_args(argv)
    variants = dict((v.split("=", 1)[0], [s for s in v.split("=", 1)[1].split(",") if s]) for v in a.variant) if a.variant else VARIANTS
    import jax.numpy as jnp
    from flax import nnx
    from dalle_nb.config import get_config
    from dalle_nb.shapes import make_split
    from dalle_nb.images import to_float
    from dalle_nb.train import train_vqgan
    images, _ = make_split("train", a.n_train, 0)
    val, _ = make_split("val", 1000, 0)
    test, captions = make_split("val", a.n, 0)
    rows = ["| variant | overrides | minutes | PSNR dB | codes used | perplexity | codes on flat patches | their perplexity | checker one / two |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, sets in variants.items():
        n = next((s.split("=")[1] for s in sets if s.startswith("vqgan.n_embed=")), None)
        cfg = get_config("tiny", sets + ([f"bart.image_codes={n}", f"bart.image_vocab={n}"] if n else []))
        t0 = time.perf_counter()
        model, hist = train_vqgan(cfg, Path(a.workdir) / name, images, val, progress=True)
        minutes = (time.perf_counter() - t0) / 60
        m, _ = tokenizer_metrics(model, test, captions)
        ids = np.asarray(nnx.jit(lambda t, x: t.encode(x))(model, jnp.asarray(to_float(test))))
        g = cfg.vqgan.grid
        s = code_stats(ids.reshape(len(test), g, g), test, test.shape[1] // g)
        print(json.dumps({"variant": name, "sets": sets, "minutes": round(minutes, 1), **m, **s}))
        rows.append(f"| {name} | `{' '.join(sets) or '(preset)'}` | {minutes:.1f} | {m['psnr']:.1f} | {m['codes_used']} | {m['perplexity']:.0f} | "
                    f"{s['flat_codes_used']} | {s['flat_perplexity']:.0f} | {m['checker']['one']:.0%} / {m['checker']['two']:.0%} |")
    print(f"\n{platform.node()} ({platform.processor() or platform.machine()}), {date.today()}, {a.n_train} training images, "
          f"{a.n} validation images (minutes: 0 when resumed from a finished checkpoint)\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
