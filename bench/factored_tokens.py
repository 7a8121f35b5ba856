"""Experiment (BENCHMARKS.md, "Attempts on held-out pairs"): is the image tokenizer's lack of factorisation the wall?

Every shapes object covers a 2 × 2 (small) or 3 × 3 (large) block of 8 × 8 patches on the grid, so a training set's
patches show only a handful of distinct pixel masks (19 in 8,000 images) and never two colours. A patch is therefore
exactly described by two symbols: its mask (which pixels are covered) and its colour (a palette colour, or none). This
script replaces the VQGAN by that lossless, hand-made tokenizer, in the factorised form — per patch a mask token then
a colour token, 128 tokens per image, so the outline of a red triangle is spelled with the same mask tokens as a
green one's and its colour with the same colour token as a red square's — and trains the shipped BART recipe on it
(same config but for the image vocabulary and length; caption blanking, schedule, seeds; `--steps` on `--n` images,
to compare with `bench/bart_variants.py`'s baseline on VQGAN tokens). Then it samples the 40 held-out evaluation
prompts (32 candidates, scale 2, the pipeline's sampler and plausibility guard), decodes them with the same table and
grades them with `caption_match`, reranking with the shipped CLIP; the seen one- and two-object prompts are the
control. An oracle experiment: it asks whether factorised tokens would be worth a tokenizer that learns them.

    python bench/factored_tokens.py --steps 1500 --n 48000 --out runs/factored/base
    python bench/factored_tokens.py --steps 1500 --n 48000 --set bart.encoder_layers=0 --out runs/factored/enc0
    python bench/factored_tokens.py --n 48000 --candidates 8 --eval-only --out runs/factored/base
"""
import argparse, json, time
from pathlib import Path

import numpy as np

P = 8                                   # patch side: the shapes grid


def patches(a):
    "`[N, 64, 64, ...]` → `[N, 64 patches, 64 pixels, ...]`, patches row-major."
    n, g = a.shape[0], a.shape[1] // P
    return a.reshape(n, g, P, g, P, *a.shape[3:]).swapaxes(2, 3).reshape(n, g * g, P * P, *a.shape[3:])


class Factored:
    "The lossless tokenizer: per patch `[mask id, n_masks + colour id]` (colour id `len(palette)` = none)."
    def __init__(self, images):
        from dalle_nb.shapes import PALETTE, BACKGROUND
        self.colors = np.array(list(PALETTE.values()), np.uint8)
        self.bg = np.array(BACKGROUND, np.uint8)
        self.masks = np.unique(patches(self._fg(images)).reshape(-1, P * P), axis=0)   # row 0: the empty patch
        self.lookup = {m.tobytes(): i for i, m in enumerate(self.masks)}
        self.n_masks, self.none = len(self.masks), len(self.colors)
        self.vocab = self.n_masks + len(self.colors) + 1

    def _fg(self, images): return np.any(images != self.bg, -1)

    def encode(self, images) -> np.ndarray:
        fg = patches(self._fg(images))                                   # [N, 64, 64] bool
        m = np.array([self.lookup[x.tobytes()] for x in fg.reshape(-1, P * P)]).reshape(fg.shape[:2])
        col = np.full(images.shape[:3], -1)
        for i, c in enumerate(self.colors): col[np.all(images == c, -1)] = i
        col = patches(col).max(-1)                                       # the patch's one colour (-1: none)
        col = np.where(fg.any(-1), col, self.none)
        return np.stack([m, self.n_masks + col], -1).reshape(len(images), -1).astype(np.int32)

    def decode(self, tokens) -> np.ndarray:
        "Images (uint8) of token rows; a symbol in the wrong slot (a colour where a mask goes, or back) draws nothing."
        t = np.asarray(tokens).reshape(len(tokens), -1, 2)
        m, c = t[..., 0], t[..., 1] - self.n_masks
        ok = (m < self.n_masks) & (c >= 0) & (c < self.none)
        fg = np.where(ok[..., None], self.masks[np.where(m < self.n_masks, m, 0)], False)       # [N, 64, 64]
        rgb = np.where(ok[..., None], self.colors[np.clip(c, 0, self.none - 1)], self.bg)      # [N, 64, 3]
        px = np.where(fg[..., None], rgb[:, :, None, :], self.bg)                                # [N, 64, 64, 3]
        g = int(round(px.shape[1] ** 0.5))
        return px.reshape(len(px), g, g, P, P, 3).swapaxes(2, 3).reshape(len(px), g * P, g * P, 3).astype(np.uint8)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", action="append", default=[], help="override of the shipped config, e.g. bart.encoder_layers=0")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--n", type=int, default=48_000)
    p.add_argument("--candidates", type=int, default=32, help="candidates per held-out prompt (seen prompts: 8)")
    p.add_argument("--eval-only", action="store_true", help="sample and grade the BART already written to --out")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    import jax.numpy as jnp
    from dataclasses import replace
    from flax import nnx
    from dalle_nb.config import override
    from dalle_nb.modeldir import load_models
    from dalle_nb.shapes import make_split, eval_prompts, caption_match, parse_caption, detect, HELD_OUT
    from dalle_nb.bart import DalleBart, bart_loss
    from dalle_nb.data import Batches, blank_captions
    from dalle_nb.sharding import mesh_from_spec, sharded_init
    from dalle_nb.optim import make_optimizer
    from dalle_nb.train import fit
    from dalle_nb.weights import save_params, load_params
    from dalle_nb.sample import generate, row_keys
    from dalle_nb.pipeline import Pipeline

    t0 = time.perf_counter()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    M = load_models(None)
    imgs, caps = make_split("train", a.n, seed=M.cfg.data.seed)
    vimgs, vcaps = make_split("val", 256, seed=M.cfg.data.seed)
    tok = Factored(imgs)
    ids = tok.encode(imgs)
    assert np.array_equal(tok.decode(ids[:512]), imgs[:512]), "the factored tokenizer must be lossless"
    cfg = override(M.cfg, a.set)
    bc = replace(cfg.bart, image_codes=tok.vocab, image_vocab=tok.vocab, image_len=ids.shape[1])
    sc = replace(cfg.bart_train, steps=a.steps, ckpt_every=10 ** 9)
    print(f"{tok.n_masks} masks, vocabulary {tok.vocab}, {ids.shape[1]} tokens per image; BART {bc}", flush=True)

    data = {"text": M.text(caps), "image": ids}
    val = {"text": jnp.asarray(M.text(vcaps)), "image": jnp.asarray(tok.encode(vimgs))}
    blank = jnp.asarray(M.text.blank(1)[0])
    if a.eval_only:
        model, hist, minutes = load_params(DalleBart(bc, rngs=nnx.Rngs(sc.seed)), out / "bart.msgpack"), None, None
    else:
        mesh = mesh_from_spec(sc.mesh)
        model = sharded_init(lambda: DalleBart(bc, rngs=nnx.Rngs(sc.seed)), mesh)
        def loss_fn(m, b, k): return bart_loss(m, blank_captions(b["text"], blank, sc.blank_caption_prob, k), b["image"])
        evaluate = nnx.jit(lambda m: bart_loss(m, val["text"], val["image"])[1])
        hist = fit(model, make_optimizer(sc), loss_fn, Batches.on_mesh(data, sc.batch_size, mesh, seed=sc.seed), sc, mesh=mesh,
                   eval_fn=evaluate, desc="bart (factored tokens)")
        save_params(model, out / "bart.msgpack")
        minutes = (time.perf_counter() - t0) / 60

    pipe = Pipeline(M, batch_size=a.candidates)            # the shipped CLIP reranks
    s = M.cfg.sample
    def candidates(prompt, i, n):
        text = np.repeat(np.asarray(M.text([prompt])), n, 0)
        toks = generate(model, text, row_keys(i, n), blank_ids=np.repeat(np.asarray(M.text.blank(1)), n, 0),
                        cond_scale=s.cond_scale, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                        plausibility=s.plausibility)
        im = tok.decode(np.asarray(toks))
        ok = np.array([caption_match(x, prompt) for x in im])
        best = int(np.argmax(pipe.score(im.astype(np.float32) / 255.0, np.asarray(M.text([prompt])))))
        return im, ok, best

    rows = {}
    for cat, n in (("heldout", a.candidates), ("one", 8), ("two", 8)):
        first, best, anyok, rate, split, drawn = [], [], [], [], {}, {}
        for i, prompt in enumerate(eval_prompts(cat, 40, seed=0)):
            im, ok, b = candidates(prompt, i, n)
            first.append(ok[0]); best.append(ok[b]); anyok.append(ok.any()); rate.append(ok.mean())
            if cat == "heldout":
                spec = parse_caption(prompt)
                ho = next(o for o in spec.objects if (o.color, o.shape) in HELD_OUT)
                for key in (f"{len(spec.objects)} object(s)", f"{ho.color} {ho.shape}"):
                    r = split.setdefault(key, [0, 0, 0.0]); r[0] += 1; r[1] += ok.any(); r[2] += ok.mean()
                if len(spec.objects) == 1:
                    c = drawn.setdefault(f"{ho.color} {ho.shape}", {})
                    for x in im:
                        for o in detect(x): c[f"{o.color} {o.shape}"] = c.get(f"{o.color} {o.shape}", 0) + 1
        rows[cat] = dict(n=n, first=float(np.mean(first)), clip_best=float(np.mean(best)), any=float(np.mean(anyok)),
                         per_sample=float(np.mean(rate)),
                         split={k: dict(prompts=v[0], any=v[1] / v[0], per_sample=v[2] / v[0]) for k, v in split.items()},
                         drawn={k: dict(sorted(v.items(), key=lambda kv: -kv[1])[:6]) for k, v in drawn.items()})
        print(cat, json.dumps(rows[cat]), flush=True)
    if a.eval_only:
        (out / f"factored_tokens_eval_{a.candidates}.json").write_text(json.dumps(dict(args=vars(a), results=rows), indent=1))
        return
    last = {k: v for k, v in hist[-1].items() if k.startswith("val_")}
    (out / "factored_tokens.json").write_text(json.dumps(dict(args=vars(a), n_masks=tok.n_masks, vocab=tok.vocab, last=last,
                                                           train_minutes=round(minutes, 1), results=rows), indent=1))
    print(f"wrote {out}: {last}, trained in {minutes:.1f} min")


if __name__ == "__main__":
    main()
