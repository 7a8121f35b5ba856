"""Our generation against min-dalle's, side by side: images/s, ms per token step, first image, peak memory (issue 22).

Each side runs in a fresh process per width, as a user's would, with random weights (nothing is downloaded):
- **ours**: a model directory with random weights at the width (made once, kept under `--cache`), loaded by `Pipeline`
  and sampled as `dalle-nb generate` does (`n` images, no reranking, super conditioning);
- **min-dalle**: its own folder layout with random weights at the same widths (made once), loaded by its own
  `init_encoder/decoder/detokenizer` and sampled by its own `generate_raw_image_stream` loop, float32 (its fastest
  working dtype on this CPU: its bfloat16 mode fails here).
Both draw 256 tokens per image with condition scale 10, top-k 256, temperature 1, then decode with the f16 VQGAN.
The first call of each image count pays compilation (ours) or allocation (theirs); the table's speed is the median of
`--repeats` warm calls. "first image" is the wall time of a new process from start to its first images (imports,
model load, compile, generate). Peak memory is the process's peak RSS. ms/token step is (warm call − VQGAN decode)/256.

The same run proves the work is equal: at a small width, min-dalle's modules loaded with our BART's weights
(`min_dalle_state`) draw the same 256 greedy tokens (top-k 1, scale 10, from dalle-mini's BOS) as `generate`.

    python bench/generate.py --widths mini --images 1,4 --out bench/results/generate          # ~20 min here
    python bench/generate.py --widths mega --images 1 --repeats 1 --out bench/results/generate_mega
    python bench/generate.py --smoke --out /tmp/g                                              # the smoke test's run
    python bench/generate.py --logits-error mega --out bench/results/generate                  # bfloat16/int8 error, ~17 GB
    python bench/generate.py --cache-error mini --out bench/results/generate                   # bfloat16/int8 cache's error
    python bench/generate.py --load --widths mega --quantize none,bfloat16 --out bench/results/load  # loading alone
    python bench/generate.py --device gpu --widths mega --images 1,16 --repeats 2 --quantize bfloat16 --out bench/results/generate_gpu

`--device gpu` runs both sides on the first GPU: min-dalle in `--min-dalle-dtype` (float16 by default there, as its README
runs it on GPUs), ours under `--quantize`; each call is synchronised before the clock stops, and the table adds each
process's peak GPU memory (torch's `max_memory_allocated`, JAX's `peak_bytes_in_use`). The greedy agreement is a check
of equal work, not of speed: it runs on CPU only.

`--quantize none,bfloat16,int8` runs our side once per weight form (`Pipeline(quantize=...)`). The report ends with the
floor of a token step: the bytes it must read and the FLOPs it must do against this machine's measured bandwidth and
matmul rate. The bytes are those of the decode layout `generate` uses (`--kv-cache`, default the backend's): the kernels,
each row's self-attention cache up to the current position, and the cross-attention keys/values of the distinct captions
(one prompt and the blank caption: 2, whatever the image count), beside what the staged cache actually reads.

`--load` times loading alone, the first part of "first image": our `Pipeline(model_dir, quantize=...)` in a new process
twice per weight form, sharing a fresh verification cache (the first process checks the files' checksums and the
tensors' finiteness, the second finds them remembered), and min-dalle's `init_encoder/decoder/detokenizer` once; every
file is read once beforehand, so each side starts from the page cache as it would after a download. Then, with the
files remembered, the time to be ready for the first image: a new process's `Pipeline` loaded and its first call's
programs (1 image: sampling, the VQGAN decoder) compiled, once compiled on a thread while the weights load
(`ahead=`, as `dalle-nb generate` does) and once after them, each three times, alternated (the table: medians).
"""
import argparse, json, os, platform, resource, statistics, subprocess, sys, time
from datetime import date
from pathlib import Path

WIDTHS = {  # d_model, layers (each side), heads, GLU width, text vocab, image vocab (DALL·E Mini's and Mega's published sizes)
    "small": dict(d_model=64, layers=2, heads=4, glu_dim=96, text_vocab=50264, image_vocab=16384),
    "mini": dict(d_model=1024, layers=12, heads=16, glu_dim=2730, text_vocab=50264, image_vocab=16384),
    "mega": dict(d_model=2048, layers=24, heads=32, glu_dim=4096, text_vocab=50272, image_vocab=16415),
}
SETTINGS = dict(cond_scale=10.0, top_k=256, temperature=1.0)
PROMPT = "a red circle above a blue square"
TOKENS = 256
READY_TRIES = 3          # `--load`: new processes per way of getting ready for the first image (the table: their median)


def device() -> str:
    "Where the children run: `cpu` or `gpu` (`--device`, passed to them in the environment)."
    return os.environ.get("DALLE_NB_BENCH_DEVICE", "cpu")


def min_dalle_dtype() -> str:
    return os.environ.get("DALLE_NB_BENCH_MIN_DALLE_DTYPE") or ("float16" if device() == "gpu" else "float32")


def jax_peak_gb(key: str = "peak_bytes_in_use"):
    "GB of the first JAX device's allocator statistic `key` (GPU: `peak_bytes_in_use`, `bytes_in_use`, `largest_alloc_size`); `None` on CPU."
    import jax
    stats = jax.local_devices()[0].memory_stats() if device() == "gpu" else None
    return stats[key] / 2 ** 30 if stats and key in stats else None


def gpu_total_bytes() -> float:
    "The first GPU's memory in bytes, from nvidia-smi (asked before JAX starts, so the pool's cap can be set)."
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0]) * 2**20


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def timed(fn, repeats: int):
    "`(first call's seconds, median of `repeats` further calls, the clock when the first call ended)`."
    t0 = time.perf_counter(); fn(); first_end = time.perf_counter()
    times = []
    for _ in range(repeats):
        t0b = time.perf_counter(); fn(); times.append(time.perf_counter() - t0b)
    return first_end - t0, statistics.median(times) if times else first_end - t0, first_end


def bart_config(width: str, init_std: float = 0.01):
    from dalle_nb.config import BartConfig
    w = WIDTHS[width]
    return BartConfig(text_vocab=w["text_vocab"], image_codes=16384, image_vocab=w["image_vocab"], max_text_len=64, image_len=TOKENS,
                      d_model=w["d_model"], encoder_layers=w["layers"], decoder_layers=w["layers"], heads=w["heads"],
                      glu_dim=w["glu_dim"], text_normalizer="dalle_mini", init_std=init_std)


def make_model_dir(width: str, path: Path) -> Path:
    "A model directory with random weights at `width`: f16 VQGAN decoder, BART, the shipped tokenizer; stored as float16."
    from dataclasses import replace
    from flax import nnx
    from dalle_nb.bart import DalleBart
    from dalle_nb.config import F16_VQGAN, RunConfig, SampleConfig, CLIP_VIT_B32
    from dalle_nb.modeldir import Models, save_models, default_model_dir
    from dalle_nb.text import TextEncoder
    from dalle_nb.vqgan import VQGAN
    cfg = RunConfig(name=f"random-{width}", vqgan=replace(F16_VQGAN, decoder_only=True), bart=bart_config(width), clip=CLIP_VIT_B32,
                    sample=SampleConfig(n_candidates=4, rerank=0, cond_scale=SETTINGS["cond_scale"]))
    text = TextEncoder.load(default_model_dir() / "tokenizer.json", max_len=64, normalizer="dalle_mini")
    # parameters made in bfloat16 (half the memory while writing); the directory's config keeps float32 for loading
    bart = DalleBart(replace(cfg.bart, param_dtype="bfloat16"), rngs=nnx.Rngs(0))
    vqgan = VQGAN(cfg.vqgan, rngs=nnx.Rngs(1))
    save_models(path, Models(cfg, text, vqgan, bart, None), card=f"# random-{width}\n\nRandom weights for bench/generate.py.\n")
    return path


def run_ours(model_dir: str, quantize: str, images: list[int], repeats: int) -> dict:
    t_start = time.perf_counter()
    import jax
    from dalle_nb.pipeline import Pipeline
    from dalle_nb.sample import default_layout
    from dalle_nb.decode import decode_mode
    # as `dalle-nb generate`: the first call's programs compiled on a thread while the weights load
    first = dict(n=images[0], rerank=0, seed=0, **SETTINGS)
    t0 = time.perf_counter(); pipe = Pipeline(model_dir, batch_size=max(images), quantize=None if quantize == "none" else quantize,
                                                    cache=os.environ.get("DALLE_NB_BENCH_KV_CACHE") or None, ahead=first); load_s = time.perf_counter() - t0
    loaded_gpu_gb, rows = jax_peak_gb("bytes_in_use"), []
    for k in images:
        res = {}
        call = lambda: res.update(r=pipe(PROMPT, n=k, rerank=0, seed=0, **SETTINGS))
        first, warm, first_end = timed(call, repeats)
        tokens = res["r"].tokens
        decode = timed(lambda: pipe.decode(tokens), repeats)[1]
        rows.append(dict(images=k, first_s=first, warm_s=warm, decode_s=decode, **({} if rows else {"first_image_s": first_end - t_start})))
    # on a GPU the peak includes XLA's autotuning scratch while compiling: its largest single allocation says how much
    return dict(side="ours", quantize=quantize, kv_cache=pipe.cache or default_layout()["cache"], decode=decode_mode(), load_s=load_s, rows=rows,
                compiled_ahead=dict(pipe._ahead.hits), peak_rss_gb=peak_rss_gb(), peak_gpu_gb=jax_peak_gb(),
                loaded_gpu_gb=loaded_gpu_gb, largest_gpu_alloc_gb=jax_peak_gb("largest_alloc_size"),
                runtime=f"jax {jax.__version__} {jax.devices()[0].platform} ({jax.devices()[0].device_kind}), {os.cpu_count()} threads")


def min_dalle_modules(width: str):
    "min-dalle's encoder, decoder and VQGAN detokenizer at `width` (torch's own random initialisation)."
    from min_dalle.models import DalleBartEncoder, DalleBartDecoder, VQGanDetokenizer
    w = WIDTHS[width]
    enc = DalleBartEncoder(attention_head_count=w["heads"], embed_count=w["d_model"], glu_embed_count=w["glu_dim"], text_token_count=64,
                           text_vocab_count=w["text_vocab"], layer_count=w["layers"], device="cpu").eval()
    dec = DalleBartDecoder(image_vocab_count=w["image_vocab"], attention_head_count=w["heads"], embed_count=w["d_model"],
                           glu_embed_count=w["glu_dim"], layer_count=w["layers"], device="cpu").eval()
    return enc, dec, VQGanDetokenizer().eval()


def make_min_dalle_dir(width: str, path: Path) -> Path:
    "min-dalle's folder layout (`dalle_bart/encoder.pt`, `decoder.pt`, `vqgan/detoker.pt`) with random weights, BART stored in the dtype it will run in."
    import torch
    dtype = getattr(torch, min_dalle_dtype())
    for i, (sub, name) in enumerate([("dalle_bart", "encoder.pt"), ("dalle_bart", "decoder.pt"), ("vqgan", "detoker.pt")]):
        (path / sub).mkdir(parents=True, exist_ok=True)
        module = min_dalle_modules(width)[i]                 # one at a time: a Mega-width side is 5 GB
        if sub == "dalle_bart": module = module.to(dtype)
        torch.save(module.state_dict(), path / sub / name); del module
    return path


def min_dalle_model(width: str, path: Path):
    "min-dalle's `MinDalle` at `width`, loaded from `path` by its own `init_encoder/decoder/detokenizer` (`--device`, `--min-dalle-dtype`).\n\n"
    "`__init__` is skipped because it asks the network for its tokenizer; the caption is 8 fixed BPE ids."
    import torch
    from min_dalle.min_dalle import MinDalle

    class Tokenizer:
        def tokenize(self, text, is_verbose=False): return [0] + [100 + i for i in range(8)] + [2]

    w = WIDTHS[width]
    m = MinDalle.__new__(MinDalle)
    m.device, m.is_mega, m.is_reusable, m.dtype, m.is_verbose = ("cuda" if device() == "gpu" else "cpu"), width == "mega", True, getattr(torch, min_dalle_dtype()), False
    m.text_token_count, m.layer_count, m.attention_head_count = 64, w["layers"], w["heads"]
    m.embed_count, m.glu_embed_count, m.text_vocab_count, m.image_vocab_count = w["d_model"], w["glu_dim"], w["text_vocab"], w["image_vocab"]
    m.encoder_params_path, m.decoder_params_path = str(path / "dalle_bart" / "encoder.pt"), str(path / "dalle_bart" / "decoder.pt")
    m.detoker_params_path, m.tokenizer = str(path / "vqgan" / "detoker.pt"), Tokenizer()
    m.init_encoder(); m.init_decoder(); m.init_detokenizer()
    return m


def run_min_dalle(width: str, path: str, images: list[int], repeats: int) -> dict:
    t_start = time.perf_counter()
    import torch
    t0 = time.perf_counter(); m = min_dalle_model(width, Path(path)); load_s = time.perf_counter() - t0
    sync = torch.cuda.synchronize if m.device == "cuda" else (lambda: None)
    rows = []
    for k in images:
        g = round(k ** 0.5)
        if g * g != k: raise SystemExit(f"min-dalle draws a square grid: --images must be squares (1, 4, 9, 16, 64), got {k}")
        call = lambda: ([None for _ in m.generate_raw_image_stream(text=PROMPT, seed=1, grid_size=g, **{
            "top_k": SETTINGS["top_k"], "supercondition_factor": SETTINGS["cond_scale"], "temperature": SETTINGS["temperature"]})], sync())
        first, warm, first_end = timed(call, repeats)
        tokens = torch.randint(0, 16384, (k, TOKENS), device=m.device)
        decode = timed(lambda: (m.detokenizer.forward(False, tokens), sync()), repeats)[1]
        rows.append(dict(images=k, first_s=first, warm_s=warm, decode_s=decode, **({} if rows else {"first_image_s": first_end - t_start})))
    gpu = torch.cuda.max_memory_allocated() / 2 ** 30 if m.device == "cuda" else None
    return dict(side="min-dalle", load_s=load_s, rows=rows, peak_rss_gb=peak_rss_gb(), peak_gpu_gb=gpu,
                runtime=f"torch {torch.__version__} {m.device}" + (f" ({torch.cuda.get_device_name()})" if gpu is not None else "")
                        + f", {torch.get_num_threads()} threads, {min_dalle_dtype()}")


def greedy_agreement(seed: int = 0) -> dict:
    "Our BART at the small width (weights std 0.1) and min-dalle's modules loaded with the same weights: 256 greedy tokens each."
    import numpy as np, torch, jax.numpy as jnp
    from flax import nnx
    from dataclasses import replace
    from dalle_nb.bart import DalleBart, unstack_params
    from dalle_nb.convert import min_dalle_state
    from dalle_nb.sample import generate, row_keys
    cfg = bart_config("small", init_std=0.1)
    ours = DalleBart(cfg, rngs=nnx.Rngs(seed))
    enc_sd, dec_sd = min_dalle_state(ours)
    enc, dec, _ = min_dalle_modules("small")
    enc.load_state_dict({k: torch.tensor(v) for k, v in enc_sd.items()}); dec.load_state_dict({k: torch.tensor(v) for k, v in dec_sd.items()})
    text = np.ones((2, 64), np.int64)                     # min-dalle's rows: the blank caption, then the caption
    text[0, :2] = [0, 2]
    text[1, :10] = [0, *range(100, 108), 2]
    with torch.no_grad():
        t_text = torch.tensor(text)
        state_enc, mask = enc(t_text), t_text.ne(1)[:, None, None, :]
        tokens = torch.full((1, TOKENS + 1), cfg.bos_id, dtype=torch.long)             # dalle-mini's BOS (min-dalle's loop uses 16383)
        state = torch.zeros(cfg.decoder_layers, 4, TOKENS, cfg.d_model)
        settings = torch.tensor([1.0, 1.0, SETTINGS["cond_scale"]])                      # temperature, top-k 1, scale
        for i in range(TOKENS):
            tokens[:, i + 1], state = dec.sample_tokens(settings=settings, attention_mask=mask, encoder_state=state_enc, attention_state=state,
                                                        prev_tokens=tokens[:, [i]], token_index=torch.arange(TOKENS)[[i]])
    theirs = tokens[0, 1:].numpy()
    listed = unstack_params(ours, DalleBart(replace(cfg, scan_layers=False), rngs=nnx.Rngs(seed)))   # as `Pipeline` loads it
    draw = lambda m: np.asarray(generate(m, text[1:], row_keys(0, 1), blank_ids=text[:1], cond_scale=SETTINGS["cond_scale"], top_k=1))[0]
    from dalle_nb.layers import serve_all
    mine, mine_listed, mine_served = draw(ours), draw(listed), draw(serve_all(listed))          # served: kernels [out, in], float32
    return dict(width="small", tokens=TOKENS, agree=int((mine == theirs).sum()), agree_unrolled=int((mine_listed == theirs).sum()),
                agree_served=int((mine_served == theirs).sum()),
                first_difference=int(np.argmax(mine != theirs)) if (mine != theirs).any() else None)


def machine_throughput() -> dict:
    "This machine's measured memory read bandwidth (summing 1 GiB) and matmul throughput (2048³, float32 and int8 → int32)."
    import numpy as np, jax, jax.numpy as jnp
    def best(f, *a):
        jax.block_until_ready(f(*a)); ts = []
        for _ in range(5):
            t0 = time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter() - t0)
        return min(ts)
    big, n = jnp.ones((2 ** 28,), jnp.float32), (8192 if device() == "gpu" else 2048)
    a32, a16, a8 = jnp.ones((n, n), jnp.float32), jnp.ones((n, n), jnp.bfloat16), jnp.ones((n, n), jnp.int8)
    return dict(read_gb_s=2 ** 30 / best(jax.jit(jnp.sum), big) / 1e9,
                float32_gflop_s=2 * n ** 3 / best(jax.jit(jnp.matmul), a32, a32) / 1e9,
                bfloat16_gflop_s=2 * n ** 3 / best(jax.jit(jnp.matmul), a16, a16) / 1e9,
                int8_gop_s=2 * n ** 3 / best(jax.jit(lambda x, y: jax.lax.dot(x, y, preferred_element_type=jnp.int32)), a8, a8) / 1e9)


def step_floor(width: str, quantize: str, rows: int, measured: dict, cache: str | None = None, runs: int | None = None) -> dict:
    "Bytes and FLOPs of one token step and the time they need here, for the decode layout `generate` uses: the kernels in\n\n"
    "the served form, each row's self-attention cache up to the current position (mean over the 256 steps) in `cache`\n\n"
    "(default: this backend's), and the cross-attention keys/values of the distinct captions (`rows / runs`; default 2:\n\n"
    "one prompt and the blank caption). `layout_cache_mb` is what the layout reads: the staged cache (`DEFAULT_LAYOUT`'s stages),\n\n"
    "or where `decode.decode_attend` serves, the positions written rounded up to its blocks."
    import jax, numpy as np
    from dataclasses import replace
    from flax import nnx
    from dalle_nb.bart import DalleBart
    from dalle_nb.layers import serve_all
    from dalle_nb.sample import default_layout
    from dalle_nb.decode import DECODE_BLOCK, decode_positions, decode_serves
    cfg = replace(bart_config(width), scan_layers=False)
    model = nnx.eval_shape(lambda: serve_all(DalleBart(cfg, rngs=nnx.Rngs(0)), None if quantize == "none" else quantize))
    flat = {"/".join(map(str, k)): v for k, v in nnx.to_flat_state(nnx.state(model.decoder, nnx.Param))}
    read = {k: v for k, v in flat.items() if ("/layers/" in k or "lm_head" in k) and k.endswith("kernel") and "encoder_attn/k_proj" not in k
            and "encoder_attn/v_proj" not in k}
    weights = sum(v.size * np.dtype(v.dtype).itemsize for v in read.values())
    params = sum(v.size for v in read.values())
    layout = default_layout(rows * cfg.decoder_layers * 2 * cfg.d_model * TOKENS * 4)    # the rows' whole float32 cache
    cache = cache or layout["cache"]
    per_pos = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1 + 4 / cfg.head_dim}[cache]          # int8: + a float32 scale per head
    cross_b = 4 if cache == "float32" else 2                                                # the captions' K/V: 16-bit unless float32
    captions = rows // (runs or rows // 2)
    kv = rows * cfg.decoder_layers * 2 * cfg.d_model * per_pos                             # bytes per cached position, all rows
    mean_pos = (TOKENS + 1) / 2                                                             # positions 0..t read at step t
    ends = [TOKENS * (s + 1) // layout["stages"] for s in range(layout["stages"])]
    mean_staged = np.mean([next(e for e in ends if e > t) for t in range(TOKENS)])
    if decode_serves(): mean_staged = decode_positions(TOKENS, DECODE_BLOCK)       # the GPU kernel's blocks
    cross = captions * cfg.decoder_layers * 2 * cfg.d_model * cfg.max_text_len * cross_b
    flops = 2 * rows * params + 4 * rows * cfg.decoder_layers * cfg.d_model * (mean_pos + cfg.max_text_len)
    peak = measured["int8_gop_s"] if quantize == "int8" else measured["bfloat16_gflop_s" if quantize == "bfloat16" else "float32_gflop_s"]
    return dict(width=width, quantize=quantize, rows=rows, cache=cache, captions=captions, weight_mb=weights / 1e6,
                cache_mb=(kv * mean_pos + cross) / 1e6, layout_cache_mb=float(kv * mean_staged + cross) / 1e6, gflop=flops / 1e9,
                floor_ms=1e3 * max((weights + kv * mean_pos + cross) / (measured["read_gb_s"] * 1e9), flops / (peak * 1e9)))


def logits_error(width: str, forms=("bfloat16", "float16", "int8"), seed: int = 0) -> dict:
    "The BART's teacher-forced logits (random weights at `width`, full depth) with weights served as `forms` against float32."
    import numpy as np, jax.numpy as jnp
    from dataclasses import replace
    from flax import nnx
    from dalle_nb.bart import DalleBart
    from dalle_nb.layers import serve_all
    # XLA:CPU multiplies float16 through float32 copies: unrolled as `Pipeline` runs it, Mega's float16 run did not fit
    # in this VM's 22 GB, scanned it does (one layer converted at a time; scanned, bfloat16's did not fit). Same
    # arithmetic either way; the random weights differ.
    cfg = replace(bart_config(width), scan_layers=tuple(forms) == ("float16",))
    model = DalleBart(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    text = np.ones((2, cfg.max_text_len), np.int32); text[:, 0] = 0
    text[:, 1:12] = rng.integers(3, cfg.text_vocab, (2, 11)); text[:, 12] = 2
    image = rng.integers(0, cfg.image_codes, (2, TOKENS)).astype(np.int32)
    run = nnx.jit(lambda m, t, i: m(t, i), graph_updates=False)
    ref = np.asarray(run(model, text, image), np.float64)
    out = dict(width=width, tokens=TOKENS, rows=2, **{f"layers_{q}": "scanned" if cfg.scan_layers else "unrolled" for q in forms})
    for q in forms:
        served = serve_all(nnx.clone(model), q)            # a second copy of the kernels, in the served form
        got = np.asarray(run(served, text, image), np.float64); del served
        out[q] = dict(relative_error=float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
                      top1_agreement=float((got.argmax(-1) == ref.argmax(-1)).mean()),
                      top256_overlap=float(np.mean([len(set(np.argsort(g)[-256:]) & set(np.argsort(r)[-256:])) / 256
                                                    for g, r in zip(got.reshape(-1, got.shape[-1])[::16], ref.reshape(-1, ref.shape[-1])[::16])])))
    return out


def cache_error(width: str, seed: int = 0) -> dict:
    "The decoder's logits decoded step by step through the KV cache (random weights at `width`, full depth, stored in\n\n"
    "bfloat16 and computed in float32, 2 captions, teacher-forced tokens) with a bfloat16, a float16 and an int8 cache against float32."
    import numpy as np, jax, jax.numpy as jnp
    from dataclasses import replace
    from flax import nnx
    from dalle_nb.bart import DalleBart, text_mask, shift_right
    cfg = replace(bart_config(width), param_dtype="bfloat16")          # Mega's 2.6 B parameters in 5 GB
    model = DalleBart(cfg, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    text = np.ones((2, cfg.max_text_len), np.int32); text[:, 0] = 0
    text[:, 1:12] = rng.integers(3, cfg.text_vocab, (2, 11)); text[:, 12] = 2
    image = rng.integers(0, cfg.image_codes, (2, TOKENS)).astype(np.int32)

    @nnx.jit(static_argnames="dtype", graph_updates=False)
    def stepped(m, text, image, dtype):
        tm, inp = text_mask(text, cfg.pad_id), shift_right(image, cfg.bos_id)
        cache = m.decoder.init_cache(m.encoder(text), tm, dtype)
        step = lambda c, t: m.decoder.step(inp[:, t], t, c, tm)[::-1]
        return jax.lax.scan(step, cache, jnp.arange(TOKENS))[1]
    ref = np.asarray(stepped(model, text, image, "float32"), np.float64)
    out = dict(width=width, tokens=TOKENS, rows=2, weights="bfloat16-stored, float32 compute")
    for c in ("bfloat16", "float16", "int8"):
        got = np.asarray(stepped(model, text, image, c), np.float64)
        out[f"cache_{c}"] = dict(relative_error=float(np.linalg.norm(got - ref) / np.linalg.norm(ref)),
                                 top1_agreement=float((got.argmax(-1) == ref.argmax(-1)).mean()))
    return out


def cli_twice(model_dir: str, quantize: str, k: int) -> dict:
    "Wall time of two `dalle-nb generate` processes in a row sharing a fresh compilation cache: the second skips compiling."
    import shutil, tempfile
    exe = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))
    with tempfile.TemporaryDirectory() as d:
        env = one_device_env()
        env["DALLE_NB_CACHE"] = d
        cmd = [exe, "generate", PROMPT, "--model", model_dir, "--n", str(k), "--rerank", "0", "--cond-scale", str(SETTINGS["cond_scale"]),
               "--top-k", str(SETTINGS["top_k"]), "--temperature", str(SETTINGS["temperature"]), "--quiet", "--out", str(Path(d) / "out")]
        cmd += [] if quantize == "none" else ["--quantize", quantize]
        walls = []
        for _ in range(2):
            t0 = time.perf_counter(); r = subprocess.run(cmd, capture_output=True, text=True, env=env); walls.append(time.perf_counter() - t0)
            if r.returncode != 0: return dict(error=f"exit {r.returncode}", stderr=r.stderr[-2000:])
    return dict(quantize=quantize, images=k, first_process_s=walls[0], second_process_s=walls[1])


def child(argv: list[str]) -> dict:
    "Run one side (or the agreement check) in this process and return its report."
    kind, rest = argv[0], argv[1:]
    if kind == "make": return dict(path=str(make_model_dir(rest[0], Path(rest[1]))))
    if kind == "make-min-dalle": return dict(path=str(make_min_dalle_dir(rest[0], Path(rest[1]))))
    if kind == "agree": return greedy_agreement()
    if kind == "error": return logits_error(rest[0], rest[1:])
    if kind == "cache-error": return cache_error(rest[0])
    if kind in ("load", "load-min-dalle"): return timed_load(kind, *rest)
    if kind == "ready": return timed_ready(*rest)
    if kind == "floor":
        measured = machine_throughput()
        return dict(measured=measured, floors=[step_floor(w, q, 2 * int(k), measured) for w in rest[0].split(",") for q in rest[1].split(",") for k in rest[2].split(",")])
    images, repeats = [int(x) for x in rest[-2].split(",")], int(rest[-1])
    return run_ours(rest[0], rest[1], images, repeats) if kind == "ours" else run_min_dalle(rest[0], rest[1], images, repeats)


def one_device_env() -> dict:
    "os.environ with one CPU device, as a user's shell has: a device-count flag dropped from XLA_FLAGS, other flags kept."
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    return {**os.environ, "XLA_FLAGS": " ".join(flags)}


def in_process(*argv, timeout=7200) -> dict:
    "A fresh Python process running `child(argv)`; its report (its last stdout line, JSON)."
    env = one_device_env()
    r = subprocess.run([sys.executable, __file__, "--child", *argv], capture_output=True, text=True, timeout=timeout, env=env)
    if r.returncode != 0:
        return dict(error=f"exit {r.returncode}" + (" (killed: out of memory?)" if r.returncode < 0 else ""), stderr=r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def timed_load(kind: str, *argv) -> dict:
    "A child's seconds importing its side and loading a model directory (`load`: ours, `load-min-dalle`: min-dalle's)."
    t0 = time.perf_counter()
    if kind == "load":
        import jax
        from dalle_nb.pipeline import Pipeline
    else: import torch, min_dalle.min_dalle
    t1 = time.perf_counter()
    if kind == "load": jax.block_until_ready(jax.tree.leaves(Pipeline(argv[0], batch_size=1, quantize=None if argv[1] == "none" else argv[1]).models.transformer))
    else: min_dalle_model(argv[0], Path(argv[1]))
    return dict(imports_s=t1 - t0, load_s=time.perf_counter() - t1, peak_rss_gb=peak_rss_gb())


def timed_ready(model_dir: str, quantize: str, how: str) -> dict:
    ("A child's seconds to a loaded `Pipeline` with its first call's programs (1 image, no reranking) compiled: `ahead`, "
     "on a thread while the weights load; `after`, the same programs compiled once loading is done.")
    from functools import partial
    t0 = time.perf_counter()
    import jax
    from dalle_nb.pipeline import Pipeline
    from dalle_nb.sample import Ahead
    t1, first, q = time.perf_counter(), dict(n=1, rerank=0, seed=0, **SETTINGS), None if quantize == "none" else quantize
    pipe = Pipeline(model_dir, batch_size=1, quantize=q, ahead=first if how == "ahead" else None)
    jax.block_until_ready(jax.tree.leaves(pipe.models.transformer)); t2 = time.perf_counter()
    ahead = pipe._ahead if how == "ahead" else Ahead(partial(pipe._first_programs, Path(model_dir), first))
    failed = [repr(f.exception()) for f in ahead.wait().table.values() if f.exception() is not None]
    return dict(how=how, imports_s=t1 - t0, load_s=t2 - t1, ready_s=time.perf_counter() - t1, programs=len(ahead.table),
                failed=failed, plan_error=repr(ahead.error) if ahead.error else None, peak_rss_gb=peak_rss_gb())


def load_runs(widths: list[str], quantize: list[str], sides: list[str], cache: Path) -> list[dict]:
    "`--load`: per width, ours twice per weight form (a fresh verification cache: checked, then remembered), min-dalle once."
    import tempfile
    runs = []
    for width in widths:
        for side in sides:
            d = cache / f"{side}-{width}"
            if not (d / ("bart.msgpack" if side == "ours" else "vqgan/detoker.pt")).exists():
                in_process("make" if side == "ours" else "make-min-dalle", width, str(d))
            for f in d.rglob("*"):                                            # into the page cache, as after a download
                if f.is_file():
                    with open(f, "rb") as fh:
                        while fh.read(1 << 26): pass
            if side == "min-dalle": runs.append(dict(width=width, side=side, first=in_process("load-min-dalle", width, str(d)))); continue
            for q in quantize:
                before = os.environ.get("DALLE_NB_CACHE")
                with tempfile.TemporaryDirectory() as v:
                    os.environ["DALLE_NB_CACHE"] = v
                    first, again = in_process("load", str(d), q), in_process("load", str(d), q)
                    tries = {"after": [], "ahead": []}                     # alternated: the VM's drift hits both
                    for _ in range(READY_TRIES):
                        for how, runs_ in tries.items(): runs_.append(in_process("ready", str(d), q, how))
                    ready = {how: dict(ready_s=statistics.median(t["ready_s"] for t in runs_) if all("ready_s" in t for t in runs_)
                                       else None, tries=runs_) for how, runs_ in tries.items()}
                os.environ.pop("DALLE_NB_CACHE") if before is None else os.environ.__setitem__("DALLE_NB_CACHE", before)
                runs.append(dict(width=width, side=side, quantize=q, first=first, again=again, ready=ready))
            print(json.dumps(runs[-1])[:400], flush=True)
    return runs


def load_table(runs: list[dict]) -> str:
    s = lambda r, k: f"{r[k]:.1f}" if r and k in r else ("—" if not r else r.get("error", "?"))
    ready = lambda r, how: s(r.get("ready", {}).get(how), "ready_s") if (r.get("ready", {}).get(how) or {}).get("ready_s") else "—"
    return ("| width | side | weights | imports (s) | load, first process (s) | load, again (s) | peak RSS, first (GB) | "
            "ready: compiled after loading (s) | ready: compiled while loading (s) |\n|---|---|---|---|---|---|---|---|---|\n"
            + "\n".join(f"| {r['width']} | {r['side']} | {r.get('quantize', min_dalle_dtype())} | {s(r['first'], 'imports_s')} | {s(r['first'], 'load_s')} | "
                        f"{s(r.get('again'), 'load_s')} | {s(r['first'], 'peak_rss_gb')} | {ready(r, 'after')} | {ready(r, 'ahead')} |" for r in runs))


def write_partial(out, widths: dict):
    "What has been measured so far, to `out/generate.partial.json` (a long run cut short keeps its finished sides)."
    if out: Path(out).mkdir(parents=True, exist_ok=True); (Path(out) / "generate.partial.json").write_text(json.dumps(widths, indent=1))


def table(widths: dict) -> str:
    gpu = any(rep.get("peak_gpu_gb") is not None for sides in widths.values() for rep in sides.values())
    lines = ["| width | images | side | images/s | s/image | ms/token step | VQGAN decode (s) | first image (s) | peak RSS (GB) |" + (" peak GPU memory (GB) |" if gpu else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if gpu else "")]
    for width, sides in widths.items():
        for side, rep in sides.items():
            if "error" in rep:
                lines.append(f"| {width} | | {side} | {rep['error']} | | | | | |"); continue
            for row in rep["rows"]:
                k = row["images"]
                step_ms = 1000 * (row["warm_s"] - row["decode_s"]) / TOKENS
                lines.append(f"| {width} | {k} | {side} | {k / row['warm_s']:.3f} | {row['warm_s'] / k:.2f} | {step_ms:.1f} | "
                             f"{row['decode_s']:.2f} | {row.get('first_image_s', float('nan')):.1f} | {rep['peak_rss_gb']:.2f} |"
                             + (f" {rep['peak_gpu_gb']:.2f} |" if gpu and rep.get("peak_gpu_gb") is not None else " |" if gpu else ""))
    return "\n".join(lines)


def ratios(widths: dict) -> list[dict]:
    "Per width and image count: ours ÷ min-dalle in images/s (higher is better), in peak RSS and time to the first image (lower)."
    out = []
    for width, sides in widths.items():
      for side, a in sides.items():
        b = sides.get("min-dalle", {})
        if not side.startswith("ours") or "rows" not in a or "rows" not in b: continue
        for ra, rb in zip(a["rows"], b["rows"]):
            out.append(dict(width=width, side=side, images=ra["images"], speed=rb["warm_s"] / ra["warm_s"],
                            first_image=ra["first_image_s"] / rb["first_image_s"] if "first_image_s" in ra and "first_image_s" in rb else None,
                            memory=a["peak_rss_gb"] / b["peak_rss_gb"],
                            gpu_memory=a["peak_gpu_gb"] / b["peak_gpu_gb"] if a.get("peak_gpu_gb") and b.get("peak_gpu_gb") else None))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", default="mini", help="comma-separated: small, mini, mega")
    p.add_argument("--images", default="1,4", help="comma-separated images per prompt (squares: min-dalle draws a grid)")
    p.add_argument("--repeats", type=int, default=2, help="warm calls timed per image count (median)")
    p.add_argument("--sides", default="ours,min-dalle")
    p.add_argument("--quantize", default="none", help="comma-separated weight forms for our side: none (float32), bfloat16, float16, int8")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "dalle_nb" / "bench_generate"), help="where the random model directories are kept")
    p.add_argument("--smoke", action="store_true", help="small width, 1 image, 1 repeat (the smoke test)")
    p.add_argument("--out", default=None, help="write generate.json and generate.md here")
    p.add_argument("--second-process", action="store_true", help="also time two `dalle-nb generate` processes sharing a fresh compilation cache")
    p.add_argument("--logits-error", default=None, metavar="WIDTH", help="only measure the logits' error with bfloat16 and int8 weights at WIDTH (mega: ~17 GB)")
    p.add_argument("--cache-error", default=None, metavar="WIDTH", help="only measure the logits' error with a bfloat16 and an int8 KV cache at WIDTH (weights stored in bfloat16: mega 5.2 GB)")
    p.add_argument("--kv-cache", default=None, choices=["float32", "bfloat16", "float16", "int8"], help="our decode cache (default: float32 on cpu, bfloat16 on gpu)")
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu"], help="where both sides run (gpu: the first CUDA device)")
    p.add_argument("--decode", default="", help="comma-separated: our token step's attention per run, xla or kernel (default: decode.decode_mode's)")
    p.add_argument("--gpu-pool-gb", type=float, default=None, help="gpu: cap JAX's memory pool at this many GB (XLA_PYTHON_CLIENT_MEM_FRACTION): bounds the autotuner's scratch")
    p.add_argument("--load", action="store_true", help="only time loading the model directories (ours twice per --quantize: checked, then remembered)")
    p.add_argument("--min-dalle-dtype", default=None, choices=["float32", "float16", "bfloat16"], help="min-dalle's dtype (default: float32 on cpu, float16 on gpu)")
    a = p.parse_args(argv)
    os.environ["DALLE_NB_BENCH_DEVICE"] = a.device                       # the children read both (`device()`, `min_dalle_dtype()`)
    os.environ["DALLE_NB_BENCH_MIN_DALLE_DTYPE"] = a.min_dalle_dtype or ""
    os.environ["DALLE_NB_BENCH_KV_CACHE"] = a.kv_cache or ""
    if a.cache_error:
        err = in_process("cache-error", a.cache_error)
        print(json.dumps(err, indent=1))
        if a.out: Path(a.out).mkdir(parents=True, exist_ok=True); (Path(a.out) / f"cache_error_{a.cache_error}.json").write_text(json.dumps(dict(err, date=str(date.today())), indent=1))
        return err
    if a.device == "gpu": os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # JAX takes what it uses, as torch does
    if "kernel" in a.decode.split(",") and a.device == "cpu": p.error("--decode kernel needs --device gpu (a GPU Triton runs on)")
    if a.gpu_pool_gb and a.device == "gpu": os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{a.gpu_pool_gb * 1e9 / gpu_total_bytes():.4f}"
    if a.logits_error:                                    # a process per form: Mega's float32 model and one served copy fit
        err = {}
        for q in ("bfloat16", "float16", "int8"):
            r = in_process("error", a.logits_error, q); err.update(r if "error" not in r else {q: r})
        print(json.dumps(err, indent=1))
        if a.out: Path(a.out).mkdir(parents=True, exist_ok=True); (Path(a.out) / f"logits_error_{a.logits_error}.json").write_text(json.dumps(dict(err, date=str(date.today())), indent=1))
        return err
    if a.smoke: a.widths, a.images, a.repeats = "small", "1", 0
    if a.load:
        runs = load_runs(a.widths.split(","), a.quantize.split(","), a.sides.split(","), Path(a.cache))
        res = dict(runs=runs, machine=f"{platform.machine()}, {os.cpu_count()} cores", device=a.device, date=str(date.today()))
        print(load_table(runs))
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True); (Path(a.out) / "load.json").write_text(json.dumps(res, indent=1))
            (Path(a.out) / "load.md").write_text(load_table(runs) + "\n")
        return res
    import dalle_nb
    widths = {}
    for width in a.widths.split(","):
        if width not in WIDTHS: p.error(f"--widths: unknown width {width!r}; choose from {', '.join(WIDTHS)}")
        sides = {}
        for side in a.sides.split(","):
            if side not in ("ours", "min-dalle"): p.error(f"--sides: unknown side {side!r}")
            d = Path(a.cache) / f"{side}-{width}"          # random weights, made once in a process of their own
            if not (d / ("bart.msgpack" if side == "ours" else "vqgan/detoker.pt")).exists():
                made = in_process("make" if side == "ours" else "make-min-dalle", width, str(d))
                if "error" in made: sides[side] = made; continue
            if side == "min-dalle":
                sides[side] = in_process("min-dalle", width, str(d), a.images, str(a.repeats))
                print(f"{width} {side}: {json.dumps(sides[side])[:400]}", flush=True)
                write_partial(a.out, {**widths, width: sides})
            for q, mode in ((q, m) for q in a.quantize.split(",") for m in a.decode.split(",")) if side == "ours" else ():
                if q not in ("none", "bfloat16", "float16", "int8"): p.error(f"--quantize: unknown form {q!r}")
                if mode not in ("", "xla", "kernel"): p.error(f"--decode: unknown mode {mode!r}")
                parts = [x for x in (None if q == "none" else q, mode) if x]                # "ours (bfloat16, xla)"
                name = "ours" + (f" ({', '.join(parts)})" if parts else "")
                os.environ["DALLE_NB_DECODE"] = mode                        # the children's `decode.decode_mode`
                sides[name] = in_process("ours", str(d), q, a.images, str(a.repeats))
                os.environ.pop("DALLE_NB_DECODE")
                print(f"{width} {name}: {json.dumps(sides[name])[:400]}", flush=True)
                write_partial(a.out, {**widths, width: sides})
                if a.second_process and "rows" in sides[name]:             # the compilation cache: a second `dalle-nb generate`
                    k = max(int(x) for x in a.images.split(","))
                    sides[name]["cli"] = cli_twice(str(d), q, k)
                    print(f"{width} {name} cli: {json.dumps(sides[name]['cli'])}", flush=True)
        widths[width] = sides
    agree = in_process("agree") if a.device == "cpu" else dict(skipped="a check of equal work, run on CPU only (--device cpu)")
    floor = in_process("floor", a.widths, a.quantize, a.images)
    res = dict(widths=widths, ratios=ratios(widths), agreement=agree, floor=floor, settings=SETTINGS, prompt=PROMPT, version=dalle_nb.__version__,
               machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}", device=a.device, date=str(date.today()))
    md = table(widths) + "\n\n" + "\n".join(
        f"- {r['width']}, {r['images']} image(s): {r['side']} {r['speed']:.2f}× min-dalle's images/s, "
        f"{r['memory']:.2f}× its peak RSS" + (f", {r['gpu_memory']:.2f}× its peak GPU memory" if r.get("gpu_memory") else "")
        + (f", {r['first_image']:.2f}× its time to the first image" if r["first_image"] else "") for r in res["ratios"])
    if "skipped" not in agree: md += f"\n- greedy agreement at the small width: {agree.get('agree')}/{TOKENS} tokens (layers unrolled: {agree.get('agree_unrolled')}/{TOKENS}; unrolled and served, as `Pipeline` runs them: {agree.get('agree_served')}/{TOKENS})" + (f" ({agree['error']})" if "error" in agree else "")
    if "floors" in floor:
        m = floor["measured"]
        md += (f"\n\nThe floor of a token step on this machine (memory read {m['read_gb_s']:.0f} GB/s, matmul {m['float32_gflop_s']:.0f} GFLOP/s float32, "
               f"{m['bfloat16_gflop_s']:.0f} bfloat16, {m['int8_gop_s']:.0f} GOP/s int8, measured here): max(bytes ÷ bandwidth, FLOPs ÷ matmul rate)\n\n"
               "the cache read to the current position, the captions' keys/values once per distinct caption; \"staged\" is what the cache's stages read\n\n"
               "| width | weights | cache | rows | captions | weights read (MB) | KV read (MB) | staged KV read (MB) | GFLOP | floor (ms/token step) |\n"
               "|---|---|---|---|---|---|---|---|---|---|\n")
        md += "\n".join(f"| {f['width']} | {f['quantize']} | {f['cache']} | {f['rows']} | {f['captions']} | {f['weight_mb']:.0f} | {f['cache_mb']:.0f} | "
                         f"{f['layout_cache_mb']:.0f} | {f['gflop']:.2f} | {f['floor_ms']:.1f} |" for f in floor["floors"])
    clis = [(w, side, rep["cli"], next(r for r in rep["rows"] if r["images"] == rep["cli"]["images"])) for w, sides in widths.items()
            for side, rep in sides.items() if "cli" in rep and "error" not in rep["cli"]]
    for w, side, c, row in clis:
        md += (f"\n- {w}, {side}, `dalle-nb generate --n {c['images']}`: a first process {c['first_process_s']:.1f} s, the second (compiled programs "
               f"from the cache) {c['second_process_s']:.1f} s = {c['second_process_s'] / row['warm_s']:.2f}× a warm in-process call ({row['warm_s']:.1f} s)")
    print(md)
    if a.out:
        out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
        (out / "generate.json").write_text(json.dumps(res, indent=1))
        (out / "generate.md").write_text(md + "\n")
    return res


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]: print(json.dumps(child(sys.argv[2:])))
    else: main()
