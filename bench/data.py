"""Throughput of `dalle-nb encode` (images → token shards) and of `TokenLoader` (token shards → training batches).

Encode: a folder of generated shapes PNGs (64 × 64, what the shipped model was trained on) and a folder of larger JPEG
photos (crops of scikit-image's bundled samples, 512 × 512, so decoding and resizing cost what they cost on real
data), each encoded by the shipped model's VQGAN (64 × 64 → 8 × 8 codes), with and without CLIP scores. Reported:
images per second end to end (read, decode, resize, encode on all local devices, write parquet), and the VQGAN alone.

Loader: synthetic token shards the size of DALL·E Mega's rows (256 codes, realistic captions), read with a shuffle
buffer and on-the-fly tokenisation (64 text tokens, as Mega), with and without a CLIP-score filter; plus the time to
`restore` at a deep step (a resumed run's start-up cost).

    python bench/data.py [--shapes 2048] [--photos 256] [--rows 200000] [--out bench/results/data]
"""
import argparse, json, os, platform, shutil, tempfile, time
from datetime import date
from pathlib import Path

import numpy as np


def timed(f, *a, **k):
    t = time.perf_counter(); r = f(*a, **k); return r, time.perf_counter() - t


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", type=int, default=2048, help="shapes PNGs to encode")
    p.add_argument("--photos", type=int, default=256, help="512 × 512 JPEG photos to encode")
    p.add_argument("--batch", type=int, default=64, help="encode batch size")
    p.add_argument("--rows", type=int, default=200_000, help="rows of synthetic token shards for the loader")
    p.add_argument("--shard-rows", type=int, default=10_000)
    p.add_argument("--loader-batch", type=int, default=256)
    p.add_argument("--loader-steps", type=int, default=200)
    p.add_argument("--model", default=None, help="model directory (default: the shipped model)")
    p.add_argument("--out", default="bench/results/data")
    a = p.parse_args(argv)

    import jax, jax.numpy as jnp
    from flax import nnx
    import pyarrow as pa, pyarrow.parquet as pq
    from PIL import Image
    from dalle_nb.modeldir import load_models
    from dalle_nb.shapes import make_split
    from dalle_nb.text import TextEncoder
    from dalle_nb.dataset import encode_to_shards, ShardedEncoder
    from dalle_nb.stream import TokenLoader

    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    models = load_models(a.model)
    work = Path(tempfile.mkdtemp(prefix="dalle_nb_bench_"))
    res = {"date": str(date.today()), "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.processor() or platform.platform()}",
           "devices": f"{jax.device_count()} × {jax.devices()[0].device_kind}", "load_average_at_start": os.getloadavg(),
           "jax": jax.__version__, "args": vars(a)}

    # ---- inputs
    imgs, caps = make_split("train", a.shapes, seed=11)
    shapes_dir = work / "shapes"; shapes_dir.mkdir()
    for i, (im, c) in enumerate(zip(imgs, caps)):
        Image.fromarray(im).save(shapes_dir / f"{i:06d}.png"); (shapes_dir / f"{i:06d}.txt").write_text(c)
    import skimage.data as skd
    srcs = [skd.astronaut(), skd.chelsea(), skd.coffee(), skd.rocket()]
    photo_dir = work / "photos"; photo_dir.mkdir()
    rng = np.random.default_rng(0)
    for i in range(a.photos):
        s = srcs[i % len(srcs)]
        big = np.asarray(Image.fromarray(s).resize((max(512, s.shape[1] * 512 // s.shape[0] + 1), 512)))
        x = rng.integers(0, big.shape[1] - 512 + 1)
        Image.fromarray(big[:, x:x + 512]).save(photo_dir / f"{i:06d}.jpg", quality=90); (photo_dir / f"{i:06d}.txt").write_text(f"photo {i}")

    # ---- encode
    enc = ShardedEncoder(models, a.batch)
    x = imgs[:enc.batch_size]
    enc(x); _, t = timed(lambda: [enc(x) for _ in range(5)])
    res["vqgan_only_images_per_s"] = 5 * enc.batch_size / t
    for name, folder, n in (("shapes_png_64", shapes_dir, a.shapes), ("photos_jpg_512", photo_dir, a.photos)):
        for clip in (False, True):
            d = work / f"tok_{name}_{clip}"
            shard = max(a.batch, n // 4 // a.batch * a.batch)       # whole batches per shard: no padded compute
            encode_to_shards(folder, d, models, batch_size=a.batch, shard_size=shard, clip_score=clip, progress=False)  # compile
            for f in d.iterdir(): f.unlink()
            man, t = timed(encode_to_shards, folder, d, models, batch_size=a.batch, shard_size=shard, clip_score=clip, progress=False)
            res[f"encode_{name}{'_clip' if clip else ''}_images_per_s"] = man["rows"] / t
            print(f"encode {name} clip={clip}: {man['rows'] / t:.0f} images/s ({man['rows']} in {t:.1f}s)", flush=True)

    # ---- loader
    tok = work / "tokens"; tok.mkdir()
    all_caps = make_split("train", 4096, seed=12)[1]
    r = np.random.default_rng(1)
    for k in range(0, a.rows, a.shard_rows):
        n = min(a.shard_rows, a.rows - k)
        codes = r.integers(0, 16384, (n, 256)).astype(np.int16)
        pq.write_table(pa.table({"key": [str(i) for i in range(k, k + n)], "caption": [all_caps[i % len(all_caps)] for i in range(k, k + n)],
                                 "encoding": pa.FixedSizeListArray.from_arrays(pa.array(codes.reshape(-1)), 256),
                                 "clip_score": r.random(n).astype(np.float32)}),
                       tok / f"part-{k // a.shard_rows:05d}.parquet", compression="zstd")
    res["shard_mb"] = sum(f.stat().st_size for f in tok.iterdir()) / 1e6 / len(list(tok.iterdir()))
    text = TextEncoder(models.text.tokenizer, 64)
    for label, kw in (("plain", {}), ("clip_filter", {"clip_range": (0.3, 1.0)})):
        ld, t_open = timed(TokenLoader, tok, a.loader_batch, text, seed=0, shuffle_buffer=16384, process_index=0, process_count=1, **kw)
        next(ld)
        _, t = timed(lambda: [next(ld) for _ in range(a.loader_steps)])
        res[f"loader_{label}_rows_per_s"] = a.loader_steps * a.loader_batch / t
        res[f"loader_{label}_open_s"] = t_open
        deep = 3 * ld.steps_per_epoch // 2
        _, t_seek = timed(lambda: (ld.restore({**ld.state(), "step": deep}), next(ld)))
        res[f"loader_{label}_restore_s"] = t_seek
        print(f"loader {label}: {res[f'loader_{label}_rows_per_s']:.0f} rows/s, open {t_open:.2f}s, restore at step {deep} + first batch {t_seek:.2f}s", flush=True)
    # tokenising alone, for comparison
    capb = all_caps[:a.loader_batch]
    text(capb); _, t = timed(lambda: [text(capb) for _ in range(50)])
    res["tokenise_only_rows_per_s"] = 50 * a.loader_batch / t
    res["load_average_at_end"] = os.getloadavg()
    (out / "data.json").write_text(json.dumps(res, indent=1))
    shutil.rmtree(work)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
