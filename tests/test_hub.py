"""Models by name against a Hugging Face Hub on loopback: `dalle_nb.hub`, `Pipeline("mega")` and `dalle-nb … --model mega`.

A small HTTP server on 127.0.0.1 answers what huggingface_hub asks (`HEAD`/`GET /{repo}/resolve/{revision}/{file}`
with `ETag`, `X-Repo-Commit`, `Content-Length` and `Range`; `/api/models/{repo}/revision/{revision}`) and serves
random micro models written in the published layouts by the package's own writers. Nothing reaches the real Hub:
every test points `HF_ENDPOINT` (in-process: `huggingface_hub.constants`) at the server and `HF_HOME` at a temp dir.
"""
import argparse, hashlib, json, re, shutil, socket, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
import pytest
from huggingface_hub import constants
from dalle_nb import hub
from dalle_nb.convert import random_models, save_flax, vqgan_to_flax
from dalle_nb.published import save_dalle_mini, save_transformers_clip
from conftest import one_device_env, cli_cache

EXE = shutil.which("dalle-nb") or str(Path(sys.executable).with_name("dalle-nb"))
LFS = (".msgpack", ".safetensors", ".bin")          # files the Hub keeps in Git LFS: their ETag is the SHA-256


def published_files(tmp: Path) -> dict:
    "`{repo_id: {file name: bytes}}` of `mega`'s three repositories, random micro models in the exact published layouts."
    micro, out = random_models(), {}
    save_dalle_mini(tmp / "bart", micro)
    save_flax(tmp / "vqgan", *vqgan_to_flax(micro.vqgan))
    save_transformers_clip(tmp / "clip", micro.clip, micro.text)
    for role, repo in hub.PUBLISHED["mega"].repos.items():
        wanted = {f if isinstance(f, str) else f[0] for f in repo.files}
        files = {p.name: p.read_bytes() for p in (tmp / role).iterdir()}
        assert wanted <= set(files), (role, wanted - set(files))            # the writers write the published names
        out[repo.repo_id] = {n: files[n] for n in wanted}
    return out


class Hub(ThreadingHTTPServer):
    "The loopback Hub: `repos` served at one commit each; `cut`, `corrupt`, `hang` make it misbehave; `log` keeps each request."
    daemon_threads = True

    def __init__(self, repos: dict):
        super().__init__(("127.0.0.1", 0), Handler)
        self.repos, self.log, self.cut, self.corrupt = repos, [], set(), set()
        self.hang, self.release = threading.Event(), threading.Event()
        self.revisions = {r.repo_id: r.revision for r in hub.PUBLISHED["mega"].repos.values()}   # what the package pins
        self.commits = {r: v if re.fullmatch(r"[0-9a-f]{40}", v) else hashlib.sha1(r.encode()).hexdigest()
                        for r, v in self.revisions.items()}
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def etag(self, name: str, data: bytes) -> str:
        return hashlib.sha256(data).hexdigest() if name.endswith(LFS) else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a): pass

    def find(self):
        "`(repo, commit, file)` the path names, or None after answering an error."
        s = self.server
        for repo in s.repos:
            m = re.fullmatch(rf"/{re.escape(repo)}/resolve/([^/]+)/(.+)", self.path) or \
                re.fullmatch(rf"/api/models/{re.escape(repo)}/revision/([^/]+)()", self.path)
            if m is None: continue
            if m[1] not in (s.revisions[repo], s.commits[repo]): return self.fail(404, "RevisionNotFound")
            return repo, s.commits[repo], m[2]
        return self.fail(404, "RepoNotFound")

    def fail(self, code, error):
        self.send_response(code); self.send_header("X-Error-Code", error); self.send_header("Content-Length", "0"); self.end_headers()

    def answer(self, body: bool):
        s = self.server
        s.log.append((self.command, self.path, self.headers.get("Range")))
        if s.hang.is_set(): s.release.wait(30); return        # never answers (until the test ends)
        found = self.find()
        if found is None: return
        repo, commit, name = found
        if not name:                                          # the model info call
            data = json.dumps(dict(id=repo, sha=commit, siblings=[{"rfilename": f} for f in s.repos[repo]])).encode()
            self.send_response(200); self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data))); self.end_headers()
            if body: self.wfile.write(data)
            return
        if name not in s.repos[repo]: return self.fail(404, "EntryNotFound")
        data = s.repos[repo][name]
        etag, served = s.etag(name, data), (data[:-1] + bytes([data[-1] ^ 1]) if name in s.corrupt else data)
        start = int(re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "bytes=0-")[1])
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", commit); self.send_header("ETag", f'"{etag}"'); self.send_header("Accept-Ranges", "bytes")
        if name.endswith(LFS): self.send_header("X-Linked-Etag", f'"{etag}"'); self.send_header("X-Linked-Size", str(len(data)))
        if start: self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start)); self.end_headers()
        if not body: return
        if name in s.cut:                                     # half the file, then the connection drops
            s.cut.discard(name); self.wfile.write(served[start:len(data) // 2]); self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR); return
        self.wfile.write(served[start:])

    def do_HEAD(self): self.answer(False)
    def do_GET(self): self.answer(True)


def point_at(monkeypatch, url: str):
    "What `HF_ENDPOINT=url` sets when huggingface_hub is imported, set in this process."
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return published_files(tmp_path_factory.mktemp("published"))


@pytest.fixture
def server(files, tmp_path, monkeypatch):
    "A fresh loopback Hub, huggingface_hub and the package pointed at it, every cache in `tmp_path`."
    s = Hub(files)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    point_at(monkeypatch, s.url)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("DALLE_NB_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("DALLE_NB_HUB_TIMEOUT", "2")
    yield s
    s.release.set(); s.shutdown(); s.server_close()


def leftovers(tmp_path) -> list:
    "What the models folder holds (a half-converted directory would show here)."
    d = tmp_path / "models"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def test_name_to_model_directory_then_reuse(server, tmp_path, capsys):
    path = hub.model_dir("mega")
    assert path == tmp_path / "models" / "mega-main" and leftovers(tmp_path) == ["mega-main"]
    card = (path / "MODEL_CARD.md").read_text()
    assert f"`dalle-mini/vqgan_imagenet_f16_16384` at commit `{server.commits['dalle-mini/vqgan_imagenet_f16_16384']}`" in card
    pinned = hub.PUBLISHED["mega"].vqgan.revision                     # files asked for at the revision the package names
    assert any(f"/dalle-mini/vqgan_imagenet_f16_16384/resolve/{pinned}/flax_model.msgpack" == p for _, p, _ in server.log)
    n = len(server.log)
    assert hub.model_dir("dalle-mini/dalle-mega") == path and len(server.log) == n      # converted: the Hub is not asked
    st = hub.status("mega")
    assert st["complete"] and st["download"] == st["cached"] == sum(len(b) for r in server.repos.values() for b in r.values())
    from dalle_nb.cli import cmd_models, cmd_info, UsageError
    assert cmd_models(argparse.Namespace(offline=False)) == 0
    mega = capsys.readouterr().out.split("\nmini ")[0]
    assert f"converted: {path}" in mega and "(all files)" in mega, mega
    assert cmd_info(argparse.Namespace(model="mega")) == 0 and f"model directory: {path}" in capsys.readouterr().out
    with pytest.raises(UsageError, match="model 'mini' is not downloaded yet: dalle-nb download mini"):
        cmd_info(argparse.Namespace(model="mini"))


def test_cut_download_resumes(server, tmp_path, monkeypatch):
    "huggingface_hub (2.x) picks a cut download up where it stopped within the run, a chunk at a time (10 MB; 4 KiB here)."
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 4096)
    server.cut.add("flax_model.msgpack")                             # the first repository's weights (the BART's)
    folders = hub.download("mega")                                    # verified: the joined file has the Hub's SHA-256
    ranges = [r for m, p, r in server.log if m == "GET" and p.endswith("dalle-mega/resolve/main/flax_model.msgpack")]
    size = len(server.repos["dalle-mini/dalle-mega"]["flax_model.msgpack"])
    assert len(ranges) == 2 and ranges[0] is None, ranges
    start = int(re.fullmatch(r"bytes=(\d+)-", ranges[1])[1])
    assert 0 < start <= size // 2                                      # asked again from where it stopped
    assert (folders["bart"] / "flax_model.msgpack").read_bytes() == server.repos["dalle-mini/dalle-mega"]["flax_model.msgpack"]


def test_corrupt_file_is_refused_by_name(server, tmp_path):
    server.corrupt.add("model.safetensors")
    with pytest.raises(hub.HubError, match="model .mega.: openai/clip-vit-base-patch32/model.safetensors: checksum mismatch"):
        hub.model_dir("mega")
    assert leftovers(tmp_path) == []                                  # nothing converted
    server.corrupt.clear()
    assert hub.model_dir("mega").name == "mega-main"                 # the bad file was dropped: fetched anew


def test_offline(server, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(hub.HubError, match=r"model 'mega' is not downloaded yet .* HF_HUB_OFFLINE is set: run `dalle-nb download mega`"):
        hub.model_dir("mega")
    assert server.log == [] and leftovers(tmp_path) == []
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.download("mega")                                              # downloaded, not converted
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    n = len(server.log)
    assert hub.model_dir("mega").is_dir() and len(server.log) == n   # converted from the cache alone


def test_hub_that_never_answers_or_refuses(server, tmp_path, monkeypatch):
    server.hang.set()
    t0 = time.monotonic()
    with pytest.raises(hub.HubError, match=r"model 'mega': no answer from the Hub at http://127\.0\.0\.1:\d+ for .* within 2s"):
        hub.model_dir("mega")
    assert time.monotonic() - t0 < 15 and leftovers(tmp_path) == []
    server.hang.clear(); server.release.set()
    with socket.socket() as closed:                                    # a port nobody listens on: refused at once
        closed.bind(("127.0.0.1", 0)); port = closed.getsockname()[1]
    point_at(monkeypatch, f"http://127.0.0.1:{port}")
    with pytest.raises(hub.HubError, match="no answer from the Hub .*check the network or HF_ENDPOINT"):
        hub.model_dir("mini")
    assert leftovers(tmp_path) == []


def test_cli_generates_from_a_name(server, tmp_path):
    env = one_device_env(DALLE_NB_CACHE=cli_cache(tmp_path), HF_ENDPOINT=server.url, HF_HOME=str(tmp_path / "hf"),
                         DALLE_NB_MODELS=str(tmp_path / "models"), DALLE_NB_HUB_TIMEOUT="5")
    run = lambda *a, **kw: subprocess.run([EXE, *a], capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**env, **kw})
    r = run("generate", "a red circle", "--model", "mega", "--n", "2", "--rerank", "1", "--out", "o")
    assert r.returncode == 0, r.stderr
    png = next((tmp_path / "o").glob("a-red-circle_*.png"))
    assert json.loads(__import__("PIL.Image").Image.open(png).text["dalle_nb"])["model"] == "mega"
    r = run("generate", "--from", str(png), "--out", "again", HF_HUB_OFFLINE="1")             # by name, offline, from the cache
    assert r.returncode == 0 and "the same tokens as recorded" in r.stdout, r.stderr
    r = run("generate", "x", "--model", "mini", "--out", "m", HF_HUB_OFFLINE="1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "dalle-nb download mini" in r.stderr, r.stderr
