"""The BART train step `dalle-nb train` runs, on the first device: ms/step, samples/s, model FLOPs, MFU, peak memory.

Builds what `dalle-nb train --data SHARDS` trains — the stage table's model, loss and optimiser (`dalle_nb.recipe.STAGES
["bart"]`, `make_optimizer`, `make_sharded_train_step`) at a preset's widths (`mega`: 24 + 24 layers, d 2048, 32 heads,
GLU 4096; `mini`: 12 + 12, d 1024) — on random tokens, and times `--steps` warm steps after a compile. Each
configuration (batch × remat × compute dtype × weights dtype × weights copy) runs in a process of its own, so one
that runs out of memory is reported and the others still run.

Model FLOPs per sample are counted as `CONVENTION` below says (causal attention: as full, uncausal score matrices).
The matmul peak is measured in the same process (a square `--peak-size`³ matmul in the compute dtype, best of 10),
and MFU = model FLOPs per second / that peak. XLA's own count of the compiled step (remat's recompute included) is
reported beside it (`hlo_flops`). Peak memory: the device's `peak_bytes_in_use` (GPUs), else the process's peak RSS.

    python bench/train.py --preset mega --batch 16,32 --remat full,outputs [--dtype bfloat16] [--param-dtype float32]
                          [--steps 8] [--warmup 2] [--set SECTION.FIELD=VALUE ...] [--out bench/results/train]
    python bench/train.py --smoke --out /tmp/train    # CPU, a micro width: the smoke test (tests/test_bench.py)
"""
import argparse, itertools, json, os, platform, resource, statistics, subprocess, sys, tempfile, time
from datetime import date
from pathlib import Path

CONVENTION = """Model FLOPs per sample = 3 x the forward pass's matmul FLOPs (forward + the two matmuls of the backward
pass; recomputation by remat is not counted), where the forward pass counts every projection as 2 x rows x in x out
(encoder rows: the caption's max_text_len; decoder rows: image_len), attention scores and their weighted sum each as
2 x queries x keys x d_model with the full, uncausal score matrix (causal self-attention counted as if every query saw
every key), and the LM head as 2 x image_len x d_model x image_vocab."""


def model_flops(bart) -> dict:
    "Matmul FLOPs of one sample's forward pass by part (`CONVENTION`), and 3× their sum: a train step's per sample."
    d, g, S, T = bart.d_model, bart.glu_dim, bart.max_text_len, bart.image_len
    glu = lambda rows: 2 * rows * d * g * 3                          # fc0, fc1 (d -> g), fc2 (g -> d)
    attn = lambda q, k: 2 * q * d * d * 2 + 2 * k * d * d * 2 + 2 * 2 * q * k * d   # q, out; k, v; scores, sum
    enc = bart.encoder_layers * (attn(S, S) + glu(S))
    dec = bart.decoder_layers * (attn(T, T) + attn(T, S) + glu(T))
    head = 2 * T * d * bart.image_vocab
    return {"encoder": enc, "decoder": dec, "lm_head": head, "train_per_sample": 3 * (enc + dec + head)}


def matmul_peak(dtype: str, n: int) -> float:
    "FLOP/s of the best of 10 square `n`³ matmuls in `dtype` on the first device (measured, not the datasheet's)."
    import jax, jax.numpy as jnp
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(mm(a, a))
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter(); jax.block_until_ready(mm(a, a)); best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def peak_memory_bytes() -> tuple[int, str]:
    "The first device's peak bytes in use (GPUs, TPUs), else this process's peak resident set."
    import jax
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats: return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS"


def build(preset: str, sets: list, workdir: str, compute_dtype=None):
    "`(config, model, TrainStep)` of the BART stage as `dalle-nb train --data` builds it, on the first device."
    import jax
    from dalle_nb.config import get_config
    from dalle_nb.optim import make_optimizer
    from dalle_nb.recipe import STAGES
    from dalle_nb.stages import StageRun
    from dalle_nb.train import make_sharded_train_step
    cfg = get_config(preset, sets + ["bart_train.mesh=dp=1"])
    run = StageRun("bart", cfg, Path(workdir), shards=("random tokens",), progress=False)   # the loss of `--data`
    stage = STAGES["bart"]
    model = stage.build(run)
    tx = stage.optimizer(run, make_optimizer(run.sc))
    return cfg, model, make_sharded_train_step(stage.loss(run), model, tx, run.mesh, grad_accum=run.sc.grad_accum,
                                               compute_dtype=compute_dtype)


def random_batch(bart, rows: int, seed: int = 0) -> dict:
    import numpy as np
    r = np.random.default_rng(seed)
    return {"text": r.integers(0, bart.text_vocab, (rows, bart.max_text_len), dtype=np.int32),
            "image": r.integers(0, bart.image_codes, (rows, bart.image_len), dtype=np.int32)}


def one(c: dict) -> dict:
    "Measure one configuration (in this process): compile, warm steps, FLOPs, peak, memory."
    import jax
    from dalle_nb.hlo import hlo_profile
    sets = c["set"] + [f"bart.remat={c['remat']}", f"bart.dtype={c['dtype']}", f"bart.param_dtype={c['param_dtype']}",
                       f"bart_train.batch_size={c['batch']}", "bart_train.grad_accum=1"]
    with tempfile.TemporaryDirectory() as work:
        cfg, model, train = build(c["preset"], sets, work, None if c["weights_copy"] == "none" else c["weights_copy"])
        state, batch = train.init(model), train.batch(random_batch(cfg.bart, c["batch"]), c["batch"])
        del model
        t0 = time.perf_counter()
        compiled = train.step.lower(state, batch, jax.random.key(0)).compile()
        compile_s = time.perf_counter() - t0
        hlo = sum(hlo_profile(compiled.as_text())["flops"].values())
        times, losses = [], []
        for i in range(c["warmup"] + c["steps"]):
            t0 = time.perf_counter()
            state, metrics = compiled(state, batch, jax.random.key(i))
            losses.append(float(jax.block_until_ready(metrics)["loss"]))
            times.append(time.perf_counter() - t0)
    peak, peak_kind = peak_memory_bytes()
    flops = model_flops(cfg.bart)
    step_s = statistics.median(times[c["warmup"]:])
    matmul = matmul_peak(c["dtype"], c["peak_size"])
    model_rate = flops["train_per_sample"] * c["batch"] / step_s
    return {**c, "params": sum(x.size for x in jax.tree.leaves(state.params)), "compile_s": compile_s,
            "ms_per_step": 1e3 * step_s, "step_ms_all": [1e3 * t for t in times], "samples_per_s": c["batch"] / step_s,
            "model_flops_per_step": flops["train_per_sample"] * c["batch"], "model_flops_by_part": flops,
            "hlo_flops_per_step": hlo, "matmul_peak_flops": matmul, "mfu": model_rate / matmul,
            "peak_bytes": peak, "peak_kind": peak_kind, "losses": losses,
            "device": f"{jax.devices()[0].platform} ({jax.devices()[0].device_kind})", "jax": jax.__version__}


def child(c: dict, timeout: int) -> dict:
    "`one(c)` in a process of its own; a failure (out of memory, a timeout) is reported as the row's `error`."
    try:
        r = subprocess.run([sys.executable, __file__, "--one", json.dumps(c)], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired: return {**c, "error": f"timed out after {timeout} s"}
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode == 0 and lines: return json.loads(lines[-1])
    tail = [l for l in r.stderr.strip().splitlines() if l.strip()][-1:] or ["no output"]
    return {**c, "error": f"exit {r.returncode}: {tail[0][:300]}"}


def table(rows: list) -> str:
    out = ["| preset | batch | remat | compute | weights (copy) | ms/step | samples/s | model TFLOP/step "
           "| matmul peak TFLOP/s | MFU | peak memory | compile |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = (f"| {r['preset']} | {r['batch']} | {r['remat']} | {r['dtype']} | {r['param_dtype']} "
                f"({r['weights_copy']}) ")
        if "error" in r: out.append(head + f"| {r['error'][:120]} | | | | | | |"); continue
        out.append(head + f"| {r['ms_per_step']:.1f} | {r['samples_per_s']:.2f} | "
                   f"{r['model_flops_per_step'] / 1e12:.3f} | {r['matmul_peak_flops'] / 1e12:.1f} | "
                   f"{100 * r['mfu']:.1f}% | {r['peak_bytes'] / 2**30:.2f} GiB | {r['compile_s']:.1f} s |")
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="mega", help="mega, mini, … (the BART's widths and the stage's optimiser)")
    p.add_argument("--batch", default="16", help="comma-separated batch sizes (one device, no accumulation)")
    p.add_argument("--remat", default="full", help="comma-separated remat policies (dalle_nb.model_configs.REMATS)")
    p.add_argument("--dtype", default="bfloat16", help="comma-separated compute dtypes")
    p.add_argument("--param-dtype", default="float32",
                   help="comma-separated parameter dtypes (the optimiser's master copies)")
    p.add_argument("--weights-copy", default="none",
                   help="comma-separated: none (each layer casts its weights as it uses them), bfloat16 (the passes "
                        "read one bfloat16 copy made per step: make_sharded_train_step(compute_dtype=))")
    p.add_argument("--steps", type=int, default=8); p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--peak-size", type=int, default=8192, help="the square matmul measured for the peak")
    p.add_argument("--set", action="append", default=[], help="SECTION.FIELD=VALUE (the config's overrides)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per configuration")
    p.add_argument("--smoke", action="store_true", help="CPU, a micro width, 2 steps: the smoke test")
    p.add_argument("--out", default="bench/results/train")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one: print(json.dumps(one(json.loads(a.one)))); return
    if a.smoke:
        from dalle_nb.config import MICRO_SIZES
        a.preset, a.batch, a.dtype, a.steps, a.warmup, a.peak_size = "tiny", "2", "float32", 2, 1, 256
        a.set = list(MICRO_SIZES) + a.set
    grid = itertools.product(a.batch.split(","), a.remat.split(","), a.dtype.split(","), a.param_dtype.split(","),
                             a.weights_copy.split(","))
    rows = []
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    for b, remat, dtype, pdt, copy in grid:
        c = dict(preset=a.preset, batch=int(b), remat=remat, dtype=dtype, param_dtype=pdt, weights_copy=copy,
                 steps=a.steps, warmup=a.warmup, peak_size=a.peak_size, set=a.set)
        rows.append(child(c, a.timeout))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        (out / "train.partial.json").write_text(json.dumps(rows, indent=1))
    result = {"date": str(date.today()), "machine": platform.node(), "command": " ".join(sys.argv), "rows": rows,
              "flops_convention": CONVENTION}
    tmp = out / "train.json.tmp"; tmp.write_text(json.dumps(result, indent=1)); os.replace(tmp, out / "train.json")
    (out / "train.partial.json").unlink()
    print(table(rows))


if __name__ == "__main__":
    main()
