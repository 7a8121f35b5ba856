"""Experiment (BENCHMARKS.md, "Attempts on held-out pairs"): a larger palette, so that colour says less about shape.

With the shipped palette, 3 of the 6 colours lack one shape in training (the held-out pairs), so for half the colours
"this colour → one of these two shapes" is a rule the BART can lean on. `--palette 8` adds two colours seen with every
shape (orange, brown: chosen far from every palette colour and from their blends with the background, which the
checker would otherwise read as a colour); `HELD_OUT` is unchanged. The dataset, the checker and the caption grammar
are switched in-process (`use_palette`), so every stage and every probe must run under this script:

    python bench/palette.py --palette 8 train --out runs/palette/p8         # tokenizer, VQGAN, decoder, BART, CLIP
    python bench/palette.py --palette 6 train --out runs/palette/p6         # the same short recipe on today's palette
    python bench/palette.py --palette 8 run bench/heldout_probes.py breakdown --model runs/palette/p8/model

`train` runs the shipped model's recipe (its config, every stage from scratch) shortened to `--n` images and
`--steps` BART steps; compare palettes trained the same way, not with the shipped model.
"""
import argparse, re, runpy, sys, time
from pathlib import Path

EXTRA = {"orange": (245, 125, 15), "brown": (120, 70, 30)}


def use_palette(k: int):
    "Switch `dalle_nb.shapes` to the first `k` colours of the shipped palette + `EXTRA` (6 = unchanged)."
    import numpy as np
    from dalle_nb import shapes as S
    base = {c: S.PALETTE[c] for c in list(S.PALETTE)[:6]}
    colours = {**base, **EXTRA}
    if not 6 <= k <= len(colours): raise SystemExit(f"--palette must be 6..{len(colours)}")
    new = dict(list(colours.items())[:k])
    S.PALETTE.clear(); S.PALETTE.update(new)              # in place: modules that imported the dict see the change
    S.SEEN = tuple((c, s) for c in S.PALETTE for s in S.SHAPES if (c, s) not in S.HELD_OUT)
    S._COLORS = np.array(list(S.PALETTE.values()), np.float32)
    S._NAMES = list(S.PALETTE)
    S._OBJ = rf"an? (?:(small|large) )?({'|'.join(S.PALETTE)}) ({'|'.join(S.SHAPES)})"
    S._CAPTION = re.compile(rf"^(?:a picture of |an image of |there is )?{S._OBJ}(?: (?:{S._REL}) {S._OBJ})?$")
    imgs, caps = S.make_split("val", 2000, seed=123)      # the checker on ground truth, as nbs/03_shapes checks it
    agree = np.mean([S.caption_match(i, c) for i, c in zip(imgs, caps)])
    print(f"palette {list(S.PALETTE)}; checker agrees with 2000 ground-truth captions {agree:.2%}", flush=True)
    if agree < 0.99: raise SystemExit("the checker cannot read this palette")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--palette", type=int, default=8)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", required=True, help="work directory; the model lands in OUT/model")
    t.add_argument("--n", type=int, default=48_000)
    t.add_argument("--steps", type=int, default=1500)
    t.add_argument("--set", action="append", default=[], help="further override of the shipped config, e.g. vqgan.restart_until=800")
    r = sub.add_parser("run")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    use_palette(a.palette)
    if a.cmd == "run":
        sys.argv = [a.script] + a.args
        sys.path.insert(0, str(Path(a.script).resolve().parent))
        runpy.run_path(a.script, run_name="__main__")
        return
    from dalle_nb.config import override
    from dalle_nb.modeldir import load_models
    from dalle_nb.train import train_all
    t0 = time.perf_counter()
    cfg = override(load_models(None).cfg, [f"data.n_train={a.n}", f"bart_train.steps={a.steps}"] + a.set)
    out = train_all(cfg, a.out, command=f"bench/palette.py --palette {a.palette} train --n {a.n} --steps {a.steps}" + "".join(f" --set {x}" for x in a.set))
    print(f"wrote {out} ({(time.perf_counter() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
