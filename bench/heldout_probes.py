"""Probes on held-out colour–shape pairs (BENCHMARKS.md, "Attempts on held-out pairs"): can sampling alone make them?

The shipped BART draws the held-out pairs ("a red triangle", "a blue circle", "a yellow square" — never in a training
image or caption) in a few percent of its samples. Each probe samples `--n` candidates for the 40 held-out evaluation
prompts with a mixture of the BART's next-token log-probabilities under several captions,

    logits = Σ_k w_k · log p(token | caption_k)      (Σ w_k = 1),

of which plain super conditioning is the special case `s · full + (1 − s) · blank`. Probes:

- `guidance`: plain super conditioning at `--scale` (the baseline; `--temperature`, `--alpha` vary the sampler);
- `negative`: the blank caption replaced by the prompt's shape near misses (each object's shape changed; the
  "negative prompt" of diffusion models), cycling over the candidates;
- `analogy`: super conditioning plus `a` × the BART's own shape direction measured on colours it has seen with every
  shape: for each object, mean over such colours X of `log p(·|X shape) − mean_{s'} log p(·|X s')`;
- `compose`: conjunction of attribute-only captions (composable guidance, as Liu et al. 2022 do for diffusion):
  `blank + f·(full − blank) + c·(colour-only − blank) + h·(shape-only − blank)`, where the colour-only caption names
  each held-out object's shape "shape" ("a red shape") and the shape-only caption leaves its colour out ("a triangle") —
  the captions `bench/bart_finetune.py --drop-attr` trains on; `--w "f,c,h;..."` lists the weight triples;
- `breakdown`: the guidance baseline, split by object count and held-out pair, with what the checker saw instead.

Every probe grades with `caption_match` (first candidate, CLIP's best, any) and never lets the checker choose.

    python bench/heldout_probes.py guidance [--n 8] [--scale 2] [--temperature 1] [--alpha 0.05]
    python bench/heldout_probes.py negative [--n 8] [--scale 2]
    python bench/heldout_probes.py analogy --a 1,2,4 [--n 8] [--scale 2]
    python bench/heldout_probes.py compose --w "2,0,0;0,1,1;1,1,1" --model runs/s16/ft_0.2/model
    python bench/heldout_probes.py breakdown [--n 32]
"""
import argparse, json
from collections import Counter, defaultdict
from dataclasses import replace

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("probe", choices=("guidance", "negative", "analogy", "compose", "breakdown"))
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=40)
    p.add_argument("--n", type=int, default=None, help="candidates per prompt (default 8; breakdown 32)")
    p.add_argument("--scale", type=float, default=2.0)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--alpha", type=float, default=0.05, help="plausibility guard (0 = off)")
    p.add_argument("--a", default="1,2,4", help="analogy weights")
    p.add_argument("--w", default="2,0,0;0,1,1;1,1,1;0,2,2", help="compose: full, colour-only, shape-only weights; ';' between triples")
    a = p.parse_args(argv)
    n = a.n or (32 if a.probe == "breakdown" else 8)

    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from rerankers import text                      # the plain caption of parsed objects
    import jax, jax.numpy as jnp
    from flax import nnx
    from dalle_nb.pipeline import Pipeline
    from dalle_nb.sample import row_keys, keep_plausible
    from dalle_nb.bart import text_mask
    from dalle_nb.shapes import eval_prompts, caption_match, parse_caption, detect, SHAPES, PALETTE, HELD_OUT

    pipe = Pipeline(a.model, batch_size=n)
    M = pipe.models
    if M.cfg.arch != "bart": raise SystemExit("heldout_probes.py mixes the BART's rows: use a bart model directory")
    full_colours = [c for c in PALETTE if all((c, s) not in HELD_OUT for s in SHAPES)]   # seen with every shape

    def shape_misses(prompt):
        spec = parse_caption(prompt); objs = list(spec.objects)
        return [text(objs[:i] + [replace(o, shape=s)] + objs[i + 1:], spec.relation)
                for i, o in enumerate(objs) for s in SHAPES if s != o.shape]

    def analogy_rows(prompt, weight):
        spec = parse_caption(prompt); objs = list(spec.objects)
        caps, w = [], []
        for i, o in enumerate(objs):
            xs = [c for c in full_colours if c != o.color]
            alts = [s for s in SHAPES if s != o.shape]
            for x in xs:
                caps.append(text(objs[:i] + [replace(o, color=x)] + objs[i + 1:], spec.relation)); w.append(weight / len(xs))
                for s in alts:
                    caps.append(text(objs[:i] + [replace(o, color=x, shape=s)] + objs[i + 1:], spec.relation))
                    w.append(-weight / len(xs) / len(alts))
        return caps, w

    @nnx.jit(static_argnums=(5,))
    def sample(model, rows, w, keys, temperature, K):
        "Rows are K captions × B candidates; one scan over the image tokens, the K rows' log-probs mixed by `w`."
        cfg, B = model.cfg, keys.shape[0]
        mask = text_mask(rows, cfg.pad_id)
        cache = model.decoder.init_cache(model.encoder(rows), mask)

        def step(carry, t):
            cache, prev = carry
            logits, cache = model.decoder.step(jnp.tile(prev, K), t, cache, mask)
            lp = jax.nn.log_softmax(logits[:, :cfg.image_codes].astype(jnp.float32).reshape(K, B, -1), -1)
            mixed = jnp.einsum("k,kbv->bv", w, lp)
            if a.alpha > 0: mixed = keep_plausible(lp[0], mixed, a.alpha)
            sk = jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, t)
            tok = jax.vmap(jax.random.categorical)(sk, mixed / temperature).astype(jnp.int32)
            return (cache, tok), tok

        _, toks = jax.lax.scan(step, (cache, jnp.full((B,), cfg.bos_id, jnp.int32)), jnp.arange(cfg.image_len, dtype=jnp.int32))
        return toks.T

    def attr_only(prompt):
        "The prompt with each held-out object's shape named 'shape', and with its colour left out."
        spec = parse_caption(prompt); objs = list(spec.objects)
        hold = [(o.color, o.shape) in HELD_OUT for o in objs]
        say = lambda o, col, shp: "a " + " ".join(w for w in (o.size, col, shp) if w)
        def cap(f): return " ".join([f(objs[0], hold[0])] + ([spec.relation, f(objs[1], hold[1])] if len(objs) == 2 else []))
        return (cap(lambda o, h: say(o, o.color, "shape" if h else o.shape)),
                cap(lambda o, h: say(o, None if h else o.color, o.shape)))

    blank = np.asarray(M.text.blank(1))[0]

    def run(prompt, i, caps, w, per_candidate=None):
        "Sample n candidates: rows = caps (caps[k] == '' is the blank caption); per_candidate replaces row 1 per candidate."
        ids = np.asarray(M.text([c or "x" for c in caps]))
        for k, c in enumerate(caps):
            if c == "": ids[k] = blank
        rows = np.repeat(ids, n, 0)
        if per_candidate is not None:
            alt = np.asarray(M.text([per_candidate[j % len(per_candidate)] for j in range(n)]))
            rows[n:2 * n] = alt
        toks = np.asarray(sample(M.transformer, jnp.asarray(rows), jnp.asarray(w, jnp.float32), row_keys(i, n),
                                 jnp.float32(a.temperature), len(caps)))
        imgs = pipe.decode(toks)
        ok = np.array([caption_match(im, prompt) for im in imgs])
        best = int(np.argmax(pipe.score(imgs, np.asarray(M.text([prompt])))))
        return imgs, ok, best

    prompts = eval_prompts("heldout", a.prompts, seed=0)
    s = a.scale
    variants = {"guidance": [None], "negative": [None], "breakdown": [None],
                "analogy": [float(x) for x in a.a.split(",")],
                "compose": [tuple(float(x) for x in t.split(",")) for t in a.w.split(";")]}[a.probe]
    for v in variants:
        first, best, anyok, rate = [], [], [], []
        split = defaultdict(lambda: [0, 0, 0.0])
        drawn = defaultdict(Counter)
        for i, prompt in enumerate(prompts):
            if a.probe == "negative":
                imgs, ok, b = run(prompt, i, [prompt, "neg"], [s, 1 - s], per_candidate=shape_misses(prompt))
            elif a.probe == "analogy":
                caps, w = analogy_rows(prompt, v)
                imgs, ok, b = run(prompt, i, [prompt, ""] + caps, [s, 1 - s] + w)
            elif a.probe == "compose":
                f, c, h = v
                imgs, ok, b = run(prompt, i, [prompt, *attr_only(prompt), ""], [f, c, h, 1 - f - c - h])
            else:
                imgs, ok, b = run(prompt, i, [prompt, ""], [s, 1 - s])
            first.append(ok[0]); best.append(ok[b]); anyok.append(ok.any()); rate.append(ok.mean())
            if a.probe == "breakdown":
                spec = parse_caption(prompt)
                ho = next(o for o in spec.objects if (o.color, o.shape) in HELD_OUT)
                for key in (f"{len(spec.objects)} object(s)", f"{ho.color} {ho.shape}"):
                    r = split[key]; r[0] += 1; r[1] += ok.any(); r[2] += ok.mean()
                if len(spec.objects) == 1:
                    for im in imgs: drawn[f"{ho.color} {ho.shape}"].update(f"{o.color} {o.shape}" for o in detect(im))
        row = dict(probe=a.probe, variant=v, n=n, scale=s, temperature=a.temperature, alpha=a.alpha, prompts=len(prompts),
                   first=float(np.mean(first)), clip_best=float(np.mean(best)), any=float(np.mean(anyok)),
                   per_sample=float(np.mean(rate)))
        print(json.dumps(row), flush=True)
        if a.probe == "breakdown":
            for key, (k, an, r) in sorted(split.items()):
                print(f"| {key} | {k} | {an / k:.0%} | {r / k:.1%} |")
            for key, c in drawn.items():
                tot = sum(c.values())
                print(f"{key} (one-object prompts): " + ", ".join(f"{name} {m / tot:.0%}" for name, m in c.most_common(6)))


if __name__ == "__main__":
    main()
