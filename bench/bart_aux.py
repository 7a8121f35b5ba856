"""Experiment (BENCHMARKS.md, "Attempts on held-out pairs"): the BART with an auxiliary continuous target.

Discrete-token generators compose unseen attribute pairs worse than ones trained on continuous targets, and an
auxiliary continuous loss has been reported to help a discrete one (Farid et al. 2025, "What drives compositional
generalization in visual generative models?", who add a JEPA-style feature-prediction loss to MaskGIT). This trains the
shipped BART stage again from scratch exactly as `bench/bart_variants.py` does (same config, seeds, data, caption
blanking and schedule), plus a linear head on the decoder's last hidden state that regresses, at every position, a
continuous description of the patch the position predicts:

- `--target ze`: the VQGAN's pre-quantisation vector of that patch (standardised per channel);
- `--target pixels`: the patch's pixels (8 × 8 × 3, scaled to [-1, 1]).

The loss is `cross-entropy + --weight × mean squared error`; sampling is unchanged (the head is dropped when the model
is written). Compare with the baseline trained the same way without the head (`bench/bart_variants.py`, no `--set`):

    python bench/bart_aux.py --target ze --weight 1 --out runs/bart_aux/ze/model
    python bench/heldout_probes.py breakdown --model runs/bart_aux/ze/model
"""
import argparse, json, shutil, time
from pathlib import Path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", choices=("ze", "pixels"), required=True)
    p.add_argument("--weight", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--n", type=int, default=48_000, help="training images (data seed of the shipped model)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)

    import numpy as np, jax.numpy as jnp, optax
    from flax import nnx
    from dalle_nb.config import override
    from dalle_nb.modeldir import load_models, save_models, default_model_dir
    from dalle_nb.shapes import make_split
    from dalle_nb.layers import Linear
    from dalle_nb.bart import DalleBart, bart_loss, shift_right, text_mask
    from dalle_nb.data import Batches, blank_captions
    from dalle_nb.sharding import mesh_from_spec, sharded_init
    from dalle_nb.optim import make_optimizer
    from dalle_nb.train import fit, encode_dataset

    t0 = time.perf_counter()
    M = load_models(None)
    cfg = override(M.cfg, [f"bart_train.steps={a.steps}", f"data.n_train={a.n}", "bart_train.ckpt_every=1000000000"])
    sc, bc = cfg.bart_train, cfg.bart
    out = Path(a.out); work = out.parent / "work"
    imgs, caps = make_split("train", a.n, seed=cfg.data.seed)
    vimgs, vcaps = make_split("val", 256, seed=cfg.data.seed)
    g = int(bc.image_len ** 0.5); ps = imgs.shape[1] // g

    data = {"text": M.text(caps), "image": encode_dataset(M.vqgan, imgs, work / "tokens_train.npy")}
    if a.target == "ze":
        feats = nnx.jit(lambda m, x: m.features(x.astype(jnp.float32) / 255.0))
        ze = np.concatenate([np.asarray(feats(M.vqgan, jnp.asarray(imgs[i:i + 512]))) for i in range(0, len(imgs), 512)])
        ze = ze.reshape(len(imgs), bc.image_len, -1)
        mu, sd = ze.mean((0, 1)), ze.std((0, 1)) + 1e-6
        data["target"] = ((ze - mu) / sd).astype(np.float32)
        dim = ze.shape[-1]
    else:
        data["target"] = imgs                       # uint8, cut into patches inside the loss
        dim = ps * ps * imgs.shape[-1]
    val = {"text": jnp.asarray(M.text(vcaps[:256])), "image": jnp.asarray(encode_dataset(M.vqgan, vimgs[:256], None, False))}
    blank = jnp.asarray(M.text.blank(1)[0])

    class AuxBart(nnx.Module):
        "The BART (initialised exactly as the stage does) and a linear head from its last hidden state to the target."
        def __init__(self):
            self.bart = DalleBart(bc, rngs=nnx.Rngs(sc.seed))
            self.aux = Linear(bc.d_model, dim, axes=("embed", None), std=0.02, rngs=nnx.Rngs(sc.seed + 1))

    def hidden_and_logits(bart, text, image):
        dec = bart.decoder
        ids_in = shift_right(image, bc.bos_id); T = ids_in.shape[1]
        x, _ = dec.layers(dec._embed(ids_in, jnp.arange(T)), bart.encoder(text), text_mask(text, bc.pad_id),
                          jnp.tril(jnp.ones((T, T), bool)))
        if dec.final_ln is not None: x = dec.final_ln(x)
        return x, dec.lm_head(x).astype(jnp.float32)

    def target_of(t):
        if a.target == "ze": return t
        B = t.shape[0]
        t = t.reshape(B, g, ps, g, ps, -1).transpose(0, 1, 3, 2, 4, 5).reshape(B, g * g, -1)
        return t.astype(jnp.float32) / 127.5 - 1.0

    def loss_fn(m, b, k):
        x, logits = hidden_and_logits(m.bart, blank_captions(b["text"], blank, sc.blank_caption_prob, k), b["image"])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, b["image"]).mean()
        mse = jnp.mean((m.aux(x).astype(jnp.float32) - target_of(b["target"])) ** 2)
        acc = (logits.argmax(-1) == b["image"]).mean()
        return ce + a.weight * mse, {"loss": ce, "aux_mse": mse, "accuracy": acc}

    mesh = mesh_from_spec(sc.mesh)
    model = sharded_init(AuxBart, mesh)
    # the hand-written forward must be the BART's own
    probe = {k: v[:4] for k, v in val.items()}
    ref = model.bart(probe["text"], probe["image"])
    np.testing.assert_allclose(np.asarray(hidden_and_logits(model.bart, probe["text"], probe["image"])[1]), np.asarray(ref),
                               rtol=1e-5, atol=1e-6)
    evaluate = nnx.jit(lambda m: bart_loss(m.bart, val["text"], val["image"])[1])
    hist = fit(model, make_optimizer(sc), loss_fn, Batches.on_mesh(data, sc.batch_size, mesh, seed=sc.seed), sc, mesh=mesh,
               workdir=work / "bart", eval_fn=evaluate, desc=f"bart+{a.target}")
    if out.exists(): shutil.rmtree(out)
    shutil.copytree(default_model_dir(), out)
    M.bart, M.cfg = model.bart, cfg
    save_models(out, M, card=M.card + f"\n\nExperiment: BART retrained {a.steps} steps on {a.n} images with an auxiliary "
                f"{a.target} regression head (weight {a.weight}; bench/bart_aux.py).\n")
    last = {k: v for k, v in hist[-1].items() if k.startswith("val_") or k == "aux_mse"}
    (out.parent / "bart_aux.json").write_text(json.dumps(dict(args=vars(a), last=last, minutes=round((time.perf_counter() - t0) / 60, 1)), indent=1))
    print(f"wrote {out}: {last} ({(time.perf_counter() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    main()
