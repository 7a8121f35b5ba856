"""The installed `dalle-nb` console script, run as a user would: in a subprocess, with the shipped model."""
import json, re, shutil, signal, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest
from PIL import Image
import dalle_nb
from dalle_nb.config import MICRO_SIZES
from conftest import one_device_env, cli_cache

EXE = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))


def run(*args, cwd=None):
    env = one_device_env(DALLE_NB_CACHE=cli_cache(cwd or "."))   # conftest's 8 fake devices are for the mesh tests
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def best_first(stdout):
    "The file names `generate` lists: best first, or in candidate order with `--rerank 0`."
    return re.search(r"(?:best first|in candidate order): (.*)", stdout).group(1).split()


def test_generate_writes_pngs_best_first_that_remember(tmp_path):
    r = run("generate", "a red circle above a blue square", "--n", "6", "--rerank", "3", "--seed", "2", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    names = best_first(r.stdout)
    assert "best first: " in r.stdout
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == sorted(names + ["grid.png"])
    assert all(re.fullmatch(r"a-red-circle-above-a-blue-square_seed2_000[0-5]\.png", n) for n in names) and len(names) == 3
    img = np.asarray(Image.open(tmp_path / "o" / names[0]))
    assert img.shape == (64, 64, 3) and img.std() > 0
    scores = [float(s) for s in r.stdout.split("clip scores:")[1].split()[:3]]
    assert scores == sorted(scores, reverse=True)
    text = Image.open(tmp_path / "o" / names[1]).text                      # PNG text chunks
    assert text["prompt"] == "a red circle above a blue square" and text["seed"] == "2" and text["model"] == "shipped"
    rec = json.loads(text["dalle_nb"])
    assert rec["rank"] == 1 and abs(rec["clip_score"] - scores[1]) < 1e-3 and rec["version"] == dalle_nb.__version__
    assert rec["settings"]["n"] == 6 and rec["settings"]["rerank"] == 3 and rec["settings"]["cond_scale"] == 2.0
    assert f"_seed2_{rec['index']:04d}.png" in names[1] and len(rec["tokens"]) == 128
    # the same image again, from its file alone
    again = run("generate", "--from", str(tmp_path / "o" / names[1]), "--out", str(tmp_path / "again"), cwd=tmp_path)
    assert again.returncode == 0 and "the same tokens as recorded" in again.stdout, again.stderr
    assert (np.asarray(Image.open(tmp_path / "again" / names[1])) == np.asarray(Image.open(tmp_path / "o" / names[1]))).all()


def test_same_seed_same_images(tmp_path):
    a = run("generate", "a green square", "--n", "2", "--rerank", "0", "--seed", "7", "--out", str(tmp_path / "a"), cwd=tmp_path)
    b = run("generate", "a green square", "--n", "2", "--rerank", "0", "--seed", "7", "--out", str(tmp_path / "b"), cwd=tmp_path)
    assert a.returncode == b.returncode == 0
    names = [f"a-green-square_seed7_{i:04d}.png" for i in range(2)]
    assert best_first(a.stdout) == best_first(b.stdout) == names and "in candidate order: " in a.stdout   # --rerank 0: no ranking
    for name in names:
        assert (np.asarray(Image.open(tmp_path / "a" / name)) == np.asarray(Image.open(tmp_path / "b" / name))).all()


def test_quantized_generation_remembers_its_form(tmp_path):
    "`--quantize int8` draws with int8 weights, says so in each PNG's record, and `--from` draws the same image with them again."
    r = run("generate", "a blue triangle", "--n", "2", "--rerank", "0", "--quantize", "int8", "--out", str(tmp_path / "q"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    name = best_first(r.stdout)[0]
    assert json.loads(Image.open(tmp_path / "q" / name).text["dalle_nb"])["settings"]["quantize"] == "int8"
    again = run("generate", "--from", str(tmp_path / "q" / name), "--out", str(tmp_path / "again"), cwd=tmp_path)
    assert again.returncode == 0 and "the same tokens as recorded" in again.stdout, again.stderr
    bad = run("generate", "a blue triangle", "--quantize", "int4", "--out", str(tmp_path / "x"), cwd=tmp_path)
    assert bad.returncode == 2 and "invalid choice: 'int4'" in bad.stderr


@pytest.mark.parametrize("args, message", [
    (["generate", "", "--out", "o"], "prompt is empty"),
    (["generate", "\U0001F642\x07 ", "--out", "o"], "prompt is empty"),
    (["generate", "a red circle", "--n", "0", "--out", "o"], "--n must be"),
    (["generate", "a red circle", "--n", "-3", "--out", "o"], "--n must be"),
    (["generate", "a red circle", "--n", "2", "--rerank", "9", "--out", "o"], "--rerank must be"),
    (["generate", "a red circle", "--model", "no/such/dir", "--out", "o"], "does not exist"),
    (["generate", "a red circle", "--cond-scale", "nan", "--out", "o"], "--cond-scale must be a finite number, got nan"),
    (["generate", "a red circle", "--cond-scale=-inf", "--out", "o"], "--cond-scale must be a finite number"),
    (["generate", "a red circle", "--temperature", "0", "--out", "o"], "--temperature must be > 0"),
    (["generate", "a red circle", "--top-p", "nan", "--out", "o"], "--top-p must be a finite number"),
    (["generate", "a red circle", "--top-k", "100000", "--out", "o"], "--top-k must be in [0,"),
    (["generate", "a red circle", "--plausibility", "2", "--out", "o"], "--plausibility must be in [0, 1]"),
    (["generate", "a red circle", "--seed", "-1", "--out", "o"], "--seed must be in [0,"),
    (["generate", "a red circle", "--keep-rows", "2", "--out", "o"], "--keep-rows needs an image prompt"),
    (["generate", "a red circle", "--image-prompt", "nothing.png", "--out", "o"], "no such image file"),
    (["generate", "a red circle", "--image-prompt", "notes.txt", "--out", "o"], "--image-prompt cannot be read"),
    (["generate", "a red circle", "--image-prompt", "tiny.png", "--out", "o"], "--image-prompt is too small"),
    (["generate", "a red circle", "--progressive", "0", "--out", "o"], "--progressive must be >= 1"),
    (["generate", "--out", "o"], "give one prompt"),
    (["generate", "a red circle", "--prompts", "p.txt", "--out", "o"], "give one prompt"),
    (["generate", "--prompts", "empty.txt", "--out", "o"], "no prompts in it"),
    (["generate", "--prompts", "bad.txt", "--out", "o"], "prompt 2"),
    (["generate", "--from", "nothing.png", "--out", "o"], "no such file"),
    (["generate", "--from", "tiny.png", "--out", "o"], "no dalle_nb generation record"),
    (["generate", "a red circle", "--out", "/proc/nope/o"], "--out /proc/nope/o: cannot write there"),
    (["generate", "a red circle", "--out", "notes.txt"], "--out notes.txt: cannot write there"),
    (["train", "--workdir", "w", "--set", "bart.d_model=abc"], "bart.d_model=abc"),
    (["train", "--workdir", "w", "--preset", "huge"], "unknown preset"),
])
def test_user_mistakes_are_one_line_errors(tmp_path, monkeypatch, capsys, args, message):
    "Every mistake through `main` in this process (the console script is `main`; a subprocess each cost ~6 s)."
    from dalle_nb import cli
    _mistake_files(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "_enable_compile_cache", lambda: None)     # leave this process's jax config alone
    code = cli.main(args)
    err = capsys.readouterr().err
    _one_line_error(code, err, message)
    assert not (tmp_path / "o").exists()          # nothing written for a rejected request


@pytest.mark.parametrize("args, message", [
    (["generate", "a red circle", "--cond-scale", "nan", "--out", "o"], "--cond-scale must be a finite number, got nan"),
    (["generate", "a red circle", "--out", "/proc/nope/o"], "--out /proc/nope/o: cannot write there"),
    (["generate", "a red circle", "--image-prompt", "tiny.png", "--out", "o"], "--image-prompt is too small"),
])
def test_user_mistakes_from_the_console_script(tmp_path, args, message):
    "A few of the same, as a user's shell meets them: one line on stderr, exit status 2, no traceback."
    _mistake_files(tmp_path)
    r = run(*args, cwd=tmp_path)
    assert "Traceback" not in r.stderr
    _one_line_error(r.returncode, r.stderr, message)
    assert not (tmp_path / "o").exists()


def _mistake_files(d):
    (d / "notes.txt").write_text("not an image")
    (d / "empty.txt").write_text("# only a comment\n\n")
    (d / "bad.txt").write_text("a red circle\n\U0001F642\n")
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(d / "tiny.png")


def _one_line_error(code, stderr, message):
    assert code == 2, stderr
    lines = [l for l in stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("dalle-nb: error:") and message in lines[0], stderr


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
    unseen = [l for l in r.stderr.splitlines() if "never saw" in l]      # the shipped model knows the shapes' words only
    assert unseen == ["dalle-nb: warning: 'un zèbre 🦓 au café': the model never saw un, zebre, au, cafe "
                      "(it knows shapes' words: dalle-nb info lists them)"], r.stderr


def test_info():
    from dalle_nb.shapes import PALETTE, SHAPES, SIZES, RELATIONS
    r = run("info")
    assert r.returncode == 0 and "parameters:" in r.stdout and "dalle_nb model" in r.stdout
    assert r.stdout.startswith("jax backend: cpu; 1 device(s): cpu:0") and "\ncompilation cache: " in r.stdout   # the doctor first
    assert (f"colours: {', '.join(PALETTE)}; shapes: {', '.join(SHAPES)}; sizes: {', '.join(SIZES)}; "
            f"relations: {', '.join(RELATIONS)}") in r.stdout


def test_no_tpu_probe_noise_without_an_accelerator(tmp_path):
    "With libtpu installed and no TPU or GPU, a `dalle-nb` command prints nothing on stderr (libtpu's errors included)."
    from dalle_nb.cli import accelerator_here
    from dalle_nb.fitcheck import libtpu_available
    if not libtpu_available() or accelerator_here(): pytest.skip("needs libtpu installed and no TPU or GPU here")
    env = one_device_env(drop=("JAX_PLATFORMS",), ALLOW_MULTIPLE_LIBTPU_LOAD="1",   # another process's libtpu lock would hide the probe
                         DALLE_NB_CACHE=cli_cache(tmp_path))
    r = subprocess.run([EXE, "info"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_readme_gives_the_shipped_recipes_time():
    "The README's time for `--preset shapes` is the sum of the stages' minutes on the shipped model card (`dalle-nb info`)."
    from dalle_nb.modeldir import default_model_dir
    card = (default_model_dir() / "MODEL_CARD.md").read_text()
    rows = [l.split("|") for l in card.splitlines() if l.startswith("| ") and not l.startswith("| stage")]
    minutes = round(sum(float(r[5]) for r in rows))
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert f"--preset shapes --workdir runs/s # the shipped model, one command ({minutes} minutes" in readme


MICRO = ["data.n_train=256", "data.n_val=64", *MICRO_SIZES,
         *(f"{s}_train.{k}={v}" for s in ("vqgan", "decoder", "bart", "clip")
           for k, v in (("steps", 8), ("batch_size", 16), ("log_every", 4), ("eval_every", 8), ("warmup_steps", 2)))]


def test_train_then_retrain_one_stage_then_generate(tmp_path):
    sets = [a for o in MICRO for a in ("--set", o)]
    r = run("train", "--workdir", str(tmp_path / "w"), *sets, "--powersgd", "2", "--quiet", cwd=tmp_path)   # the BART with PowerSGD
    assert r.returncode == 0, r.stderr
    model = tmp_path / "w" / "model"
    assert f"model directory: {model}" in r.stdout
    r = run("train", "--workdir", str(tmp_path / "w"), *sets, "--set", "clip_train.steps=12", "--set", "clip_train.shampoo_start=4",
            "--set", "clip_train.shampoo_every=3", "--optimizer", "shampoo", "--stages", "clip", "--quiet", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    card = (model / "MODEL_CARD.md").read_text()
    made = [l for l in card.splitlines() if l.startswith("- `dalle-nb train")]
    assert len(made) == 2 and made[0].endswith("--powersgd 2` → vqgan, decoder, bart, clip") and made[1].endswith("--stages clip` → clip")
    assert [l.split("|")[1].strip() for l in card.splitlines() if l.startswith("| ") and "stage" not in l] == ["vqgan", "decoder", "bart", "clip"]
    assert "| clip | 12 | 16 | shampoo |" in card and "| bart | 8 | 16 | adam |" in card
    for s in ("vqgan", "decoder", "bart", "clip"):          # each stage's history travels with the model: the run's, whole
        kept = json.loads((model / f"history_{s}.json").read_text())
        assert kept == json.loads((tmp_path / "w" / f"history_{s}.json").read_text()), s
        assert [r["step"] for r in kept if "loss" in r][-1] == (12 if s == "clip" else 8) and kept[-1]["loss"] < kept[0]["loss"], (s, kept)
    r = run("generate", "a red circle", "--n", "2", "--model", str(model), "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a-red-circle_seed0_0000.png", "a-red-circle_seed0_0001.png", "grid.png"]


def test_ctrl_c_keeps_every_finished_image(tmp_path):
    "A long run interrupted as a user would (SIGINT): every batch already drawn is on disk, whole, with a grid; exit status 130."
    env = one_device_env(DALLE_NB_CACHE=cli_cache(tmp_path))
    out = tmp_path / "o"
    p = subprocess.Popen([EXE, "generate", "a red circle", "--n", "100000", "--rerank", "0", "--out", str(out)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None and len(list(out.glob("a-red-circle_*.png"))) < 16:
        time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 130, (stdout, stderr)
    assert "memory: about" in stderr and ("image/s" in stderr or "s/image" in stderr)     # the estimate, then a progress bar with its rate
    kept = int(stderr.split("interrupted: kept the ")[1].split()[0])
    files = sorted(out.glob("a-red-circle_seed0_*.png"))
    assert kept == len(files) >= 16, (kept, len(files))                                 # the first batch of 16, at least
    assert [f.name for f in files] == [f"a-red-circle_seed0_{i:04d}.png" for i in range(kept)]
    for f in files: assert np.asarray(Image.open(f)).shape == (64, 64, 3)              # none half written
    assert (out / "grid.png").exists() and not list(out.glob(".*.tmp"))


def test_progressive_frames_and_prompts_file(tmp_path):
    (tmp_path / "prompts.txt").write_text("a red circle\na blue square above a green circle\n")
    r = run("generate", "--prompts", "prompts.txt", "--n", "3", "--rerank", "2", "--progressive", "32", "--out", "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a-blue-square-above-a-green-circle", "a-red-circle", "progress", "progress.gif"]
    for d in ("a-red-circle", "a-blue-square-above-a-green-circle"):
        assert len(list((tmp_path / "o" / d).glob("*_seed0_*.png"))) == 2 and (tmp_path / "o" / d / "grid.png").exists()
    frames = sorted((tmp_path / "o" / "progress").iterdir())
    assert len(frames) == 4                                                 # 6 rows in one batch: 32, 64, 96 tokens, done
    first, last = (np.asarray(Image.open(f)) for f in (frames[0], frames[-1]))
    assert (first == 128).mean() > 0.5 and (last == 128).mean() < 0.05       # grey where nothing is drawn yet, then none
    gif = Image.open(tmp_path / "o" / "progress.gif")
    assert gif.is_animated and gif.n_frames >= 4


def test_importing_prints_nothing_alarming(tmp_path):
    "No banner from transformers (\"PyTorch was not found\") or JAX when a user imports the package and generates."
    code = ("import dalle_nb.pipeline, dalle_nb.cli\n"
            "from transformers.utils import logging\n"
            "logging.get_logger('transformers').warning_advice('PyTorch was not found.')\n"   # what transformers prints without torch
            "dalle_nb.pipeline.Pipeline()('a red circle', n=1, rerank=0)\n")
    env = one_device_env(drop=("TRANSFORMERS_NO_ADVISORY_WARNINGS",))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.strip() == "", r.stderr


def test_the_flags_offer_every_serving_form():
    "`generate` and `gpu fit` list the forms `Linear.serve` and the decode cache take (literal, so `--help` imports no JAX)."
    import argparse
    from dalle_nb.bart import CACHE_DTYPES
    from dalle_nb.cli import build_parser
    from dalle_nb.layers import QUANTIZE

    def command(p, *names):
        for name in names: p = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        return {o: a.choices for a in p._actions for o in a.option_strings}
    gen, fit = command(build_parser(), "generate"), command(build_parser(), "gpu", "fit")
    assert (tuple(gen["--quantize"]), tuple(gen["--cache"])) == (QUANTIZE[1:], CACHE_DTYPES)
    assert (tuple(fit["--quantize"]), tuple(fit["--cache"])) == (("none", *QUANTIZE[1:]), CACHE_DTYPES)
