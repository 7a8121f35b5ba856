"""Does the shipped BART gain from more images? Continue its training on freshly drawn shapes images it has never seen.

The shipped BART saw 40,000 images for 8 epochs and overfits them (BENCHMARKS.md). This experiment continues it for
`--steps` steps on `--n` new training images (data seed `--seed`, so none of them is one of the 40,000; the train
split never draws a `HELD_OUT` pair), with the stage's own loss (caption blanking included) at a lower peak learning
rate, then writes a model directory — the shipped one with this BART — for `bench/quality.py` to score:

    python bench/bart_finetune.py --n 80000 --steps 1500 --out runs/bart_ft/model
    python bench/quality.py --model runs/bart_ft/model --scales 2 --out bench/results/bart_ft

`--drop-attr P` tries attribute dropout for held-out pairs: per object, with probability P its colour word is left out
("a large circle") and, independently, with probability P its shape is called "shape" ("a red shape"), so that each
word alone must carry its attribute.

An experiment, not a way to make the shipped model: `dalle-nb train` is that.
"""
import argparse, json, shutil, time
from dataclasses import replace
from pathlib import Path


def drop_attributes(captions, p: float, seed: int = 0) -> list[str]:
    "Captions with, per object and independently with probability `p` each, the colour word left out or the shape word made 'shape'."
    import re, numpy as np
    from dalle_nb.shapes import PALETTE, SHAPES
    rng = np.random.default_rng(seed)
    pat = re.compile(r"\b(%s) (%s)\b" % ("|".join(PALETTE), "|".join(SHAPES)))
    def one(m):
        r = rng.random(2)
        if r[0] < p: return m.group(2)
        if r[1] < p: return m.group(1) + " shape"
        return m.group(0)
    return [pat.sub(one, c) for c in captions]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model directory to continue (default: the shipped model)")
    p.add_argument("--n", type=int, default=80_000, help="fresh training images")
    p.add_argument("--seed", type=int, default=1, help="data seed of the fresh images (the shipped model used 0)")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--drop-attr", type=float, default=0.0,
                   help="per object, the probability of dropping its colour word ('a circle') and, separately, of naming its shape 'shape' ('a red shape')")
    p.add_argument("--out", default="runs/bart_ft/model")
    a = p.parse_args(argv)

    import jax.numpy as jnp
    from flax import nnx
    from dalle_nb.modeldir import load_models, save_models, default_model_dir
    from dalle_nb.shapes import make_split
    from dalle_nb.train import fit, encode_dataset
    from dalle_nb.data import Batches, blank_captions
    from dalle_nb.optim import make_optimizer
    from dalle_nb.bart import bart_loss

    src = Path(a.model) if a.model else default_model_dir()
    m = load_models(src)
    cfg = m.cfg
    sc = replace(cfg.bart_train, steps=a.steps, lr=a.lr, warmup_steps=50, eval_every=250, ckpt_every=10 ** 9, seed=a.seed)
    out = Path(a.out); work = out.parent
    t0 = time.perf_counter()
    imgs, caps = make_split("train", a.n, seed=a.seed)
    if a.drop_attr: caps = drop_attributes(caps, a.drop_attr, a.seed)
    val_imgs, val_caps = make_split("val", 256, seed=cfg.data.seed)
    data = {"text": m.text(caps), "image": encode_dataset(m.vqgan, imgs, None, True)}
    val = {"text": jnp.asarray(m.text(val_caps)), "image": jnp.asarray(encode_dataset(m.vqgan, val_imgs, None, False))}
    blank = jnp.asarray(m.text.blank(1)[0])
    evaluate = nnx.jit(lambda mm: bart_loss(mm, val["text"], val["image"])[1])
    before = {k: float(v) for k, v in evaluate(m.bart).items()}
    print("before:", json.dumps(before), flush=True)
    loss_fn = lambda mm, b, k: bart_loss(mm, blank_captions(b["text"], blank, sc.blank_caption_prob, k), b["image"])
    hist = fit(m.bart, make_optimizer(sc), loss_fn, Batches(data, sc.batch_size, seed=sc.seed), sc, eval_fn=evaluate, desc="bart-ft")
    after = {k: float(v) for k, v in evaluate(m.bart).items()}
    print("after:", json.dumps(after), flush=True)
    if out.exists(): shutil.rmtree(out)
    shutil.copytree(src, out)
    save_models(out, m, card=m.card + f"\n\nExperiment: BART continued {a.steps} steps on {a.n} fresh images (seed {a.seed}), lr {a.lr} (bench/bart_finetune.py).\n")
    work.mkdir(parents=True, exist_ok=True)
    (work / "bart_finetune.json").write_text(json.dumps(dict(args=vars(a), before=before, after=after, history=hist,
                                                             minutes=round((time.perf_counter() - t0) / 60, 1)), indent=1))
    print(f"wrote {out} ({(time.perf_counter() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
