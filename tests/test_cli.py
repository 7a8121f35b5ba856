"""The installed `dalle-nb` console script, run as a user would: in a subprocess, with the shipped model."""
import os, shutil, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
from PIL import Image

EXE = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))


def run(*args, cwd=None):
    env = {**os.environ, "DALLE_NB_CACHE": str(Path(cwd or ".") / ".cache")}
    env.pop("XLA_FLAGS", None)          # one CPU device, as a user's shell has (conftest's 8 fake devices are for the mesh tests)
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def test_generate_writes_pngs_best_first(tmp_path):
    r = run("generate", "a red circle above a blue square", "--n", "6", "--rerank", "3", "--seed", "2", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    files = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert files == ["grid.png", "image_00.png", "image_01.png", "image_02.png"]
    img = np.asarray(Image.open(tmp_path / "o" / "image_00.png"))
    assert img.shape == (64, 64, 3) and img.std() > 0
    assert "clip scores" in r.stdout
    scores = [float(s) for s in r.stdout.split("clip scores:")[1].split()[:3]]
    assert scores == sorted(scores, reverse=True)


def test_same_seed_same_images(tmp_path):
    a = run("generate", "a green square", "--n", "2", "--rerank", "0", "--seed", "7", "--out", str(tmp_path / "a"), cwd=tmp_path)
    b = run("generate", "a green square", "--n", "2", "--rerank", "0", "--seed", "7", "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert a.returncode == b.returncode == 0
    for name in ("image_00.png", "image_01.png"):
        assert (np.asarray(Image.open(tmp_path / "a" / name)) == np.asarray(Image.open(tmp_path / "b" / name))).all()


@pytest.mark.parametrize("args, message", [
    (["generate", "", "--out", "o"], "prompt is empty"),
    (["generate", "\U0001F642\x07 ", "--out", "o"], "prompt is empty"),
    (["generate", "a red circle", "--n", "0", "--out", "o"], "--n must be"),
    (["generate", "a red circle", "--n", "-3", "--out", "o"], "--n must be"),
    (["generate", "a red circle", "--n", "2", "--rerank", "9", "--out", "o"], "--rerank must be"),
    (["generate", "a red circle", "--model", "no/such/dir", "--out", "o"], "does not exist"),
    (["train", "--workdir", "w", "--set", "bart.d_model=abc"], "bart.d_model=abc"),
    (["train", "--workdir", "w", "--preset", "huge"], "unknown preset"),
])
def test_user_mistakes_are_one_line_errors(tmp_path, args, message):
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("dalle-nb: error:") and message in lines[0], r.stderr
    assert not (tmp_path / "o").exists()          # nothing written for a rejected request


def test_corrupt_model_directory(tmp_path):
    from dalle_nb.modeldir import default_model_dir
    bad = tmp_path / "model"
    shutil.copytree(default_model_dir(), bad)
    data = (bad / "bart.msgpack").read_bytes()
    (bad / "bart.msgpack").write_bytes(data[: len(data) // 3])
    r = run("generate", "a red circle", "--model", str(bad), "--out", "o", cwd=tmp_path)
    assert r.returncode == 2 and "bart.msgpack" in r.stderr and "Traceback" not in r.stderr


def test_long_prompt_and_unusual_text(tmp_path):
    r = run("generate", "a red circle " * 800, "--n", "1", "--rerank", "0", "--out", "long", cwd=tmp_path)
    assert r.returncode == 0 and "truncated" in r.stderr
    r = run("generate", "un zèbre 🦓 au café", "--n", "1", "--out", "odd", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "odd" / "grid.png").exists()


def test_info():
    r = run("info")
    assert r.returncode == 0 and "parameters:" in r.stdout and "dalle_nb model" in r.stdout


MICRO = ["data.n_train=256", "data.n_val=64",
         "vqgan.ch=8", "vqgan.z_channels=8", "vqgan.embed_dim=8", "vqgan.n_embed=32", "vqgan.norm_groups=4",
         "bart.image_codes=32", "bart.image_vocab=32", "bart.d_model=32", "bart.encoder_layers=1", "bart.decoder_layers=1",
         "bart.heads=2", "bart.glu_dim=32",
         "clip.vision_width=32", "clip.vision_layers=1", "clip.vision_heads=2", "clip.vision_mlp=64", "clip.text_width=32",
         "clip.text_layers=1", "clip.text_heads=2", "clip.text_mlp=64", "clip.embed_dim=16",
         *(f"{s}_train.{k}={v}" for s in ("vqgan", "decoder", "bart", "clip")
           for k, v in (("steps", 8), ("batch_size", 16), ("log_every", 4), ("eval_every", 8), ("warmup_steps", 2)))]


def test_train_then_retrain_one_stage_then_generate(tmp_path):
    sets = [a for o in MICRO for a in ("--set", o)]
    r = run("train", "--workdir", str(tmp_path / "w"), *sets, "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    model = tmp_path / "w" / "model"
    assert f"model directory: {model}" in r.stdout
    r = run("train", "--workdir", str(tmp_path / "w"), *sets, "--set", "clip_train.steps=12", "--set", "clip_train.shampoo_start=4",
            "--set", "clip_train.shampoo_every=3", "--optimizer", "shampoo", "--stages", "clip", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    card = (model / "MODEL_CARD.md").read_text()
    made = [l for l in card.splitlines() if l.startswith("- `dalle-nb train")]
    assert len(made) == 2 and made[0].endswith("→ vqgan, decoder, bart, clip") and made[1].endswith("--stages clip` → clip")
    assert [l.split("|")[1].strip() for l in card.splitlines() if l.startswith("| ") and "stage" not in l] == ["vqgan", "decoder", "bart", "clip"]
    assert "| clip | 12 | 16 | shampoo |" in card and "| bart | 8 | 16 | adam |" in card
    r = run("generate", "a red circle", "--n", "2", "--model", str(model), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["grid.png", "image_00.png", "image_01.png"]
