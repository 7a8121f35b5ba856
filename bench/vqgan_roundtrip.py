"""Can the image tokenizer draw every object? Round trips per colour × shape × size, held-out pairs included.

A transformer can only draw what its tokenizer can: if encode → decode turns a small purple circle into a small purple
square, no BART output will ever be a small purple circle. For every (colour, shape, size) this renders `--k` one-object
scenes at random grid places, sends them through the model's VQGAN and asks `caption_match` whether the decoded
image still shows that object. Held-out pairs (marked *) were in none of the VQGAN's training images.

    python bench/vqgan_roundtrip.py --model dalle_nb/assets/default                      # measure a model directory
    python bench/vqgan_roundtrip.py --set vqgan.restart_until=800 --out runs/vqrt/r800/model   # train VQGAN + decoder stages, then measure
    python bench/vqgan_roundtrip.py --decoder-only --set decoder_train.steps=4000 --out runs/vqrt/dec4000/model

With `--set`, the shipped model's recipe trains the VQGAN and decoder stages from scratch on `--n` images with the
overrides, and writes a model directory (the shipped one with that VQGAN — its BART and CLIP then read the wrong
tokens: use it for this script only). A codebook of another size needs `--set bart.image_codes=K --set bart.image_vocab=K`
and gets an untrained BART.
"""
import argparse, json, shutil, time
from pathlib import Path

import numpy as np


def report(name: str, table: dict) -> dict:
    from dalle_nb.shapes import PALETTE, SHAPES, SIZES, HELD_OUT
    print(f"\n{name}\n\n| colour | " + " | ".join(f"{sz} {s}" for s in SHAPES for sz in SIZES) + " |")
    print("|---" * (1 + len(SHAPES) * len(SIZES)) + "|")
    for c in PALETTE:
        print(f"| {c} | " + " | ".join(f"{table[c, s, sz]:.0%}" + ("*" if (c, s) in HELD_OUT else "") for s in SHAPES for sz in SIZES) + " |")
    seen = [v for (c, s, _), v in table.items() if (c, s) not in HELD_OUT]
    held = [v for (c, s, _), v in table.items() if (c, s) in HELD_OUT]
    summary = dict(seen_mean=round(float(np.mean(seen)), 3), seen_below_90=int(sum(v < 0.9 for v in seen)),
                   heldout_mean=round(float(np.mean(held)), 3), heldout_below_90=int(sum(v < 0.9 for v in held)))
    print(json.dumps(summary))
    return summary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", action="append", default=[])
    p.add_argument("--set", action="append", default=[], help="VQGAN override of the shipped config (trains a VQGAN)")
    p.add_argument("--out", default=None, help="where the trained VQGAN's model directory goes (with --set)")
    p.add_argument("--n", type=int, default=48_000, help="training images (with --set)")
    p.add_argument("--decoder-only", action="store_true", help="keep the shipped VQGAN's encoder and codes; train only the decoder stage (its --set decoder_train.steps=...)")
    p.add_argument("--k", type=int, default=24, help="renders per colour × shape × size")
    a = p.parse_args(argv)
    from dalle_nb.pipeline import Pipeline, roundtrip_table     # the table itself: nbs/13_pipeline.ipynb
    models = list(a.model)
    if a.set or a.out:
        if not a.out: raise SystemExit("--set needs --out")
        from dalle_nb.config import override
        from dalle_nb.modeldir import load_models, save_models, default_model_dir
        from dalle_nb.shapes import make_split
        from dalle_nb.train import train_vqgan, train_decoder
        t0 = time.perf_counter()
        M = load_models(None)
        cfg = override(M.cfg, [f"data.n_train={a.n}", "vqgan_train.ckpt_every=1000000000", "decoder_train.ckpt_every=1000000000"] + a.set)
        out = Path(a.out); work = out.parent / "work"
        imgs, _ = make_split("train", a.n, seed=cfg.data.seed)
        vimgs, _ = make_split("val", 256, seed=cfg.data.seed)
        vq, h1 = (M.vqgan, [{}]) if a.decoder_only else train_vqgan(cfg, work, imgs, vimgs)
        vq, h2 = train_decoder(cfg, work, vq, imgs, vimgs)
        if out.exists(): shutil.rmtree(out)
        shutil.copytree(default_model_dir(), out)
        M.vqgan, M.cfg = vq, cfg
        if cfg.bart != load_models(None).cfg.bart:           # other codebook size: a placeholder BART of the right shape
            from flax import nnx
            from dalle_nb.bart import DalleBart
            M.bart = DalleBart(cfg.bart, rngs=nnx.Rngs(0))
        what = "the shipped VQGAN's decoder fine-tuned again" if a.decoder_only else "VQGAN retrained"
        save_models(out, M, card=M.card + f"\n\nExperiment: {what} with {a.set} on {a.n} images (bench/vqgan_roundtrip.py); BART and CLIP are the shipped ones.\n")
        last = dict(vqgan={k: v for k, v in h1[-1].items() if k.startswith("val_")}, decoder={k: v for k, v in h2[-1].items() if k.startswith("val_")})
        (out.parent / "vqgan.json").write_text(json.dumps(dict(args=vars(a), last=last, minutes=round((time.perf_counter() - t0) / 60, 1)), indent=1))
        print(f"wrote {out}: {last} ({(time.perf_counter() - t0) / 60:.1f} min)")
        models.append(str(out))
    for m in models or [None]:
        report(m or "shipped model", roundtrip_table(Pipeline(m), a.k))


if __name__ == "__main__":
    main()
