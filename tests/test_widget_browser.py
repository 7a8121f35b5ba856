"""The ipywidgets panel works in a real browser, the way a notebook user meets it: JupyterLab (isolated in
`tmp_path`, offline) runs a one-cell notebook showing `dalle_nb.pipeline.widget`, headless Chromium types a prompt,
clicks Generate, uploads an image prompt and sends an empty one, and the page must show the status line, the rendered
images, and no traceback. The panel's DOM contract is its CSS classes (`.dalle-prompt`, `.dalle-generate`, ...)."""
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from importlib.util import find_spec
from pathlib import Path

import pytest

# The notebook's only cell: what a user types to get the panel.
NOTEBOOK_CELL = """\
from dalle_nb.pipeline import Pipeline, widget
ui = widget(Pipeline(batch_size=4))
ui.n.value = 4; ui.keep.value = 4
ui"""

PROMPT = "a red circle above a blue square"
IMAGES_RE = r"(\d+) image\(s\)"
START_S = 120          # JupyterLab server answering
PAGE_S = 180           # the notebook page loaded and its kernel connected
PANEL_S = 240          # the cell ran: imports, model loading (jax on a slow 2-core machine)
GENERATE_S = 240       # one Generate click, first-time jit compiles included
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def _need(ok: bool, why: str):
    "Skip when a tool is missing, except on CI (`CI=true`), which installs them: there it is a failure."
    if ok: return
    if os.environ.get("CI", "").lower() == "true": pytest.fail(f"CI=true but {why}")
    pytest.skip(why)


def _chromium() -> str | None:
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium")


def _need_tools():
    _need(find_spec("jupyterlab") is not None, "jupyterlab is not installed")
    _need(find_spec("playwright") is not None, "playwright is not installed")
    _need(_chromium() is not None, "chromium is not installed (/usr/bin/chromium)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 60) -> str:
    try: return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError as e: return f"(no server log: {e})"


class Lab:
    "A running JupyterLab server: `url(path)`, `get(api_path)`, `log_tail()`."
    def __init__(self, root: Path, port: int, token: str, log: Path, proc: subprocess.Popen):
        self.root, self.port, self.token, self.log, self.proc = root, port, token, log, proc

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}{'&' if '?' in path else '?'}token={self.token}"

    def get(self, path: str, timeout: float = 5):
        with urllib.request.urlopen(self.url(path), timeout=timeout) as r:
            return json.loads(r.read())

    def log_tail(self, n: int = 60) -> str:
        return _tail(self.log, n)

    def stop(self):
        "Ask the server to shut down (it stops its kernels), then terminate, then kill its process group."
        if self.proc.poll() is None:
            try:
                req = urllib.request.Request(self.url("/api/shutdown"), method="POST", data=b"")
                urllib.request.urlopen(req, timeout=5).close()
            except (urllib.error.URLError, OSError): pass
            try: self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try: self.proc.wait(10)
                except subprocess.TimeoutExpired: pass
        try: os.killpg(self.proc.pid, signal.SIGKILL)     # the server's own session: leftover kernels, if any
        except (ProcessLookupError, PermissionError): pass
        try: self.proc.wait(10)
        except subprocess.TimeoutExpired: pass


@pytest.fixture
def lab(tmp_path):
    "JupyterLab on loopback, rooted at `tmp_path/'root'`, with its own config/data/runtime dirs and no network access."
    _need_tools()
    root, home = tmp_path / "root", tmp_path / "jupyter"
    root.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JUPYTER_PATH", "JUPYTER_CONFIG_PATH")}
    env.update(JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), IPYTHONDIR=str(home / "ipython"),
               JUPYTER_PLATFORM_DIRS="1", JAX_PLATFORMS="cpu", XLA_FLAGS=os.environ["DALLE_NB_TEST_XLA_FLAGS"], PYTHONUNBUFFERED="1",
               PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]))
    # Front-end plugins that would reach the network or put a toast over the page.
    (home / "config" / "labconfig").mkdir(parents=True)
    (home / "config" / "labconfig" / "page_config.json").write_text(json.dumps({"disabledExtensions": {
        "@jupyterlab/apputils-extension:announcements": True, "@jupyterlab/extensionmanager-extension": True}}))
    port, token, log = _free_port(), secrets.token_hex(16), tmp_path / "jupyterlab.log"
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           "--LabApp.extension_manager=readonly", "--LabApp.expose_app_in_browser=True",
           "--ServerApp.terminals_enabled=False"] + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Lab(root, port, token, log, proc)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode} before answering; its log:\n{server.log_tail()}")
            try:
                server.get("/api/status")
                break
            except (urllib.error.URLError, OSError, ValueError):
                if time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not answer on port {port} within {START_S}s; its log:\n{server.log_tail()}")
                time.sleep(0.5)
        # The notebook's kernel must be this environment's python: ipykernel's own `python3` spec, whose argv[0]
        # "python" jupyter_client replaces by the server's sys.executable.
        specs = server.get("/api/kernelspecs")["kernelspecs"]
        assert "python3" in specs, f"no python3 kernelspec, only {sorted(specs)}"
        argv0 = specs["python3"]["spec"]["argv"][0]
        assert argv0 in ("python", "python3", sys.executable) or Path(argv0).resolve() == Path(sys.executable).resolve(), \
            f"the python3 kernel would run {argv0!r}, not this environment's {sys.executable}"
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser():
    "Headless system Chromium, driven by playwright (its own browser download is not used)."
    _need_tools()
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=_chromium(), headless=True, args=CHROMIUM_ARGS)
        try: yield b
        finally: b.close()
    finally:
        pw.stop()


def _write_notebook(path: Path, source: str):
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nbformat.write(nb, path)


# JS helpers evaluated in the page.
STATUS_JS = "() => { const e = document.querySelector('.dalle-status'); return e ? e.textContent.trim() : null; }"
IMAGES_JS = """() => [...document.querySelectorAll('.dalle-grid img')].map(i => {
    const r = i.getBoundingClientRect();
    return {complete: i.complete, natural: i.naturalWidth, w: r.width, h: r.height, cls: i.className}; })"""
LOADED_JS = "() => [...document.querySelectorAll('.dalle-grid img')].filter(i => i.complete && i.naturalWidth > 0).length"
OUTPUTS_JS = """() => [...document.querySelectorAll('.jp-OutputArea-output')].map(e =>
    ({mime: e.getAttribute('data-mime-type'), text: e.innerText}))"""
# The status after a Generate click: a finished run or an error, and different from what it read before the click.
DONE_JS = """([before, re, need]) => {
    const e = document.querySelector('.dalle-status'); if (!e) return false;
    const t = e.textContent.trim();
    if (t === before) return false;
    if (t.startsWith('⚠')) return true;
    return new RegExp(re).test(t) && (!need || t.includes(need)); }"""
RUN_ALL_JS = r"""async () => {
    const app = window.jupyterapp;
    await app.started; await app.restored;
    const nb = app.shell.currentWidget;
    if (!nb || !nb.sessionContext) throw new Error('no notebook is the current widget');
    await nb.context.ready; await nb.sessionContext.ready;
    const kernel = nb.sessionContext.session && nb.sessionContext.session.kernel;
    if (!kernel) throw new Error('the notebook has no kernel');
    // Every stderr stream and error the kernel sends, whichever cell or widget callback (thread) it belongs to:
    // output from a button's handler has no cell, so the notebook's output area never shows it.
    window.__kernelStderr = [];
    kernel.iopubMessage.connect((_, msg) => {
        const t = msg.header.msg_type, c = msg.content;
        if (t === 'stream' && c.name === 'stderr') window.__kernelStderr.push({error: false, text: c.text});
        if (t === 'error') window.__kernelStderr.push({error: true, text: `${c.ename}: ${c.evalue}\n` + (c.traceback || []).join('\n')});
    });
    app.commands.execute('notebook:run-all-cells');   // not awaited: it runs until the cell finishes
    return kernel.name; }"""


def test_widget_in_browser(lab, browser, tmp_path):
    from playwright.sync_api import TimeoutError as PWTimeout
    from PIL import Image
    from dalle_nb.shapes import make_split

    _write_notebook(lab.root / "widget.ipynb", NOTEBOOK_CELL)
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    console = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))

    def why(msg: str) -> str:
        "The failure message: what went wrong, the status line, the cell outputs, console errors, the server log."
        try: page.screenshot(path=str(tmp_path / "failure.png"), full_page=True)
        except Exception as e: msg += f"\n(no failure screenshot: {e})"   # noqa: BLE001 - diagnostics only
        try: status, outputs = page.evaluate(STATUS_JS), page.evaluate(OUTPUTS_JS)
        except Exception as e: status, outputs = f"(page gone: {e})", []   # noqa: BLE001
        outs = "\n".join(f"[{o['mime'] or 'widget'}] {o['text'][:2000]}" for o in outputs)
        return (f"{msg}\nstatus: {status!r}\ncell outputs:\n{outs or '(none)'}\n"
                f"browser console (last 20):\n" + "\n".join(console[-20:]) +
                f"\nscreenshot: {tmp_path / 'failure.png'}\nJupyterLab log (tail):\n{lab.log_tail()}")

    def wait(js, arg=None, timeout_s=60, what="the page"):
        try: return page.wait_for_function(js, arg=arg, timeout=timeout_s * 1000, polling=250)
        except PWTimeout: pytest.fail(why(f"timed out after {timeout_s}s waiting for {what}"))

    def generate(need: str | None = None) -> str:
        "Click Generate and wait for the status to change to a finished run (containing `need`) or an error."
        before = page.evaluate(STATUS_JS)
        page.locator(".dalle-generate").click()
        wait(DONE_JS, [before, IMAGES_RE, need], GENERATE_S, f"the status to change from {before!r} after Generate")
        return page.evaluate(STATUS_JS)

    def check_images(status: str, label: str):
        "The status says N image(s); N `<img>`s in the grid have loaded and have a size on the page."
        m = re.search(IMAGES_RE, status)
        assert m and not status.startswith("⚠"), why(f"{label}: the status does not report images")
        n = int(m.group(1))
        try: page.wait_for_function(f"() => ({LOADED_JS})() === {n}", timeout=30_000, polling=250)
        except PWTimeout: pass                                       # reported by the asserts below
        imgs = page.evaluate(IMAGES_JS)
        loaded = [i for i in imgs if i["complete"] and i["natural"] > 0]
        assert len(loaded) == n, why(f"{label}: the status says {n} image(s) but {len(loaded)} of the grid's {len(imgs)} <img> have loaded: {imgs}")
        assert n == 4 or (0 < n < 4 and "repeated a better one" in status), \
            why(f"{label}: asked for 4 images (n=4, keep=4), got {n} and the status does not say why")
        assert all(i["w"] > 0 and i["h"] > 0 for i in loaded), why(f"{label}: an <img> has an empty bounding box: {imgs}")
        assert all("dalle-image" in i["cls"].split() for i in imgs), why(f"{label}: every grid <img> should have the class dalle-image: {imgs}")

    page.goto(lab.url("/lab/tree/widget.ipynb"), timeout=PAGE_S * 1000)
    try: page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=PAGE_S * 1000)
    except PWTimeout: pytest.fail(why(f"the notebook did not open within {PAGE_S}s"))
    wait("() => window.jupyterapp !== undefined", timeout_s=PAGE_S, what="window.jupyterapp")
    try: kernel = page.evaluate(RUN_ALL_JS)
    except Exception as e: pytest.fail(why(f"could not run the notebook's cells: {e}"))   # noqa: BLE001
    assert kernel == "python3", why(f"the notebook runs on kernel {kernel!r}, not python3")
    try: page.wait_for_selector(".dalle-generate", state="visible", timeout=PANEL_S * 1000)
    except PWTimeout: pytest.fail(why(f"the panel did not appear within {PANEL_S}s of running the cell"))
    for cls in ("prompt", "negative", "generate", "stop", "upload", "progress", "status", "grid"):
        assert page.locator(f".dalle-{cls}").count() == 1, why(f"the panel should have exactly one .dalle-{cls}")

    # a. a text prompt: 4 images, all rendered
    box = page.locator(".dalle-prompt input")
    box.fill(PROMPT)
    box.press("Tab")                    # blur: the Text view syncs its value on 'input' and on 'change'
    status = generate()
    check_images(status, "text prompt")
    assert "image prompt" not in status, why("text prompt: the status mentions an image prompt though none was given")
    page.locator(".dalle-grid").scroll_into_view_if_needed()
    shot = tmp_path / "widget.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 1000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"bad screenshot {shot}"

    # b. an image prompt: upload a 64x64 RGB PNG, wait until the widget's model holds it, then Generate
    imgs, _ = make_split("val", 1, seed=0)
    png = tmp_path / "prompt.png"
    Image.fromarray(imgs[0]).convert("RGB").save(png)
    assert Image.open(png).size == (64, 64)
    # ipywidgets 8's FileUpload view keeps its <input type=file> detached from the page (its `update` clears the
    # button's children), so choose the file the way a user does: click the button, answer the file chooser.
    with page.expect_file_chooser(timeout=30_000) as chooser:
        page.locator(".dalle-upload").click()
    chooser.value.set_files(str(png))
    # The FileUpload view relabels itself "<description> (1)" when it set the model's value (and sent it).
    wait("() => /\\(1\\)\\s*$/.test(document.querySelector('.dalle-upload').textContent)", timeout_s=30,
         what="the upload to register (the button to read '... (1)')")
    status = generate(need="image prompt")
    assert "image prompt" in status, why("image prompt: the status does not mention the image prompt")
    check_images(status, "image prompt")

    # b2. a negative prompt: typed in its box, said in the status line of the finished run
    negative = page.locator(".dalle-negative input")
    negative.fill("a red circle")
    negative.press("Tab")
    status = generate(need="negative")
    assert "negative: 'a red circle'" in status, why("negative prompt: the status does not mention it")
    negative.fill("")
    negative.press("Tab")

    # c. an empty prompt: a one-line warning, no traceback
    box.fill("")
    box.press("Tab")
    status = generate()
    assert status.startswith("⚠"), why("empty prompt: the status should start with ⚠")
    assert "prompt is empty" in status, why("empty prompt: the status should say the prompt is empty")

    # c/d. the cell's output, and what the kernel sent from the widget's callbacks: no traceback, no PyTorch banner
    outputs = page.evaluate(OUTPUTS_JS)
    assert not [o for o in outputs if "Traceback" in o["text"]], why("a traceback appeared in the notebook's output")
    stderr = page.evaluate("() => window.__kernelStderr")
    assert not [e for e in stderr if e["error"] or "Traceback" in e["text"]], \
        why("the kernel reported an error (a widget callback or its thread failed):\n" + "\n".join(e["text"] for e in stderr)[-4000:])
    banners = [o["text"] for o in outputs if o["mime"] == "application/vnd.jupyter.stderr" and "PyTorch was not found" in o["text"]]
    banners += [e["text"] for e in stderr if "PyTorch was not found" in e["text"]]
    assert not banners, why(f"importing the package printed a stderr banner: {banners}")
    page.close()
