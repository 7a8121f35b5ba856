"""`kill -9` at any moment — between steps, while a checkpoint's files are being written, after they are written but
before the checkpoint is committed — and a resumed run reproduces the uninterrupted run's losses bit for bit.

The run is `dalle_nb.train.fit` on a small two-layer model with logically named axes, data-parallel over 2 CPU
devices (so every checkpoint holds sharded arrays), Adam, a checkpoint every 3 steps. Each run is a subprocess:
this file is also the child (`python tests/test_preemption.py WORKDIR MODE OUT`).
"""
import json, os, signal, subprocess, sys, threading, time
from pathlib import Path
from conftest import one_device_env

HERE = Path(__file__).resolve()
STEPS, CKPT_EVERY = 12, 3


def child(workdir: str, mode: str, out: str):
    import numpy as np
    import jax, jax.numpy as jnp
    from flax import nnx
    from dalle_nb.config import StageConfig
    from dalle_nb.layers import Linear
    from dalle_nb.data import Batches
    from dalle_nb.optim import make_optimizer
    from dalle_nb.sharding import mesh_from_spec
    from dalle_nb.train import fit

    kind, _, at = mode.partition(":")
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)
    ckpt = Path(workdir) / "ckpt"
    if kind == "commit":          # all of checkpoint `at` is written; killed just before orbax renames it into place
        from orbax.checkpoint._src.path import async_path
        rename = async_path.rename
        async def killing_rename(src, dst, *a, **k):
            if Path(dst).name == at: die()
            return await rename(src, dst, *a, **k)
        async_path.rename = killing_rename
    if kind == "writing":         # killed as soon as checkpoint `at`'s temporary directory appears: files half written
        def watch():
            while True:
                if ckpt.exists() and any(p.name.startswith(f"{at}.") and "tmp" in p.name for p in ckpt.iterdir()): die()
                time.sleep(0.0005)
        threading.Thread(target=watch, daemon=True).start()
    hooks = [lambda s, m, b: die() if s == int(at) else None] if kind == "step" else []

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.a = Linear(8, 32, axes=("embed", "mlp"), use_bias=True, std=0.3, rngs=rngs)
            self.b = Linear(32, 4, axes=("mlp", "embed"), std=0.3, rngs=rngs)
        def __call__(self, x): return self.b(jnp.tanh(self.a(x)))
    def loss_fn(m, batch, key):
        noise = 0.01 * jax.random.normal(key, batch["y"].shape)         # uses the step's key: the RNG must resume too
        loss = jnp.mean((m(batch["x"]) - batch["y"] - noise) ** 2)
        return loss, {"loss": loss}
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype(np.float32)
    data = {"x": x, "y": np.sin(x @ rng.normal(size=(8, 4))).astype(np.float32)}
    cfg = StageConfig(steps=STEPS, batch_size=16, lr=3e-2, warmup_steps=2, log_every=2, eval_every=10**6,
                      ckpt_every=CKPT_EVERY, mesh="dp=2", optimizer="adam")
    history = fit(MLP(nnx.Rngs(0)), make_optimizer(cfg), loss_fn, Batches.on_mesh(data, 16, mesh_from_spec(cfg.mesh), seed=0),
                  cfg, workdir=workdir, progress=False, hooks=hooks)
    Path(out).write_text(json.dumps(history))


def run(workdir, mode, out):
    env = {**one_device_env(2), "JAX_PLATFORMS": "cpu",
           "JAX_COMPILATION_CACHE_DIR": str(Path(workdir).parent / "jax-cache"),     # compile once for all the runs
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    return subprocess.run([sys.executable, str(HERE), str(workdir), mode, str(out)], capture_output=True, text=True,
                          timeout=600, env=env)


def test_resume_after_kill_9_reproduces_the_losses(tmp_path):
    ref = run(tmp_path / "ref", "none", tmp_path / "ref.json")
    assert ref.returncode == 0, ref.stderr
    want = json.loads((tmp_path / "ref.json").read_text())
    assert len(want) == STEPS // 2

    work, out = tmp_path / "work", tmp_path / "out.json"
    for mode in ("step:5", "writing:6", "commit:9"):      # between steps; while writing; written but not committed
        r = run(work, mode, out)
        assert r.returncode == -signal.SIGKILL, (mode, r.returncode, r.stderr[-3000:])
        assert not out.exists()
    steps = sorted(int(p.name) for p in (work / "ckpt").iterdir() if p.name.isdigit())
    assert steps == [3, 6], steps                     # writing:6 lost 6, then commit:9 saved 6 (resumed from 3) but lost 9
    r = run(work, "none", out)
    assert r.returncode == 0, r.stderr
    got = json.loads(out.read_text())
    assert [row["step"] for row in got] == [row["step"] for row in want]
    for a, b in zip(got, want):                       # exactly the same numbers, not merely close
        assert {k: v for k, v in a.items() if k != "seconds"} == {k: v for k, v in b.items() if k != "seconds"}
    assert not [p for p in (work / "ckpt").iterdir() if "tmp" in p.name]   # half-written checkpoints were cleaned up


if __name__ == "__main__":
    child(*sys.argv[1:4])
