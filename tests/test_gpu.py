"""Compiling for a named NVIDIA GPU without one (`dalle_nb.gpu`, `dalle-nb gpu`).

* always: every shipped target description parses into the figures the reports use; `step_reads` counts the bytes of a
  hand-written program with nested loops; without JAX's CUDA plugin, `dalle-nb gpu` says what to install in one line;
* with the plugin installed (marker `cuda`; `pip install -e ".[gpu]"`, no GPU needed): a micro sampling program compiled
  for a T4 through the CLI, and one that cannot fit a card made smaller than it.
"""
import contextlib, io, json, re
import unittest.mock
import pytest

from dalle_nb import gpu as G
from dalle_nb.cli import main


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("gpu", G.gpu_names())
def test_target_descriptions_parse(gpu):
    s = G.gpu_spec(gpu)
    text = s["target"]
    assert s["gpu"] == gpu and s["name"] and "Where the numbers come from" in text
    assert 8 * 2**30 <= s["memory_bytes"] <= 96 * 2**30 and 1e11 < s["bandwidth"] < 1e13 and 20 <= s["sms"] <= 200
    assert re.fullmatch(r"\d\.\d", s["compute_capability"])
    for field in ("threads_per_block_limit", "shared_memory_per_core", "core_count", "memory_bandwidth",
                  "l2_cache_size", "clock_rate_ghz", "device_memory_size", "shared_memory_per_block_optin", "cuda_compute_capability"):
        assert re.search(rf"^\s*{field}\b", text, re.M), f"{gpu}: no {field}"


def test_a_description_missing_a_field(tmp_path):
    bad = tmp_path / "half.textproto"
    bad.write_text(re.sub(r"\n\s*memory_bandwidth:[^\n]*", "", G.gpu_spec("l4")["target"]))
    with pytest.raises(G.GpuError, match="half.textproto: no memory_bandwidth"): G.gpu_spec(str(bad))


NESTED = """HloModule nested
%fused_lookup (param_0: f32[100,8], param_1: s32[2,1]) -> f32[2,8] {
  %param_0 = f32[100,8]{1,0} parameter(0)
  %param_1 = s32[2,1]{1,0} parameter(1)
  ROOT %g = f32[2,8]{1,0} gather(%param_0, %param_1), offset_dims={1}, collapsed_slice_dims={0}, slice_sizes={1,8}
}
%inner (a: (s32[], f32[100,8], s32[2,1])) -> (s32[], f32[100,8], s32[2,1]) {
  %a = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) parameter(0)
  %j = s32[] get-tuple-element(%a), index=0
  %table = f32[100,8]{1,0} get-tuple-element(%a), index=1
  %ids = s32[2,1]{1,0} get-tuple-element(%a), index=2
  %rows = f32[2,8]{1,0} fusion(%table, %ids), kind=kLoop, calls=%fused_lookup
  %k = s32[] constant(1)
  %j1 = s32[] add(%j, %k)
  ROOT %t = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) tuple(%j1, %table, %ids)
}
%inner_cond (a.1: (s32[], f32[100,8], s32[2,1])) -> pred[] {
  %a.1 = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) parameter(0)
  %j.1 = s32[] get-tuple-element(%a.1), index=0
  %three = s32[] constant(3)
  ROOT %lt = pred[] compare(%j.1, %three), direction=LT
}
%outer (b: (s32[], f32[100,8], s32[2,1])) -> (s32[], f32[100,8], s32[2,1]) {
  %b = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) parameter(0)
  %l = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) while(%b), condition=%inner_cond, body=%inner
  %copy = f32[100,8]{1,0} copy(%l)
  ROOT %u = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) tuple(%l)
}
%outer_cond (b.1: (s32[], f32[100,8], s32[2,1])) -> pred[] {
  %b.1 = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%b.1), index=0
  %four = s32[] constant(4)
  ROOT %lt.1 = pred[] compare(%i.1, %four), direction=LT
}
ENTRY %main (x: (s32[], f32[100,8], s32[2,1])) -> (s32[], f32[100,8], s32[2,1]) {
  %x = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) parameter(0)
  ROOT %w = (s32[], f32[100,8]{1,0}, s32[2,1]{1,0}) while(%x), condition=%outer_cond, body=%outer
}"""


def test_step_reads_nested_loops_and_gathers():
    r = G.step_reads(NESTED, 4)
    # per outer trip: 3 inner trips x (gather of 2 rows: 64 bytes + ids 8 + add 8) + a copy of the whole loop state
    state = 4 + 100 * 8 * 4 + 2 * 4
    assert r["loops"] == [4] and r["kernels"] == 3 * 2 + 1
    assert r["by_kind"]["fusion rows"] == [3, 3 * (2 * 8 * 4 + 8)] and r["by_kind"]["copy"] == [1, state]
    assert r["bytes"] == 3 * (72 + 8) + state
    assert (r["made"], r["made_max"]) == (state, state)    # only the copy reads what the trip made: the inner loop's result
    with pytest.raises(G.GpuError, match="run 4 trips, not one per token"): G.step_reads(NESTED, 12)


def test_without_the_cuda_plugin_one_line():
    with unittest.mock.patch("importlib.util.find_spec", return_value=None):
        code, out, err = cli("gpu", "fit", "--gpu", "t4", "--preset", "tiny")
    assert code == 2 and out == "" and err.count("\n") == 1 and 'pip install -e ".[gpu]"' in err, err
    code, out, err = cli("gpu", "fit", "--gpu", "h200", "--preset", "tiny")
    assert code == 2 and "unknown GPU 'h200'" in err and err.count("\n") == 1


# ---- with JAX's CUDA plugin (no GPU): a micro compile for a real card's description

cuda = pytest.mark.skipif(not G.cuda_plugin_available(),
                          reason="JAX's CUDA plugin is not installed (pip install -e '.[gpu]')")
MICRO = [x for s in ("bart.d_model=32", "bart.encoder_layers=1", "bart.decoder_layers=1", "bart.heads=2", "bart.glu_dim=32")
         for x in ("--set", s)]


@pytest.mark.cuda
@cuda
def test_micro_sampling_program_for_a_t4(tmp_path):
    code, out, err = cli("gpu", "fit", "--gpu", "t4", "--preset", "tiny", "--images", "2", *MICRO,
                         "--json", tmp_path / "t4.json")
    assert code == 0, err
    rep = json.loads((tmp_path / "t4.json").read_text())
    assert rep["fits"] and rep["spec"]["name"] == "Tesla T4" and rep["config"]["rows"] == 4
    assert sum(rep["step"]["loops"]) == rep["config"]["image_len"]             # one loop per cache stage
    assert rep["step"]["bytes"] > 0 and rep["memory"]["argument"] > 0
    assert 0 < rep["step"]["made"] < rep["step"]["bytes"] and rep["step"]["made_max"] > 0
    assert "token step" in out and "FITS" in out
    # the same program on a card of 1 MB: does not fit, exit status 1
    small = tmp_path / "small.textproto"
    small.write_text(re.sub(r"device_memory_size: \d+", "device_memory_size: 1000000", G.gpu_spec("t4")["target"]))
    code, out, err = cli("gpu", "fit", "--gpu", small, "--preset", "tiny", "--images", "2", *MICRO)
    assert code == 1 and "DOES NOT FIT" in out
