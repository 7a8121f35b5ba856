"""Caption accuracy of a model directory on the shapes task.

For each prompt category (one seen object, two seen objects, held-out colour–shape pairs) and each condition
scale, sample N candidates per prompt and report the fraction that `dalle_nb.shapes.caption_match` accepts:
for the first sample (no reranking) and for CLIP's best of N. Writes a JSON file, a markdown table and a plot.

    python bench/quality.py [--model DIR] [--prompts 40] [--n 8] [--scales 1,2,3,5,8] [--quantize int8] [--out bench/results]

With `--negative TEXT` it measures a negative prompt instead: `--prompt` ("a circle" by default) drawn for `--prompts`
seeds × N candidates at each scale, once plainly and once with the negative, and the share of images the checker
accepts as the prompt and as the negative (e.g. how many of the circles are red with and without "a red circle").
Writes negative.json and negative.md:

    python bench/quality.py --negative "a red circle" --prompt "a circle" --prompts 40 --n 8 --scales 2,3 --out bench/results/negative

Works for either architecture: the model directory's config says which transformer (`arch`: bart or dalle) and which
image tokenizer (`image_tokenizer`: vqgan or dvae) the pipeline uses; both are recorded with the results.
"""
import argparse, json, platform, subprocess, sys, time
from datetime import date
from pathlib import Path

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    p.add_argument("--prompts", type=int, default=40, help="prompts per category")
    p.add_argument("--n", type=int, default=8, help="candidates per prompt")
    p.add_argument("--scales", default="1,2,3,5,8", help="condition scales")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plausibility", type=float, default=None, help="sampling guard α (default: the model's setting)")
    p.add_argument("--quantize", default=None, choices=("bfloat16", "float16", "int8"), help="the transformer's weights in this form (default float32)")
    p.add_argument("--cache", default=None, choices=("float32", "bfloat16", "float16", "int8"), help="the decode cache (default: the backend's)")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--negative", default=None, metavar="TEXT", help="measure this negative prompt on --prompt (see above)")
    p.add_argument("--prompt", default="a circle", help="with --negative: the prompt drawn with and without it")
    a = p.parse_args(argv)
    if a.negative is not None: return negative_main(a, argv)

    from dalle_nb.pipeline import Pipeline
    from dalle_nb.shapes import eval_prompts, caption_match, CATEGORIES, make_split, category
    from dalle_nb.images import to_float, center_crop_resize
    from flax import nnx

    pipe = Pipeline(a.model, batch_size=a.n, quantize=a.quantize, cache=a.cache)
    scales = [float(s) for s in a.scales.split(",")]

    # The ceiling the VQGAN sets: how often the checker still accepts a ground-truth image after encode → decode.
    roundtrip = nnx.jit(lambda m, x: m.decode(m.encode(x)))
    ceiling = {}
    for split in ("val", "heldout"):
        imgs, caps = make_split(split, 16 * a.prompts, seed=a.seed + 1)
        res = pipe.cfg.tokenizer_cfg.resolution
        if imgs.shape[1] != res: imgs = np.stack([center_crop_resize(im, res) for im in imgs])   # micro test models
        rec = np.concatenate([np.asarray(roundtrip(pipe.models.image_tokenizer, to_float(imgs[i:i + 64]))) for i in range(0, len(imgs), 64)])
        for c, r in zip(caps, rec): ceiling.setdefault(category(c), []).append(caption_match(r, c))
    ceiling = {c: float(np.mean(v)) for c, v in ceiling.items()}
    print(json.dumps({"vqgan_roundtrip_accuracy": ceiling}), flush=True)
    rows, t0 = [], time.perf_counter()
    for cat in CATEGORIES:
        prompts = eval_prompts(cat, a.prompts, seed=a.seed)
        for scale in scales:
            first, best, any_ok = [], [], []
            for i, prompt in enumerate(prompts):
                r = pipe(prompt, n=a.n, rerank=a.n, cond_scale=scale, seed=a.seed * 1000 + i, plausibility=a.plausibility)
                ok = {int(idx): caption_match(img, prompt) for idx, img in zip(r.indices, r.images)}
                first.append(ok[0])                      # candidate 0 = the first sample, unranked
                best.append(ok[int(r.indices[0])])       # CLIP's choice
                any_ok.append(any(ok.values()))
            row = dict(category=cat, cond_scale=scale, plausibility=r.settings["plausibility"], prompts=len(prompts), n=a.n, first=float(np.mean(first)),
                       reranked=float(np.mean(best)), oracle=float(np.mean(any_ok)))
            rows.append(row)
            print(json.dumps(row), flush=True)
    seconds = time.perf_counter() - t0

    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    meta = dict(date=str(date.today()), machine=f"{platform.machine()} {platform.processor() or ''} ({_cpu()})",
                model=str(pipe.models.path), arch=pipe.cfg.arch, image_tokenizer=pipe.cfg.image_tokenizer, quantize=a.quantize, cache=a.cache, seconds=round(seconds, 1), command="python bench/quality.py " + " ".join(argv or sys.argv[1:]))
    (out / "quality.json").write_text(json.dumps(dict(meta=meta, vqgan_roundtrip_accuracy=ceiling, rows=rows), indent=1))
    table = ["| category | cond scale | plausibility α | first sample | CLIP best of %d | any of %d |" % (a.n, a.n), "|---|---|---|---|---|---|"]
    table += [f"| {r['category']} | {r['cond_scale']:g} | {r['plausibility']:g} | {r['first']:.0%} | {r['reranked']:.0%} | {r['oracle']:.0%} |" for r in rows]
    table += ["", f"{pipe.cfg.image_tokenizer.upper()} round trip (ground-truth image → tokens → image) accepted by the checker: " +
              ", ".join(f"{c} {ceiling.get(c, float('nan')):.0%}" for c in CATEGORIES)]
    (out / "quality.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))

    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(CATEGORIES), figsize=(4 * len(CATEGORIES), 3), sharey=True)
    for ax, cat in zip(axes, CATEGORIES):
        rs = [r for r in rows if r["category"] == cat]
        ax.plot([r["cond_scale"] for r in rs], [r["first"] for r in rs], marker="o", label="first sample")
        ax.plot([r["cond_scale"] for r in rs], [r["reranked"] for r in rs], marker="o", label=f"CLIP best of {a.n}")
        ax.set_title(cat); ax.set_xlabel("condition scale"); ax.set_ylim(0, 1); ax.grid(alpha=0.3)
    axes[0].set_ylabel("caption accuracy"); axes[0].legend()
    fig.tight_layout(); fig.savefig(out / "quality.png", dpi=110)
    print(f"wrote {out / 'quality.json'}, quality.md, quality.png in {seconds:.0f}s")


def negative_main(a, argv):
    "`--negative`: the share of `--prompt`'s images that the checker accepts as the prompt and as the negative, with and without it."
    from dalle_nb.pipeline import Pipeline
    from dalle_nb.shapes import caption_match, PALETTE
    def accepts(image, caption):
        "The checker's verdict; a caption that names no colour ('a circle') is accepted in any colour of the palette."
        try: return caption_match(image, caption)
        except ValueError: return any(caption_match(image, caption.replace("a ", f"a {c} ", 1)) for c in PALETTE)
    pipe, rows, t0 = Pipeline(a.model, batch_size=a.n, quantize=a.quantize), [], time.perf_counter()
    for scale in [float(s) for s in a.scales.split(",")]:
        for neg in (None, a.negative):
            images = [im for i in range(a.prompts) for im in pipe(a.prompt, n=a.n, rerank=0, cond_scale=scale, seed=a.seed * 1000 + i,
                                                                   plausibility=a.plausibility, negative=neg).images]
            row = dict(prompt=a.prompt, negative=neg, cond_scale=scale, images=len(images),
                       as_prompt=float(np.mean([accepts(im, a.prompt) for im in images])),
                       as_negative=float(np.mean([accepts(im, a.negative) for im in images])))
            rows.append(row); print(json.dumps(row), flush=True)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    meta = dict(date=str(date.today()), machine=f"{platform.machine()} {platform.processor() or ''} ({_cpu()})", model=str(pipe.models.path),
                seconds=round(time.perf_counter() - t0, 1), command="python bench/quality.py " + " ".join(argv or sys.argv[1:]))
    (out / "negative.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    table = [f"| cond scale | negative | images | accepted as {a.prompt!r} | accepted as {a.negative!r} |", "|---|---|---|---|---|"]
    table += [f"| {r['cond_scale']:g} | {r['negative'] or '(none: the empty caption)'} | {r['images']} | {r['as_prompt']:.1%} | {r['as_negative']:.1%} |"
              for r in rows]
    (out / "negative.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


def _cpu():
    try: return subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() + " cores"
    except OSError: return "?"


if __name__ == "__main__":
    main()
