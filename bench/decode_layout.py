"""The decode loop's layout on this machine: seconds per `generate` call (and its first call, compile included) for
each self-attention cache dtype and number of cache stages, at one width, random weights (nothing is downloaded).

    python bench/decode_layout.py --width mini --images 4 --out bench/results/decode_layout          # ~20 min here
    python bench/decode_layout.py --width mini --images 4 --bytes --out bench/results/decode_layout  # step's bytes

Each configuration runs `--repeats` warm calls after its first; the rows of one caption share its keys/values as
`generate` does for one prompt. The same run reports, per configuration, how many of the tokens equal float32 with
one stage (the plain layout), as a check that the settings compared do the same work.

`--bytes` instead compiles one token step (`Decoder.step`, layers unrolled as `Pipeline` runs them) for each cache
dtype and cache length, and prints the bytes XLA's cost analysis says the compiled step accesses beside the bytes it
must read (its kernels, the cache of that length, the distinct captions' keys/values), and the step's fastest time of
`max(--repeats, 20)` calls (the fastest: robust to other work on the machine).
"""
import argparse, json, statistics, time
from dataclasses import replace
from datetime import date
from pathlib import Path

SETTINGS = dict(cond_scale=10.0, top_k=256, temperature=1.0)     # bench/generate.py's sampling settings


def peak_rss_gb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def step_bytes(model, rows: int, lengths=(32, 256), repeats: int = 20) -> list[dict]:
    "Bytes accessed by the compiled token step (XLA's cost analysis) against the bytes it must read, and its\n\n"
    "fastest time of `repeats` calls, per cache dtype and length."
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from dalle_nb.bart import CACHE_DTYPES, text_mask
    cfg, out = model.cfg, []
    read = lambda p: ("kernel" in p and "encoder_attn', 'k_proj" not in p and "encoder_attn', 'v_proj" not in p
                      and ("layers" in p or "lm_head" in p))     # the step's kernels: not the captions' K/V projections
    kernels = sum(x.nbytes for path, x in nnx.to_flat_state(nnx.state(model.decoder, nnx.Param)) if read(str(path)))
    text = jnp.ones((2, cfg.max_text_len), jnp.int32)
    for cache in CACHE_DTYPES:
        for T in lengths:
            c = jax.eval_shape(lambda: model.decoder.init_cache(model.encoder(text), text_mask(text), cache,
                                                                rows=rows, length=T))
            graphdef, state = nnx.split(model)
            # the cache donated, as the decode loop's carry is: else writing its new column would copy it whole first
            fn = jax.jit(lambda st, c, tok, pos: nnx.merge(graphdef, st).decoder.step(tok, pos, c, text_mask(text)),
                         donate_argnums=1)
            ids, pos = jax.ShapeDtypeStruct((rows,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)
            compiled = fn.lower(state, c, ids, pos).compile()
            args = (state, jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), c), jnp.zeros((rows,), jnp.int32),
                    jnp.int32(T - 1))
            times = []
            for _ in range(repeats + 1):                             # the fastest of many: robust to a busy machine
                t0 = time.perf_counter(); _, cache_out = jax.block_until_ready(compiled(*args))
                times.append(time.perf_counter() - t0)
                args = (args[0], cache_out, *args[2:])
            cost = compiled.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            cache_b = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(c))
            accessed = float(cost.get("bytes accessed", float("nan")))
            out.append(dict(cache=cache, length=T, rows=rows, bytes_accessed_mb=accessed / 1e6,
                            must_read_mb=float(kernels + cache_b) / 1e6, fastest_ms=1e3 * min(times)))
            print(json.dumps(out[-1]), flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", default="mini", choices=("mini", "mega")); p.add_argument("--images", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1); p.add_argument("--quantize", default="none")
    p.add_argument("--layouts", default="float32:1,float32:8,bfloat16:1,bfloat16:8,int8:8",
                   help="cache:stages pairs, comma separated")
    p.add_argument("--layers", type=int, default=None, help="encoder and decoder layers (default: the width's)")
    p.add_argument("--bytes", action="store_true", help="the compiled step's bytes instead of speed")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    import jax, numpy as np
    from flax import nnx
    from dalle_nb.bart import DalleBart
    from dalle_nb.layers import serve_all
    from dalle_nb.sample import generate, row_keys
    from dalle_nb.config import get_config
    cfg = replace(get_config(a.width).bart, scan_layers=False)     # DALL·E Mini's or Mega's published sizes
    if a.layers: cfg = replace(cfg, encoder_layers=a.layers, decoder_layers=a.layers)
    model = serve_all(DalleBart(cfg, rngs=nnx.Rngs(0)), None if a.quantize == "none" else a.quantize)
    text = np.ones((a.images, cfg.max_text_len), np.int32)
    text[:, 0], text[:, 1:9], text[:, 9] = 0, np.arange(100, 108), 2
    blank = np.ones_like(text); blank[:, 0] = 0; blank[:, 1] = 2
    if a.bytes:
        res = dict(width=a.width, layers=cfg.decoder_layers, rows=2 * a.images, quantize=a.quantize,
                   steps=step_bytes(model, 2 * a.images, repeats=max(a.repeats, 20)), date=str(date.today()))
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            tmp = Path(a.out) / f"step_bytes_{a.width}_{a.quantize}.json.tmp"
            tmp.write_text(json.dumps(res, indent=1)); tmp.replace(tmp.with_suffix(""))
        return res
    rows, ref = [], None
    for spec in a.layouts.split(","):
        cache, stages = spec.split(":")
        call = lambda: np.asarray(generate(model, text, row_keys(0, a.images), blank_ids=blank, cache=cache,
                                           stages=int(stages), **SETTINGS))
        t0 = time.perf_counter(); toks = call(); first = time.perf_counter() - t0
        warm = []
        for _ in range(a.repeats):
            t0 = time.perf_counter(); call(); warm.append(time.perf_counter() - t0)
        ref = toks if ref is None else ref
        rows.append(dict(cache=cache, stages=int(stages), first_s=first, warm_s=statistics.median(warm),
                         ms_per_step=1e3 * statistics.median(warm) / cfg.image_len,
                         same_tokens=float((toks == ref).mean())))
        print(json.dumps(rows[-1]), flush=True)
    res = dict(width=a.width, layers=cfg.decoder_layers, images=a.images, quantize=a.quantize, rows=rows,
               peak_rss_gb=peak_rss_gb(), date=str(date.today()),
               runtime=f"jax {jax.__version__} {jax.devices()[0].platform}, {jax.device_count()} device(s)")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        tmp = Path(a.out) / f"layout_{a.width}_{a.quantize}.json.tmp"
        tmp.write_text(json.dumps(res, indent=1)); tmp.replace(tmp.with_suffix(""))


if __name__ == "__main__":
    main()
