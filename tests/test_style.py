"""The book's shape, read from the .ipynb files and the exported modules (nothing executed; well under a second):
exported cells and definitions short, code lines at most 120 characters, and stored outputs free of what a reader
should never see (stderr, this machine's paths, raw numpy scalar reprs). The house rule is 30 lines; 40 is the ceiling
these tests hold."""
import ast, json, re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))
MODULES = sorted(p for p in (ROOT / "dalle_nb").glob("*.py") if not p.name.startswith("_"))
MAX_LINES, MAX_WIDTH = 40, 120
LEAKS = re.compile(r"/work/|/tmp/|/root/|/home/\w+|np\.(?:float|int)(?:16|32|64)\(")


def _code_cells(nb: Path) -> list:
    return [(i, "".join(c["source"]), c) for i, c in enumerate(json.loads(nb.read_text())["cells"])
            if c["cell_type"] == "code"]


def _exported(src: str) -> bool: return bool(re.match(r"\s*#\|\s*export", src))


def long_cells(nb: Path) -> list:
    "Exported cells over MAX_LINES lines, and code lines over MAX_WIDTH characters, as 'cell N: why'."
    bad = []
    for i, src, _ in _code_cells(nb):
        lines = src.split("\n")
        if _exported(src) and len(lines) > MAX_LINES: bad.append(f"cell {i}: exported cell of {len(lines)} lines")
        bad += [f"cell {i}: a line of {len(l)} characters" for l in lines if len(l) > MAX_WIDTH]
    return bad


def long_definitions(module: Path) -> list:
    "Top-level functions, classes and methods over MAX_LINES lines."
    bad, tree = [], ast.parse(module.read_text())
    for n in tree.body:
        subs = n.body if isinstance(n, ast.ClassDef) else []
        for d in [n, *subs]:
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                size = d.end_lineno - d.lineno + 1
                if size > MAX_LINES: bad.append(f"{module.stem}.{d.name}: {size} lines")
    return bad


def split_docstrings(module: Path) -> list:
    "Definitions whose docstring is written as two string statements: `__doc__` holds only the first."
    is_str = lambda b: isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)
    return [f"{module.stem}.{d.name}" for d in ast.walk(ast.parse(module.read_text()))
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and len(d.body) > 1
            and is_str(d.body[0]) and is_str(d.body[1])]


def output_leaks(nb: Path) -> list:
    "Stored stderr streams, machine paths and numpy scalar reprs in a notebook's outputs."
    bad = []
    for i, _, c in _code_cells(nb):
        for o in c.get("outputs", []):
            if o.get("name") == "stderr": bad.append(f"cell {i}: stderr stored")
            texts = ["".join(o.get("text", ""))]
            texts += ["".join(v) for k, v in o.get("data", {}).items() if k.startswith("text/")]
            bad += [f"cell {i}: {m[0]!r} in an output" for t in texts for m in [LEAKS.search(t)] if m]
    return bad


@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_cells_and_lines_are_short(nb):
    bad = long_cells(nb)
    assert not bad, f"{nb.name}: split the cell into demonstrated pieces / wrap the line:\n" + "\n".join(bad)


def test_exported_definitions_are_short():
    bad = [b for m in MODULES for b in long_definitions(m)]
    assert not bad, "definitions to split into named pieces (@patch methods, helpers):\n" + "\n".join(bad)


def test_docstrings_are_whole():
    bad = [b for m in MODULES for b in split_docstrings(m)]
    assert not bad, "join each into one docstring (a bracketed implicit concatenation):\n" + "\n".join(bad)


@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_outputs_show_nothing_a_reader_should_not_see(nb):
    bad = output_leaks(nb)
    assert not bad, f"{nb.name}: fix at the source (capture the warning, show paths by name, format numbers):\n" + \
        "\n".join(bad)


def test_the_checks_catch_what_they_are_for(tmp_path):
    "Each rule flags what it is for and passes the mended cell."
    def nb(src, outputs=()):
        p = tmp_path / "x.ipynb"
        p.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [src], "outputs": list(outputs)}]}))
        return p
    assert long_cells(nb("#| export\n" + "x = 1\n" * 45)) and not long_cells(nb("#| export\n" + "x = 1\n" * 30))
    assert long_cells(nb("y = " + "1 + " * 40 + "1")) and not long_cells(nb("y = 1"))
    assert not long_cells(nb("x = 1\n" * 45))                                   # a long check cell is not exported
    out = lambda t, name="stdout": {"output_type": "stream", "name": name, "text": [t]}
    assert output_leaks(nb("f()", [out("saved /tmp/tmpab12/x.png")])) and output_leaks(nb("f()", [out("warn", "stderr")]))
    assert output_leaks(nb("f()", [out("np.float64(0.5)")])) and not output_leaks(nb("f()", [out("saved x.png 0.5")]))
    m = tmp_path / "m.py"; m.write_text("def f():\n" + "    x = 1\n" * 45 + "\ndef g(): pass\n")
    assert long_definitions(m) == ["m.f: 46 lines"]
    m.write_text('def f():\n    "one."\n    "two."\n    return 1\n\ndef g():\n    ("one. " "two.")\n    return 1\n')
    assert split_docstrings(m) == ["m.f"]
