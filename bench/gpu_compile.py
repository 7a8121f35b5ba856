"""What `dalle-nb gpu fit` / `gpu train` say for DALL·E Mega on each shipped card, compiled on this machine (no GPU).

Each configuration compiles in a process of its own (`python -m dalle_nb.cli gpu ... --json`), one at a time, and its
report is added to one JSON file (`--out`, kept between calls); a configuration that fails is recorded with its
error. Needs JAX's CUDA plugin (`pip install -e ".[gpu]"`). A Mega sampling compile takes about a minute and 1.5 GB
here; a Mega train step several minutes and several GB.

    python bench/gpu_compile.py sample --gpus h100,a100-40gb,a100-80gb,l4,t4,rtx4090,rtx3060 --images 9
    python bench/gpu_compile.py train --gpus h100 --devices 8 --mesh fsdp=8 --optimizer shampoo --per-replica 8 \\
                                      --accum 3
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("program", choices=("sample", "train"))
    p.add_argument("--gpus", default="h100"); p.add_argument("--preset", default="mega")
    p.add_argument("--images", default="9", help="sample: comma-separated image counts")
    p.add_argument("--quantize", default="bfloat16", help="sample: comma-separated weight forms (none, bfloat16, int8)")
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
    if a.program == "sample":
        runs = [["fit", "--gpu", g, "--preset", a.preset, "--images", n, "--quantize", q, *sets]
                for g, n, q in itertools.product(a.gpus.split(","), a.images.split(","), a.quantize.split(","))]
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
