"""Shared pytest setup, before JAX initialises: 8 fake CPU devices for every test process, and fast compiles.

Tests compile with less of XLA's backend optimisation (`--xla_backend_optimization_level=1`, kept in
`DALLE_NB_TEST_XLA_FLAGS`): the test models are tiny, so optimising each program's machine code costs far more than
running it. The programs are the same (XLA's graph passes still run); only the generated code is slower, and speed is
measured by `bench/`, never by tests. Level 0 is faster still but changes float results enough to flip near-tied
argmaxes (docs/experiments/2026-11-25-suite-time.md). `DALLE_NB_TEST_XLA_FLAGS=""` compiles as users do.
Subprocesses that want one device, as a user's shell has, pass `one_device_env()`.

Every process of one test run — both xdist workers, the notebooks and CLI runs they start — shares one persistent
JAX compilation cache, new for each run: many tests compile the same programs (the shipped model's generation
above all), and a cache hit is the same executable. A `dalle-nb` process keeps its programs in `$DALLE_NB_CACHE/jax`,
so the run's cache is that directory of `DALLE_NB_CACHE` (the tests' CLI processes take it from `cli_cache`).
`DALLE_NB_TEST_JAX_CACHE=0` turns it off (each test's CLI processes then share a cache of their own); tests that time
the cache itself (bench/generate.py's second process) make their own.
"""
import os, shutil, tempfile
TEST_XLA_FLAGS = os.environ.setdefault("DALLE_NB_TEST_XLA_FLAGS", "--xla_backend_optimization_level=1")
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {TEST_XLA_FLAGS}".strip())
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_CACHE = None          # made by the process that starts the run (xdist's workers inherit it), removed when the run ends
if (os.environ.get("DALLE_NB_TEST_JAX_CACHE", "1") != "0" and "PYTEST_XDIST_WORKER" not in os.environ
        and "JAX_COMPILATION_CACHE_DIR" not in os.environ):
    _CACHE = tempfile.mkdtemp(prefix="dalle-nb-test-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = os.path.join(_CACHE, "jax")
    os.makedirs(os.environ["JAX_COMPILATION_CACHE_DIR"])
    os.environ["DALLE_NB_CACHE"] = os.environ["DALLE_NB_TEST_CACHE"] = _CACHE   # `dalle-nb` processes, the notebooks' too
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


# The longest tests, longest first (by `pytest --durations`, session 36; docs/experiments/2026-11-25-suite-time.md), and xdist handing
# out tests one at a time as its workers free up (`--maxschedchunk 1`; by default each worker starts with a quarter of
# its share in one consecutive block, which would give one worker every long test): the two workers share the long
# tests out and end together, instead of one idling while the other runs a long notebook at the end.
LONGEST_FIRST = ("test_cli.py::test_train_then_retrain", "test_notebook[15_train]", "test_notebook[15a_stages]",
                 "test_peers.py::test_generate_bench_runs", "test_bench.py::test_gpu_sh_cpu_smoke_and_train",
                 "test_multihost.py::test_the_eight_gpu_layout", "test_notebook[06_bart]", "test_notebook[13b_shampoo]",
                 "test_notebook[08_clip]", "test_notebook[07_sample]", "test_multihost.py::test_two_processes_train_like_one",
                 "test_notebook[20_train_dalle]", "test_bench.py::test_optimizers_runs", "test_notebook[05_vqgan]",
                 "test_notebook[10_pipeline]", "test_notebook[17_dvae]", "test_bench.py::test_paper_techniques_runs",
                 "test_notebook[18_dalle]", "test_pod.py::test_local_pod", "test_notebook[16a_fitcheck]")


def pytest_configure(config):
    if getattr(config.option, "maxschedchunk", "no xdist") is None: config.option.maxschedchunk = 1   # unless given


def pytest_collection_modifyitems(config, items):
    "Start with `LONGEST_FIRST`, in its order; every other test keeps its place after them."
    rank = lambda item: next((i for i, k in enumerate(LONGEST_FIRST) if k in item.nodeid), len(LONGEST_FIRST))
    items.sort(key=rank)


def pytest_unconfigure(config):
    if _CACHE: shutil.rmtree(_CACHE, ignore_errors=True)


def cli_cache(cwd) -> str:
    "`DALLE_NB_CACHE` for a `dalle-nb` process a test starts: the run's shared cache, else (cache off) one in the test's `cwd`."
    return os.environ.get("DALLE_NB_TEST_CACHE") or os.path.join(str(cwd), ".cache")


def one_device_env(devices: int = 1, drop=(), **extra) -> dict:
    "os.environ for a subprocess with `devices` CPU devices (one, as a user's shell has), the test compile flags, `extra` set."
    env = {k: v for k, v in os.environ.items() if k not in drop}
    count = f"--xla_force_host_platform_device_count={devices} " if devices > 1 else ""
    env["XLA_FLAGS"] = (count + os.environ["DALLE_NB_TEST_XLA_FLAGS"]).strip()
    return {**env, **extra}
