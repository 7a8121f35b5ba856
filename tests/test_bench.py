"""Every script in bench/ runs against the shipped model at its smallest and answers --help.

These are smoke tests: they check that each script still works and writes the results its BENCHMARKS.md section cites,
never what the numbers are (speed and quality are measured by the scripts, not asserted here). `generate.py`,
`peer_errors.py` and `progressive.py` have theirs beside the code they measure (tests/test_peers.py, which holds
peer_errors.py's figures to < 1e-4, and tests/test_pipeline.py).
"""
import json, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))


def run(script: str, *args, timeout: int = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / f"{script}.py"), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, cwd=ROOT)
    assert r.returncode == 0, f"bench/{script}.py {' '.join(map(str, args))}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.parametrize("script", SCRIPTS)
def test_answers_help(script):
    out = run(script, "--help", timeout=120).stdout
    assert out.startswith("usage:") and "--" in out


def test_imports_only_public_names():
    "A script reads the package as a user would: no private names, no reaching into tests/ or other scripts."
    import ast
    for p in (ROOT / "bench").glob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("dalle_nb"):
                private = [a.name for a in n.names if a.name.startswith("_")]
                assert not private and not any(part.startswith("_") for part in n.module.split(".")), f"{p.name}: {n.module} {private}"
            if isinstance(n, (ast.Import, ast.ImportFrom)):
                names = [n.module or ""] if isinstance(n, ast.ImportFrom) else [a.name for a in n.names]
                assert not any(m.split(".")[0] in ("tests", "bench") or m.startswith("test_") for m in names), f"{p.name} imports {names}"
        assert "sys.path.insert" not in p.read_text(), p.name


def test_quality_runs(tmp_path):
    run("quality", "--prompts", 1, "--n", 2, "--scales", 2, "--out", tmp_path)
    res = json.loads((tmp_path / "quality.json").read_text())
    assert [r["cond_scale"] for r in res["rows"]] == [2.0] * 3 and set(res["vqgan_roundtrip_accuracy"]) == {"one", "two", "heldout"}
    assert all(0 <= r["first"] <= 1 and r["prompts"] == 1 for r in res["rows"]) and (tmp_path / "quality.png").stat().st_size > 0


def test_quality_negative_runs(tmp_path):
    run("quality", "--negative", "a red circle", "--prompt", "a circle", "--prompts", 1, "--n", 2, "--scales", 2, "--out", tmp_path)
    rows = json.loads((tmp_path / "negative.json").read_text())["rows"]
    assert [(r["negative"], r["images"]) for r in rows] == [(None, 2), ("a red circle", 2)] and (tmp_path / "negative.md").exists()


def test_data_runs(tmp_path):
    run("data", "--shapes", 16, "--photos", 2, "--batch", 8, "--rows", 2000, "--shard-rows", 1000, "--loader-batch", 16,
        "--loader-steps", 4, "--out", tmp_path)
    res = json.loads((tmp_path / "data.json").read_text())
    assert res and all(v is not None for v in res.values())


def test_dvae_runs(tmp_path):
    run("dvae", "--steps", 2, "--n-val", 16, "--set", "data.n_train=64", "--workdir", tmp_path / "work", "--out", tmp_path / "out")
    res = json.loads((tmp_path / "out" / "dvae.json").read_text())
    assert len(res["rows"]) == 2 and (tmp_path / "out" / "dvae.md").exists()


def test_optimizers_runs(tmp_path):
    run("optimizers", "--steps", 2, "--batch", 8, "--n-train", 64, "--n-val", 16, "--adam-lrs", "1e-3", "--shampoo-lrs", "1e-3",
        "--eval-every", 1, "--out", tmp_path, *(x for v in ("d_model=32", "glu_dim=32", "heads=2", "encoder_layers=1", "decoder_layers=1")
                                                for x in ("--set", f"bart.{v}")))
    res = json.loads((tmp_path / "optimizers.json").read_text())
    assert res and (tmp_path / "optimizers.png").exists() and (tmp_path / "optimizers.md").exists()


def test_paper_techniques_runs(tmp_path):
    run("paper_techniques", "--steps", 2, "--batch", 8, "--ranks", 2, "--n-train", 16, "--n-val", 8, "--fp16-steps", 2,
        "--loss-scales", "2^-10", "--no-reference", "--layers", 1, "--d-model", 32, "--tail", 2, "--dp", 2, "--out", tmp_path)
    res = json.loads((tmp_path / "paper_techniques.json").read_text())
    assert {"date", "machine", "command", "jax", "powersgd", "fp16"} <= set(res)
    plain, psgd = res["powersgd"]
    assert (plain["rank"], psgd["rank"]) == (0, 2) and 0 < psgd["allreduce_bytes"] < plain["allreduce_bytes"]
    assert all(r["train_loss"] > 0 and r["step_s"] > 0 for r in res["powersgd"])
    assert [r["per_block"] for r in res["fp16"]] == [False, True] and all(0 <= r["frozen_fraction"] <= 1 for r in res["fp16"])
    assert res["fp16"][1]["overflowed_blocks_mean"] is not None and (tmp_path / "paper_techniques.png").stat().st_size > 0


def test_train_step_runs(tmp_path):
    run("train_step", "--stages", "vqgan", "--ynn", "package", "--rounds", 1, "--steps", 1, "--warmup", 0,
        "--set", "vqgan_train.batch_size=2", "--out", tmp_path)
    res = json.loads((tmp_path / "train_step.json").read_text())
    assert [(r["stage"], r["setting"], r["batch"]) for r in res["summary"]] == [("vqgan", "package", 2)]
    assert all(r["ms_median"] > 0 and r["gflop_per_step"] > 0 for r in res["summary"])
    (one,) = res["runs"]                      # the package's training flags reached the worker's XLA, on one device
    assert one["xla_flags"].endswith("ynn_fusion_type=-individual_convolution") and one["devices"] == 1
    assert (tmp_path / "train_step.md").read_text().count("| vqgan |") == 1


@pytest.mark.tpu
@pytest.mark.skipif(not __import__("dalle_nb.fitcheck").fitcheck.libtpu_available(), reason="libtpu is not installed (pip install -e '.[tpu]')")
def test_fit_check_runs(tmp_path):
    "bench/fit_check.py's Shampoo-state table for Mega on a v3-256 (shardings only; the compile path is tests/test_fitcheck.py's)."
    run("fit_check", "--shampoo-state", "--out", tmp_path / "fit_check.json")
    rows = json.loads((tmp_path / "shampoo_state.json").read_text())
    assert {r["layout"] for r in rows} == {"dp=32,mp=8", "fsdp=32,mp=8"} and len(rows) == 4
    assert all(0 < r["opt_gib"] < 16 and r["params_gib"] > 0 for r in rows)
    by = {(r["layout"], r["optimizer"]): r for r in rows}
    assert by["fsdp=32,mp=8", "Shampoo (preset)"]["params_gib"] < by["dp=32,mp=8", "Shampoo (preset)"]["params_gib"] / 8   # fsdp splits them 32 ways



def test_gpu_sh_cpu_smoke_and_train(tmp_path):
    "bench/gpu.sh --cpu-smoke: the device script's steps at tiny widths on CPU, every result under one folder; and the"
    "rows bench/train.py writes there (the BART stage's step at a micro width: timed, its FLOPs, peak memory and MFU)."
    r = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--cpu-smoke", str(tmp_path)], capture_output=True,
                       text=True, timeout=3000, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert dict(l.split() for l in (tmp_path / "steps.txt").read_text().splitlines()) == {
        "train": "0", "generate": "0", "decode_xla": "0", "pool16": "0"}
    assert (tmp_path / "devices.txt").read_text().strip() and not (tmp_path / "bin").exists()
    res = json.loads((tmp_path / "train" / "train.json").read_text())
    assert [(r["remat"], r["batch"]) for r in res["rows"]] == [("full", 2)] and "uncausal" in res["flops_convention"]
    (row,) = res["rows"]
    assert "error" not in row, row
    assert row["ms_per_step"] > 0 and 0 < row["mfu"] < 1 and row["peak_bytes"] > 0 and len(row["losses"]) == 3
    assert row["model_flops_per_step"] == 2 * row["model_flops_by_part"]["train_per_sample"]
    # full remat recomputes the forward pass: the compiled step does more FLOPs than the model's count (which has none)
    assert 1.15 * row["model_flops_per_step"] < row["hlo_flops_per_step"] < 1.5 * row["model_flops_per_step"]
    gen = json.loads((tmp_path / "generate" / "generate.json").read_text())
    ours = gen["widths"]["small"]["ours"]
    assert ours["rows"] and ours["cli"]["second_process_s"] > 0, ours        # and the second-process time
    xla = json.loads((tmp_path / "decode_xla" / "generate.json").read_text())["widths"]["small"]["ours (xla)"]
    assert xla["rows"] and xla["decode"] == "xla", xla                      # the alternative attention, by name
