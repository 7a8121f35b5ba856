"""The book's prose against its own stored outputs: a number a notebook quotes must not be contradicted by the outputs
beside it. Reads the .ipynb files only (nothing is executed), so it takes well under a second.

Three kinds of claim can be checked mechanically, each only where the outputs hold something to check it against:
* a quantity with a unit (`7.6 GiB`, `31.95 dB`, `12 %`) that lies within the span of the notebook's output
  quantities of the same unit must be one of them, at the precision quoted (a number outside that span — a core's
  16 GiB beside a model's 9.6 — is taken to be about something else);
* a step count written out in words (`forty steps`, `a few hundred steps`) must fit a count the code cells next to
  the paragraph run or report (`range(100)`, `steps=30`, a `steps` column);
* a ratio (`about ten times lower`, `twice as fast`) must match the two numbers of the output it describes (±15%).
The way to keep prose true is to render such numbers from the computed values (a Markdown output).
"""
import json, re
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
NBS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith(("_", ".")))

UNITS = r"GiB|MiB|KiB|GB|MB|KB|dB|%"
QUANTITY = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*(" + UNITS + r")(?!\w)")
KEYED = re.compile(r"['\"][^'\"\n]*?(" + UNITS + r")[^'\"\n]*['\"]\s*:\s*(\d+(?:\.\d+)?)")   # {'GiB/core': 10.24}

EXACT = {"ten": 10, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "a hundred": 100,
         "one hundred": 100, "two hundred": 200, "a thousand": 1000}
VAGUE = {"a few dozen": (24, 96), "dozens of": (24, 120), "a couple of hundred": (150, 300),
         "a few hundred": (200, 900), "hundreds of": (200, 999), "a few thousand": (2000, 9000)}
STEPS = re.compile(r"(?i)\b(" + "|".join(sorted([*EXACT, *VAGUE], key=len, reverse=True)) + r")\s+(?:\w+\s+)?steps?\b")
COUNTS = [re.compile(p) for p in (r"range\((\d+)\)", r"\bsteps?\s*[=:]\s*(\d+)", r"['\"]steps?['\"]\s*:\s*(\d+)",
                                  r"(?m)^\|\s*\w+\s*\|\s*(\d+)\s*\|")]   # a model card's `| stage | steps |` rows

TIMES = {"twice": 2, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9,
         "ten": 10, "twenty": 20, "a hundred": 100}
RATIO = re.compile(r"(?i)\b(twice|(" + "|".join(TIMES) + r"|\d+(?:\.\d+)?)\s*(?:times|×))\s+"
                   r"(?:as\s+\w+|lower|higher|smaller|larger|faster|slower|fewer|more|less|bigger)\b")
FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e-?\d+)?")


def _cells(nb: Path) -> list: return json.loads(nb.read_text())["cells"]
def _src(c) -> str: return "".join(c["source"])


def _out(c) -> str:
    "A code cell's stored text outputs (streams, plain text, markdown)."
    parts = []
    for o in c.get("outputs", []):
        if "text" in o: parts.append("".join(o["text"]))
        parts += ["".join(v) for k, v in o.get("data", {}).items() if k in ("text/plain", "text/markdown")]
    return "\n".join(parts)


def _quantities(cells) -> dict:
    "Every `number unit` the notebook's outputs show, by unit."
    found = {}
    for c in cells:
        t = _out(c)
        for m in QUANTITY.finditer(t): found.setdefault(m[2], set()).add(float(m[1]))
        for m in KEYED.finditer(t): found.setdefault(m[1], set()).add(float(m[2]))
    return found


def unit_claims(cells) -> list:
    "Prose quantities inside the span of the outputs' quantities of their unit, but not one of them as quoted."
    shown, bad = _quantities(cells), []
    for i, c in enumerate(cells):
        if c["cell_type"] != "markdown": continue
        for m in QUANTITY.finditer(_src(c)):
            places, v = len(m[1].partition(".")[2]), float(m[1])
            if m[2] not in shown or not min(shown[m[2]]) <= v <= max(shown[m[2]]): continue
            if not any(round(x, places) == v for x in shown[m[2]]):
                bad.append(f"cell {i}: '{m[0]}', but the outputs show {m[2]} {sorted(shown[m[2]])[:8]}")
    return bad


def _neighbours(cells, i) -> list:
    "The code cells on either side of markdown cell `i`, up to the next markdown cell each way."
    out, j = [], i - 1
    while j >= 0 and cells[j]["cell_type"] == "code": out.append(cells[j]); j -= 1
    j = i + 1
    while j < len(cells) and cells[j]["cell_type"] == "code": out.append(cells[j]); j += 1
    return out


def step_claims(cells) -> list:
    "Step counts written in words that no neighbouring code cell runs or reports."
    bad = []
    for i, c in enumerate(cells):
        if c["cell_type"] != "markdown": continue
        near = "\n".join(_src(d) + "\n" + _out(d) for d in _neighbours(cells, i))
        counts = {int(m[1]) for r in COUNTS for m in r.finditer(near)}
        for m in STEPS.finditer(_src(c)):
            w = m[1].lower()
            lo, hi = VAGUE.get(w, (EXACT.get(w), EXACT.get(w)))
            if counts and not any(lo <= k <= hi for k in counts):
                bad.append(f"cell {i}: '{m[0]}', but the cells beside it run {sorted(counts)}")
    return bad


def ratio_claims(cells) -> list:
    "Ratios claimed of an output of exactly two numbers (the cell's own, or the next code cell's) that they miss."
    bad = []
    for i, c in enumerate(cells):
        nxt = c if c["cell_type"] == "code" else next((d for d in cells[i + 1:] if d["cell_type"] == "code"), None)
        nums = [abs(float(x)) for x in FLOAT.findall(_out(nxt))] if nxt else []
        if len(nums) != 2 or min(nums) == 0: continue
        for m in RATIO.finditer(_src(c)):
            claim = 2.0 if m[1].lower() == "twice" else float(TIMES.get((m[2] or "").lower()) or m[2])
            if abs(max(nums) / min(nums) / claim - 1) > 0.15:
                bad.append(f"cell {i}: '{m[0]}', but the output's ratio is {max(nums) / min(nums):.2f}")
    return bad


@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_prose_agrees_with_outputs(nb):
    cells = _cells(nb)
    bad = unit_claims(cells) + step_claims(cells) + ratio_claims(cells)
    assert not bad, f"{nb.name} quotes numbers its outputs contradict (render them from the computed values):\n" + \
        "\n".join(bad)


def _md(text): return {"cell_type": "markdown", "source": [text]}
def _code(src, out): return {"cell_type": "code", "source": [src], "outputs": [{"output_type": "execute_result",
                                                                                  "data": {"text/plain": [out]}}]}


def test_the_checks_catch_what_they_are_for():
    "Each rule flags a contradiction and passes the same sentence once it is true."
    fit = _code("rows", "{'name': 'journal', 'GiB/core': 10.24, 'fits': True}\n{'name': 'fsdp', 'GiB/core': 5.97}")
    test = lambda text, cells: bool(unit_claims(cells + [_md(text)]))
    assert test("takes 7.6 GiB", [fit]) and not test("takes 10.2 GiB, and 6.0 fully sharded", [fit])
    assert not test("a core's 16 GiB", [fit])                                  # outside 5.97–10.24: about something else
    assert not test("takes 7.6 MiB", [fit])                                    # no MiB in the outputs: nothing to check
    loop = _code("hist = [step() for _ in range(100)]", "{'accuracy': 1.0}")
    assert step_claims([_md("A few hundred steps of Adam"), loop]) and not step_claims([_md("A hundred steps"), loop])
    card = _code("train_all()", "| dvae | 20 | 16 | adam |\n| dalle | 30 | 32 | adam |")
    assert step_claims([card, _md("forty steps of training")]) and not step_claims([card, _md("thirty steps")])
    two = _code("x  # about ten times lower", "(0.006527189165353775, 0.0008491280023008585)")
    assert ratio_claims([two]) and not ratio_claims([_code("x  # 7.7 times lower", _out(two))])
