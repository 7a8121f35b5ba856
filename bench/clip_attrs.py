"""Experiment (BENCHMARKS.md, "Attempts on held-out pairs"): a CLIP trained with attribute-dropped captions.

The `clip` stage of the shipped model again (same config, data, VQGAN reconstructions, hard negatives), except that
each positive caption loses, per object and with probability P each, its colour word ("a large circle") or its shape
word ("a red shape") — `bench/bart_finetune.py`'s `drop_attributes` — so that the text tower learns colour and shape
words on their own; the hard negatives stay those of the full captions. Writes a model directory (the shipped model
with this CLIP) for `bench/rerankers.py --clip DIR`:

    python bench/clip_attrs.py 0.3 runs/clip_attrs/model
    python bench/rerankers.py --categories heldout,two,one --clip runs/clip_attrs/model
"""
import dataclasses, shutil, sys
from pathlib import Path

import numpy as np


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2: raise SystemExit(__doc__)
    p, out = float(argv[0]), Path(argv[1])
    sys.path.insert(0, str(Path(__file__).parent))
    from bart_finetune import drop_attributes
    from flax import nnx
    from dalle_nb.modeldir import load_models, save_models, default_model_dir
    from dalle_nb.shapes import make_split
    from dalle_nb.train import encode_dataset, reconstruct, hard_negatives, fit, make_optimizer, _floats, TextEncoder
    from dalle_nb.clip import CLIP, clip_loss
    from dalle_nb.data import Batches
    from dalle_nb.sharding import mesh_from_spec, sharded_init

    M = load_models(None); cfg = M.cfg; sc = cfg.clip_train
    imgs, caps = make_split("train", cfg.data.n_train, seed=cfg.data.seed)
    vimgs, vcaps = make_split("val", 256, seed=cfg.data.seed)
    imgs = reconstruct(M.vqgan, encode_dataset(M.vqgan, imgs, None, True))
    vimgs = reconstruct(M.vqgan, encode_dataset(M.vqgan, vimgs, None, False), progress=False)
    ct = TextEncoder(M.text.tokenizer, cfg.clip.text_len)
    data = {"image": imgs, "text": ct(drop_attributes(caps, p, 7)), "neg": ct(hard_negatives(caps, sc.seed))}
    vx, vt, vn = _floats(vimgs), ct(vcaps), ct(hard_negatives(vcaps, sc.seed + 1))
    mesh = mesh_from_spec(sc.mesh)
    model = sharded_init(lambda: CLIP(cfg.clip, rngs=nnx.Rngs(sc.seed)), mesh)
    evaluate = nnx.jit(lambda m: clip_loss(m, vx, vt, vn)[1])
    hist = fit(model, make_optimizer(sc), lambda m, b, k: clip_loss(m, _floats(b["image"]), b["text"], b["neg"]),
               Batches.on_mesh(data, sc.batch_size, mesh, seed=sc.seed), sc, mesh=mesh, workdir=out.parent / "clipwork",
               eval_fn=evaluate, desc="clip")
    if out.exists(): shutil.rmtree(out)
    shutil.copytree(default_model_dir(), out)
    try: M.clip = model
    except dataclasses.FrozenInstanceError: M = dataclasses.replace(M, clip=model)
    save_models(out, M, card=M.card + f"\n\nExperiment: CLIP trained with attribute-dropped captions, p={p} (bench/clip_attrs.py).\n")
    print("wrote", out, {k: round(v, 4) for k, v in hist[-1].items() if k.startswith("val_")})


if __name__ == "__main__":
    main()
