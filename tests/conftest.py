"""Shared pytest setup, before JAX initialises: 8 fake CPU devices for every test process, and fast compiles.

Tests compile with less of XLA's backend optimisation (`--xla_backend_optimization_level=1`, kept in
`DALLE_NB_TEST_XLA_FLAGS`): the test models are tiny, so optimising each program's machine code costs far more than
running it. The programs are the same (XLA's graph passes still run); only the generated code is slower, and speed is
measured by `bench/`, never by tests. Level 0 is faster still but changes float results enough to flip near-tied
argmaxes (docs/experiments/2026-11-25-suite-time.md). `DALLE_NB_TEST_XLA_FLAGS=""` compiles as users do.
Subprocesses that want one device, as a user's shell has, pass `one_device_env()`.
"""
import os
TEST_XLA_FLAGS = os.environ.setdefault("DALLE_NB_TEST_XLA_FLAGS", "--xla_backend_optimization_level=1")
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {TEST_XLA_FLAGS}".strip())
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def one_device_env(devices: int = 1, drop=(), **extra) -> dict:
    "os.environ for a subprocess with `devices` CPU devices (one, as a user's shell has), the test compile flags, `extra` set."
    env = {k: v for k, v in os.environ.items() if k not in drop}
    count = f"--xla_force_host_platform_device_count={devices} " if devices > 1 else ""
    env["XLA_FLAGS"] = (count + os.environ["DALLE_NB_TEST_XLA_FLAGS"]).strip()
    return {**env, **extra}
