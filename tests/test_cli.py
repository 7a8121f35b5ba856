"""The installed `dalle-nb` console script, run as a user would: in a subprocess, with the shipped model."""
import os, shutil, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
from PIL import Image

EXE = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))


def run(*args, cwd=None):
    env = {**os.environ, "DALLE_NB_CACHE": str(Path(cwd or ".") / ".cache")}
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
