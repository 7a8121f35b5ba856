"""The fit check (`dalle_nb.fitcheck`, `dalle-nb pod fit`) with libtpu, and what it says without it.

* with libtpu installed (marker `tpu`): a small AOT compile for topology v3:2x2, and `dalle-nb pod fit`'s exit status;
* without libtpu: `dalle-nb pod fit` says how to get it, in one line.
"""
import contextlib, io, json
import pytest

from dalle_nb import fitcheck as F
from dalle_nb.hlo import hlo_profile
from dalle_nb.cli import main


def cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


# ---- with libtpu: a small ahead-of-time compile for a real TPU topology

tpu = pytest.mark.skipif(not F.libtpu_available(), reason="libtpu is not installed (pip install -e '.[tpu]')")


@pytest.mark.tpu
@tpu
def test_small_aot_compile_for_v3_2x2(tmp_path):
    import jax, jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding
    devs = F.topology_devices("v3:2x2")
    assert len(devs) == 8 and "v3" in devs[0].device_kind.lower()
    # matmuls as TPU HLO writes them (convolutions), loop-free: our FLOP count = XLA's
    s = SingleDeviceSharding(devs[0])
    q = jax.ShapeDtypeStruct((4, 64, 4, 64), jnp.float32, sharding=s)
    c = jax.jit(lambda a, b: jnp.einsum("bqhd,bkhd->bhqk", a, b) @ jnp.ones((64, 32))).lower(q, q).compile()
    xla = c.cost_analysis(); xla = xla[0] if isinstance(xla, list) else xla
    assert sum(hlo_profile(c.as_text())["flops"].values()) == pytest.approx(xla["flops"], rel=0.02)
    # the CLI on a micro BART: the report, and exit status 1 when the HBM given is too small
    sets = ["bart.d_model=32", "bart.encoder_layers=1", "bart.decoder_layers=2", "bart.heads=2", "bart.glu_dim=32",
            "vqgan.n_embed=32", "bart.image_codes=32", "bart.image_vocab=32", "bart.max_text_len=8",
            "bart_train.optimizer=adam"]      # (Shampoo's many small matrices take XLA's TPU compiler ~10 CPU minutes here)
    code, out, err = cli("pod", "fit", "--preset", "tiny", "--topology", "v3:2x2", "--mesh", "dp=2,fsdp=2,mp=2", "--per-replica", "2",
                         "--accum", "3", "--hbm-gib", "0.001", "--json", str(tmp_path / "r.json"), *(a for s in sets for a in ("--set", s)))
    rep = json.loads((tmp_path / "r.json").read_text())
    assert code == 1 and "DOES NOT FIT" in out and "8 cores" in out
    assert rep["config"]["global_batch"] == 2 * 4 * 3 and rep["config"]["device_kind"].lower().startswith("tpu v3")
    assert rep["memory"]["total"] > rep["memory"]["argument"] > 0 and rep["flops"]["forward_backward"] > 0
    assert {c["op"] for c in rep["collectives"]} & {"all-reduce", "reduce-scatter", "all-gather"}
    assert F.FitReport(**{k: rep[k] for k in ("config", "memory", "state", "flops", "xla_flops", "collectives", "compile_seconds", "lower_seconds")},
                       hbm_bytes=16 * 2**30).fits


@pytest.mark.skipif(F.libtpu_available(), reason="libtpu is installed: the fit check runs (test above)")
def test_fit_without_libtpu_says_how_to_get_it():
    code, out, err = cli("pod", "fit", "--preset", "mega", "--topology", "v3:8x16")
    assert code == 2 and "pip install -e \".[tpu]\"" in err and err.count("\n") == 1
