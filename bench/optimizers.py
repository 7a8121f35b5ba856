"""Adam vs Distributed Shampoo on the shapes task: validation loss against steps and wall-clock, and state memory.

Trains the tiny preset's BART on (caption, VQGAN tokens) pairs of the embedded shapes dataset (tokens from the
shipped model's VQGAN, cached), once per optimiser and learning rate, from the same initialisation on the same
batches. Reports each optimiser at its best learning rate of the sweep, plots the curves, and measures the optimiser
state's bytes per parameter for the tiny and mega BARTs (abstract shapes: nothing allocated).

    python bench/optimizers.py [--steps 600] [--batch 32] [--adam-lrs 1e-3,2e-3,4e-3] [--shampoo-lrs 1e-3,2e-3,4e-3]
"""
import argparse, json, platform, time
from datetime import date
from pathlib import Path

import numpy as np


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--n-train", type=int, default=20_000)
    p.add_argument("--adam-lrs", default="1e-3,2e-3,4e-3")
    p.add_argument("--shampoo-lrs", default="1e-3,2e-3,4e-3")
    p.add_argument("--n-val", type=int, default=256, help="validation pairs")
    p.add_argument("--set", action="append", default=[], metavar="bart.FIELD=VALUE",
                   help="override the BART's sizes (e.g. bart.d_model=32: smoke tests); its vocabularies stay the model's")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--model", default=None, help="model directory whose VQGAN and tokenizer make the data (default: shipped)")
    p.add_argument("--out", default="bench/results/optimizers")
    p.add_argument("--replot", action="store_true", help="only redraw the table and plot from OUT/optimizers.json")
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.replot:
        report(json.loads((out / "optimizers.json").read_text()), out)
        return

    import jax, jax.numpy as jnp
    from flax import nnx
    from dalle_nb.config import StageConfig, get_config, override
    from dalle_nb.modeldir import load_models
    from dalle_nb.shapes import make_split
    from dalle_nb.train import make_train_step
    from dalle_nb.stages import encode_dataset
    from dalle_nb.data import Batches
    from dalle_nb.bart import DalleBart, bart_loss
    from dalle_nb.optim import make_optimizer
    from dalle_nb.shampoo import state_bytes_per_param

    out.mkdir(parents=True, exist_ok=True)
    m = load_models(a.model)
    if bad := [x for x in a.set if not x.startswith("bart.")]: p.error(f"--set: only bart.FIELD=VALUE overrides, got {bad}")
    cfg = override(m.cfg, a.set)
    images, captions = make_split("train", a.n_train, cfg.data.seed)
    val_images, val_captions = make_split("val", a.n_val, cfg.data.seed)
    data = {"text": m.text(captions), "image": encode_dataset(m.vqgan, images, out / f"tokens_{a.n_train}.npy", True)}
    val = {"text": jnp.asarray(m.text(val_captions)), "image": jnp.asarray(encode_dataset(m.vqgan, val_images, None, False))}
    evaluate = nnx.jit(lambda mod: bart_loss(mod, val["text"], val["image"])[0])

    def stage(optimizer, lr):
        return StageConfig(steps=a.steps, batch_size=a.batch, lr=lr, warmup_steps=min(50, a.steps // 10), decay="cosine",
                           optimizer=optimizer, b1=0.9, b2=0.99, weight_decay=0.0, shampoo_block=128, shampoo_every=10,
                           shampoo_start=min(101, a.steps // 4))

    runs = []
    for name, lrs in (("adam", a.adam_lrs), ("shampoo", a.shampoo_lrs)):
        for lr in (float(x) for x in lrs.split(",")):
            sc = stage(name, lr)
            model = DalleBart(cfg.bart, rngs=nnx.Rngs(0))
            opt = nnx.Optimizer(model, make_optimizer(sc), wrt=nnx.Param)
            step = make_train_step(lambda mod, b, k: bart_loss(mod, b["text"], b["image"]), 1)
            batches = Batches(data, a.batch, seed=0)
            curve, train_seconds, compile_seconds = [], 0.0, 0.0
            for i in range(1, a.steps + 1):
                t0 = time.perf_counter()
                metrics = step(model, opt, next(batches), jax.random.key(i))
                jax.block_until_ready(metrics)
                dt = time.perf_counter() - t0
                if i == 1: compile_seconds = dt           # the first call compiles: reported, not counted as training
                else: train_seconds += dt
                if i % a.eval_every == 0 or i == a.steps:
                    curve.append({"step": i, "seconds": round(train_seconds, 2), "val_loss": float(evaluate(model))})
            run = {"optimizer": name, "lr": lr, "curve": curve, "final_val_loss": curve[-1]["val_loss"],
                   "seconds_per_step": train_seconds / max(a.steps - 1, 1), "compile_seconds": compile_seconds}
            runs.append(run)
            print(f"{name:8} lr {lr:.0e}: val loss {run['final_val_loss']:.4f}  {run['seconds_per_step'] * 1000:.0f} ms/step"
                  f"  (first step {compile_seconds:.1f} s)", flush=True)

    best = {n: min((r for r in runs if r["optimizer"] == n), key=lambda r: r["final_val_loss"]) for n in ("adam", "shampoo")}
    tiny_ps = nnx.state(nnx.eval_shape(lambda: DalleBart(cfg.bart, rngs=nnx.Rngs(0))), nnx.Param)
    mega = get_config("mega")
    mega_ps = nnx.state(nnx.eval_shape(lambda: DalleBart(mega.bart, rngs=nnx.Rngs(0))), nnx.Param)
    memory = {}
    for o in ("adam", "adafactor", "shampoo"):
        memory[o] = {"tiny": state_bytes_per_param(make_optimizer(stage(o, 1e-3)), tiny_ps),
                     "mega": state_bytes_per_param(make_optimizer(StageConfig(**{**mega.bart_train.__dict__, "optimizer": o})), mega_ps)}
    result = {"date": str(date.today()), "machine": f"{platform.machine()}, {jax.devices()[0].device_kind}, {len(jax.devices())} device(s)",
              "args": vars(a), "runs": runs, "best": {k: {"lr": v["lr"], "final_val_loss": v["final_val_loss"]} for k, v in best.items()},
              "state_bytes_per_param": memory}
    (out / "optimizers.json").write_text(json.dumps(result, indent=1))

    report(result, out)


def report(result, out):
    "Write optimizers.md (tables) and optimizers.png (curves) from a result dict."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    colors = {"adam": "tab:blue", "shampoo": "tab:red"}
    runs, memory, a_batch = result["runs"], result["state_bytes_per_param"], result["args"]["batch"]
    best = {n: min((r for r in runs if r["optimizer"] == n), key=lambda r: r["final_val_loss"]) for n in ("adam", "shampoo")}
    for r in runs:
        is_best = r is best[r["optimizer"]]
        kw = dict(color=colors[r["optimizer"]], alpha=1.0 if is_best else 0.3, lw=2 if is_best else 1,
                  label=f"{r['optimizer']} lr {r['lr']:g}" + (" (best)" if is_best else ""))
        axes[0].plot([c["step"] for c in r["curve"]], [c["val_loss"] for c in r["curve"]], **kw)
        axes[1].plot([c["seconds"] for c in r["curve"]], [c["val_loss"] for c in r["curve"]], **kw)
    axes[0].set_xlabel("step"); axes[1].set_xlabel("training seconds (CPU)")
    for ax in axes: ax.set_ylabel("validation loss"); ax.set_yscale("log")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"tiny BART on shapes, batch {a_batch}: Adam vs Distributed Shampoo")
    fig.tight_layout(); fig.savefig(out / "optimizers.png", dpi=110)

    lines = ["| optimizer | lr | final val loss | ms/step | first step (s) |", "|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['optimizer']}{' **best**' if r is best[r['optimizer']] else ''} | {r['lr']:g} | {r['final_val_loss']:.4f} | "
                     f"{r['seconds_per_step'] * 1000:.0f} | {r['compile_seconds']:.1f} |")
    lines += ["", "| optimizer | state bytes/param, tiny BART | state bytes/param, mega BART |", "|---|---|---|"]
    lines += [f"| {o} | {v['tiny']:.1f} | {v['mega']:.1f} |" for o, v in memory.items()]
    (out / "optimizers.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
