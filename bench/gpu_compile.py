"""What `dalle-nb gpu fit` / `gpu train` say for DALL·E Mega on each shipped card, compiled on this machine (no GPU).

Each configuration compiles in a process of its own (`python -m dalle_nb.cli gpu ... --json`), one at a time, and its
report is added to one JSON file (`--out`, kept between calls); a configuration that fails is recorded with its
error. Needs JAX's CUDA plugin (`pip install -e ".[gpu]"`). A Mega sampling compile takes about a minute and 1.5 GB
here; a Mega train step several minutes and several GB.

    python bench/gpu_compile.py sample --gpus h100,a100-40gb,a100-80gb,l4,t4,rtx4090,rtx3060 --images 9
    python bench/gpu_compile.py sample --gpus h100 --images 9,64 --quantize int8 --cache int8
    python bench/gpu_compile.py train --gpus h100 --devices 8 --mesh fsdp=8 --optimizer shampoo --per-replica 8 \\
                                      --accum 3
    python bench/gpu_compile.py state --gpus h100 --devices 8 --mesh "dp=8;fsdp=8;mp=8" --optimizer adam,shampoo
    ... [--preset mega] [--set SECTION.FIELD=VALUE ...] [--out bench/results/gpu_compile/NAME.json]
"""
import argparse, itertools, json, os, subprocess, sys, tempfile, time
from datetime import date
from pathlib import Path


def compile_one(argv: list, timeout: int) -> dict:
    "`dalle-nb gpu ARGV --json` in a process of its own: its report, or `{'error'}`."
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "r.json"
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1"}
        t0 = time.perf_counter()
        cmd = [sys.executable, "-c", "import sys; from dalle_nb.cli import main; sys.exit(main(sys.argv[1:]))"]
        try: r = subprocess.run([*cmd, "gpu", *argv, "--json", str(out)], capture_output=True, text=True,
                                timeout=timeout, env=env)
        except subprocess.TimeoutExpired: return {"argv": argv, "error": f"timed out after {timeout} s"}
        if not out.exists():
            tail = [l for l in r.stderr.strip().splitlines() if l.strip()][-1:] or ["no output"]
            return {"argv": argv, "error": f"exit {r.returncode}: {tail[0][:400]}"}
        return {"argv": argv, "wall_s": time.perf_counter() - t0, "exit": r.returncode, "table": r.stdout,
                **json.loads(out.read_text())}


def state_rows(gpu: str, devices: int, layouts: list, optimizers: list, preset: str, sets: list) -> list:
    "Parameters and optimizer state per device of each layout × optimiser on `devices` of the card: shardings, no compile."
    import dataclasses
    from flax import nnx
    from dalle_nb.bart import DalleBart, bart_loss
    from dalle_nb.config import get_config
    from dalle_nb.fitcheck import layout_mesh, state_bytes
    from dalle_nb.gpu import gpu_devices
    from dalle_nb.optim import make_optimizer
    from dalle_nb.train import make_sharded_train_step
    cfg = get_config(preset, sets)
    model = nnx.eval_shape(lambda: DalleBart(cfg.bart, rngs=nnx.Rngs(0)))
    devs, rows = gpu_devices(gpu, devices), []
    for layout, opt in ((l, o) for l in layouts for o in optimizers):
        tx = make_optimizer(dataclasses.replace(cfg.bart_train, optimizer=opt))
        t = make_sharded_train_step(lambda m, b, k: bart_loss(m, b["text"], b["image"]), model, tx, layout_mesh(layout, devs))
        sb = state_bytes(t.abstract)
        rows.append({"gpu": gpu, "devices": devices, "layout": layout, "optimizer": opt, "params_bytes": sb["params"],
                     "opt_bytes": sb["opt"]})
        print(f"{devices} x {gpu} {layout:8s} {opt:8s} parameters {sb['params'] / 2**30:6.2f} GiB/device, "
              f"optimizer state {sb['opt'] / 2**30:6.2f} GiB/device", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("program", choices=("sample", "train", "state"), help="state: train-state bytes per device, no compile")
    p.add_argument("--gpus", default="h100"); p.add_argument("--preset", default="mega")
    p.add_argument("--images", default="9", help="sample: comma-separated image counts")
    p.add_argument("--quantize", default="bfloat16", help="sample: comma-separated weight forms (none, bfloat16, float16, int8)")
    p.add_argument("--cache", default="", help="sample: comma-separated decode cache dtypes (float32, bfloat16, float16, int8; default the card's)")
    p.add_argument("--devices", default="1", help="train: comma-separated device counts (one host)")
    p.add_argument("--mesh", default="dp=-1", help="train: layouts, separated by ';'")
    p.add_argument("--per-replica", default="16", help="train: comma-separated batch per replica")
    p.add_argument("--accum", default="1", help="train: comma-separated accumulation steps")
    p.add_argument("--optimizer", default="adam", help="train: comma-separated optimisers (adam, shampoo, …)")
    p.add_argument("--remat", default="full", help="train: comma-separated remat policies")
    p.add_argument("--dtype", default="bfloat16", help="train: compute dtype")
    p.add_argument("--param-dtype", default="float32")
    p.add_argument("--set", action="append", default=[]); p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--out", default="bench/results/gpu_compile/results.json")
    a = p.parse_args(argv)
    sets = [x for s in a.set for x in ("--set", s)]
    if a.program == "state":
        rows = [r for g in a.gpus.split(",") for d in a.devices.split(",")
                for r in state_rows(g, int(d), a.mesh.split(";"), a.optimizer.split(","), a.preset, a.set)]
        out = Path(a.out); out.parent.mkdir(parents=True, exist_ok=True)
        res = {"date": str(date.today()), "command": " ".join(sys.argv), "rows": rows}
        tmp = out.with_name(out.name + ".tmp"); tmp.write_text(json.dumps(res, indent=1)); os.replace(tmp, out)
        return
    if a.program == "sample":
        runs = [["fit", "--gpu", g, "--preset", a.preset, "--images", n, "--quantize", q, *(["--cache", c] if c else []), *sets]
                for g, n, q, c in itertools.product(a.gpus.split(","), a.images.split(","), a.quantize.split(","),
                                                    a.cache.split(","))]
    else:
        runs = [["train", "--gpu", g, "--preset", a.preset, "--devices", d, "--mesh", m, "--per-replica", b,
                 "--accum", k,
                 "--optimizer", o, "--remat", r, "--dtype", a.dtype, "--param-dtype", a.param_dtype, *sets]
                for g, d, m, b, k, o, r in itertools.product(a.gpus.split(","), a.devices.split(","), a.mesh.split(";"),
                                                              a.per_replica.split(","), a.accum.split(","),
                                                              a.optimizer.split(","), a.remat.split(","))]
    out = Path(a.out); out.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(out.read_text())["rows"] if out.exists() else []
    for run in runs:
        rows.append(compile_one(run, a.timeout))
        print(rows[-1].get("table") or f"{' '.join(run)}: {rows[-1]['error']}", flush=True)
        res = {"date": str(date.today()), "machine": f"{os.cpu_count()} CPUs, no GPU", "command": " ".join(sys.argv),
               "rows": rows}
        tmp = out.with_name(out.name + ".tmp"); tmp.write_text(json.dumps(res, indent=1)); os.replace(tmp, out)


if __name__ == "__main__":
    main()
