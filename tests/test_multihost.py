"""Multi-host training through the real entry point: `dalle-nb train` as 2 processes on localhost, 2 CPU devices each
(`--coordinator/--num-processes/--process-id`), against 1 process with 4 devices on the same data.

Only the BART stage trains (a micro model directory with the other stages' models is written first), so each process
compiles one train step. Checked: both processes see the same global losses, equal to the 1-process run's; only
process 0 writes the history and the model directory; the checkpoint holds shards written by both processes.
"""
import json, shutil, socket, subprocess, sys
from pathlib import Path
import pytest
from dalle_nb.config import MICRO_SIZES
from conftest import one_device_env

EXE = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))

SETS = ["data.n_train=64", "data.n_val=64",          # one shape for the training and validation images: one encoder compile
        *MICRO_SIZES,
        "bart_train.steps=4", "bart_train.batch_size=8", "bart_train.log_every=1", "bart_train.eval_every=4",
        "bart_train.ckpt_every=2", "bart_train.warmup_steps=1", "bart_train.blank_caption_prob=0.25"]


def make_model_dir(workdir: Path):
    "The other stages' models (random weights) and the tokenizer, as `train_all` would have left them."
    from flax import nnx
    from dalle_nb.config import get_config
    from dalle_nb.shapes import make_split
    from dalle_nb.text import TextEncoder, train_tokenizer
    from dalle_nb.vqgan import VQGAN
    from dalle_nb.bart import DalleBart
    from dalle_nb.clip import CLIP
    from dalle_nb.modeldir import Models, save_models, _materialise
    from dalle_nb.sharding import sharded_init, mesh_from_spec
    cfg = get_config("tiny", SETS)
    _, captions = make_split("train", cfg.data.n_train, cfg.data.seed)
    text = TextEncoder(train_tokenizer(captions, vocab_size=min(cfg.bart.text_vocab, cfg.clip.text_vocab)), cfg.bart.max_text_len)
    vqgan = sharded_init(lambda: VQGAN(cfg.vqgan, rngs=nnx.Rngs(0)), mesh_from_spec("dp=1"))   # one compile, not one per array
    zeros = lambda cls, c: _materialise(nnx.eval_shape(lambda: cls(c, rngs=nnx.Rngs(0))))        # retrained / unused here
    models = Models(cfg, text, vqgan, zeros(DalleBart, cfg.bart), zeros(CLIP, cfg.clip))
    save_models(workdir / "model", models, card="# micro\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(workdir: Path, devices: int, extra=(), cache=None):
    env = {**one_device_env(devices), "JAX_PLATFORMS": "cpu",
           "DALLE_NB_CACHE": str(cache or workdir / ".cache")}
    args = [EXE, "train", "--workdir", str(workdir), "--stages", "bart", "--mesh", "dp=4", "--quiet",
            *(a for s in SETS for a in ("--set", s)), *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(p, what):
    try: out, err = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill(); out, err = p.communicate()
    assert p.returncode == 0, f"{what} failed ({p.returncode}):\n{err[-4000:]}"
    return out


def test_two_processes_train_like_one(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    make_model_dir(two)
    shutil.copytree(two / "model", one / "model")

    port = free_port()
    procs = [launch(two, 2, ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i)],
                    cache=tmp_path / f"cache{i}") for i in range(2)]
    outs = [finish(p, f"process {i} of 2") for i, p in enumerate(procs)]
    finish(single := launch(one, 4), "the 1-process run")

    # only process 0 prints, writes the history and the model directory
    assert "model directory:" in outs[0] and "model directory:" not in outs[1]
    assert [p.name for p in two.glob("history_*.json")] == ["history_bart.json"]
    hist2 = json.loads((two / "history_bart.json").read_text())
    assert len(hist2) == 4 and (two / "model" / "bart.msgpack").stat().st_mtime > (two / "model" / "vqgan.msgpack").stat().st_mtime

    # each process logged the same global numbers
    logs = [[json.loads(l) for l in (two / "bart" / f"log.process-{i}.jsonl").read_text().splitlines()] for i in range(2)]
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]
    assert strip(logs[0]) == strip(logs[1]) == strip(hist2)

    # ... equal to one process holding all four devices
    hist1 = json.loads((one / "history_bart.json").read_text())
    for a, b in zip(hist2, hist1):
        assert a["step"] == b["step"]
        for k in ("loss", "accuracy", "grad_norm", "val_loss"):
            if k in b: assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (k, a, b)

    # the checkpoint was written by both processes (each its own shards)
    names = {p.name for p in (two / "bart" / "ckpt" / "4").rglob("*")}
    assert any("process_1" in n for n in names) and any("process_0" in n for n in names), sorted(names)


def test_the_eight_gpu_layout_trains_like_one_device(tmp_path):
    """The 8 x H100 plan (BENCHMARKS.md, "Training on GPUs"): the journal's recipe (Distributed Shampoo, full remat,
    gradient accumulation) in the layout compiled for 8 H100s, as `dalle-nb train --mesh fsdp=8` on 8 fake CPU devices,
    against the same run on one device: the same losses, step for step."""
    eight, one = tmp_path / "eight", tmp_path / "one"
    make_model_dir(eight)
    shutil.copytree(eight / "model", one / "model")
    recipe = [x for s in ("bart_train.optimizer=shampoo", "bart.remat=full", "bart_train.grad_accum=2",
                          "bart_train.batch_size=16") for x in ("--set", s)]
    finish(launch(eight, 8, [*recipe, "--mesh", "fsdp=8"], cache=tmp_path / "cache8"), "fsdp=8 on 8 devices")
    finish(launch(one, 1, [*recipe, "--mesh", "dp=1"], cache=tmp_path / "cache1"), "one device")
    h8, h1 = (json.loads((d / "history_bart.json").read_text()) for d in (eight, one))
    assert [r["step"] for r in h8] == [r["step"] for r in h1] == [1, 2, 3, 4]
    for a, b in zip(h8, h1):
        for k in ("loss", "accuracy", "grad_norm", "val_loss"):
            if k in b: assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), (k, a, b)
