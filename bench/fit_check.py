"""Does DALL·E Mega's BART train step fit a TPU v3-256? AOT-compile it for topology v3:8x16 in several configurations.

Each configuration is one `dalle-nb pod fit` call (a subprocess: every compile starts from a clean process), and its
report is merged into bench/results/pod/fit_check.json, which BENCHMARKS.md and nbs/16a_fitcheck.ipynb read. Needs libtpu
(`pip install -e ".[tpu]"`); no TPU. A full Mega compile takes minutes and several GB of RAM: run it niced, alone.

    python bench/fit_check.py                      # every configuration below
    python bench/fit_check.py --only journal fsdp  # some of them
    python bench/fit_check.py --layers 2           # the same with 2+2 layers: what a compile costs
    python bench/fit_check.py --shampoo-no-1d dp=32,mp=8   # Shampoo with 1-D parameters grafted only (row *-shampoo-1d-grafted)
    python bench/fit_check.py --shampoo-state      # Shampoo's state per core from the shardings alone (no compile)
"""
import argparse, json, os, shutil, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "pod" / "fit_check.json"

# name -> extra `dalle-nb pod fit` flags (all: --preset mega --topology v3:8x16, 44 per replica x 3 accumulation steps)
CONFIGS = {
    # DALL·E Mega's recipe: Distributed Shampoo, float32, remat, 8 mp x 32 dp
    "journal": ["--mesh", "dp=32,mp=8"],
    "fsdp": ["--mesh", "fsdp=32,mp=8"],                                             # parameters + optimizer state split 256 ways
    "fsdp-bf16": ["--mesh", "fsdp=32,mp=8", "--dtype", "bfloat16"],
    "fsdp-no-remat": ["--mesh", "fsdp=32,mp=8", "--remat", "none"],
    # issue 24: remat that keeps each sub-layer's output (its model-parallel all-reduce is not repeated), and bfloat16
    # compute (the journal's first 800M samples; "at 800M train/samples, we switched to full precision")
    "journal-remat-outputs": ["--mesh", "dp=32,mp=8", "--remat", "outputs"],
    "journal-bf16": ["--mesh", "dp=32,mp=8", "--dtype", "bfloat16"],
    "journal-bf16-remat-outputs": ["--mesh", "dp=32,mp=8", "--dtype", "bfloat16", "--remat", "outputs"],
    # the same step with Adam (optimizer state: 2 parameter-shaped buffers)
    "journal-adam": ["--mesh", "dp=32,mp=8", "--optimizer", "adam"],
    "journal-adam-no-remat": ["--mesh", "dp=32,mp=8", "--optimizer", "adam", "--remat", "none"],
    "journal-adam-bf16": ["--mesh", "dp=32,mp=8", "--optimizer", "adam", "--dtype", "bfloat16"],
    "journal-adam-bf16-params": ["--mesh", "dp=32,mp=8", "--optimizer", "adam", "--dtype", "bfloat16", "--param-dtype", "bfloat16"],
    "journal-adafactor": ["--mesh", "dp=32,mp=8", "--optimizer", "adafactor"],
    "fsdp-adam": ["--mesh", "fsdp=32,mp=8", "--optimizer", "adam"],
    "journal-adam-no-scan": ["--mesh", "dp=32,mp=8", "--optimizer", "adam", "--no-scan"],
}


def shampoo_variants(cfg):
    "Mega's Shampoo as the preset makes it, and the same with 1-D parameters (norms) grafted only, not preconditioned."
    from dalle_nb.optim import make_optimizer
    from dalle_nb.shampoo import distributed_shampoo
    import optax
    from dalle_nb.optim import lr_schedule
    sc = cfg.bart_train
    no_1d = distributed_shampoo(lr_schedule(sc), sc.shampoo_block, b1=sc.b1, b2=sc.b2, start_preconditioning_step=sc.shampoo_start,
                                preconditioning_compute_steps=sc.shampoo_every, graft=sc.shampoo_graft, nesterov=sc.shampoo_nesterov,
                                moving_average_for_momentum=True, skip_preconditioning_dim_size_gt=sc.shampoo_skip_gt,
                                skip_preconditioning_rank_lt=2)
    return {"Shampoo (preset)": make_optimizer(sc),       # the same wrapping as make_optimizer: clipping, non-finite skip
            "Shampoo, 1-D parameters grafted only": optax.apply_if_finite(optax.chain(optax.clip_by_global_norm(sc.grad_clip), no_1d), 1_000_000)}


def shampoo_state(layouts=("dp=32,mp=8", "fsdp=32,mp=8")):
    "Optimizer-state GiB per core of Mega's Shampoo (and with 1-D parameters not preconditioned), from shardings only: no compile."
    from flax import nnx
    from dalle_nb.config import get_config
    from dalle_nb.bart import DalleBart, bart_loss
    from dalle_nb.train import make_sharded_train_step
    from dalle_nb.fitcheck import topology_devices, layout_mesh, state_bytes
    cfg = get_config("mega")
    model = nnx.eval_shape(lambda: DalleBart(cfg.bart, rngs=nnx.Rngs(0)))
    variants = shampoo_variants(cfg)
    devs = topology_devices("v3:8x16")
    rows = []
    for layout in layouts:
        mesh = layout_mesh(layout, devs)
        for name, tx in variants.items():
            t = make_sharded_train_step(lambda m, b, k: bart_loss(m, b["text"], b["image"]), model, tx, mesh, grad_accum=3)
            sb = state_bytes(t.abstract)
            rows.append({"layout": layout, "optimizer": name, "params_gib": sb["params"] / 2**30, "opt_gib": sb["opt"] / 2**30})
            print(f"{layout:14s} {name:40s} parameters {rows[-1]['params_gib']:6.2f} GiB/core, optimizer state {rows[-1]['opt_gib']:6.2f} GiB/core", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(CONFIGS))
    ap.add_argument("--layers", type=int, default=None, help="encoder and decoder layers (default: Mega's 24)")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--shampoo-no-1d", default=None, metavar="LAYOUT", help="only: compile Mega with Shampoo that does not precondition 1-D parameters")
    ap.add_argument("--shampoo-state", action="store_true", help="only: Shampoo's state per core on both layouts (no compile)")
    a = ap.parse_args()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if a.shampoo_no_1d:                     # in-process: a custom optimizer is not a `dalle-nb pod fit` flag
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        from dalle_nb.config import get_config
        from dalle_nb.fitcheck import fit_check
        cfg = get_config("mega")
        layout = a.shampoo_no_1d
        t0 = time.time()
        rep = fit_check(cfg, "v3:8x16", layout, per_replica=44, accum=3, layers=a.layers, tx=shampoo_variants(cfg)["Shampoo, 1-D parameters grafted only"])
        print(rep.table(), flush=True)
        results = {r["name"]: r for r in json.loads(out.read_text())} if out.exists() else {}
        name = f"{'fsdp' if 'fsdp' in layout else 'journal'}-shampoo-1d-grafted"
        results[name] = {**rep.to_json(), "name": name, "flags": ["(in-process) Shampoo with skip_preconditioning_rank_lt=2", "--mesh", layout],
                         "wall_seconds": round(time.time() - t0, 1), "date": time.strftime("%Y-%m-%d"),
                         "command": f"python bench/fit_check.py --shampoo-no-1d {layout}"}
        out.write_text(json.dumps(list(results.values()), indent=1))
        return
    if a.shampoo_state:
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        rows = shampoo_state()
        (out.parent / "shampoo_state.json").write_text(json.dumps(rows, indent=1))
        return
    exe = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))
    results = {r["name"]: r for r in json.loads(out.read_text())} if out.exists() else {}
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    for name in a.only or list(CONFIGS):
        tmp = out.parent / f".{name}.json"
        cmd = [exe, "pod", "fit", "--preset", "mega", "--topology", "v3:8x16", "--per-replica", "44", "--accum", "3",
               *CONFIGS[name], *(["--layers", str(a.layers)] if a.layers else []), "--json", str(tmp)]
        print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
        t0 = time.time()
        r = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=a.timeout)
        print("\n".join(l for l in r.stdout.splitlines()), flush=True)
        if not tmp.exists():
            print(f"   failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:] }", flush=True)
            continue
        rep = json.loads(tmp.read_text()); tmp.unlink()
        rep.update(name=f"{name}{f'-{a.layers}layers' if a.layers else ''}", flags=CONFIGS[name], wall_seconds=round(time.time() - t0, 1),
                   date=time.strftime("%Y-%m-%d"), command=" ".join(["dalle-nb", *cmd[1:-2]]))
        results[rep["name"]] = rep
        out.write_text(json.dumps(list(results.values()), indent=1))


if __name__ == "__main__":
    main()
