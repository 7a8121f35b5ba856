"""Pod jobs (`dalle_nb.pod`, `dalle-nb pod …`) without a pod.

* the dry runs print exactly the gcloud commands, and names that break GCP's rules are refused with one line;
* hostile values (`"; rm -rf ~`, quotes, spaces, newlines, `$(…)`) in --set values, paths and environment variables
  reach `dalle-nb` on the worker unchanged, through a real `bash` (a stand-in `dalle-nb` records its arguments);
* `dalle-nb pod watch`, against a stand-in `gcloud` whose pod is preempted, recreates and relaunches, and gives up
  after --max-restarts;
* the local pod: `dalle-nb train --data SHARDS` as 2 processes joined by jax.distributed, started by `LocalPod` with
  the same entry point a TPU worker runs, trains the BART stage from token shards this test writes.

The fit check (`dalle_nb.fitcheck`, `dalle-nb pod fit`) is tested in tests/test_fitcheck.py.
"""
import contextlib, io, json, os, shlex, stat, subprocess, sys
from pathlib import Path
import numpy as np
import pytest

from dalle_nb import pod as P
from dalle_nb.cli import main

HOSTILE = ['"; rm -rf ~', "it's \"quoted\"", "two\nlines", "$(touch PWNED) `touch PWNED2`", "a  b", "*", "~", "", "\\"]


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_dry_run_prints_the_exact_commands():
    code, out, _ = cli("pod", "create", "dalle-mega", "--zone", "us-central1-a", "--provisioning", "preemptible", "--dry-run")
    assert code == 0
    assert out == ("$ gcloud compute tpus tpu-vm create dalle-mega --accelerator-type=v3-256 --version=tpu-ubuntu2204-base "
                   "--preemptible --zone=us-central1-a\n")
    code, out, _ = cli("pod", "delete", "dalle-mega", "--project", "my-project", "--dry-run")
    assert out == "$ gcloud compute tpus tpu-vm delete dalle-mega --quiet --zone=europe-west4-a --project=my-project\n"
    code, out, _ = cli("pod", "setup", "dalle-mega", "--wheel", "dist/dalle_nb-1.0-py3-none-any.whl", "--mount", "my-bucket", "--dry-run")
    lines = out.splitlines()
    assert lines[0] == ("$ gcloud compute tpus tpu-vm scp dist/dalle_nb-1.0-py3-none-any.whl dalle-mega:dalle_nb-1.0-py3-none-any.whl "
                        "--worker=all --zone=europe-west4-a")
    setup = shlex.split(lines[1][2:])
    assert setup[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "dalle-mega", "--worker=all"]
    assert "python3.11 -m venv" in setup[7] and "gcsfuse --implicit-dirs" in setup[7] and "/mnt/gcs/my-bucket" in setup[7]
    code, out, _ = cli("pod", "logs", "dalle-mega", "--run", "mega-1", "--dry-run")
    assert shlex.split(out[2:])[-2] == '--command=tail -n 100 -F "$HOME"/dalle_nb_runs/mega-1.log'
    code, out, _ = cli("pod", "watch", "dalle-mega", "--run", "mega-1", "--workdir", "gs://b-1/w", "--wheel", "d/dalle_nb-1-py3-none-any.whl", "--dry-run")
    verbs = [shlex.split(l[2:])[4] for l in out.splitlines() if l.startswith("$ ")]
    assert verbs == ["describe", "ssh", "delete", "create", "scp", "ssh", "ssh"] and out.rstrip().endswith("watch: dry run")


@pytest.mark.parametrize("argv, msg", [
    (["pod", "create", "Mega_Pod", "--dry-run"], "pod name 'Mega_Pod' is not allowed"),
    (["pod", "create", "mega; rm -rf ~", "--dry-run"], "pod name"),
    (["pod", "launch", "mega", "--run", "run 1", "--workdir", "/w", "--dry-run"], "run name 'run 1'"),
    (["pod", "launch", "mega", "--run", "r", "--workdir", "gs://Bad$Bucket/w", "--dry-run"], "bucket"),
    (["pod", "launch", "mega", "--run", "r", "--workdir", "/w", "--env", "X;Y=1", "--dry-run"], "environment variable"),
    (["pod", "create", "mega", "--zone", "us-central1-a\nls", "--dry-run"], "zone"),
    (["pod", "logs", "mega", "--run", "../x", "--dry-run"], "run name"),
    (["pod", "setup", "mega", "--wheel", "x; reboot.whl", "--dry-run"], "not a dalle_nb wheel"),
])
def test_bad_names_are_refused_in_one_line(argv, msg):
    code, out, err = cli(*argv)
    assert code == 2 and out == "" and err.startswith("dalle-nb: error:") and msg in err and err.count("\n") == 1


def test_hostile_values_reach_the_worker_unchanged(tmp_path):
    home = tmp_path / "home"
    (home / "dalle_nb_venv" / "bin").mkdir(parents=True)
    fake = home / "dalle_nb_venv" / "bin" / "dalle-nb"                   # what the remote PATH finds first
    fake.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "json.dump({'argv': sys.argv[1:], 'env': os.environ.get('XLA_FLAGS')}, open(os.environ['RECORD'], 'w'))\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    job = P.TrainJob("r1", str(tmp_path / "dir with 'quotes' and\nnewline"), sets=tuple(f"bart_train.x={h}" for h in HOSTILE),
                     data=("gs://bucket-1/tokens/it's here",), env=(("XLA_FLAGS", HOSTILE[0] + HOSTILE[3]),))
    dry = P.DryRun(echo=None)
    P.TPUPod(P.PodSpec("dalle-mega"), dry).launch(job)
    command = next(a for a in dry.commands[0] if a.startswith("--command=")).removeprefix("--command=")
    record = tmp_path / "argv.json"
    r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env={"HOME": str(home), "PATH": os.environ["PATH"], "RECORD": str(record)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(record.read_text())
    assert got["argv"] == P.worker_start_argv(job)[1:]
    assert got["env"] == HOSTILE[0] + HOSTILE[3]
    assert [a for a in got["argv"] if a.startswith("bart_train.x=")] == [f"bart_train.x={h}" for h in HOSTILE]
    assert "/mnt/gcs/bucket-1/tokens/it's here" in got["argv"]
    assert not list(tmp_path.rglob("PWNED*")) and home.exists()


FAKE_GCLOUD = """#!{python}
import json, os, sys
state = json.load(open(os.environ["FAKE_STATE"]))
state["calls"].append(sys.argv[1:])
cmd = next((a for a in sys.argv if a.startswith("--command=")), "")
out = ""
if "describe" in sys.argv: out = state["states"].pop(0) if state["states"] else "READY"
elif "worker-status" in cmd: out = state["statuses"].pop(0) if state["statuses"] else "exit 0"
json.dump(state, open(os.environ["FAKE_STATE"], "w"))
print(out)
"""


def fake_gcloud(tmp_path, states, statuses):
    bin_dir = tmp_path / "bin"; bin_dir.mkdir()
    g = bin_dir / "gcloud"
    g.write_text(FAKE_GCLOUD.format(python=sys.executable)); g.chmod(g.stat().st_mode | stat.S_IEXEC)
    st = tmp_path / "state.json"
    st.write_text(json.dumps({"states": states, "statuses": statuses, "calls": []}))
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_STATE": str(st)}, st


def run_watch(env, tmp_path, *extra):
    wheel = tmp_path / "dalle_nb-1-py3-none-any.whl"; wheel.write_bytes(b"")
    return subprocess.run([sys.executable, "-c", "import sys; from dalle_nb.cli import main; sys.exit(main())", "pod", "watch", "dalle-mega",
                           "--run", "mega-1", "--workdir", "/shared/w", "--wheel", str(wheel), "--poll", "0", *extra],
                          env=env, capture_output=True, text=True, timeout=120)


def test_watch_recreates_a_preempted_pod_and_relaunches(tmp_path):
    env, st = fake_gcloud(tmp_path, ["READY", "READY", "PREEMPTED", "CREATING", "READY", "READY"], ["absent", "running", "running", "exit 0"])
    r = run_watch(env, tmp_path)
    assert r.returncode == 0, r.stderr
    calls = json.loads(st.read_text())["calls"]
    verbs = [c[3] for c in calls]
    assert verbs == ["describe", "ssh", "ssh", "describe", "ssh", "describe", "delete", "create", "scp", "ssh", "ssh",
                     "describe", "describe", "ssh", "describe", "ssh"]
    launches = [c for c in calls if any("worker-start" in a for a in c)]
    assert len(launches) == 2 and launches[0] == launches[1]            # the same job: it resumes from its checkpoints
    assert "watch: PREEMPTED: relaunch 1 of at most 10" in r.stdout and r.stdout.rstrip().endswith("watch: done")


def test_watch_gives_up_after_max_restarts(tmp_path):
    env, st = fake_gcloud(tmp_path, ["PREEMPTED"] * 10, [])
    r = run_watch(env, tmp_path, "--max-restarts", "2")
    assert r.returncode == 1
    assert r.stdout.rstrip().endswith("watch: gave up after 2 relaunches: pod PREEMPTED")
    assert [c[3] for c in json.loads(st.read_text())["calls"]].count("create") == 2


# ---- the local pod: 2 processes, the BART stage on token shards

def write_shards(directory: Path, n_shards=4, rows=16, tokens=64, codes=32, seed=0):
    import pyarrow as pa, pyarrow.parquet as pq
    from dalle_nb.shapes import make_split
    directory.mkdir(parents=True)
    _, captions = make_split("train", n_shards * rows, seed)
    rng = np.random.default_rng(seed)
    for k in range(n_shards):
        enc = rng.integers(0, codes, (rows, tokens)).astype(np.int16)
        pq.write_table(pa.table({"caption": captions[k * rows:(k + 1) * rows],
                                 "encoding": pa.FixedSizeListArray.from_arrays(pa.array(enc.ravel()), tokens)}),
                       directory / f"part-{k:05d}.parquet")


def test_local_pod_trains_the_bart_on_token_shards(tmp_path):
    from test_multihost import make_model_dir, SETS
    work, shards = tmp_path / "work", tmp_path / "tokens"
    make_model_dir(work)
    write_shards(shards)
    job = P.TrainJob("local-1", str(work), preset="tiny", stages=("bart",), mesh="dp=4", sets=tuple(SETS), data=(str(shards),),
                     env=(("DALLE_NB_CACHE", str(tmp_path / "cache")),))
    lp = P.LocalPod(tmp_path / "pod", processes=2, devices=2, say=lambda *_: None)
    pids = lp.launch(job)
    assert len(pids) == 2 and lp.run_status("local-1") == ["running", "running"]
    status = lp.wait("local-1", timeout=600)
    assert status == ["exit 0", "exit 0"], lp.logs("local-1", 0) + "\n---\n" + lp.logs("local-1", 1)
    hist = json.loads((work / "history_bart.json").read_text())
    assert [r["step"] for r in hist] == [1, 2, 3, 4] and all(np.isfinite(r["loss"]) for r in hist)
    assert "val_loss" not in hist[-1]                                  # token shards: no validation set
    assert "model directory:" in lp.logs("local-1", 0) and "model directory:" not in lp.logs("local-1", 1)
    ckpt = work / "bart" / "ckpt" / "4"
    assert (ckpt / "state" / "ocdbt.process_0").exists() and (ckpt / "state" / "ocdbt.process_1").exists()   # both wrote shards
    state = json.loads((ckpt / "meta" / "metadata").read_text())["data"]       # the loader's position, split over 2 processes
    assert state["process_count"] == 2 and state["shards"] == 4 and state["step"] == 4


def test_data_with_the_wrong_token_length_is_one_line(tmp_path):
    from test_multihost import make_model_dir, SETS
    make_model_dir(tmp_path / "w")
    write_shards(tmp_path / "tok", tokens=16)
    code, out, err = cli("train", "--workdir", str(tmp_path / "w"), "--stages", "bart", "--mesh", "dp=1", "--quiet",
                         *(a for s in SETS for a in ("--set", s)), "--data", str(tmp_path / "tok"))
    assert code == 2 and "16 tokens per image" in err and "image_len is 64" in err and err.count("\n") == 1
