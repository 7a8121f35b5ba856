"""Experiment (BENCHMARKS.md, "Attempts on held-out pairs"): a BART variant trained from scratch beside a baseline.

Trains the shipped model's BART stage again from scratch — same config, VQGAN tokens, caption blanking, schedule
shape — with `--set`s applied to it, for `--steps` steps on `--n` training images (fewer than the shipped 6000 × 160k,
so compare variants with a baseline trained the same way: no `--set`), and writes a model directory (the shipped
model with this BART) for `bench/quality.py` or `bench/heldout_probes.py --model DIR`:

    python bench/bart_variants.py --steps 1500 --n 48000 --out runs/bart_var/base/model
    python bench/bart_variants.py --steps 1500 --n 48000 --set bart.encoder_layers=0 --out runs/bart_var/enc0/model
    python bench/heldout_probes.py guidance --model runs/bart_var/enc0/model
"""
import argparse, json, shutil, time
from pathlib import Path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--set", action="append", default=[], help="override of the shipped config, e.g. bart.encoder_layers=0")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--n", type=int, default=48_000, help="training images (data seed of the shipped model)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    from dalle_nb.config import override
    from dalle_nb.modeldir import load_models, save_models, default_model_dir
    from dalle_nb.shapes import make_split
    from dalle_nb.train import train_bart

    t0 = time.perf_counter()
    M = load_models(None)
    cfg = override(M.cfg, [f"bart_train.steps={a.steps}", f"data.n_train={a.n}", "bart_train.ckpt_every=1000000000"] + a.set)
    out = Path(a.out); work = out.parent / "work"
    imgs, caps = make_split("train", a.n, seed=cfg.data.seed)
    vimgs, vcaps = make_split("val", 256, seed=cfg.data.seed)
    bart, hist = train_bart(cfg, work, M.vqgan, M.text, imgs, caps, vimgs, vcaps)
    if out.exists(): shutil.rmtree(out)
    shutil.copytree(default_model_dir(), out)
    M.bart, M.cfg = bart, cfg
    save_models(out, M, card=M.card + f"\n\nExperiment: BART retrained {a.steps} steps on {a.n} images with {a.set} (bench/bart_variants.py).\n")
    last = {k: v for k, v in hist[-1].items() if k.startswith("val_")}
    (out.parent / "bart_variant.json").write_text(json.dumps(dict(args=vars(a), last=last, minutes=round((time.perf_counter() - t0) / 60, 1)), indent=1))
    print(f"wrote {out}: {last} ({(time.perf_counter() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
