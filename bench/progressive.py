"""Does watching cost anything? Generation with and without partial pictures (`every=K`) on a model directory.

`Pipeline.__call__` without `every` runs each batch as one compiled program; with `every=K` it draws K tokens per
compiled call and decodes the partial batch after each (what `dalle-nb generate --progressive K` and the widget do).
This times both, warm (compilation paid by a first call, reported separately), as the median of `--repeats` runs,
and checks that the tokens are identical. `--plain-only` times only the one-program path, with the API that existed
before streaming, so the same script measures an older checkout (`PYTHONPATH=/path/to/old/checkout`).

    python bench/progressive.py --out bench/results/progressive                       # the shipped model
    PYTHONPATH=/tmp/old python bench/progressive.py --plain-only --out /tmp/old_prog   # an older checkout
"""
import argparse, json, platform, statistics, time
from datetime import date
from pathlib import Path

import numpy as np


def timed(fn, repeats: int):
    "`(first call's seconds, median of `repeats` further calls, last result)`."
    t0 = time.perf_counter(); r = fn(); first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter(); r = fn(); times.append(time.perf_counter() - t0)
    return first, statistics.median(times), r


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    p.add_argument("--prompt", default="a red circle above a blue square")
    p.add_argument("--n", type=int, default=16, help="images per call (default 16: one batch)")
    p.add_argument("--every", default="8,32", help="comma-separated K values to time with partial pictures")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--plain-only", action="store_true", help="only the one-program path (works on checkouts without streaming)")
    p.add_argument("--out", default=None, help="write progressive.json here")
    a = p.parse_args(argv)
    import jax
    import dalle_nb
    from dalle_nb.pipeline import Pipeline
    pipe = Pipeline(a.model)
    call = dict(n=a.n, rerank=0, seed=0)
    first, warm, plain = timed(lambda: pipe(a.prompt, **call), a.repeats)
    rows = [dict(every=None, first_s=round(first, 3), warm_s=round(warm, 4), images_per_s=round(a.n / warm, 2), same_tokens=True)]
    if not a.plain_only:
        for k in [int(x) for x in a.every.split(",") if x]:
            frames = []
            first, warm, r = timed(lambda: pipe(a.prompt, **call, every=k, callback=lambda s, res: frames.append(s.t)), a.repeats)
            rows.append(dict(every=k, first_s=round(first, 3), warm_s=round(warm, 4), images_per_s=round(a.n / warm, 2),
                             same_tokens=bool((r.tokens == plain.tokens).all()), frames_per_call=len(frames) // (a.repeats + 1)))
    print(f"| every | first call (s) | warm call (s) | images/s | frames | same tokens |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['every'] or 'off (one program)'} | {r['first_s']} | {r['warm_s']} | {r['images_per_s']} | {r.get('frames_per_call', 1)} | {r['same_tokens']} |")
    res = dict(model=str(pipe.models.path), prompt=a.prompt, n=a.n, repeats=a.repeats, rows=rows, version=dalle_nb.__version__,
               machine=f"{platform.machine()} {jax.devices()[0].platform} × {jax.device_count()}, {platform.python_version()}, jax {jax.__version__}",
               date=str(date.today()))
    if a.out:
        out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
        (out / "progressive.json").write_text(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
