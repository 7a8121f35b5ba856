"""Train-step speed of a model directory's stages on this machine, under settings of XLA:CPU's YNNPACK fusions.

For each stage asked (vqgan, decoder, bart, clip), builds exactly what `dalle-nb train` trains: the stage table's model,
loss, optimiser and data (`dalle_nb.recipe.STAGES`) at the model's config (default: the shipped model's, the `shapes`
recipe), a real batch of its size from the shapes data, and the sharded train step `fit` compiles, on one CPU device.
Reports the compile time, the mean of `--steps` warm steps after `--warmup`, FLOPs of the compiled step and the rate.
Each setting runs in its own process (XLA reads its flags once per process), the settings taking turns for `--rounds`
rounds; the table gives each one's median round and the range (a shared 2-core VM's speed drifts by ±10% between runs):

- `package`: what `dalle_nb` sets for a training process (`dalle_nb.layers.xla_cpu_defaults("train")`);
- `jaxlib`: jaxlib's own defaults (`DALLE_NB_XLA_DEFAULTS=0`);
- any other word: that value of `--xla_cpu_experimental_ynn_fusion_type` (`individual_dot`, `-individual_convolution`, …).

    python bench/train_step.py [--model DIR] [--stages vqgan,decoder,bart,clip] [--ynn package,jaxlib] [--rounds 3]
                               [--steps 5] [--warmup 1] [--set SECTION.FIELD=VALUE ...] [--out bench/results/train_step]
"""
import argparse, json, os, platform, statistics, subprocess, sys, tempfile, time
from datetime import date
from pathlib import Path

STAGE_NAMES = ("vqgan", "decoder", "bart", "clip")


def child_env(setting: str) -> dict:
    "This process's environment with one CPU device and the YNNPACK fusions of `setting`."
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith(("--xla_force_host_platform_device_count", "--xla_cpu_experimental_ynn_fusion_type"))]
    env = {k: v for k, v in os.environ.items() if k not in ("DALLE_NB_YNN", "DALLE_NB_XLA_DEFAULTS")}
    if setting == "jaxlib": env["DALLE_NB_XLA_DEFAULTS"] = "0"
    elif setting != "package": flags.append(f"--xla_cpu_experimental_ynn_fusion_type={setting}")
    return {**env, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": env.get("JAX_PLATFORMS", "cpu")}


def time_stage(name: str, models, sets, steps: int, warmup: int) -> dict:
    "Compile time, warm ms/step and FLOPs of stage `name`'s train step, built as `train_all` builds it."
    import jax
    from dalle_nb.config import override
    from dalle_nb.optim import make_optimizer
    from dalle_nb.recipe import STAGES
    from dalle_nb.shapes import make_split
    from dalle_nb.stages import StageRun
    from dalle_nb.train import make_sharded_train_step
    cfg = override(models.cfg, sets)
    sc = getattr(cfg, f"{name}_train")
    images, captions = make_split("train", max(256, sc.batch_size), cfg.data.seed)     # the VQGAN's codebook starts from 256
    val_images, val_captions = make_split("val", 8, cfg.data.seed)
    with tempfile.TemporaryDirectory() as work:
        run = StageRun(name, cfg, Path(work), models.text, {"vqgan": models.vqgan, "bart": models.bart, "clip": models.clip},
                       images, captions, val_images, val_captions, progress=False)
        stage = STAGES[name]
        model = stage.build(run)
        train = make_sharded_train_step(stage.loss(run), model, stage.optimizer(run, make_optimizer(sc)), run.mesh, grad_accum=sc.grad_accum)
        batch, state = train.batch(next(stage.data(run)), sc.batch_size), train.init(model)
        t0 = time.perf_counter()
        cost = train.step.lower(state, batch, jax.random.key(0)).compile().cost_analysis()
        compile_s = time.perf_counter() - t0
        flops = (cost[0] if isinstance(cost, list) else cost or {}).get("flops", 0.0)
        state, metrics = train.step(state, batch, jax.random.key(0)); jax.block_until_ready(metrics)
        for i in range(warmup): state, metrics = train.step(state, batch, jax.random.key(1 + i))
        jax.block_until_ready(metrics)
        t0 = time.perf_counter()
        for i in range(steps): state, metrics = train.step(state, batch, jax.random.key(100 + i))
        jax.block_until_ready(metrics)
        warm = (time.perf_counter() - t0) / steps
    return dict(stage=name, batch=sc.batch_size, compile_s=round(compile_s, 2), ms_per_step=round(warm * 1e3, 1),
                gflop_per_step=round(flops / 1e9, 2), gflop_per_s=round(flops / 1e9 / warm, 1))


def worker(a) -> None:
    "One setting, every stage asked: prints one JSON object."
    import jax
    from dalle_nb.modeldir import load_models
    models = load_models(a.model)
    rows = [time_stage(s, models, a.set, a.steps, a.warmup) for s in a.stages.split(",")]
    print(json.dumps({"xla_flags": os.environ.get("XLA_FLAGS", ""), "devices": jax.device_count(), "rows": rows}))


def summary(runs: list[dict]) -> list[dict]:
    "One row per (stage, setting): the median round's numbers and the range of ms/step over the rounds."
    rows = {}
    for run in runs:
        for r in run["rows"]: rows.setdefault((r["stage"], run["setting"]), []).append(r)
    out = []
    for (stage, setting), rs in rows.items():
        ms = [r["ms_per_step"] for r in rs]
        mid = sorted(rs, key=lambda r: r["ms_per_step"])[len(rs) // 2]
        out.append({**mid, "setting": setting, "rounds": len(rs), "ms_min": min(ms), "ms_max": max(ms), "ms_median": statistics.median(ms)})
    return sorted(out, key=lambda r: STAGE_NAMES.index(r["stage"]))


def table(rows: list[dict]) -> str:
    lines = ["| stage | batch | YNNPACK fusions | ms/step (median) | range | GFLOP/step | GFLOP/s | compile (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['batch']} | {r['setting']} | {r['ms_median']:.0f} | {r['ms_min']:.0f}–{r['ms_max']:.0f} | "
                     f"{r['gflop_per_step']} | {r['gflop_per_step'] / r['ms_median'] * 1e3:.1f} | {r['compile_s']} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model directory whose config and earlier stages are used (default: the shipped model)")
    p.add_argument("--stages", default=",".join(STAGE_NAMES), help=f"comma-separated subset of {','.join(STAGE_NAMES)}")
    p.add_argument("--ynn", default="package,jaxlib", help="comma-separated settings: package, jaxlib, or a value of the XLA flag")
    p.add_argument("--rounds", type=int, default=3, help="times each setting runs, taking turns")
    p.add_argument("--steps", type=int, default=5, help="warm steps timed")
    p.add_argument("--warmup", type=int, default=1, help="steps run after the first and before timing")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE", help="config overrides (e.g. bart_train.batch_size=8)")
    p.add_argument("--out", default="bench/results/train_step")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    bad = set(a.stages.split(",")) - set(STAGE_NAMES)
    if bad: p.error(f"--stages: unknown stage(s) {sorted(bad)}; choose from {','.join(STAGE_NAMES)}")
    if a.worker: return worker(a)
    if a.model is None:
        from dalle_nb.modeldir import default_model_dir
        a.model = str(default_model_dir())
    runs = []
    for rnd in range(a.rounds):
        for setting in a.ynn.split(","):
            cmd = [sys.executable, __file__, "--worker", "--model", a.model, "--stages", a.stages, "--steps", str(a.steps),
                   "--warmup", str(a.warmup), *(x for s in a.set for x in ("--set", s))]
            r = subprocess.run(cmd, capture_output=True, text=True, env=child_env(setting))
            if r.returncode != 0: sys.exit(f"bench/train_step.py: the {setting!r} run failed:\n{r.stderr[-3000:]}")
            runs.append({"setting": setting, "round": rnd, **json.loads(r.stdout.strip().splitlines()[-1])})
            for row in runs[-1]["rows"]:
                print(f"round {rnd} {setting:>24} {row['stage']:>8}: {row['ms_per_step']:8.1f} ms/step  {row['gflop_per_s']:6.1f} GFLOP/s", flush=True)
    import jax, jaxlib
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    meta = {"date": date.today().isoformat(), "machine": f"{platform.machine()} {platform.processor()} ({os.cpu_count()} cores)",
            "jax": jax.__version__, "jaxlib": jaxlib.__version__, "model": a.model,
            "command": "python bench/train_step.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    rows = summary(runs)
    (out / "train_step.json").write_text(json.dumps({**meta, "summary": rows, "runs": runs}, indent=1))
    (out / "train_step.md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
