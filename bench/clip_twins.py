"""Experiment (BENCHMARKS.md, "Attempts on two-object accuracy"): a CLIP trained with near-miss twins.

Each training pair comes with a twin: its caption with one attribute changed (never into a held-out pair), drawn as a
fresh scene and sent through the shipped VQGAN like the original. Both go into the contrastive batch, so every caption
has an image that differs from its own in exactly one respect (image-side hard negatives, besides the text-side ones
the `clip` stage already uses). Writes a model directory (the shipped model with this CLIP) to compare with
`bench/rerankers.py --clip WORKDIR/model`.

    python bench/clip_twins.py STEPS PAIRS_PER_BATCH WORKDIR [twins|plain]
"""
import sys, json, time, numpy as np, jax, jax.numpy as jnp
from dataclasses import replace
from pathlib import Path
from flax import nnx
from dalle_nb.config import get_config
from dalle_nb.modeldir import load_models
from dalle_nb.shapes import make_split, corrupt_caption, parse_caption, render, Obj, SIZES, _place_one, _place_two, HELD_OUT, PALETTE
from dalle_nb.train import encode_dataset, reconstruct, hard_negatives, fit, make_optimizer, _floats, TextEncoder
from dalle_nb.clip import CLIP, clip_loss
from dalle_nb.data import Batches
from dalle_nb.sharding import mesh_from_spec, sharded_init
steps = int(sys.argv[1]); bs = int(sys.argv[2]); work = Path(sys.argv[3]); mode = sys.argv[4] if len(sys.argv) > 4 else "twins"
cfg = get_config("tiny"); sc = replace(cfg.clip_train, steps=steps, batch_size=bs)
M = load_models(None)
HO = set(HELD_OUT)
def scene_for(caption, rng):
    s = parse_caption(caption)
    if any((w.color, w.shape) in HO for w in s.objects): return None
    objs = [Obj(w.color, w.shape, w.size or ("small", "large")[rng.integers(2)], 0., 0., 0.) for w in s.objects]
    objs = [replace(o, r=float(SIZES[o.size])) for o in objs]
    if len(objs) == 1: return [_place_one(rng, objs[0])]
    p = _place_two(rng, objs[0], objs[1], s.relation)
    return None if p is None else list(p)
def twins(captions, seed):
    rng, kinds = np.random.default_rng(seed), ("color", "shape", "relation", "size")
    imgs, caps = [], []
    for i, c in enumerate(captions):
        for j in range(8):
            t = corrupt_caption(c, rng, kinds[(i + j) % 4])
            objs = None if t is None else scene_for(t, rng)
            if objs is not None: break
        else: t, objs = c, scene_for(c, rng)
        imgs.append(render(objs)); caps.append(t)
    return np.stack(imgs), caps
images, captions = make_split("train", cfg.data.n_train, cfg.data.seed)
vimg, vcap = make_split("val", 256, cfg.data.seed)
t0 = time.time()
work.mkdir(parents=True, exist_ok=True)
ti, tc = twins(captions, 1); vti, vtc = twins(vcap, 2)
print("twins", time.time() - t0, flush=True)
vq = M.vqgan
rec = reconstruct(vq, encode_dataset(vq, images, work / "tok_train.npy"))
rtw = reconstruct(vq, encode_dataset(vq, ti, work / "tok_twin.npy"))
vrec = reconstruct(vq, encode_dataset(vq, vimg, None, False), progress=False); vrtw = reconstruct(vq, encode_dataset(vq, vti, None, False), progress=False)
print("recon", time.time() - t0, flush=True)
ct = TextEncoder(M.text.tokenizer, cfg.clip.text_len)
data = {"image": rec, "text": ct(captions), "neg": ct(hard_negatives(captions, sc.seed)), "timage": rtw, "ttext": ct(tc)}
mesh = mesh_from_spec(sc.mesh)
model = sharded_init(lambda: CLIP(cfg.clip, rngs=nnx.Rngs(sc.seed)), mesh)
def loss(m, b, k):
    if mode == "twins":
        return clip_loss(m, jnp.concatenate([_floats(b["image"]), _floats(b["timage"])]), jnp.concatenate([b["text"], b["ttext"]]), b["neg"])
    return clip_loss(m, _floats(b["image"]), b["text"], b["neg"])
from dalle_nb.images import to_float
vx = jnp.asarray(to_float(np.concatenate([vrec, vrtw]))); vt = jnp.asarray(ct(vcap + vtc)); vn = jnp.asarray(ct(hard_negatives(vcap, 3)))
evaluate = nnx.jit(lambda m: clip_loss(m, vx, vt, vn)[1])
hist = fit(model, make_optimizer(sc), loss, Batches.on_mesh(data, sc.batch_size, mesh, seed=sc.seed), sc, mesh=mesh, workdir=work / "clip", eval_fn=evaluate, desc="clip")
print(hist[-1], time.time() - t0, flush=True)
# save a model dir copy with this clip
from dalle_nb.modeldir import save_models
out = work / "model"
M2 = replace(M, clip=model)
save_models(out, M2, card=M.card)
print("saved", out, flush=True)
