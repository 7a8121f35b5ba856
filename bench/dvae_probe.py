"""dVAE collapse probe (BENCHMARKS.md, "Collapse probes"): train the tiny dVAE N steps with its own Adam loop and, every 50 steps, report codes used and hard-code PSNR on 100 validation images."""
import argparse, json, sys, time, math
import numpy as np, jax, jax.numpy as jnp, optax
from flax import nnx
from dalle_nb.config import get_config
from dalle_nb.shapes import make_split
from dalle_nb.images import to_float
import dalle_nb.dvae as D

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--set", action="append", default=[])
p.add_argument("--usage", type=float, default=0.0, help="weight of KL(batch-mean q || uniform) per pixel value")
p.add_argument("--out_std", type=float, default=None, help="std of encoder output conv init")
p.add_argument("--dec_in_std", type=float, default=None)
p.add_argument("--usage_on", default="probs")
p.add_argument("--st", action="store_true")
p.add_argument("--no_noise", action="store_true")
p.add_argument("--name", default="run")
p.add_argument("--n_train", type=int, default=6000)
a = p.parse_args()
cfg = get_config("tiny", ["image_tokenizer=dvae", "arch=dalle"] + a.set)
d, s = cfg.dvae, cfg.dvae_train
imgs, _ = make_split("train", a.n_train, cfg.data.seed)
val = jnp.asarray(to_float(make_split("val", 100, cfg.data.seed)[0]))
if a.st:
    _soft = D.gumbel_softmax
    def _st(logits, key, tau):
        y = _soft(logits, key, tau)
        h = jax.nn.one_hot(y.argmax(-1), y.shape[-1], dtype=y.dtype)
        return y + jax.lax.stop_gradient(h - y)
    D.gumbel_softmax = _st
if a.no_noise:
    D.gumbel_softmax = lambda logits, key, tau: jax.nn.softmax(logits.astype(jnp.float32), -1)
model = D.DVAE(d, rngs=nnx.Rngs(s.seed))
if a.out_std is not None:
    k = model.encoder.output.kernel
    k[...] = jax.random.normal(jax.random.key(1), k[...].shape) * a.out_std
if a.dec_in_std is not None:
    k = model.decoder.input.kernel
    k[...] = jax.random.normal(jax.random.key(2), k[...].shape) * a.dec_in_std
sched = optax.warmup_cosine_decay_schedule(0.0, s.lr, s.warmup_steps, max(s.steps, a.steps), s.lr * 0.1)
opt = nnx.Optimizer(model, optax.adam(sched), wrt=nnx.Param)

def loss_fn(m, x, key):
    loss, aux = D.dvae_loss(m, x, key, advance=1.0)
    if a.usage:
        logits = m.logits(x)
        if a.usage_on == "probs": q = jax.nn.softmax(logits, -1)
        else: q = D.gumbel_softmax(logits, key, aux["tau"])
        q = q.reshape(-1, logits.shape[-1]).mean(0)
        ukl = (q * jnp.log(q + 1e-12)).sum() + math.log(q.shape[0])
        n_values = x.shape[1] * x.shape[2] * x.shape[3]
        loss = loss + a.usage * ukl * logits.shape[1] * logits.shape[2] / n_values
        aux = {**aux, "ukl": ukl}
    return loss, aux

@nnx.jit
def step(m, opt, x, key):
    (l, aux), g = nnx.value_and_grad(loss_fn, has_aux=True)(m, x, key)
    opt.update(m, g)
    return aux

@nnx.jit
def evaluate(m):
    logits = m.logits(val)
    ids = logits.argmax(-1).reshape(val.shape[0], -1)
    rec = m.decode(ids)
    mse = ((rec - val) ** 2).mean((1, 2, 3))
    rec2 = m.decode(jnp.roll(ids, 1, axis=0))
    shuf = jnp.mean(10 * jnp.log10(1 / jnp.maximum(((rec2 - val) ** 2).mean((1, 2, 3)), 1e-10)))
    q = jax.nn.softmax(logits, -1)
    ent = -(q * jnp.log(q + 1e-12)).sum(-1).mean()
    return ids, jnp.mean(10 * jnp.log10(1 / jnp.maximum(mse, 1e-10))), ent, q.max(-1).mean(), shuf

rng = np.random.default_rng(0)
key = jax.random.key(0)
t0 = time.time(); rows = []
for i in range(a.steps):
    x = jnp.asarray(to_float(imgs[rng.integers(0, len(imgs), s.batch_size)]))
    aux = step(model, opt, x, jax.random.fold_in(key, i))
    if (i + 1) % 50 == 0:
        ids, ps, ent, qmax, shuf = evaluate(model)
        ids = np.asarray(ids); c = np.bincount(ids.ravel()) / ids.size; c = c[c > 0]
        row = dict(step=i + 1, codes=int(len(c)), ppl=float(np.exp(-(c * np.log(c)).sum())), hard_psnr=float(ps), shuf_psnr=float(shuf),
                   soft_psnr=float(aux["psnr"]), tau=float(aux["tau"]), beta=float(aux["beta"]), kl=float(aux["kl"]),
                   post_ent=float(ent), qmax=float(qmax), sec=round(time.time() - t0))
        if "ukl" in aux: row["ukl"] = float(aux["ukl"])
        rows.append(row); print(json.dumps(row), flush=True)
json.dump(dict(name=a.name, args=vars(a), rows=rows), open(f"/tmp/dvae_exp/{a.name}.json", "w"))
