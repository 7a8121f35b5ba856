"""The fault table of docs/faults.md: every attempt tests/test_faults.py makes, counted by kind and outcome.

Runs `pytest tests/test_faults.py` with DALLE_NB_FAULT_LOG set (each attempt appends `[kind, outcome]`), then writes
`faults.json` (counts, pytest's summary line, machine, date) and `faults.md` (the table) into `--out`.

    python bench/faults.py [--out bench/results/faults] [--examples 60]

`--examples` is hypothesis's examples per property test (the suite runs 60; more finds rarer inputs).
"""
import argparse, collections, json, os, platform, subprocess, sys, tempfile, time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "faults"))
    p.add_argument("--examples", type=int, default=60)
    a = p.parse_args(argv)
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    log = Path(tempfile.mkdtemp()) / "attempts.jsonl"
    env = {**os.environ, "DALLE_NB_FAULT_LOG": str(log), "DALLE_NB_FAULT_EXAMPLES": str(a.examples)}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_faults.py"), "-q", "-p", "no:cacheprovider"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
    summary = [l for l in r.stdout.splitlines() if " passed" in l or " failed" in l or " skipped" in l][-1:]
    counts = collections.Counter(tuple(json.loads(l)) for l in log.read_text().splitlines()) if log.exists() else {}
    rows = sorted(counts.items())
    res = dict(date=str(date.today()), machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}",
               command="python bench/faults.py " + " ".join(argv or sys.argv[1:]), seconds=round(time.perf_counter() - t0),
               pytest=summary[0] if summary else r.stdout[-500:], attempts=[dict(kind=k, outcome=o, count=n) for (k, o), n in rows])
    (out / "faults.json").write_text(json.dumps(res, indent=1))
    table = ["| kind | outcome | attempts |", "|---|---|---|"] + [f"| {k} | {o} | {n} |" for (k, o), n in rows]
    (out / "faults.md").write_text("\n".join(table) + f"\n\n{res['pytest']} ({res['seconds']} s, {res['machine']}, {res['date']})\n")
    print("\n".join(table)); print(res["pytest"])
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
