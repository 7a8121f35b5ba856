"""Token shards end to end (`dalle_nb.dataset`): encoding folders, webdataset tars and parquet into shards, bad input,
resumable encoding, streaming to several hosts, resuming exactly together with a training checkpoint, and the CLI.

Every file is made here: shapes images from `dalle_nb.shapes`, photos bundled with scikit-image. The shipped model's
VQGAN (64 × 64 → 8 × 8 codes) encodes; pytest runs with 8 fake CPU devices (conftest), so encoding is sharded."""
import io, json, shutil, subprocess, sys, tarfile
from pathlib import Path
import numpy as np
import pytest
import jax, jax.numpy as jnp
import pyarrow as pa, pyarrow.parquet as pq
from PIL import Image
from conftest import one_device_env, cli_cache
from flax import nnx

from dalle_nb.dataset import (encode_to_shards, open_source, decode_image, read_shard, shard_tokens, shard_files,
                              ShardedEncoder, ShardError, EncodeError, MANIFEST)
from dalle_nb.stream import TokenLoader
from dalle_nb.shapes import make_split
from dalle_nb.vqgan import psnr

EXE = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))


@pytest.fixture(scope="module")
def models():
    from dalle_nb.modeldir import load_models
    return load_models()


def image_bytes(img, fmt="PNG") -> bytes:
    buf = io.BytesIO(); Image.fromarray(img).save(buf, format=fmt); return buf.getvalue()


def photos():
    "scikit-image's bundled photos: RGB, greyscale and RGBA (no download)."
    import skimage.data as d
    return {"astronaut": d.astronaut(), "chelsea": d.chelsea(), "coffee": d.coffee(), "camera": d.camera(), "logo": d.logo()}


def write_folder(root: Path, images, captions, fmt="png"):
    root.mkdir(parents=True, exist_ok=True)
    for i, (im, c) in enumerate(zip(images, captions)):
        (root / f"{i:04d}.{fmt}").write_bytes(image_bytes(im, "JPEG" if fmt == "jpg" else "PNG"))
        (root / f"{i:04d}.txt").write_text(c)
    return root


def table(out: Path) -> dict:
    "All rows of a token dataset, in shard order."
    t = pa.concat_tables([read_shard(f) for f, _ in shard_files(out)])
    return {**t.to_pydict(), "encoding": shard_tokens(t["encoding"])}


encode_jit = nnx.jit(lambda m, x: m.encode(jnp.asarray(x, jnp.float32) / 255.0))
decode_jit = nnx.jit(lambda m, t: m.decode(t))


def test_round_trip_images_tokens_images(models, tmp_path):
    imgs, caps = make_split("val", 20, seed=5)
    root = write_folder(tmp_path / "in", imgs, caps)
    ph = photos()
    for name, im in ph.items():
        (root / f"photo_{name}.png").write_bytes(image_bytes(im)); (root / f"photo_{name}.txt").write_text(f"a photo: {name}")
    man = encode_to_shards(root, tmp_path / "tok", models, batch_size=8, shard_size=10, progress=False)
    assert ShardedEncoder(models, batch_size=8).n_devices == jax.local_device_count() == 8    # the batch was split over 8
    assert (man["rows"], man["skipped"], man["complete"], len(man["shards"])) == (25, {}, True, 3)
    rows = table(tmp_path / "tok")
    # the stored codes are exactly what the VQGAN gives the same centre-cropped pixels, whatever the batch split
    pixels = np.stack([decode_image((root / k).read_bytes(), 64) for k in rows["key"]])
    assert (rows["encoding"] == np.asarray(encode_jit(models.vqgan, pixels))).all()
    assert rows["encoding"].dtype == np.int32 and rows["encoding"].shape == (25, models.cfg.vqgan.n_tokens)
    # tokens → images: the shapes come back (the shipped VQGAN reaches ~32 dB on shapes); re-encoding the decoded
    # images gives codes that decode to the same pictures, far above the reconstruction error (the shipped factored
    # VQGAN: 98% of the codes equal; a plain VQGAN's flat background has near-twins in the codebook, so fewer)
    shapes = np.array([not k.startswith("photo_") for k in rows["key"]])
    recon = np.asarray(decode_jit(models.vqgan, jnp.asarray(rows["encoding"])))
    order = [int(k[:4]) for k in np.array(rows["key"])[shapes]]
    first = float(psnr(recon[shapes], imgs[order] / 255.0))
    again = np.asarray(encode_jit(models.vqgan, (recon * 255 + 0.5).astype(np.uint8)))
    second = float(psnr(np.asarray(decode_jit(models.vqgan, jnp.asarray(again)))[shapes], recon[shapes]))
    print(f"shapes: PSNR {first:.1f} dB; re-encoded codes equal {(again[shapes] == rows['encoding'][shapes]).mean():.0%}, "
          f"their images {second:.1f} dB from the first decoding; photos: PSNR {float(psnr(recon[~shapes], pixels[~shapes] / 255.0)):.1f} dB")
    assert first > 24.0 and second > first + 3
    assert (again[shapes] == rows["encoding"][shapes]).mean() > 0.5
    # photos: greyscale and RGBA arrive as RGB; a shapes VQGAN draws them poorly, but the round trip is well-formed
    assert recon[~shapes].shape == (5, 64, 64, 3) and np.isfinite(recon).all()
    logo = decode_image((root / "photo_logo.png").read_bytes(), 64)
    assert logo.shape == (64, 64, 3) and logo[0, 0].tolist() == [255, 255, 255]        # transparent corner → white


def test_tar_and_parquet_sources_give_the_folder_rows(models, tmp_path):
    imgs, caps = make_split("train", 6, seed=2)
    write_folder(tmp_path / "folder", imgs, caps, fmt="jpg")
    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "shard-000.tar", "w") as tf:
        for i in range(6):
            for ext, payload in (("jpg", (tmp_path / "folder" / f"{i:04d}.jpg").read_bytes()), ("txt", caps[i].encode())):
                info = tarfile.TarInfo(f"{i:04d}.{ext}"); info.size = len(payload); tf.addfile(info, io.BytesIO(payload))
    hf_style = [{"bytes": (tmp_path / "folder" / f"{i:04d}.jpg").read_bytes(), "path": None} for i in range(6)]
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"img": hf_style, "text": caps}), tmp_path / "pq" / "pairs.parquet", row_group_size=4)
    got = {}
    for name, src in [("folder", open_source(tmp_path / "folder")), ("wds", open_source(tmp_path / "wds")),
                      ("pq", open_source([tmp_path / "pq" / "pairs.parquet"], image_column="img", caption_column="text"))]:
        man = encode_to_shards(src, tmp_path / f"tok_{name}", models, batch_size=4, shard_size=4, clip_score=True, progress=False)
        assert man["source"]["kind"] == {"folder": "folder", "wds": "webdataset", "pq": "parquet"}[name]
        got[name] = table(tmp_path / f"tok_{name}")
    for name in ("wds", "pq"):
        assert got[name]["caption"] == got["folder"]["caption"] == caps
        assert (got[name]["encoding"] == got["folder"]["encoding"]).all()
        np.testing.assert_allclose(got[name]["clip_score"], got["folder"]["clip_score"], rtol=1e-5)
    assert got["wds"]["key"][:2] == ["shard-000.tar:0000", "shard-000.tar:0001"] and got["pq"]["key"][5] == "pairs.parquet#5"


def test_corrupt_images_are_counted_not_fatal(models, tmp_path):
    imgs, caps = make_split("train", 6, seed=4)
    root = write_folder(tmp_path / "in", imgs, caps, fmt="jpg")
    jpg = (root / "0001.jpg").read_bytes()
    (root / "0001.jpg").write_bytes(jpg[: len(jpg) // 3])              # truncated JPEG
    (root / "0002.jpg").write_bytes(b"<html>not found</html>")         # not an image at all
    (root / "0003.png").write_bytes(b"")                               # empty file
    (root / "0003.txt").write_text("an empty file")
    (root / "0004.txt").unlink()                                       # no caption
    (root / "0005.txt").write_text("   \n")                            # blank caption
    man = encode_to_shards(root, tmp_path / "tok", models, batch_size=4, shard_size=3, progress=False)
    assert man["rows"] == 2 and man["skipped"] == {"corrupt": 3, "no_caption": 2} and man["complete"]
    why = {e["key"]: e["why"] for s in man["shards"] for e in s["errors"]}
    assert why == {"0001.jpg": "corrupt", "0002.jpg": "corrupt", "0003.png": "corrupt", "0004.jpg": "no_caption", "0005.jpg": "no_caption"}
    rows = table(tmp_path / "tok")                                     # 0003.jpg shares 0003.txt with the empty 0003.png
    assert rows["key"] == ["0000.jpg", "0003.jpg"] and rows["caption"] == [caps[0], "an empty file"]


class Interrupted(Exception): pass


class Recording:
    "A source that records the ranges asked of it, and can fail after `fail_after` records (a killed job)."
    def __init__(self, src, fail_after=None):
        self.src, self.fail_after, self.asked, self.n = src, fail_after, [], 0
        self.errors = src.errors
    def __len__(self): return len(self.src)
    def describe(self): return self.src.describe()
    def iter_range(self, a, b):
        self.asked.append((a, b))
        for p in self.src.iter_range(a, b):
            if self.fail_after is not None and self.n == self.fail_after: raise Interrupted
            self.n += 1
            yield p


def test_resumable_encode_skips_finished_shards(models, tmp_path):
    imgs, caps = make_split("train", 22, seed=6)
    root = write_folder(tmp_path / "in", imgs, caps)
    out, ref = tmp_path / "tok", tmp_path / "ref"
    with pytest.raises(Interrupted):                                   # killed in the middle of shard 2 (records 10..14)
        encode_to_shards(Recording(open_source(root), fail_after=12), out, models, batch_size=4, shard_size=5, progress=False)
    man = json.loads((out / MANIFEST).read_text())
    assert [s["file"] for s in man["shards"]] == ["part-00000.parquet", "part-00001.parquet"] and not man["complete"]
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST, "part-00000.parquet", "part-00001.parquet"]
    (out / "part-00002.parquet.tmp").write_bytes(b"half a shard")      # what a crash during a write leaves
    (out / "part-00001.parquet").unlink()                              # a finished shard lost since
    stamp = (out / "part-00000.parquet").stat().st_mtime_ns
    rec = Recording(open_source(root))
    man = encode_to_shards(rec, out, models, batch_size=4, shard_size=5, progress=False)
    assert rec.asked == [(5, 10), (10, 15), (15, 20), (20, 22)]        # shard 0 not read again
    assert (out / "part-00000.parquet").stat().st_mtime_ns == stamp
    assert man["complete"] and man["rows"] == 22 and not list(out.glob("*.tmp"))
    assert [r["shards_to_encode"] for r in man["runs"]] == [5, 4]
    encode_to_shards(root, ref, models, batch_size=4, shard_size=5, progress=False)      # one uninterrupted run
    a, b = table(out), table(ref)
    assert a["key"] == b["key"] and (a["encoding"] == b["encoding"]).all()
    with pytest.raises(EncodeError, match="another shard size"):
        encode_to_shards(root, out, models, shard_size=7, progress=False)


def write_token_shards(root: Path, sizes, n_tokens=4, seed=0):
    "Parquet shards (no manifest) with an `id` column: shard k holds `sizes[k]` rows with consecutive ids."
    root.mkdir(parents=True, exist_ok=True)
    rng, start = np.random.default_rng(seed), 0
    for k, n in enumerate(sizes):
        ids = np.arange(start, start + n); start += n
        codes = rng.integers(0, 1024, (n, n_tokens)).astype(np.int16)
        codes[:, 0] = ids % 1024
        caps = [f"a {['red', 'blue', 'green'][i % 3]} circle" for i in ids]
        pq.write_table(pa.table({"caption": caps, "id": ids, "clip_score": rng.random(n).astype(np.float32),
                                 "encoding": pa.FixedSizeListArray.from_arrays(pa.array(codes.reshape(-1)), n_tokens)}),
                       root / f"part-{k:05d}.parquet")
    return root, start


@pytest.mark.parametrize("hosts", [2, 3])
def test_hosts_split_every_row_exactly_once(models, tmp_path, hosts):
    root, n = write_token_shards(tmp_path / "d", [13, 7, 20, 1, 9, 16, 11])
    loaders = [TokenLoader(root, 2 * hosts, models.text, seed=3, shuffle_buffer=10, columns=["id"],
                           process_index=i, process_count=hosts) for i in range(hosts)]
    for epoch in range(2):
        seen = []
        for ld in loaders:
            rows = []
            while len(rows) < (epoch + 1) * ld.rows_per_epoch:
                rows += next(ld)["id"].tolist()
            mine = rows[epoch * ld.rows_per_epoch:(epoch + 1) * ld.rows_per_epoch]
            assert len(set(mine)) == len(mine)                          # no duplicates within a host's epoch
            seen += mine
            ld.restore({**ld.state(), "step": 0})
        assert sorted(seen) == list(range(n))                           # together: every row, exactly once
    with pytest.raises(ValueError, match="cannot be split over 8"):
        TokenLoader(root, 8, models.text, process_index=0, process_count=8)


def test_loader_filters_and_blanking(models, tmp_path):
    root, n = write_token_shards(tmp_path / "d", [10, 10, 10])
    full = pa.concat_tables([pq.read_table(p) for p in sorted(root.glob("*.parquet"))]).to_pydict()
    ld = TokenLoader(root, 4, models.text, seed=0, clip_range=(0.25, 0.75), columns=["id", "clip_score"], process_index=0, process_count=1)
    want = sorted(i for i, s in zip(full["id"], full["clip_score"]) if 0.25 <= s <= 0.75)
    got = np.concatenate([next(ld)["id"] for _ in range(-(-len(want) // 4))])[:len(want)]
    assert sorted(got.tolist()) == want
    b = next(TokenLoader(root, 30, models.text, seed=1, blank_prob=1.0, process_index=0, process_count=1))
    assert (b["text"] == models.text.blank(1)).all()
    b = next(TokenLoader(root, 30, models.text, seed=1, columns=["id"], process_index=0, process_count=1))
    assert (b["text"] == models.text([full["caption"][i] for i in b["id"]])).all()      # normalised + tokenised on the fly
    assert b["text"].dtype == b["image"].dtype == np.int32
    more, _ = write_token_shards(tmp_path / "e", [5, 5])                          # ids 0..9 again, in a second directory
    both = TokenLoader([root, more], 8, models.text, columns=["id"], process_index=0, process_count=1)
    assert both.rows_per_epoch == 40 and both.state()["shards"] == 5


def test_resume_with_training_checkpoint_is_exact(models, tmp_path):
    """A `fit` run stopped at step 3 (`until=3`) and resumed from its checkpoint gives the batches and losses of an
    uninterrupted run: the loader's position travels in the checkpoint's JSON."""
    from dalle_nb.config import StageConfig
    from dalle_nb.train import fit
    from dalle_nb.optim import make_optimizer
    from dalle_nb.bart import bart_loss
    from dalle_nb.sharding import mesh_from_spec
    root, _ = write_token_shards(tmp_path / "d", [9, 14, 6, 11], n_tokens=models.cfg.bart.image_len)
    cfg = StageConfig(steps=6, batch_size=4, lr=1e-3, warmup_steps=1, log_every=1, eval_every=100, ckpt_every=100, mesh="dp=1")
    loss_fn = lambda m, b, k: bart_loss(m, b["text"], b["image"])
    def train(workdir, until=None):
        model, seen = nnx.clone(models.bart), []
        loader = TokenLoader.on_mesh(root, 4, mesh_from_spec(cfg.mesh), models.text, seed=7, shuffle_buffer=8, blank_prob=0.25,
                                     clip_range=(0.1, 1.0))
        hist = fit(model, make_optimizer(cfg), loss_fn, loader, cfg, workdir=workdir, progress=False, until=until,
                   hooks=[lambda s, m, b: seen.append((s, np.asarray(b["text"]), np.asarray(b["image"])))])
        return hist, seen
    whole, whole_seen = train(tmp_path / "a")
    first, first_seen = train(tmp_path / "b", until=3)
    rest, rest_seen = train(tmp_path / "b")
    assert [s for s, *_ in first_seen + rest_seen] == [s for s, *_ in whole_seen] == [1, 2, 3, 4, 5, 6]
    for (_, t1, i1), (_, t2, i2) in zip(first_seen + rest_seen, whole_seen):
        assert (t1 == t2).all() and (i1 == i2).all()
    assert [r["step"] for r in rest] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([r["loss"] for r in rest], [r["loss"] for r in whole], rtol=1e-6)
    assert any((t == models.text.blank(1)).all(1).any() for _, t, _ in whole_seen)   # blanking happened, identically


def test_bad_shards_are_named(models, tmp_path):
    imgs, caps = make_split("train", 12, seed=8)
    out = tmp_path / "tok"
    encode_to_shards(write_folder(tmp_path / "in", imgs, caps), out, models, batch_size=4, shard_size=4, progress=False)
    open_loader = lambda: TokenLoader(out, 2, models.text, process_index=0, process_count=1)
    good = (out / "part-00001.parquet").read_bytes()
    (out / "part-00001.parquet").write_bytes(good[: len(good) // 2])                # truncated
    with pytest.raises(ShardError, match=r"part-00001\.parquet: not a readable parquet shard"):
        open_loader()
    (out / "part-00001.parquet").unlink()
    with pytest.raises(ShardError, match=r"part-00001\.parquet: no such shard"):
        open_loader()
    man = json.loads((out / MANIFEST).read_text())
    (out / "part-00001.parquet").write_bytes(good)
    man["shards"][2]["rows"] += 1                                                    # manifest and file disagree
    (out / MANIFEST).write_text(json.dumps(man))
    with pytest.raises(ShardError, match=r"part-00002\.parquet: 4 rows, but the manifest says 5"):
        open_loader()
    (out / MANIFEST).write_text("{not json")
    with pytest.raises(ShardError, match=r"manifest\.json: not a readable manifest"):
        open_loader()


def run_cli(*args, cwd):
    env = one_device_env(DALLE_NB_CACHE=cli_cache(cwd))
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_cli_encode_folder(tmp_path):
    imgs, caps = make_split("train", 5, seed=9)
    write_folder(tmp_path / "pics", imgs, caps)
    (tmp_path / "pics" / "0003.png").write_bytes(b"broken")
    r = run_cli("encode", "pics", "--out", "tok", "--shard-size", "2", "--batch-size", "4", "--clip-score", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "encoded 3 shard(s), 0 already done: 4 rows in 3 shard(s), 1 record(s) skipped (1 corrupt)" in r.stdout
    man = json.loads((tmp_path / "tok" / MANIFEST).read_text())
    assert man["rows"] == 4 and man["model"]["name"] == "shapes" and man["runs"][0]["command"].startswith("dalle-nb encode pics")
    assert read_shard(tmp_path / "tok" / "part-00000.parquet").column_names == ["key", "caption", "encoding", "clip_score"]
    r = run_cli("encode", "nowhere", "--out", "o", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip() == "dalle-nb: error: nowhere: no such file or directory"
    assert not (tmp_path / "o").exists()
