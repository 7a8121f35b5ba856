"""Sharding across notebooks: the golden Mega layout, scanned vs unrolled layers (with remat), and sampling that gives
the same images on 1 or 8 devices. (The sharded train step itself — accumulation, meshes, skipped non-finite steps,
checkpoints restored on another mesh — is checked in nbs/15_train.ipynb; multi-process and kill tests have their own
files.)

Regenerate the golden file after a deliberate change of the rules or the model:
    DALLE_NB_REGEN_GOLDEN=1 python -m pytest tests/test_sharding.py -k golden
"""
import json, os
from dataclasses import replace
from pathlib import Path
import numpy as np
import jax, jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from dalle_nb.config import BartConfig, get_config
from dalle_nb.bart import DalleBart, bart_loss, unstack_params
from dalle_nb.sharding import partition_specs, parse_mesh, mesh_from_spec, state_shardings, place, unnamed_params

GOLDEN = Path(__file__).parent / "golden" / "mega_partition_specs.json"
LAYOUTS = ("dp=32,mp=8", "fsdp=32,mp=8")


def mega_specs() -> dict:
    "Every parameter's partition spec of the Mega BART on DALL·E Mega's layouts, from shapes alone."
    params = nnx.state(nnx.eval_shape(lambda: DalleBart(get_config("mega").bart, rngs=nnx.Rngs(0))), nnx.Param)
    return {"about": "dalle_nb.sharding.partition_specs of get_config('mega').bart on these mesh layouts; "
                     "regenerate: DALLE_NB_REGEN_GOLDEN=1 python -m pytest tests/test_sharding.py -k golden",
            "layouts": {layout: partition_specs(params, parse_mesh(layout)) for layout in LAYOUTS}}


def dump(specs: dict) -> str:
    "JSON with one line per parameter, so that a change of layout is a readable one-line diff in git."
    out = ["{", f' "about": {json.dumps(specs["about"])},', ' "layouts": {']
    for i, (layout, params) in enumerate(sorted(specs["layouts"].items())):
        out.append(f"  {json.dumps(layout)}: {{")
        rows = sorted(params.items())
        out += [f"   {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" + ("," if j < len(rows) - 1 else "") for j, (k, v) in enumerate(rows)]
        out.append("  }" + ("," if i < len(specs["layouts"]) - 1 else ""))
    return "\n".join(out + [" }", "}"]) + "\n"


def spec_diff(old: dict, new: dict) -> list[str]:
    "One line per parameter whose layout differs between two `partition_specs` results."
    lines = []
    for layout in sorted(set(old) | set(new)):
        a, b = old.get(layout, {}), new.get(layout, {})
        for path in sorted(set(a) | set(b)):
            if path not in b: lines.append(f"{layout}  {path}: in the golden file, no longer in the model")
            elif path not in a: lines.append(f"{layout}  {path}: new parameter {b[path]}")
            elif a[path] != b[path]:
                what = ", ".join(f"{k} {a[path][k]} → {b[path][k]}" for k in ("shape", "names", "spec") if a[path][k] != b[path][k])
                lines.append(f"{layout}  {path}: {what}")
    return lines


def test_golden_mega_partition_specs():
    now = mega_specs()
    if os.environ.get("DALLE_NB_REGEN_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(dump(now))
    golden = json.loads(GOLDEN.read_text())
    diff = spec_diff(golden["layouts"], now["layouts"])
    assert not diff, ("the Mega parameter layout changed:\n  " + "\n  ".join(diff[:40]) +
                      (f"\n  ... and {len(diff) - 40} more" if len(diff) > 40 else "") +
                      "\nIf this is intended: DALLE_NB_REGEN_GOLDEN=1 python -m pytest tests/test_sharding.py -k golden")
    # what the layout must be, whatever the file says: the big matrices split over mp, every split even
    dp = now["layouts"]["dp=32,mp=8"]
    assert dp["encoder/embed_tokens/embedding"]["spec"] == ["mp", None]
    assert dp["decoder/lm_head/kernel"]["spec"] == [None, "mp"]
    assert dp["decoder/layers/layers/self_attn/q_proj/kernel"]["spec"] == [None, None, "mp"]
    assert now["layouts"]["fsdp=32,mp=8"]["decoder/layers/layers/glu/fc2/kernel"]["spec"] == [None, "mp", "fsdp"]
    assert not unnamed_params(nnx.eval_shape(lambda: DalleBart(get_config("mega").bart, rngs=nnx.Rngs(0))))


def test_golden_diff_names_what_moved():
    "The diff a mismatch prints says which parameter moved, and how."
    g = {"dp=32,mp=8": {"a/kernel": {"shape": [4, 8], "names": ["embed", "mlp"], "spec": [None, "mp"]}}}
    moved = {"dp=32,mp=8": {"a/kernel": {"shape": [4, 8], "names": ["embed", "mlp"], "spec": [None, None]},
                            "b/kernel": {"shape": [2], "names": ["norm"], "spec": [None]}}}
    d = spec_diff(g, moved)
    assert d == ["dp=32,mp=8  a/kernel: spec [None, 'mp'] → [None, None]",
                 "dp=32,mp=8  b/kernel: new parameter {'shape': [2], 'names': ['norm'], 'spec': [None]}"]


MICRO = BartConfig(text_vocab=40, image_codes=16, image_vocab=18, max_text_len=6, image_len=8, d_model=32,
                   encoder_layers=2, decoder_layers=2, heads=4, glu_dim=48)


def _batch(n=4, seed=0):
    r = np.random.default_rng(seed)
    text = r.integers(4, MICRO.text_vocab, (n, MICRO.max_text_len)).astype(np.int32)
    text[:, 0], text[:, -2:] = 0, 1
    return jnp.asarray(text), jnp.asarray(r.integers(0, MICRO.image_codes, (n, MICRO.image_len)).astype(np.int32))


def test_scanned_remat_and_unrolled_give_the_same_loss_and_grads():
    text, image = _batch()
    scanned = DalleBart(replace(MICRO, scan_layers=True, remat="full"), rngs=nnx.Rngs(0))
    unrolled = unstack_params(scanned, DalleBart(replace(MICRO, scan_layers=False), rngs=nnx.Rngs(1)))
    def loss_and_grads(m):
        gd, params, rest = nnx.split(m, nnx.Param, ...)
        f = lambda p: bart_loss(nnx.merge(gd, p, rest), text, image)[0]
        return jax.jit(jax.value_and_grad(f))(params), jax.make_jaxpr(f)(params)
    (ls, gs), jaxpr_s = loss_and_grads(scanned)
    (lu, gu), jaxpr_u = loss_and_grads(unrolled)
    assert "checkpoint" in str(jaxpr_s) or "remat" in str(jaxpr_s)       # remat really is on, per layer
    assert "checkpoint" not in str(jaxpr_u) and "remat" not in str(jaxpr_u)
    np.testing.assert_allclose(float(ls), float(lu), rtol=1e-6)
    gs, gu = nnx.to_flat_state(gs), dict(nnx.to_flat_state(gu))
    compared = 0
    for path, g in gs:
        if path[1:3] == ("layers", "layers"):      # stacked (layers, ...) gradient vs one gradient per unrolled layer
            for l in range(g.shape[0]):
                p = path[:3] + (l,) + path[3:]
                np.testing.assert_allclose(np.asarray(g[...][l]), np.asarray(gu[p][...]), rtol=2e-4, atol=1e-7)
                compared += 1
        else:
            np.testing.assert_allclose(np.asarray(g[...]), np.asarray(gu[path][...]), rtol=2e-4, atol=1e-7)
            compared += 1
    assert compared == len(gu)


def test_same_seed_same_images_on_1_or_8_devices():
    "dalle-mini issue #273: samples must not depend on how many devices share the batch."
    from dalle_nb.sample import generate, row_keys
    cfg = replace(MICRO, encoder_layers=1, decoder_layers=2, init_std=0.5)
    model = DalleBart(cfg, rngs=nnx.Rngs(0))
    text, _ = _batch(8, seed=3)
    blank = jnp.tile(jnp.asarray([[0, 2, 1, 1, 1, 1]], jnp.int32), (8, 1))
    keys = row_keys(7, 8)
    kw = dict(blank_ids=blank, cond_scale=3.0, top_k=8, temperature=1.0)
    one = np.asarray(generate(model, text, keys, **kw))

    mesh = mesh_from_spec("dp=8")
    gd, state = nnx.split(model)
    replicated = nnx.merge(gd, place(state, jax.tree.map(lambda _: NamedSharding(mesh, P()), state,
                                                         is_leaf=lambda x: isinstance(x, nnx.Variable))))
    rows = NamedSharding(mesh, P("dp"))
    text8, blank8, keys8 = (jax.device_put(x, rows) for x in (text, blank, keys))
    eight = generate(replicated, text8, keys8, **{**kw, "blank_ids": blank8})
    assert len(eight.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(eight), one)
    assert len({tuple(r) for r in one}) > 1          # different rows, different images: the check has teeth


def test_models_name_no_mesh_axis():
    "Model code speaks logical axes only: no physical mesh axis name appears in it (they live in the rules table)."
    import inspect, re
    from dalle_nb import layers, vqgan, bart, clip, sample
    for mod in (layers, vqgan, bart, clip, sample):
        hits = re.findall(r"""["'](dp|fsdp|mp)["']""", inspect.getsource(mod))
        assert not hits, f"{mod.__name__} names mesh axes {hits}"
    for cls, c in ((DalleBart, get_config("tiny").bart), (DalleBart, replace(get_config("tiny").bart, scan_layers=True))):
        assert unnamed_params(nnx.eval_shape(lambda: cls(c, rngs=nnx.Rngs(0)))) == []
