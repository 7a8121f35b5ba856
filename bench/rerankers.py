"""Which reranker picks a right image among a model's candidates? (BENCHMARKS.md, "Attempts on two-object accuracy")

Samples `--n` candidates for `--prompts` two-object prompts (and one-object ones, as a control) at each condition scale
with the model directory's transformer, marks each candidate with `caption_match`, and then asks every scorer which
candidate is best. The checker only grades; no scorer sees it. Scorers:

- `cos`: CLIP cosine with the prompt (what `dalle-nb generate` uses);
- `contrast`: CLIP's log-softmax of the prompt against every one-attribute change of it (colour, shape, size, relation,
  swapped bindings) — does the image fit the prompt better than its near misses?;
- `logp`: the transformer's own log-likelihood of the candidate's tokens given the prompt;
- `pmi`: that minus the likelihood given the blank caption (how much the prompt explains the tokens);
- `bayes`: the transformer's posterior of the prompt among the prompt and its near misses.
`--clip DIR` (repeatable) adds the `cos` of another model directory's CLIP on the same candidates.

    python bench/rerankers.py [--model DIR] [--prompts 80] [--n 8] [--scales 1,1.5,2] [--categories two,one] [--clip DIR ...]
"""
import argparse, json
from dataclasses import replace

import numpy as np


FLIP = {"to the left of": "to the right of", "to the right of": "to the left of", "above": "below", "below": "above"}


def say(o) -> str: return "a " + (f"{o.size} " if o.size else "") + f"{o.color} {o.shape}"


def text(objs, rel) -> str:
    "The plain caption of one or two parsed objects (`parse_caption(...).objects`) and their relation."
    return say(objs[0]) + (f" {rel} {say(objs[1])}" if len(objs) == 2 else "")


def near_misses(caption: str) -> list[str]:
    "Every caption that differs from `caption` in one attribute, the relation, or (two objects) swapped colours/shapes/order."
    from dalle_nb.shapes import parse_caption, PALETTE, SHAPES
    spec = parse_caption(caption)
    objs, rel = list(spec.objects), spec.relation
    out = set()
    for i, o in enumerate(objs):
        changed = [replace(o, color=c) for c in PALETTE if c != o.color] + [replace(o, shape=s) for s in SHAPES if s != o.shape]
        if o.size: changed.append(replace(o, size="large" if o.size == "small" else "small"))
        out |= {text(objs[:i] + [c] + objs[i + 1:], rel) for c in changed}
    if rel:
        a, b = objs
        out |= {text(objs, FLIP[rel]), text([b, a], rel), text([replace(a, shape=b.shape), replace(b, shape=a.shape)], rel),
                text([replace(a, color=b.color), replace(b, color=a.color)], rel)}
    out.discard(text(objs, rel))
    return sorted(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--prompts", type=int, default=80, help="two-object prompts (half as many one-object ones)")
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--scales", default="1,1.5,2")
    p.add_argument("--categories", default="two,one", help="prompt categories (two, one, heldout); 'one' gets half --prompts")
    p.add_argument("--clip", action="append", default=[], help="another model directory whose CLIP also scores")
    a = p.parse_args(argv)

    import jax.numpy as jnp, optax
    from flax import nnx
    from dalle_nb.pipeline import Pipeline
    from dalle_nb.modeldir import load_models
    from dalle_nb.shapes import eval_prompts, caption_match
    from dalle_nb.images import to_float

    pipe = Pipeline(a.model, batch_size=a.n)
    M = pipe.models
    if M.cfg.arch != "bart": raise SystemExit("rerankers.py scores with the BART's likelihood: use a bart model directory")
    clips = {"cos": M.clip} | {f"cos[{d}]": load_models(d).clip for d in a.clip}
    enc_i, enc_t = nnx.jit(lambda m, x: m.encode_image(x)), nnx.jit(lambda m, t: m.encode_text(t))

    @nnx.jit
    def logp(m, text_ids, image_ids):
        lg = m(text_ids, image_ids).astype(jnp.float32)
        return -optax.softmax_cross_entropy_with_integer_labels(lg, image_ids).sum(-1)

    blank = np.asarray(M.text.blank(1))
    rows = []
    for cat in a.categories.split(","):
        P = a.prompts // 2 if cat == "one" else a.prompts
        prompts = eval_prompts(cat, P, seed=0)
        for scale in [float(s) for s in a.scales.split(",")]:
            picks, oks = {}, []
            for i, prompt in enumerate(prompts):
                r = pipe(prompt, n=a.n, rerank=0, cond_scale=scale, seed=i)
                ok = np.array([caption_match(im, prompt) for im in r.images]); oks.append(ok)
                caps = [prompt] + near_misses(prompt)
                ids = np.asarray(M.text(caps))
                x = jnp.asarray(to_float(np.asarray(r.images)))
                scores = {}
                for name, clip in clips.items():
                    sims = np.asarray(enc_i(clip, x)) @ np.asarray(enc_t(clip, jnp.asarray(ids))).T        # [n, 1 + misses]
                    scores[name] = sims[:, 0]
                    if name == "cos":
                        lg = float(clip.scale()) * sims
                        scores["contrast"] = lg[:, 0] - np.logaddexp.reduce(lg, axis=1)
                C, n = len(caps), a.n
                lp = np.asarray(logp(M.transformer, jnp.asarray(np.repeat(ids, n, 0)), jnp.asarray(np.tile(r.tokens, (C, 1))))).reshape(C, n).T
                scores["logp"] = lp[:, 0]
                scores["pmi"] = lp[:, 0] - np.asarray(logp(M.transformer, jnp.asarray(np.repeat(blank, n, 0)), jnp.asarray(r.tokens)))
                scores["bayes"] = lp[:, 0] - np.logaddexp.reduce(lp, axis=1)
                for name, s in scores.items(): picks.setdefault(name, []).append(bool(ok[int(np.argmax(s))]))
            oks = np.array(oks)
            row = dict(category=cat, cond_scale=scale, prompts=P, n=a.n, first=float(oks[:, 0].mean()), oracle=float(oks.any(1).mean()),
                       **{k: float(np.mean(v)) for k, v in picks.items()})
            rows.append(row)
            print(json.dumps(row), flush=True)
    names = [k for k in rows[0] if k not in ("category", "cond_scale", "prompts", "n")]
    print("\n| category | cond scale | " + " | ".join(names) + " |\n|" + "---|" * (2 + len(names)))
    for r in rows: print(f"| {r['category']} | {r['cond_scale']:g} | " + " | ".join(f"{r[k]:.0%}" for k in names) + " |")


if __name__ == "__main__":
    main()
