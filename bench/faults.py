"""The fault table of docs/faults.md: every attempt tests/test_faults.py makes, counted by kind and outcome.

Runs `pytest tests/test_faults.py` with DALLE_NB_FAULT_LOG set (each attempt appends `[kind, outcome]`), then writes
`faults.json` (counts, pytest's summary line, machine, date) and `faults.md` (the table) into `--out`.

    python bench/faults.py [--out bench/results/faults] [--examples 60]

`--examples` is hypothesis's examples per property test (the suite runs 60; more finds rarer inputs).
It also times what the manifest costs a load: the shipped model loaded with its check remembered and checked in
full, and SHA-256's speed on this machine (what the first load of a larger directory pays per GB, once).
"""
import argparse, collections, json, os, platform, subprocess, sys, tempfile, time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def load_times(repeats: int = 5) -> dict:
    "Seconds to load the shipped model: check remembered vs full (manifest + finiteness), and SHA-256 in MB/s."
    import statistics
    import hashlib
    from dalle_nb.modeldir import load_models
    load_models()                                                          # warm: imports, the remembered check
    def t(f, k=repeats):
        times = []
        for _ in range(k): t0 = time.perf_counter(); f(); times.append(time.perf_counter() - t0)
        return statistics.median(times)
    remembered = t(load_models)
    def full():
        os.environ["DALLE_NB_CACHE"] = tempfile.mkdtemp(); load_models()   # a new package cache: hashed and scanned again
    before = os.environ.get("DALLE_NB_CACHE")
    checked = t(full)
    if before is None: os.environ.pop("DALLE_NB_CACHE", None)
    else: os.environ["DALLE_NB_CACHE"] = before
    big = Path(tempfile.mkdtemp()) / "blob"; big.write_bytes(os.urandom(256 * 2**20))
    def sha256():
        with open(big, "rb") as f: hashlib.file_digest(f, "sha256")
    sha = t(sha256, 3); big.unlink()
    return dict(load_remembered_s=round(remembered, 3), load_checked_s=round(checked, 3),
                sha256_MB_per_s=round(256 * 1.048576 / sha))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "faults"))
    p.add_argument("--examples", type=int, default=60)
    a = p.parse_args(argv)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    log = Path(tempfile.mkdtemp()) / "attempts.jsonl"
    env = {**os.environ, "DALLE_NB_FAULT_LOG": str(log), "DALLE_NB_FAULT_EXAMPLES": str(a.examples)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_faults.py"), "-q", "-p",
                        "no:cacheprovider"], capture_output=True, text=True, cwd=ROOT, env=env)
    summary = [l for l in r.stdout.splitlines() if " passed" in l or " failed" in l or " skipped" in l][-1:]
    counts = collections.Counter(tuple(json.loads(l)) for l in log.read_text().splitlines()) if log.exists() else {}
    rows = sorted(counts.items())
    os.environ.setdefault("DALLE_NB_CACHE", tempfile.mkdtemp())          # its own record of verified directories
    times = load_times()
    res = dict(date=str(date.today()), load=times,
               machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
               command="python bench/faults.py " + " ".join(argv or sys.argv[1:]),
               seconds=round(time.perf_counter() - t0), pytest=summary[0] if summary else r.stdout[-500:],
               attempts=[dict(kind=k, outcome=o, count=n) for (k, o), n in rows])
    (out / "faults.json").write_text(json.dumps(res, indent=1))
    table = ["| kind | outcome | attempts |", "|---|---|---|"] + [f"| {k} | {o} | {n} |" for (k, o), n in rows]
    tail = f"\n\n{res['pytest']} ({res['seconds']} s, {res['machine']}, {res['date']})\n"
    (out / "faults.md").write_text("\n".join(table) + tail)
    print("\n".join(table)); print(res["pytest"]); print(times)
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
