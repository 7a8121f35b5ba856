"""The DALL·E paper's two training techniques at the tiny preset's size: PowerSGD and per-resblock gradient scaling.

Data: the shapes task, images tokenized by the shipped model's VQGAN (cached in OUT) and captions by its tokenizer. The
shipped VQGAN is factored (per patch of its 8×8 grid an outline code of 64 and a colour code of 16); the DALL·E
transformer reads one code per patch, `outline·16 + colour` (1024 codes, 64 tokens: exactly the `tiny` preset's
`--set arch=dalle` transformer), the BART of the shipped model's recipe (`shapes` preset) reads the 128 tokens as made.

1. PowerSGD: each `--models` transformer trained `--steps` steps on a dp=8 CPU mesh (8 host devices), from the same
   initialisation on the same batches, with the plain all-reduce and with `powersgd(r)` for each of `--ranks`: training
   loss (mean of the last `--tail` steps), validation loss, bytes all-reduced per device by one run of the compiled step
   (`dalle_nb.hlo.allreduce_bytes` of its HLO), seconds per step.
2. Per-resblock gradient scaling: the DALL·E transformer computed in float16 (`dtype="float16"`), `--fp16-steps` steps
   at each single loss scale of `--loss-scales`, without and with per-resblock scales (`block_scales=residual_blocks`):
   the fraction of the blocks' parameter elements that never moved, steps skipped (non-finite), the `overflowed_blocks`
   metric, the final training loss (mean of the last 5 steps); and the same transformer in float32 as the reference.

    python bench/paper_techniques.py [--steps 150] [--batch 32] [--ranks 4,16] [--models dalle[,bart]]
                                     [--fp16-steps 10] [--loss-scales 2^-10,1,2^20] [--out bench/results/paper_techniques]

The defaults took 18 minutes on a shared 2-core VM (4 of them compiling the rank-16 step); `--models dalle,bart` adds
the BART's runs (roughly as long again). The smoke test (tests/test_bench.py) runs it at toy sizes with `--dp 2`.
"""
import argparse, json, os, platform, sys, time
from datetime import date
from pathlib import Path

import numpy as np


def scale_value(s: str) -> float:
    "`'2^-10'` → 2**-10; anything else as a float."
    if "^" in s:
        b, e = s.split("^")
        return float(b) ** float(e)
    return float(s)


def show_scale(x: float) -> str:
    "2^k for a power of two, else the number."
    k = np.log2(x) if x > 0 else 0.5
    return f"2^{int(k)}" if k == int(k) and abs(k) >= 4 else f"{x:g}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="dalle", help="transformers of the PowerSGD runs: dalle (tiny, arch=dalle) and/or bart (shapes)")
    p.add_argument("--steps", type=int, default=150, help="steps of each PowerSGD run")
    p.add_argument("--batch", type=int, default=32, help="global batch (split over dp=8)")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ranks", default="4,16", help="PowerSGD ranks")
    p.add_argument("--tail", type=int, default=20, help="final training loss = mean of this many last steps")
    p.add_argument("--n-train", type=int, default=4096, help="shapes training images")
    p.add_argument("--n-val", type=int, default=256)
    p.add_argument("--fp16-steps", type=int, default=10, help="steps of each float16 run")
    p.add_argument("--fp16-lr", type=float, default=1e-3)
    p.add_argument("--loss-scales", default="2^-10,1,2^20", help="single loss scales of the float16 runs ('2^k' or a number)")
    p.add_argument("--no-reference", action="store_true", help="skip the float32 reference run of part 2")
    p.add_argument("--layers", type=int, default=None, help="override the transformers' depth (smoke tests)")
    p.add_argument("--d-model", type=int, default=None, help="override the transformers' width (smoke tests)")
    p.add_argument("--dp", type=int, default=8, help="data-parallel CPU devices")
    p.add_argument("--model", default=None, help="model directory whose VQGAN and tokenizer make the data (default: shipped)")
    p.add_argument("--out", default="bench/results/paper_techniques")
    a = p.parse_args(argv)
    if "jax" not in sys.modules:                     # host devices for the mesh: set before JAX starts
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={a.dp}".strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)

    import jax, jax.numpy as jnp
    from dataclasses import replace
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P
    from dalle_nb.config import StageConfig, get_config, override
    from dalle_nb.modeldir import load_models
    from dalle_nb.shapes import make_split
    from dalle_nb.stages import encode_dataset
    from dalle_nb.data import Batches
    from dalle_nb.sharding import mesh_from_spec
    from dalle_nb.optim import make_optimizer
    from dalle_nb.train import make_sharded_train_step
    from dalle_nb.powersgd import powersgd
    from dalle_nb.hlo import allreduce_bytes
    from dalle_nb.bart import DalleBart, bart_loss
    from dalle_nb.dalle import DalleTransformer, dalle_loss

    if len(jax.devices()) < a.dp: raise SystemExit(f"need {a.dp} devices, JAX has {len(jax.devices())} (set XLA_FLAGS before JAX starts)")
    t_start, load_start = time.perf_counter(), os.getloadavg()
    mesh = mesh_from_spec(f"dp={a.dp}")
    m = load_models(a.model)
    vq = m.cfg.vqgan
    if not (vq.factored and vq.n_embed * vq.color_codes == 1024 and vq.grid == 8):
        raise SystemExit(f"{m.path}: expected the shipped factored VQGAN (8×8 grid, 64 × 16 codes), got {vq}")
    t0 = time.perf_counter()
    images, captions = make_split("train", a.n_train, m.cfg.data.seed)
    val_images, val_captions = make_split("val", a.n_val, m.cfg.data.seed)
    factored = {"train": encode_dataset(m.vqgan, images, out / f"tokens_{a.n_train}.npy", False),
                "val": encode_dataset(m.vqgan, val_images, None, False)}
    text = {"train": m.text(captions), "val": m.text(val_captions)}
    print(f"data: {a.n_train} + {a.n_val} shapes images tokenized in {time.perf_counter() - t0:.0f} s", flush=True)
    joined = {k: (v[:, 0::2] * vq.color_codes + (v[:, 1::2] - vq.n_embed)).astype(np.int32) for k, v in factored.items()}

    dsets, bsets = [], []
    if a.layers: dsets.append(f"dalle.layers={a.layers}"); bsets += [f"bart.encoder_layers={a.layers}", f"bart.decoder_layers={a.layers}"]
    if a.d_model: dsets.append(f"dalle.d_model={a.d_model}"); bsets.append(f"bart.d_model={a.d_model}")
    dcfg = override(get_config("tiny"), ["arch=dalle", *dsets]).dalle      # `dalle-nb train --preset tiny --arch dalle`'s transformer
    bcfg = get_config("shapes", bsets).bart                                 # the shipped model's BART recipe
    models = {
        "dalle": dict(build=lambda c=dcfg: DalleTransformer(c, rngs=nnx.Rngs(0)), data=joined,
                      loss=lambda mod, b, k, **kw: dalle_loss(mod, b["text"], b["image"], **kw),
                      name=f"DALL·E transformer (tiny, arch=dalle: {dcfg.layers} layers, d {dcfg.d_model})"),
        "bart": dict(build=lambda c=bcfg: DalleBart(c, rngs=nnx.Rngs(0)), data=factored,
                     loss=lambda mod, b, k: bart_loss(mod, b["text"], b["image"]),
                     name=f"BART (shapes recipe: {bcfg.encoder_layers}+{bcfg.decoder_layers} layers, d {bcfg.d_model})"),
    }
    rep = NamedSharding(mesh, P())

    def snapshot(module):
        return [np.asarray(x[...]) for _, x in nnx.to_flat_state(jax.tree.map(np.asarray, nnx.state(module, nnx.Param)))]

    def unmoved(before, after):
        "Fraction of parameter elements equal before and after, and how many elements there are."
        total = sum(x.size for x in before)
        return sum(int((x == y).sum()) for x, y in zip(before, after)) / total, total

    def train(spec, sc, steps, reduce=None, loss_scale=1.0, block_scales=False, watch=False):
        "One run: per-step metrics, compile and step seconds, all-reduce bytes; `watch`: the fraction of parameters that never moved."
        model = spec["build"]()
        before = (snapshot(model.layers), snapshot(model)) if watch else None
        t = make_sharded_train_step(spec["loss"], model, make_optimizer(sc), mesh, reduce=reduce, loss_scale=loss_scale,
                                    block_scales=model.residual_blocks if block_scales else 0)
        data = {"text": text["train"], "image": spec["data"]["train"]}
        batch_structs = t.batch_structs({k: ((a.batch, v.shape[1]), jnp.int32) for k, v in data.items()})
        t0 = time.perf_counter()
        compiled = t.step.lower(t.abstract, batch_structs, jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=rep)).compile()
        compile_s = time.perf_counter() - t0
        sent = allreduce_bytes(compiled.as_text())
        state, batches, rows, run_s = t.init(model), Batches.on_mesh(data, a.batch, mesh, seed=0), [], 0.0
        for i in range(steps):
            batch = t.batch(next(batches), a.batch)
            t0 = time.perf_counter()
            state, metrics = compiled(state, batch, jax.device_put(jax.random.key(i), rep))
            metrics = jax.device_get(metrics)
            if i: run_s += time.perf_counter() - t0      # the first step warms up: not counted
            rows.append({k: float(v) for k, v in metrics.items()})
        t.write_back(model, state)
        moved = None
        if watch:
            (blocks, n_blocks), (whole, n_whole) = unmoved(before[0], snapshot(model.layers)), unmoved(before[1], snapshot(model))
            moved = {"frozen_fraction": blocks, "block_param_elements": n_blocks, "frozen_fraction_all": whole, "param_elements": n_whole}
        return dict(model=model, rows=rows, compile_s=compile_s, step_s=run_s / max(steps - 1, 1), allreduce_bytes=sent,
                    skipped=int(state.skipped), **(moved or {}))

    def tail_loss(rows):
        ok = [r["loss"] for r in rows if r["finite"]][-a.tail:]
        return float(np.mean(ok)) if ok else float("nan")

    # 1. PowerSGD
    psgd = []
    ranks = [int(r) for r in a.ranks.split(",") if r]
    for name in [x for x in a.models.split(",") if x]:
        spec = models[name]
        val = {"text": jnp.asarray(text["val"]), "image": jnp.asarray(spec["data"]["val"])}
        evaluate = nnx.jit(lambda mod: spec["loss"](mod, val, None)[0])
        sc = StageConfig(steps=a.steps, batch_size=a.batch, lr=a.lr, warmup_steps=min(30, a.steps // 10), decay="cosine",
                         weight_decay=0.0, mesh=f"dp={a.dp}")
        n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(nnx.eval_shape(spec["build"]), nnx.Param)))
        for rank in [0, *ranks]:
            r = train(spec, sc, a.steps, reduce=powersgd(rank) if rank else None)
            row = {"model": name, "description": spec["name"], "params": n_params, "rank": rank,
                   "train_loss": tail_loss(r["rows"]), "val_loss": float(evaluate(r["model"])),
                   "allreduce_bytes": r["allreduce_bytes"], "step_s": r["step_s"], "compile_s": r["compile_s"],
                   "skipped": r["skipped"], "curve": [x["loss"] for x in r["rows"]]}
            psgd.append(row)
            print(f"{name} {'all-reduce' if not rank else f'PowerSGD r={rank}'}: train loss {row['train_loss']:.4f}, val {row['val_loss']:.4f}, "
                  f"{row['allreduce_bytes']:,} B/step, {row['step_s'] * 1000:.0f} ms/step (compile {row['compile_s']:.1f} s)", flush=True)
    for row in psgd:
        base = next(x for x in psgd if x["model"] == row["model"] and x["rank"] == 0)
        row["bytes_ratio"] = row["allreduce_bytes"] / base["allreduce_bytes"] if base["allreduce_bytes"] else float("nan")
        row["loss_ratio"] = row["train_loss"] / base["train_loss"]

    # 2. Per-resblock gradient scaling in float16
    fp16 = []
    f16 = {**models["dalle"], "build": lambda c=replace(dcfg, dtype="float16"): DalleTransformer(c, rngs=nnx.Rngs(0))}
    sc = StageConfig(steps=a.fp16_steps, batch_size=a.batch, lr=a.fp16_lr, warmup_steps=0, decay="constant", weight_decay=0.0,
                     mesh=f"dp={a.dp}")
    runs = [] if a.no_reference else [("float32", models["dalle"], 1.0, False)]
    runs += [("float16", f16, scale_value(s), per) for s in a.loss_scales.split(",") if s for per in (False, True)]
    for dtype, spec, scale, per in runs:
        r = train(spec, sc, a.fp16_steps, loss_scale=scale, block_scales=per, watch=True)
        over = [x["overflowed_blocks"] for x in r["rows"]] if per else []
        row = {"dtype": dtype, "loss_scale": scale, "per_block": per, "frozen_fraction": r["frozen_fraction"],
               "block_param_elements": r["block_param_elements"],
               "frozen_fraction_all": r["frozen_fraction_all"], "param_elements": r["param_elements"], "skipped": r["skipped"], "steps": a.fp16_steps,
               "overflowed_blocks_mean": float(np.mean(over)) if over else None, "overflowed_blocks_max": float(np.max(over)) if over else None,
               "overflowed_blocks_first": float(over[0]) if over else None, "final_loss": tail_loss(r["rows"][-5:]),
               "step_s": r["step_s"], "compile_s": r["compile_s"]}
        fp16.append(row)
        print(f"{dtype} loss scale {show_scale(scale)}{' + per-resblock' if per else ''}: {row['frozen_fraction']:.1%} of block parameters never "
              f"moved ({row['frozen_fraction_all']:.1%} of all), {row['skipped']} skipped, overflowed blocks {row['overflowed_blocks_mean']}, loss {row['final_loss']:.4f}", flush=True)

    result = {"date": str(date.today()), "command": ("python bench/paper_techniques.py " + " ".join(map(str, sys.argv[1:] if argv is None else argv))).strip(),
              "machine": f"{platform.machine()} {platform.processor()}".strip() + f", {os.cpu_count()} CPUs, {len(jax.devices())} {jax.devices()[0].platform} devices".strip(),
              "jax": jax.__version__, "python": platform.python_version(), "model_dir": str(m.path), "args": vars(a),
              "seconds": round(time.perf_counter() - t_start, 1),
              "load_average": {"start": [round(x, 2) for x in load_start], "end": [round(x, 2) for x in os.getloadavg()]},
              "data": f"shapes {a.n_train} train / {a.n_val} val images, tokens of the shipped VQGAN (joined to 1024 codes for the DALL·E transformer)",
              "powersgd": psgd, "fp16": fp16}
    (out / "paper_techniques.json").write_text(json.dumps(result, indent=1))
    report(result, out)
    return result


def report(result, out):
    "Print and write paper_techniques.md (tables); draw paper_techniques.png (PowerSGD loss curves, frozen fractions)."
    lines = ["| model | reduction | train loss | val loss | all-reduce B/step | bytes ratio | ms/step |", "|---|---|---|---|---|---|---|"]
    for r in result["powersgd"]:
        lines.append(f"| {r['model']} ({r['params'] / 1e6:.2f}M) | {'all-reduce' if not r['rank'] else 'PowerSGD r=%d' % r['rank']} | "
                     f"{r['train_loss']:.4f} | {r['val_loss']:.4f} | {r['allreduce_bytes']:,} | {r['bytes_ratio']:.3f} | {r['step_s'] * 1000:.0f} |")
    lines += ["", "| dtype | loss scale | per-resblock | block params never moved | all params never moved | skipped steps | overflowed blocks (mean / max) | final loss |",
              "|---|---|---|---|---|---|---|---|"]
    for r in result["fp16"]:
        ob = "—" if r["overflowed_blocks_mean"] is None else f"{r['overflowed_blocks_mean']:.2f} / {r['overflowed_blocks_max']:.0f}"
        lines.append(f"| {r['dtype']} | {show_scale(r['loss_scale'])} | {'yes' if r['per_block'] else 'no'} | {r['frozen_fraction']:.1%} | {r['frozen_fraction_all']:.1%} | "
                     f"{r['skipped']}/{r['steps']} | {ob} | {r['final_loss']:.4f} |")
    (out / "paper_techniques.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in result["powersgd"]:
        label = f"{r['model']}, {'all-reduce' if not r['rank'] else 'PowerSGD r=%d' % r['rank']} ({r['allreduce_bytes'] / 1e6:.2f} MB/step)"
        axes[0].plot(np.arange(1, len(r["curve"]) + 1), r["curve"], label=label, lw=1)
    axes[0].set_xlabel("step"); axes[0].set_ylabel("training loss"); axes[0].set_yscale("log"); axes[0].legend(fontsize=7)
    axes[0].set_title("PowerSGD, dp=8 CPU devices", fontsize=9)
    f16 = [r for r in result["fp16"] if r["dtype"] == "float16"]
    scales = sorted({r["loss_scale"] for r in f16})
    for k, per in enumerate((False, True)):
        ys = [next(r["frozen_fraction"] for r in f16 if r["loss_scale"] == s and r["per_block"] == per) for s in scales]
        axes[1].bar(np.arange(len(scales)) + (k - 0.5) * 0.4, ys, 0.4, label="per-resblock scales" if per else "one loss scale")
    axes[1].set_xticks(np.arange(len(scales)), [show_scale(s) for s in scales]); axes[1].set_xlabel("loss scale")
    axes[1].set_ylabel("block parameters never moved"); axes[1].legend(fontsize=7)
    axes[1].set_title(f"float16, {f16[0]['steps'] if f16 else 0} steps", fontsize=9)
    fig.tight_layout(); fig.savefig(out / "paper_techniques.png", dpi=110)


if __name__ == "__main__":
    main()
