"""Do a held-out pair's image tokens exist in training *with that colour*? (BENCHMARKS.md, "Attempts on held-out pairs")

A BART can only draw "a red triangle" from codes it has learned to emit after "red". This encodes one-object training
scenes with the model's VQGAN and records, for every code on a patch at or next to the object (its bounding box
grown by 4 pixels), the colour and the shape of that object. Then it encodes one-object scenes of each held-out pair
(and, as a control, of seen pairs) and asks of each such token: was its code seen in training on an object of the
same colour? of the same shape? of either? (at least `--min` times). A code never seen with the colour is one the
BART has no reason to emit after the colour word.

    python bench/token_binding.py [--model DIR] [--train 20000] [--test 300] [--min 5]
"""
import argparse
from collections import defaultdict

import numpy as np


def scenes(split, n, seed, pairs=None):
    "n one-object scenes of `split` (optionally only of `pairs`): images and their objects."
    from dalle_nb.shapes import make_scene, render
    rng = np.random.default_rng([seed, 7])
    imgs, objs = [], []
    while len(imgs) < n:
        (o,), _ = make_scene(rng, split, 1)
        if pairs is not None and (o.color, o.shape) not in pairs: continue
        imgs.append(render([o])); objs.append(o)
    return np.stack(imgs), objs


def near(o, g: int, f: int, pad: float = 4.0):
    "Boolean [g, g]: token patches that touch the object's bounding box grown by `pad` pixels."
    lo = np.arange(g) * f; hi = lo + f
    xs = (hi > o.x - o.r - pad) & (lo < o.x + o.r + pad)
    ys = (hi > o.y - o.r - pad) & (lo < o.y + o.r + pad)
    return ys[:, None] & xs[None, :]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--train", type=int, default=20_000)
    p.add_argument("--test", type=int, default=300)
    p.add_argument("--min", type=int, default=5, help="times a code must be seen with an attribute to count")
    a = p.parse_args(argv)
    import jax.numpy as jnp
    from dalle_nb.pipeline import Pipeline
    from dalle_nb.images import to_float
    from dalle_nb.shapes import HELD_OUT, SEEN
    pipe = Pipeline(a.model)
    g = pipe.grid; f = 64 // g

    def encode(imgs):
        return np.concatenate([np.asarray(pipe._encode(pipe.models.image_tokenizer, jnp.asarray(to_float(imgs[i:i + 256])))).reshape(-1, g, g)
                               for i in range(0, len(imgs), 256)])

    imgs, objs = scenes("train", a.train, 0)
    ids = encode(imgs)
    by_colour, by_shape = defaultdict(lambda: defaultdict(int)), defaultdict(lambda: defaultdict(int))
    for t, o in zip(ids, objs):
        for c in t[near(o, g, f)]:
            by_colour[int(c)][o.color] += 1; by_shape[int(c)][o.shape] += 1
    print(f"{a.train} one-object training scenes, {len(by_colour)} codes near objects")

    controls = tuple(p for p in SEEN if p[1] in {s for _, s in HELD_OUT})[:6]
    print("| pair | kind | tokens near the object | code seen with the colour | with the shape | with neither | round trip right |")
    print("|---|---|---|---|---|---|---|")
    from dalle_nb.shapes import caption_match
    for pair in HELD_OUT + controls:
        timgs, tobjs = scenes("heldout" if pair in HELD_OUT else "val", a.test, 1, {pair})
        tids = encode(timgs)
        col = shp = none = total = 0
        for t, o in zip(tids, tobjs):
            for c in t[near(o, g, f)]:
                kc = by_colour[int(c)].get(o.color, 0) >= a.min
                ks = by_shape[int(c)].get(o.shape, 0) >= a.min
                col += kc; shp += ks; none += not (kc or ks); total += 1
        rec = pipe.decode(tids.reshape(len(tids), -1))
        right = np.mean([caption_match(im, f"a {o.color} {o.shape}") for im, o in zip(rec, tobjs)])
        kind = "held out" if pair in HELD_OUT else "seen"
        print(f"| {pair[0]} {pair[1]} | {kind} | {total} | {col / total:.1%} | {shp / total:.1%} | {none / total:.1%} | {right:.0%} |")


if __name__ == "__main__":
    main()
