"""Peer equivalence: our converted models against implementations nobody here wrote, with random weights.

The measurements live in `bench/peer_errors.py` (min-dalle 0.4.11's and transformers' PyTorch modules built with random
weights, saved, converted with `dalle_nb.convert`, run beside ours; relative error = max |ours − theirs| / max |theirs|):
BENCHMARKS.md prints what it measures. These tests run it, one comparison per process, and hold its figures to float32
rounding (< 1e-4) and its greedy tokens to identity.
"""
import json, subprocess, sys
from dataclasses import replace
from pathlib import Path

import pytest

from dalle_nb.convert import clip_config_from_transformers

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4


def _torch():
    return pytest.importorskip("torch", reason="peer tests need the dev extra (torch==2.13.0)")


def peer_errors(key: str, tmp_path: Path, full: bool = False) -> dict:
    "bench/peer_errors.py's comparison `key`, run in a process of its own: {name, errors, greedy_ours, greedy_theirs, seconds}."
    _torch()
    cmd = [sys.executable, str(ROOT / "bench" / "peer_errors.py"), "--only", key, "--out", str(tmp_path), *(["--full"] if full else [])]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    comparisons = json.loads((tmp_path / "peer_errors.json").read_text())["comparisons"]
    assert list(comparisons) == [key], list(comparisons)
    m = comparisons[key]
    assert f"| {m['name']} |" in r.stdout, r.stdout                 # the markdown table BENCHMARKS.md copies
    print(m)
    return m


# ---------------------------------------------------------------- the tests

def test_bart_matches_min_dalle(tmp_path):
    "Mega's depth (24 + 24 layers) at a small width."
    m = peer_errors("bart-deep", tmp_path)
    assert set(m["errors"]) == {"encoder_states", "decoder_logits", "supercond_logits"}
    assert max(m["errors"].values()) < TOL, m["errors"]
    assert m["greedy_ours"] == m["greedy_theirs"] and len(m["greedy_ours"]) == 8
    assert len(set(m["greedy_ours"])) > 1                     # a real sequence, not one id repeated


@pytest.mark.slow
@pytest.mark.parametrize("width", ["mini", "mega"])
def test_bart_matches_min_dalle_at_published_widths(tmp_path, width):
    m = peer_errors(f"bart-{width}", tmp_path, full=True)
    assert len(m["errors"]) == 3 and max(m["errors"].values()) < TOL, m["errors"]
    assert m["greedy_ours"] == m["greedy_theirs"]


def test_vqgan_decoder_matches_min_dalle(tmp_path):
    m = peer_errors("vqgan", tmp_path)["errors"]
    assert m["decoder_output"] < TOL and m["image"] < TOL, m


@pytest.mark.slow
def test_vqgan_full_forward_matches_min_dalle(tmp_path):
    m = peer_errors("vqgan-full", tmp_path, full=True)["errors"]
    assert m["image_eps_1e-05"] < TOL, m


def test_clip_matches_transformers(tmp_path):
    m = peer_errors("clip-small", tmp_path)["errors"]
    assert set(m) == {"image_embeds", "text_embeds", "logits_per_image"} and max(m.values()) < TOL, m


@pytest.mark.slow
def test_clip_matches_transformers_vit_b32(tmp_path):
    m = peer_errors("clip-b32", tmp_path, full=True)["errors"]
    assert len(m) == 3 and max(m.values()) < TOL, m


def test_clip_config_matches_transformers_defaults():
    "transformers' default CLIPConfig is ViT-B/32: it converts to our preset (no weights needed)."
    _torch()
    from transformers import CLIPConfig as HFCLIPConfig
    from dalle_nb.config import CLIP_VIT_B32
    d = HFCLIPConfig(projection_dim=512).to_dict()
    assert clip_config_from_transformers(d) == replace(CLIP_VIT_B32, pad_id=clip_config_from_transformers(d).pad_id)


def test_generate_bench_runs(tmp_path):
    "bench/generate.py at its smallest: both sides (ours in int8, the path float32 shares) generate one image, min-dalle's loop draws our greedy tokens, the floor and the second process are reported."
    _torch()
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "generate.py"), "--smoke", "--quantize", "int8", "--second-process", "--cache", str(tmp_path / "cache"),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "generate.json").read_text())
    sides = res["widths"]["small"]
    assert set(sides) == {"ours (int8)", "min-dalle"} and all("error" not in s for s in sides.values()), sides
    assert all(s["rows"][0]["images"] == 1 and s["rows"][0]["warm_s"] > s["rows"][0]["decode_s"] > 0 and s["peak_rss_gb"] > 0
               for s in sides.values())
    assert res["agreement"]["agree"] == res["agreement"]["agree_unrolled"] == res["agreement"]["agree_served"] == 256, res["agreement"]
    assert [(f["quantize"], f["rows"]) for f in res["floor"]["floors"]] == [("int8", 2)] and all(f["floor_ms"] > 0 for f in res["floor"]["floors"])
    assert sides["ours (int8)"]["cli"]["second_process_s"] > 0, sides["ours (int8)"].get("cli")
    assert "| small | 1 | ours (int8) |" in (tmp_path / "out" / "generate.md").read_text()
