"""Run every notebook in nbs/ as its own test, each in a fresh subprocess (what `nbdev-test` does per notebook).

Cells flagged `#| slow`, `#| gpu` or `#| tpu` are skipped (see `tst_flags` in pyproject.toml); set
`DALLE_NB_TEST_FLAGS="slow"` to run the slow ones too.
"""
import os, shutil, subprocess, sys
from pathlib import Path
import pytest
from conftest import one_device_env

ROOT = Path(__file__).resolve().parents[1]
NBS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))


def _nbdev_test():
    exe = Path(sys.executable).with_name("nbdev-test")
    return str(exe) if exe.exists() else shutil.which("nbdev-test")


@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_notebook(nb):
    cmd = [_nbdev_test(), str(nb.relative_to(ROOT))]
    if flags := os.environ.get("DALLE_NB_TEST_FLAGS"): cmd += ["--flags", flags]
    env = one_device_env(PYTHONUNBUFFERED="1")   # notebooks choose their own device count
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500, env=env)
    assert r.returncode == 0, f"{nb.name} failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"


def _shown_cells(nb: Path):
    "The code cells a reader should see a result of (not exported, hidden or flagged), and those with stored outputs."
    import json
    skip = ("#| export", "#| exporti", "#| hide", "#| slow", "#| gpu", "#| tpu", "#|export", "#|hide")
    cells = [c for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]
    shown = [c for c in cells if "".join(c["source"]).strip() and not "".join(c["source"]).lstrip().startswith(skip)]
    return shown, [c for c in shown if c.get("outputs")]


@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_notebook_keeps_its_outputs(nb):
    "Readers see every notebook with its results (run `nbdev-test --save nbs/X.ipynb` after changing one); pictures stay small."
    import json
    shown, with_out = _shown_cells(nb)
    assert not shown or len(with_out) >= 0.5 * len(shown), (
        f"{nb.name}: only {len(with_out)} of {len(shown)} cells have stored outputs; run `nbdev-test --save {nb.relative_to(ROOT)}`")
    assert nb.stat().st_size <= 1.5e6, f"{nb.name} is {nb.stat().st_size / 1e6:.1f} MB with its outputs (at most 1.5 MB)"
    stored = "".join(json.dumps(c.get("outputs", [])) for c in with_out)
    assert not any(w in stored for w in ("InitGoogle", "TPU_WORKER_HOSTNAMES", "libtpu_init_utils")), (
        f"{nb.name} stored libtpu's start-up warnings: with the tpu extra installed and no TPU, save notebooks with JAX_PLATFORMS=cpu")


def test_all_notebooks_stay_small():
    total = sum(p.stat().st_size for p in NBS)
    assert total <= 15e6, f"nbs/ holds {total / 1e6:.1f} MB of notebooks (at most 15 MB)"
