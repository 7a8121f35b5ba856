"""The decode loop's layout on this machine: seconds per `generate` call (and its first call, compile included) for
each self-attention cache dtype and number of cache stages, at one width, random weights (nothing is downloaded).

    python bench/decode_layout.py --width mini --images 4 --out bench/results/decode_layout          # ~20 min here

Each configuration runs `--repeats` warm calls after its first; the rows of one caption share its keys/values as
`generate` does for one prompt. The same run reports, per configuration, how many of the tokens equal float32 with
one stage (the plain layout), as a check that the settings compared do the same work.
"""
import argparse, json, statistics, sys, time
from dataclasses import replace
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from generate import bart_config, SETTINGS, peak_rss_gb  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", default="mini"); p.add_argument("--images", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1); p.add_argument("--quantize", default="none")
    p.add_argument("--layouts", default="float32:1,float32:8,bfloat16:1,bfloat16:8,int8:8",
                   help="cache:stages pairs, comma separated")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import jax, numpy as np
    from flax import nnx
    from dalle_nb.bart import DalleBart
    from dalle_nb.layers import serve_all
    from dalle_nb.sample import generate, row_keys
    cfg = replace(bart_config(a.width), scan_layers=False)
    model = serve_all(DalleBart(cfg, rngs=nnx.Rngs(0)), None if a.quantize == "none" else a.quantize)
    text = np.ones((a.images, cfg.max_text_len), np.int32); text[:, 0] = 0; text[:, 1:9] = np.arange(100, 108); text[:, 9] = 2
    blank = np.ones_like(text); blank[:, 0] = 0; blank[:, 1] = 2
    rows, ref = [], None
    for spec in a.layouts.split(","):
        cache, stages = spec.split(":")
        call = lambda: np.asarray(generate(model, text, row_keys(0, a.images), blank_ids=blank, cache=cache, stages=int(stages), **SETTINGS))
        t0 = time.perf_counter(); toks = call(); first = time.perf_counter() - t0
        warm = []
        for _ in range(a.repeats):
            t0 = time.perf_counter(); call(); warm.append(time.perf_counter() - t0)
        ref = toks if ref is None else ref
        rows.append(dict(cache=cache, stages=int(stages), first_s=first, warm_s=statistics.median(warm),
                         ms_per_step=1e3 * statistics.median(warm) / cfg.image_len, same_tokens=float((toks == ref).mean())))
        print(json.dumps(rows[-1]), flush=True)
    res = dict(width=a.width, images=a.images, quantize=a.quantize, rows=rows, peak_rss_gb=peak_rss_gb(), date=str(date.today()),
               runtime=f"jax {jax.__version__} {jax.devices()[0].platform}, {jax.device_count()} device(s)")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        tmp = Path(a.out) / f"layout_{a.width}_{a.quantize}.json.tmp"
        tmp.write_text(json.dumps(res, indent=1)); tmp.replace(tmp.with_suffix(""))


if __name__ == "__main__":
    main()
