"""The DALL·E paper's discrete VAE against the shipped VQGAN, as image tokenizers of the shapes data.

Trains the `tiny` dVAE (64×64 → 8×8 codes of 1024, the shipped VQGAN's grid) with the `dvae` stage (`dalle_nb.train_dalle.DVAE_STAGE`) —
the stage `dalle-nb train --set image_tokenizer=dvae` runs — then measures both tokenizers on the same validation
images: PSNR of decode(encode(x)) through hard codes, how many of the codes the images use (and the perplexity of their
use), and how often the shapes checker still accepts the round-tripped image. Writes JSON, a markdown table and a
picture of reconstructions.

    python bench/dvae.py [--steps 1500] [--set dvae.n_hid=64 ...] [--workdir runs/dvae_bench] [--out bench/results/dvae]
"""
import argparse, json, platform, subprocess, sys, time
from datetime import date
from pathlib import Path

import numpy as np


def tokenizer_metrics(model, images, captions, batch: int = 200):
    "PSNR, codes used, code perplexity and checker round-trip accuracy of `model` (anything with encode/decode) on uint8 `images`."
    import jax.numpy as jnp
    from flax import nnx
    from dalle_nb.images import to_float
    from dalle_nb.shapes import caption_match, category
    enc, dec = nnx.jit(lambda m, x: m.encode(x)), nnx.jit(lambda m, t: m.decode(t))
    ids, recs = [], []
    for i in range(0, len(images), batch):
        x = jnp.asarray(to_float(images[i:i + batch]))
        t = enc(model, x)
        ids.append(np.asarray(t)); recs.append(np.asarray(dec(model, t)))
    ids, recs = np.concatenate(ids), np.concatenate(recs)
    x = to_float(images)
    mse = ((recs - x) ** 2).mean((1, 2, 3))
    counts = np.bincount(ids.ravel(), minlength=int(ids.max()) + 1) / ids.size
    p = counts[counts > 0]
    by_cat = {}
    for c, r in zip(captions, recs): by_cat.setdefault(category(c), []).append(caption_match(r, c))
    return dict(psnr=float(np.mean(10 * np.log10(1 / np.maximum(mse, 1e-10)))), codes_used=int((counts > 0).sum()),
                perplexity=float(np.exp(-(p * np.log(p)).sum())),
                checker={k: float(np.mean(v)) for k, v in by_cat.items()}), recs


def main(argv=None):
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--steps", type=int, default=None, help="dVAE training steps (default: the tiny preset's)")
    a.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config overrides")
    a.add_argument("--workdir", default="runs/dvae_bench")
    a.add_argument("--vqgan", default=None, help="model directory whose VQGAN is compared (default: the shipped model)")
    a.add_argument("--n-val", type=int, default=1000)
    a.add_argument("--out", default="bench/results/dvae")
    a = a.parse_args(argv)

    from dalle_nb.config import get_config
    from dalle_nb.shapes import make_split
    from dalle_nb.modeldir import load_models
    from dalle_nb.stages import StageRun, train_stage
    from dalle_nb.train_dalle import DVAE_STAGE
    from dalle_nb.images import image_grid, save_png

    sets = ["image_tokenizer=dvae", "arch=dalle"] + ([f"dvae_train.steps={a.steps}"] if a.steps else []) + a.set
    cfg = get_config("tiny", sets)
    t0 = time.perf_counter()
    images, _ = make_split("train", cfg.data.n_train, cfg.data.seed)
    val_images, val_captions = make_split("val", a.n_val, cfg.data.seed)
    dvae, hist = train_stage(DVAE_STAGE, StageRun("dvae", cfg, Path(a.workdir), images=images, val_images=val_images))
    minutes = (time.perf_counter() - t0) / 60
    vqgan = load_models(a.vqgan).vqgan
    rows, recs = {}, {}
    for name, model in (("dVAE (this run)", dvae), ("VQGAN (shipped)", vqgan)):
        rows[name], recs[name] = tokenizer_metrics(model, val_images, val_captions)
        print(name, json.dumps(rows[name]), flush=True)

    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    d, s = cfg.dvae, cfg.dvae_train
    setup = (f"dVAE: {d.resolution}px, patch {d.patch}, {d.group_count} groups × {d.n_blk_per_group} block(s), n_hid {d.n_hid}, "
             f"{d.vocab_size} codes ({d.grid}×{d.grid}), recon {d.recon}, τ {d.tau_start:g}→{d.tau_end:g} over {d.tau_steps} steps, "
             f"β 0→{d.kl_weight:g} over {d.kl_warmup_steps}, usage term {d.usage_weight:g}; {s.steps} steps × {s.batch_size}, lr {s.lr:g} ({s.optimizer}), "
             f"{minutes:.1f} min. VQGAN: the shipped model's (1500 + 1000 decoder steps × 32).")
    cats = sorted({c for r in rows.values() for c in r["checker"]})
    table = ["| tokenizer | PSNR (dB) | codes used | code perplexity | checker accepts round trip (" + ", ".join(cats) + ") |",
             "|---|---|---|---|---|"]
    table += [f"| {n} | {r['psnr']:.1f} | {r['codes_used']} of {cfg.dvae.vocab_size if 'dVAE' in n else vqgan.cfg.n_embed} | "
              f"{r['perplexity']:.0f} | " + " / ".join(f"{r['checker'].get(c, float('nan')):.0%}" for c in cats) + " |" for n, r in rows.items()]
    text = "\n".join(table) + "\n\n" + setup
    meta = dict(date=str(date.today()), machine=f"{platform.machine()} ({_cpu()})", command="python bench/dvae.py " + " ".join(argv or sys.argv[1:]))
    (out / "dvae.json").write_text(json.dumps(dict(meta=meta, rows=rows, history=hist, table=text), indent=1))
    (out / "dvae.md").write_text(text + "\n")
    k = 8
    save_png(image_grid(np.concatenate([val_images[:k] / 255.0] + [recs[n][:k] for n in rows]), ncols=k), out / "reconstructions.png")
    print(text)


def _cpu():
    try: return subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() + " cores"
    except OSError: return "?"


if __name__ == "__main__":
    main()
