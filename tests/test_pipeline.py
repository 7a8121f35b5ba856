"""Pipeline behaviour that spans notebooks (sampling + VQGAN + CLIP + text), on micro models with random weights."""
import numpy as np
import pytest
from dalle_nb.modeldir import micro_models, save_models, load_models
from dalle_nb.pipeline import Pipeline, PromptError, image_name


@pytest.fixture(scope="module")
def pipe():
    return Pipeline(micro_models(seed=1), batch_size=4)


def test_same_seed_same_images_whatever_n_and_batching(pipe):
    a = pipe("a red circle", n=1, rerank=0, seed=11)
    b = pipe("a red circle", n=7, rerank=0, seed=11)          # two chunks of 4, the last padded
    assert (a.tokens[0] == b.tokens[0]).all()
    assert (a.images[0] == b.images[0]).all()
    assert len({t.tobytes() for t in b.tokens}) > 1           # different images within a call


def test_rerank_returns_best_first_and_matches_clip_scores(pipe):
    full = pipe("a blue square above a green triangle", n=6, rerank=0, seed=3)
    ranked = pipe("a blue square above a green triangle", n=6, rerank=6, seed=3)
    scores = pipe.score(full.images.astype(np.float32) / 255, pipe.encode_prompt("a blue square above a green triangle"))
    distinct = {}                                                   # best first, a copy of a better image left out
    for i in np.argsort(-scores, kind="stable"): distinct.setdefault(full.images[i].tobytes(), int(i))
    assert list(ranked.indices) == list(distinct.values()) and ranked.repeats == 6 - len(distinct)
    assert np.all(np.diff(ranked.scores) <= 1e-6)


def test_cond_scale_changes_samples(pipe):
    a = pipe("a red circle", n=4, rerank=0, seed=0, cond_scale=1.0)
    b = pipe("a red circle", n=4, rerank=0, seed=0, cond_scale=8.0)
    assert (a.tokens != b.tokens).any()


def test_bad_requests(pipe):
    with pytest.raises(PromptError): pipe("   ", n=2)
    with pytest.raises(ValueError, match=r"n must be in \[1,"): pipe("a red circle", n=0)
    with pytest.raises(ValueError, match="rerank"): pipe("a red circle", n=2, rerank=3)


def test_save_and_reload_gives_same_images(tmp_path, pipe):
    save_models(tmp_path / "m", pipe.models, dtype=None)
    again = Pipeline(load_models(tmp_path / "m"), batch_size=4)
    a = pipe("a cyan circle", n=3, rerank=0, seed=5)
    b = again("a cyan circle", n=3, rerank=0, seed=5)
    assert (a.tokens == b.tokens).all()
    paths = b.save(tmp_path / "out")
    assert [p.name for p in paths] == [image_name("a cyan circle", 5, i) for i in range(3)] + ["grid.png"]


def test_plausibility_one_is_greedy_conditional_decoding(pipe):
    # α = 1 keeps only the conditional model's best id, so any guidance scale gives the greedy conditional sample
    guarded = pipe("a red circle", n=3, rerank=0, seed=5, cond_scale=8.0, plausibility=1.0)
    greedy = pipe("a red circle", n=3, rerank=0, seed=9, cond_scale=1.0, top_k=1)
    assert (guarded.tokens == greedy.tokens).all()
    assert guarded.settings["plausibility"] == 1.0
    with pytest.raises(ValueError, match="plausibility"): pipe("a red circle", n=1, plausibility=2.0)


def test_quality_bench_runs_on_a_model_directory(tmp_path):
    import json, subprocess, sys
    from pathlib import Path
    model = save_models(tmp_path / "m", micro_models(seed=2))
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "bench" / "quality.py"), "--model", str(model), "--prompts", "2", "--n", "2",
           "--scales", "1,3", "--out", str(tmp_path / "out")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "quality.json").read_text())
    rows = res["rows"]
    assert set(res["vqgan_roundtrip_accuracy"]) == {"one", "two", "heldout"}
    assert [(r["category"], r["cond_scale"]) for r in rows] == [(c, s) for c in ("one", "two", "heldout") for s in (1.0, 3.0)]
    assert all(0 <= r["first"] <= r["oracle"] <= 1 and r["reranked"] <= r["oracle"] for r in rows)
    assert (tmp_path / "out" / "quality.png").stat().st_size > 0


def test_factored_tokens_through_the_pipeline(tmp_path):
    "A factored VQGAN (outline + colour code per patch) in a model directory: sampling, image prompts, save and reload."
    from dataclasses import replace
    from flax import nnx
    from dalle_nb.modeldir import Models
    from dalle_nb.factored import make_vqgan
    from dalle_nb.bart import DalleBart
    m = micro_models(seed=3)
    vq = replace(m.cfg.vqgan, n_embed=16, color_codes=8)
    cfg = replace(m.cfg, vqgan=vq, bart=replace(m.cfg.bart, image_codes=vq.n_codes, image_vocab=vq.n_codes, image_len=vq.n_tokens))
    assert (vq.grid, vq.n_tokens, vq.n_codes) == (4, 32, 24)
    models = Models(cfg, m.text, make_vqgan(vq, rngs=nnx.Rngs(0)), DalleBart(cfg.bart, rngs=nnx.Rngs(1)), m.clip)
    pipe = Pipeline(models, batch_size=4)
    r = pipe("a red circle", n=3, rerank=2, seed=4)
    assert r.tokens.shape == (2, 32) and r.images.shape == (2, 16, 16, 3) and r.scores[0] >= r.scores[1]
    picture = np.zeros((16, 16, 3), np.uint8); picture[:] = 240; picture[4:12, 4:12] = (220, 30, 30)
    ids = pipe.encode_image(picture)
    pairs = ids.reshape(-1, 2)
    assert (pairs[:, 0] < 16).all() and (pairs[:, 1] >= 16).all()          # outline id, then colour id, per patch
    assert pipe.row_tokens == 8
    done = pipe("a red circle", n=2, rerank=0, seed=4, image_prompt=picture, keep_rows=1)
    assert (done.tokens[:, :8] == ids[:, :8]).all()                         # one grid row is 8 tokens
    with pytest.raises(ValueError, match="expected 32 token ids"):
        models.vqgan.decode(np.zeros((1, 16), np.int32))
    wrong_slots = models.vqgan.decode(np.full((1, 32), 20, np.int32))        # colour ids in outline slots: clipped, drawn
    assert np.isfinite(np.asarray(wrong_slots)).all()
    again = Pipeline(load_models(save_models(tmp_path / "m", models, dtype=None)), batch_size=4)
    assert again.cfg.vqgan.color_codes == 8
    assert (again("a red circle", n=3, rerank=0, seed=4).tokens == pipe("a red circle", n=3, rerank=0, seed=4).tokens).all()


def test_shipped_tokenizer_spells_held_out_pairs_with_seen_tokens():
    "The shipped VQGAN is factored: a red triangle (held out) has a green triangle's outline ids and a red square's colour ids."
    import jax.numpy as jnp
    from dalle_nb.shapes import Obj, render, caption_match, HELD_OUT
    m = load_models()
    assert m.cfg.vqgan.factored and ("red", "triangle") in HELD_OUT
    drawn = np.stack([render([Obj(c, s, "large", 28, 28, 12)]) for c, s in (("red", "triangle"), ("green", "triangle"), ("red", "square"))])
    x = jnp.asarray(drawn / 255.0, jnp.float32)
    ids = np.asarray(m.vqgan.encode(x)).reshape(3, -1, 2)
    assert (ids[0, :, 0] == ids[1, :, 0]).all()                              # outline: the same, whatever the colour
    figure = ids[0, :, 0] != ids[0, 0, 0]                                    # patches the triangle covers (patch 0 is background)
    assert figure.sum() >= 6
    assert set(ids[0, figure, 1]).isdisjoint(ids[1, figure, 1])              # red is not green ...
    assert set(ids[0, figure, 1]) <= set(ids[2, :, 1])                       # ... and is the red square's red
    from dalle_nb.images import to_uint8
    assert caption_match(to_uint8(np.asarray(m.vqgan.decode(ids[:1].reshape(1, -1))))[0], "a large red triangle")


def test_progressive_bench_runs(tmp_path):
    "bench/progressive.py at its smallest: both paths timed, the same tokens."
    import json, subprocess, sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "bench" / "progressive.py"), "--n", "2", "--every", "64", "--repeats", "1",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads((tmp_path / "progressive.json").read_text())["rows"]
    assert [row["every"] for row in rows] == [None, 64] and all(row["same_tokens"] for row in rows)
    assert rows[1]["frames_per_call"] == 2 and all(row["warm_s"] > 0 for row in rows)
