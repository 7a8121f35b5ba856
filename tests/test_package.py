"""The package's shape: which module imports which.

Imports are read from the source (`ast`), wherever they sit — at the top or inside a function (a lazy import is
still a dependency) — so a circle shows up even when Python would tolerate it at run time.
"""
import ast, re, sys, tomllib
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "dalle_nb"
MODULES = sorted(p.stem for p in PKG.glob("*.py") if not p.stem.startswith("_"))


def imports_of(module: str) -> set:
    "The package modules `module` imports anywhere in its source."
    deps = set()
    for n in ast.walk(ast.parse((PKG / f"{module}.py").read_text())):
        if isinstance(n, ast.ImportFrom):
            name = n.module or ""
            if n.level == 1: parts = name.split(".") if name else []
            elif name == "dalle_nb" or name.startswith("dalle_nb."): parts = name.split(".")[1:]
            else: continue
            deps |= {parts[0]} if parts else {a.name for a in n.names}
        elif isinstance(n, ast.Import):
            deps |= {a.name.split(".")[1] for a in n.names if a.name.startswith("dalle_nb.")}
    return (deps & set(MODULES)) - {module}


def cycles(graph: dict) -> list:
    "Every circle a depth-first walk of `graph` meets, as the list of modules around it."
    found, state, path = [], {}, []
    def walk(u):
        state[u] = "open"; path.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == "open": found.append(path[path.index(v):] + [v])
            elif v not in state: walk(v)
        path.pop(); state[u] = "done"
    for m in sorted(graph):
        if m not in state: walk(m)
    return found


def test_cycles_are_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    graph = {m: imports_of(m) for m in MODULES}
    assert {"train", "stages", "recipe"} <= set(graph) and "train" in graph["stages"]   # the reader sees the package
    assert cycles(graph) == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles(graph))


def test_the_engine_names_no_stage():
    "The training engine imports no model: what a stage trains comes from the stage table (`stages`, `recipe`)."
    models = {"vqgan", "bart", "clip", "dvae", "dalle", "stages", "recipe", "train_dalle"}
    assert imports_of("train") & models == set()


def test_generating_never_imports_transformers():
    "Loading the shipped model for generation (the CLI's path) reads its tokenizer with `tokenizers` alone: importing transformers costs every `dalle-nb generate` about two seconds."
    import subprocess, sys
    code = ("import sys; import dalle_nb.cli; from dalle_nb.pipeline import Pipeline; p = Pipeline(); p.models.text(['a red circle']); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'transformers', 'torch'}))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout


DIST = {"PIL": "pillow", "orbax": "orbax-checkpoint", "jaxlib": "jax"}   # import name -> distribution where they differ (jaxlib comes with jax)
OPTIONAL = {"torch": "convert"}      # only to read .pt files, imported inside `try` with a one-line error naming `pip install torch`


def third_party_imports() -> dict:
    "Each library (not the standard library, not the package) any module imports anywhere -> the modules importing it."
    found = {}
    for m in MODULES:
        for n in ast.walk(ast.parse((PKG / f"{m}.py").read_text())):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module] if isinstance(n, ast.ImportFrom) and n.level == 0 else []
            for top in {x.split(".")[0] for x in names if x}:
                if top not in sys.stdlib_module_names and top not in ("dalle_nb", "__future__"): found.setdefault(top, set()).add(m)
    return found


def test_the_package_imports_only_its_declared_dependencies():
    "`pip install dalle_nb` brings everything the package imports: nothing may arrive only with the dev extra or by way of another library."
    deps = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in
            tomllib.loads((PKG.parent / "pyproject.toml").read_text())["project"]["dependencies"]}
    used = third_party_imports()
    assert {"jax", "tokenizers", "safetensors", "scipy"} <= set(used), sorted(used)      # the reader sees the imports
    missing = {m: sorted(by) for m, by in used.items() if DIST.get(m, m).lower() not in deps and m not in OPTIONAL}
    assert not missing, f"imported but not in pyproject's dependencies: {missing}"
    assert all(used.get(m, set()) <= {mod} for m, mod in OPTIONAL.items()), {m: used.get(m) for m in OPTIONAL}
    assert "transformers" not in used and "transformers" not in deps     # tokenizers reads tokenizer.json itself
