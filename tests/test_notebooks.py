"""Run every notebook in nbs/ as its own test, each in a fresh subprocess (what `nbdev-test` does per notebook).

Cells flagged `#| slow`, `#| gpu` or `#| tpu` are skipped (see `tst_flags` in pyproject.toml); set
`DALLE_NB_TEST_FLAGS="slow"` to run the slow ones too.
"""
import os, shutil, subprocess, sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))


def _nbdev_test():
    exe = Path(sys.executable).with_name("nbdev-test")
    return str(exe) if exe.exists() else shutil.which("nbdev-test")


@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_notebook(nb):
    cmd = [_nbdev_test(), str(nb.relative_to(ROOT))]
    if flags := os.environ.get("DALLE_NB_TEST_FLAGS"): cmd += ["--flags", flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("XLA_FLAGS", None)   # notebooks choose their own device count
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500, env=env)
    assert r.returncode == 0, f"{nb.name} failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
