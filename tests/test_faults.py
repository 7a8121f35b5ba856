"""The faults a user meets on the command line, on disk and in files (issue 45): each gives one line and nothing lost.

Property-based (hypothesis) over `generate`'s settings, PNG generation records and `config.json` values — run in-process
(`dalle_nb.cli.main`, the checking functions) with the drawing itself stubbed where a valid request would otherwise
compile: what is checked is that every request is either refused in one line, exit 2, nothing written, or accepted
with settings the sampler can take. Then the disk and the processes for real: a full disk on a small tmpfs (root only;
skipped elsewhere), two runs writing into one folder at once, and `kill -9` at random moments of `generate`, `encode`
and training followed by a re-run that completes with nothing duplicated or lost. docs/faults.md: the table of attempts.
"""
import contextlib, io, json, math, os, random, shutil, signal, subprocess, sys, time
from pathlib import Path
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image
import dalle_nb.pipeline as pipeline
from dalle_nb.cli import main
from dalle_nb.images import save_png
from dalle_nb.modeldir import ModelDirError, default_model_dir, load_models, _read_config
from conftest import one_device_env, cli_cache

EXE = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))
FAST = settings(max_examples=int(os.environ.get("DALLE_NB_FAULT_EXAMPLES", 60)), deadline=None,
                suppress_health_check=list(HealthCheck), derandomize=True)


def tally(kind: str, outcome: str):
    "Count one attempt for docs/faults.md's table (`bench/faults.py` sets DALLE_NB_FAULT_LOG; otherwise nothing)."
    if os.environ.get("DALLE_NB_FAULT_LOG"):
        with open(os.environ["DALLE_NB_FAULT_LOG"], "a") as f: f.write(json.dumps([kind, outcome]) + "\n")


def call(*argv):
    "`main(argv)` in this process: (exit status, stdout, stderr); argparse's own refusals come back as status 2."
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try: code = main([str(a) for a in argv])
        except SystemExit as e: code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def stubbed(tmp_path_factory):
    "The shipped model loaded once, and `Pipeline.stream` replaced by one final batch of grey images (no compiling)."
    models = pipeline.serving_models(load_models(unrolled=True, serve=True))
    mp = pytest.MonkeyPatch()
    mp.setattr(pipeline, "serving_models", lambda m, quantize=None: models)
    seen = []
    def stream(self, prompts, n=None, rerank=None, cond_scale=None, seed=0, temperature=None, top_k=None, top_p=None,
               plausibility=None, image_prompt=None, keep_rows=None, every=None, indices=None, pad_to=None, negative=None):
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        s = self.settings(n, rerank, cond_scale, seed, temperature, top_k, top_p, plausibility)   # the real checks
        self.image_prompt(image_prompt, keep_rows)
        self.encode_negative(negative, s["cond_scale"])
        seen.append(s)
        idx = np.arange(min(s["n"], 2)) if indices is None else np.asarray(indices)
        res = self.cfg.tokenizer_cfg.resolution
        p, i = np.repeat(np.arange(len(prompts)), len(idx)), np.tile(idx, len(prompts))
        grey, tokens = np.full((len(p), res, res, 3), 128, np.uint8), np.zeros((len(p), self.image_len), np.int32)
        scores = np.zeros(len(p), np.float32) if s["rerank"] else None
        yield pipeline.Step(p, i, grey, tokens, self.image_len, self.image_len, len(p), len(p), scores)
    mp.setattr(pipeline.Pipeline, "stream", stream)
    yield seen
    mp.undo()


def refused_cleanly(code, out, err, wrote: Path):
    "Exit 2, one line on stderr naming the problem, nothing written."
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[-1].startswith(("dalle-nb: error:", "dalle-nb generate: error:", "dalle-nb: error")), err
    assert len(lines[-1]) < 400, lines[-1]                   # a hostile value is named, not echoed whole
    assert not wrote.exists(), sorted(wrote.rglob("*"))


# ------------------------------------------------------------------------------------------------ the CLI's settings
FLAGS = ["--n", "--rerank", "--cond-scale", "--seed", "--temperature", "--top-k", "--top-p", "--plausibility",
         "--keep-rows", "--progressive", "--max-memory"]
VALUES = st.one_of(st.integers(-2**70, 2**70).map(str), st.integers(-3, 40).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr), st.floats(-2, 3).map(str),
                   st.sampled_from(["nan", "-inf", "1e999", "0x10", "", " ", "1_000", "٣", "9223372036854775808"]),
                   st.text(max_size=12))


@FAST
@given(st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), min_size=1, max_size=3))
def test_any_settings_are_refused_in_one_line_or_drawn_right(stubbed, tmp_path_factory, flags):
    out = tmp_path_factory.mktemp("s") / "out"
    argv = ["generate", "a red circle", "--out", out, "--quiet"] + [x for f, v in flags for x in (f"{f}={v}",)]
    before = len(stubbed)
    code, o, err = call(*argv)
    if code == 0:                                             # accepted: the sampler got finite numbers in range
        s = stubbed[before]
        assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in s.values()), s
        assert 1 <= s["n"] < 2**31 and 0 <= s["rerank"] <= s["n"] and s["temperature"] > 0 and 0 < s["top_p"] <= 1
        assert (out / "grid.png").exists() or (out / "grid-2.png").exists()
        tally("generate settings", "drawn with checked settings")
    else: refused_cleanly(code, o, err, out); tally("generate settings", "refused: one line, exit 2, nothing written")


def test_the_requests_of_the_issue(stubbed, tmp_path):
    "Item 6/8: each a sentence, before any work."
    png = save_png(np.zeros((8, 8, 3), np.uint8), tmp_path / "list.png", text={"dalle_nb": "[1, 2]"})
    for argv, says in [(["--n", "9223372036854775808"], "--n must be in [1, 2147483647]"),
                       (["--keep-rows", "0"], "--keep-rows needs an image prompt"),
                       (["--prompts", str(png)], "cannot read it")]:
        prompt = ["a red circle"] if "--prompts" not in argv else []
        code, o, err = call("generate", *prompt, *argv, "--out", tmp_path / "x")
        refused_cleanly(code, o, err, tmp_path / "x"); assert says in err, err
    code, o, err = call("generate", "a red circle", "--out", "")
    assert code == 2 and "--out is empty" in err and not any(Path(".").glob("a-red-circle_seed*.png"))
    code, o, err = call("generate", "--from", png, "--out", tmp_path / "x")
    refused_cleanly(code, o, err, tmp_path / "x"); assert "is not a record" in err
    code, o, err = call("train", "--workdir", png)
    refused_cleanly(code, o, err, tmp_path / "x"); assert "is a file" in err


# -------------------------------------------------------------------------------------------------- PNG records
SCALARS = st.none() | st.booleans() | st.integers(-2**66, 2**66) | st.floats(allow_nan=True) | st.text(max_size=8)
NEST = lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
JSON = st.recursive(SCALARS, NEST, max_leaves=8)
FIELDS = ["n", "rerank", "cond_scale", "seed", "temperature", "top_k", "top_p", "plausibility", "batch", "keep_rows",
          "image_prompt", "quantize"]


def record_png(path, rec) -> Path:
    return save_png(np.zeros((8, 8, 3), np.uint8), path, text={"dalle_nb": json.dumps(rec)})


@pytest.fixture(scope="module")
def good_record():
    settings = dict(n=2, rerank=0, cond_scale=2.0, seed=0, temperature=1.0, top_k=0, top_p=1.0, plausibility=0.0,
                    batch=2)
    return dict(prompt="a red circle", seed=0, index=1, rank=0, clip_score=None, model="shipped", version="x",
                tokens=[0] * 128, settings=settings)


@FAST
@given(st.one_of(
    st.tuples(st.just("settings"), st.sampled_from(FIELDS), JSON),                    # one setting made odd
    st.tuples(st.just("top"), st.sampled_from(["prompt", "index", "settings", "model", "seed"]), JSON),
    st.tuples(st.just("whole"), st.just(""), JSON)))                                  # the record itself any JSON value
def test_any_png_record_is_refused_in_one_line_or_drawn_right(stubbed, good_record, tmp_path_factory, change):
    where, key, value = change
    rec = json.loads(json.dumps(good_record))
    if where == "settings": rec["settings"][key] = value
    elif where == "top": rec[key] = value
    else: rec = value
    d = tmp_path_factory.mktemp("r")
    code, o, err = call("generate", "--from", record_png(d / "in.png", rec), "--out", d / "out")
    if code == 0:
        assert len(list((d / "out").glob("a-red-circle_seed*.png"))) == 1, sorted((d / "out").iterdir())
        assert f"seed {rec['settings'].get('seed', 0)}," in o                        # the seed used, not the record's
        tally("PNG records (--from)", "drawn again, one PNG")
    else:
        refused_cleanly(code, o, err, d / "out")
        tally("PNG records (--from)", "refused: one line, exit 2, nothing written")


def test_a_record_asking_for_a_batch_past_memory_is_refused(stubbed, good_record, tmp_path):
    "Item 1: `settings.batch` 10⁹ would ask XLA for gigabytes; -5 ended in an IndexError."
    for batch, says in [(10**9, "MiB are free"), (-5, "settings.batch must be >= 1")]:
        rec = {**good_record, "settings": {**good_record["settings"], "batch": batch}}
        code, o, err = call("generate", "--from", record_png(tmp_path / f"b{batch}.png", rec), "--out", tmp_path / "o")
        refused_cleanly(code, o, err, tmp_path / "o"); assert says in err, err


# -------------------------------------------------------------------------------------------------- config.json
SHIPPED = json.loads((default_model_dir() / "config.json").read_text())
SECTIONS = [k for k, v in SHIPPED.items() if isinstance(v, dict)]


@st.composite
def config_change(draw):
    "A path into the shipped config (a section and maybe a field) and a new value for it."
    sec = draw(st.sampled_from(SECTIONS + ["name", "arch"]))
    whole = not isinstance(SHIPPED[sec], dict) or draw(st.booleans())
    field = None if whole else draw(st.sampled_from(sorted(SHIPPED[sec])))
    odd = st.sampled_from([0, 1, 10**7, "128", "object", float("nan")])
    value = draw(st.one_of(JSON, st.integers(-2**40, 2**40), odd))
    return sec, field, value


@FAST
@given(config_change())
def test_any_config_value_is_refused_in_one_line_or_loads(tmp_path_factory, change):
    sec, field, value = change
    cfg = json.loads(json.dumps(SHIPPED))
    if field is None: cfg[sec] = value
    else: cfg[sec][field] = value
    d = tmp_path_factory.mktemp("c")
    for f in ("config.json", "tokenizer.json"): shutil.copy(default_model_dir() / f, d / f)
    (d / "config.json").write_text(json.dumps(cfg))
    for f in ("vqgan.msgpack", "bart.msgpack"): (d / f).write_bytes(b"")   # _read_config checks presence only
    t0 = time.perf_counter()
    try: c = _read_config(d)
    except ModelDirError as e:
        assert "\n" not in str(e) and len(str(e)) < 600, str(e)
        tally("config.json values", "refused: one line, before building")
    else:
        tally("config.json values", "loaded, every float finite")
        from dataclasses import fields, is_dataclass
        def finite(o):
            for f in fields(o):
                v = getattr(o, f.name)
                if is_dataclass(v): finite(v)
                elif isinstance(v, float): assert math.isfinite(v), f.name
        finite(c)
    assert time.perf_counter() - t0 < 30                       # refused before anything is built


# -------------------------------------------------------------------------------------------- processes, disks
def run(*args, cwd, timeout=600, **popen):
    env = one_device_env(DALLE_NB_CACHE=cli_cache(cwd))
    return subprocess.run([EXE, *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def pngs_whole(folder: Path) -> list[str]:
    "Names of the PNGs in `folder`, after checking each one opens and no temporary file is left."
    assert not [p.name for p in folder.rglob("*.tmp")], sorted(p.name for p in folder.rglob("*"))
    names = sorted(p.name for p in folder.glob("*.png"))
    for n in names: Image.open(folder / n).load()
    return names


@pytest.fixture
def tiny_disk(tmp_path):
    "A 1 MiB tmpfs (root only: skipped elsewhere)."
    d = tmp_path / "disk"; d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0: pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode})")
    yield d
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_a_full_disk_is_one_line_and_keeps_what_is_finished(tiny_disk, tmp_path):
    "Item 5: fill the tmpfs but ~100 KB, ask for 32 images with frames: one line, exit 1, every file left whole."
    (tiny_disk / "filler").write_bytes(b"\0" * (1024 * 1024 - 100 * 1024))
    r = run("generate", "a red circle", "--n", "32", "--rerank", "0", "--progressive", "64", "--out", tiny_disk / "o",
            "--quiet", cwd=tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    last = r.stderr.strip().splitlines()[-1]
    assert "Traceback" not in r.stderr and "No space left" in last
    assert last.startswith("dalle-nb: error: cannot write into")
    kept = pngs_whole(tiny_disk / "o")
    n = len([n for n in kept if n.startswith("a-red")])
    assert f"kept the {n} finished image(s)" in last and n > 0, (last, kept)
    if (tiny_disk / "o" / "progress.gif").exists(): Image.open(tiny_disk / "o" / "progress.gif").load()
    tally("full disk: generate --progressive", f"one line, exit 1; {len(kept)} whole PNG(s) kept, no temporary file")


def test_two_runs_into_one_folder(tmp_path):
    "Item 4: two `generate` at once into one --out, same prompt, other settings: both finish, neither loses a file."
    out, env = tmp_path / "o", one_device_env(DALLE_NB_CACHE=cli_cache(tmp_path))
    cmds = [[EXE, "generate", "a red circle", "--n", str(n), "--rerank", "0", "--out", str(out), "--quiet"]
            for n in (3, 4)]
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
             for c in cmds]
    results = [(p.wait(600), *p.communicate()) for p in procs]
    assert all(code == 0 for code, _, _ in results), [err[-2000:] for _, _, err in results]
    names = pngs_whole(out)
    listed = [o.split("in candidate order: ")[1].split("\n")[0].split() for _, o, _ in results]   # --rerank 0
    assert sorted(sum(listed, [])) + ["grid-2.png", "grid.png"] == names, (listed, names)
    for files in listed:                                  # each run's files carry its own settings
        assert len({json.loads(Image.open(out / f).text["dalle_nb"])["settings"]["n"] for f in files}) == 1
    tally("two generate runs into one --out", f"both exit 0; {len(names)} files, none replaced or lost")


def kill_at_random(cmd, cwd, env, rng, low, high):
    "Start `cmd`, SIGKILL it after a random moment in [low, high] s (or let it end first); its exit status."
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd, env=env)
    try: p.wait(rng.uniform(low, high))
    except subprocess.TimeoutExpired: p.send_signal(signal.SIGKILL)
    return p.wait()


def test_generate_killed_at_random_then_rerun(tmp_path):
    "SIGKILL anywhere in `generate`; the same command again finishes with each image once (the killed run's adopted)."
    rng, env = random.Random(45), one_device_env(DALLE_NB_CACHE=cli_cache(tmp_path))
    args = ["generate", "a blue square", "--n", "6", "--rerank", "3", "--out", str(tmp_path / "o"), "--quiet"]
    first = run(*args, cwd=tmp_path)                      # also warms the compile cache
    assert first.returncode == 0, first.stderr
    want = pngs_whole(tmp_path / "o")
    shutil.rmtree(tmp_path / "o")
    for trial in range(2):
        killed = kill_at_random([EXE, *args], tmp_path, env, rng, 1.0, 9.0)
        again = run(*args, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert pngs_whole(tmp_path / "o") == want         # the same files, none twice (no -2 names), none lost
        tally("kill -9 in generate, then the same command",
              "re-run exit 0, the same files once each" + (" (ran to the end first)" if killed == 0 else ""))
        shutil.rmtree(tmp_path / "o")


def _encode_args(tmp_path, n: int, seed: int) -> list:
    "`dalle-nb encode` over a folder of `n` captioned shapes pictures written under `tmp_path`, in shards of 8."
    from dalle_nb.shapes import make_split
    imgs, caps = make_split("val", n, seed=seed)
    src = tmp_path / "pics"; src.mkdir()
    for i, (im, c) in enumerate(zip(imgs, caps)):
        save_png(im, src / f"{i:03d}.png"); (src / f"{i:03d}.txt").write_text(c)
    return [EXE, "encode", str(src), "--out", str(tmp_path / "tok"), "--shard-size", "8", "--batch-size", "8", "--quiet"]


def test_encode_killed_at_random_then_rerun(tmp_path):
    "SIGKILL anywhere in `encode`; the same command again has every record exactly once."
    import pyarrow.parquet as pq
    args = _encode_args(tmp_path, 40, seed=3)
    env, rng = one_device_env(DALLE_NB_CACHE=cli_cache(tmp_path)), random.Random(7)
    for trial in range(2):
        code = kill_at_random(args, tmp_path, env, rng, 2.0, 10.0)
        tally("kill -9 in encode", "killed" if code else "ran to the end")
    r = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    man = json.loads((tmp_path / "tok" / "manifest.json").read_text())
    read = lambda s: pq.read_table(tmp_path / "tok" / s["file"], columns=["key"])["key"].to_pylist()
    keys = [k for s in man["shards"] for k in read(s)]
    assert sorted(keys) == [f"{i:03d}.png" for i in range(40)] and man["rows"] == 40
    assert not list((tmp_path / "tok").glob("*.tmp"))
    tally("kill -9 in encode", "re-run exit 0, every record once")


def test_train_killed_at_random_then_resumed(tmp_path):
    "SIGKILL at a random moment of `fit` (test_preemption.py's run); resuming reproduces the uninterrupted losses."
    import test_preemption as tp
    ref = tp.run(tmp_path / "ref", "none", tmp_path / "ref.json")
    assert ref.returncode == 0, ref.stderr
    work, out, rng = tmp_path / "work", tmp_path / "out.json", random.Random(11)
    env = {**one_device_env(2), "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    kill_at_random([sys.executable, str(tp.HERE), str(work), "none", str(out)], tmp_path, env, rng, 3.0, 12.0)
    r = tp.run(work, "none", out)
    assert r.returncode == 0, r.stderr
    strip = lambda rows: [{k: v for k, v in row.items() if k != "seconds"} for row in rows]
    assert strip(json.loads(out.read_text())) == strip(json.loads((tmp_path / "ref.json").read_text()))
    tally("kill -9 in training, then resume", "the uninterrupted run's losses, bit for bit")


def test_a_full_disk_during_a_checkpoint_is_one_error_and_no_partial_checkpoint(tiny_disk, capfd):
    "Item 5 (train): orbax fails on a full tmpfs; one `CheckpointError`, little on stderr, the last checkpoint kept."
    import jax.numpy as jnp
    from dalle_nb.checkpoint import Checkpointer, CheckpointError
    ck = Checkpointer(tiny_disk / "ckpt")
    ck.save(1, {"w": jnp.ones(8)}, {"step": 1})
    capfd.readouterr()
    with pytest.raises(CheckpointError, match="checkpoint 2 could not be written .*No space left on device") as e:
        noise = jnp.asarray(np.random.default_rng(0).normal(size=2**20), jnp.float32)   # 4 MiB that do not compress
        ck.save(2, {"w": noise}, {"step": 2})
    assert "\n" not in str(e.value) and len(capfd.readouterr().err) < 2000
    assert sorted(p.name for p in (tiny_disk / "ckpt").iterdir()) == ["1"]
    assert Checkpointer(tiny_disk / "ckpt").latest == 1
    tally("full disk: a training checkpoint", "one CheckpointError line; no partial checkpoint, the last one kept")


def test_ctrl_c_in_encode_is_one_line_and_resumes(tmp_path):
    "Item 6: SIGINT during `encode` gave a KeyboardInterrupt traceback; now one line, exit 130, and a re-run finishes."
    args = _encode_args(tmp_path, 48, seed=5)
    env = one_device_env(DALLE_NB_CACHE=cli_cache(tmp_path))
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    while not (tmp_path / "tok" / "manifest.json").exists() and p.poll() is None: time.sleep(0.05)   # it has begun
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=600)
    if p.returncode == 0: pytest.skip("encode finished before the interrupt reached it")
    assert p.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("dalle-nb: interrupted"), err
    r = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0 and json.loads((tmp_path / "tok" / "manifest.json").read_text())["rows"] == 48, r.stderr
    tally("Ctrl-C in encode", "one line, exit 130; the re-run completes")


def test_a_long_prompt_is_named_not_echoed_and_warned_once(tmp_path):
    "Item 8: a 100,000-character prompt: the truncation warning once, no line of output longer than a screen."
    r = run("generate", "a red circle " * 7700, "--n", "1", "--rerank", "0", "--out", tmp_path / "o", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("truncated") == 1 and "warnings.warn" not in r.stderr, r.stderr
    assert max(len(line) for line in (r.stdout + r.stderr).splitlines()) < 300
    tally("a 100,000-character prompt", "drawn; warned once; no line over 300 characters")
