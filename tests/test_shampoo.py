"""Our Distributed Shampoo (`dalle_nb.shampoo`) against Google's reference implementation (`precondition-opt`).

Both optimisers train the same small model from the same start on the same batches, independently, for 25 steps
with the same hyper-parameters; their parameter updates must agree at every step. The model has what Shampoo treats
differently: matrices cut into blocks, a 1-D parameter, a 4-D tensor whose small axes merge, an embedding too long
to precondition (diagonal fallback) and a scalar.
"""
import warnings
import numpy as np
import pytest
import jax, jax.numpy as jnp
import optax

from dalle_nb.shampoo import distributed_shampoo


def reference():
    "Google's implementation, imported through a shim for the `jax.tree_*` aliases recent JAX removed."
    for name in ("tree_map", "tree_flatten", "tree_unflatten", "tree_leaves", "tree_structure"):
        if not hasattr(jax, name): setattr(jax, name, getattr(jax.tree_util, name))
    from precondition import distributed_shampoo as ds
    return ds


def init_params():
    k = jax.random.split(jax.random.key(0), 6)
    return {"w1": 0.3 * jax.random.normal(k[0], (12, 40)), "b1": jnp.zeros(40), "w2": 0.3 * jax.random.normal(k[1], (40, 3)),
            "k": 0.3 * jax.random.normal(k[2], (2, 3, 5, 4)), "emb": 0.3 * jax.random.normal(k[3], (70, 6)),
            "scale": jnp.float32(1.0)}


def loss_fn(p, batch):
    x, y, ids, t = batch
    h = jnp.tanh(x @ p["w1"] + p["b1"])
    fit = jnp.mean((h @ p["w2"] - y) ** 2)
    conv = jnp.mean((jnp.tanh(x[:, :6] @ p["k"].reshape(6, 20)) - 0.5) ** 2)
    emb = jnp.mean((p["scale"] * p["emb"][ids].sum(-1) - t) ** 2)
    return fit + conv + emb


def batch(step):
    k = jax.random.split(jax.random.fold_in(jax.random.key(1), step), 4)
    x = jax.random.normal(k[0], (32, 12))
    y = jnp.stack([jnp.sin(x[:, 0]), x[:, 1] * x[:, 2], jnp.cos(x[:, 3])], -1)
    return x, y, jax.random.randint(k[2], (32,), 0, 70), jax.random.normal(k[3], (32,))


def run(tx, steps):
    p, updates = init_params(), []
    s = tx.init(p)
    @jax.jit
    def step(p, s, b):
        g = jax.grad(loss_fn)(p, b)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s, u
    for i in range(steps):
        p, s, u = step(p, s, batch(i))
        updates.append(u)
    return p, updates


CONFIGS = {
    # DALL·E Mega's choices (scaled down): RMSProp-normalised grafting, momentum as moving average, no Nesterov
    "mega": dict(graft="rmsprop_normalized", b1=0.9, b2=0.99, nesterov=False, moving_average_for_momentum=True,
                 start_preconditioning_step=5, preconditioning_compute_steps=3, weight_decay=0.0),
    "sgd+nesterov+wd": dict(graft="sgd", b1=0.9, b2=0.999, nesterov=True, moving_average_for_momentum=False,
                            start_preconditioning_step=3, preconditioning_compute_steps=4, weight_decay=1e-3),
    "adagrad": dict(graft="adagrad", b1=0.5, b2=1.0, nesterov=True, moving_average_for_momentum=False,
                    start_preconditioning_step=7, preconditioning_compute_steps=5, weight_decay=0.0),
    "rmsprop": dict(graft="rmsprop", b1=0.0, b2=0.95, nesterov=False, moving_average_for_momentum=False,
                    start_preconditioning_step=4, preconditioning_compute_steps=2, weight_decay=0.0),
    "adagrad_normalized": dict(graft="adagrad_normalized", b1=0.9, b2=0.9, nesterov=False, moving_average_for_momentum=True,
                               start_preconditioning_step=6, preconditioning_compute_steps=1, weight_decay=0.0),
}
STEPS = 25
# Per-update tolerance, relative to the update's largest entry. Seen (2026-11-22, CPU, float32): mega 2.1e-5,
# sgd+nesterov+wd 6.3e-6, adagrad_normalized 3.2e-5, rmsprop 2.3e-4, adagrad 2.7e-3. The larger ones are all on the
# 1-D `b1`, whose 16×16 block statistics are sums of fewer than 16 rank-one terms early on: their roots are set by
# the 1e-6 ridge, a 10^6 condition number that float32 Newton iterations resolve only to ~1e-3 (the notebook measures
# the same against float64). A real difference in the algorithm shows up at 1e-2 and above (see the test below).
TOL = 5e-3
SHARED = dict(diagonal_epsilon=1e-10, matrix_epsilon=1e-6, skip_preconditioning_dim_size_gt=64, merge_small_dims_block_size=16)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_reference(name):
    ds = reference()
    c = CONFIGS[name]
    lr = optax.linear_schedule(0.0, 0.02, 8)
    graft_type = {"sgd": ds.GraftingType.SGD, "adagrad": ds.GraftingType.ADAGRAD, "rmsprop": ds.GraftingType.RMSPROP,
                  "rmsprop_normalized": ds.GraftingType.RMSPROP_NORMALIZED,
                  "adagrad_normalized": ds.GraftingType.ADAGRAD_NORMALIZED}[c["graft"]]
    theirs = ds.distributed_shampoo(lr, 16, beta1=c["b1"], beta2=c["b2"], weight_decay=c["weight_decay"],
                                    start_preconditioning_step=c["start_preconditioning_step"],
                                    preconditioning_compute_steps=c["preconditioning_compute_steps"], graft_type=graft_type,
                                    nesterov=c["nesterov"], moving_average_for_momentum=c["moving_average_for_momentum"],
                                    precision=jax.lax.Precision.HIGHEST, **SHARED)
    ours = distributed_shampoo(lr, 16, b1=c["b1"], b2=c["b2"], weight_decay=c["weight_decay"],
                               start_preconditioning_step=c["start_preconditioning_step"],
                               preconditioning_compute_steps=c["preconditioning_compute_steps"], graft=c["graft"],
                               nesterov=c["nesterov"], moving_average_for_momentum=c["moving_average_for_momentum"], **SHARED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the reference asks for float64 roots; without x64 JAX warns and uses float32
        p_ref, u_ref = run(theirs, STEPS)
    p_our, u_our = run(ours, STEPS)
    worst = 0.0
    for i, (a, b) in enumerate(zip(u_our, u_ref)):
        for k in a:
            scale = float(jnp.abs(b[k]).max()) + 1e-12
            dev = float(jnp.abs(a[k] - b[k]).max()) / scale
            worst = max(worst, dev)
            assert dev < TOL, f"step {i}, {k}: relative deviation {dev:.2e}"
    for k in p_ref:
        assert float(jnp.abs(p_our[k] - p_ref[k]).max()) <= TOL * float(jnp.abs(p_ref[k]).max()), k
    moved = float(jnp.abs(p_ref["w1"] - init_params()["w1"]).max())
    assert moved > 1e-2                           # the comparison is not between two optimisers that do nothing
    print(f"{name}: largest relative deviation of an update over {STEPS} steps: {worst:.2e}")


def test_reference_check_can_fail():
    "A deliberate change (Nesterov on one side only) is caught by the same comparison."
    ds = reference()
    c = CONFIGS["mega"]
    kw = dict(start_preconditioning_step=c["start_preconditioning_step"], preconditioning_compute_steps=c["preconditioning_compute_steps"],
              moving_average_for_momentum=True, **SHARED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, u_ref = run(ds.distributed_shampoo(0.01, 16, beta1=0.9, beta2=0.99, graft_type=ds.GraftingType.RMSPROP_NORMALIZED,
                                              nesterov=False, **kw), 8)
    _, u_our = run(distributed_shampoo(0.01, 16, b1=0.9, b2=0.99, graft="rmsprop_normalized", nesterov=True, **kw), 8)
    dev = max(float(jnp.abs(a[k] - b[k]).max() / (jnp.abs(b[k]).max() + 1e-12)) for a, b in zip(u_our, u_ref) for k in a)
    assert dev > 1e-2


def test_checkpoint_round_trip_in_training(tmp_path):
    "Shampoo inside `make_optimizer` and `nnx.Optimizer`: an orbax checkpoint restores a state that continues identically."
    from flax import nnx
    from dalle_nb.config import StageConfig
    from dalle_nb.optim import make_optimizer
    from dalle_nb.layers import Linear
    from dalle_nb.checkpoint import Checkpointer

    sc = StageConfig(steps=20, lr=0.05, warmup_steps=0, decay="constant", optimizer="shampoo", shampoo_block=4, shampoo_every=2,
                     shampoo_start=1)
    xs = jax.random.normal(jax.random.key(0), (32, 6)); ys = jnp.sin(xs @ jnp.arange(12.).reshape(6, 2))
    def make():
        m = Linear(6, 2, use_bias=True, rngs=nnx.Rngs(0))
        return m, nnx.Optimizer(m, make_optimizer(sc), wrt=nnx.Param)
    @nnx.jit
    def step(m, opt):
        loss, g = nnx.value_and_grad(lambda m: ((m(xs) - ys) ** 2).mean())(m)
        opt.update(m, g)
        return loss
    m, opt = make()
    for _ in range(5): step(m, opt)
    ck = Checkpointer(tmp_path / "ck")
    ck.save(5, nnx.state((m, opt)), {"step": 5})
    after = [float(step(m, opt)) for _ in range(4)]
    m2, opt2 = make()
    restored, _ = ck.restore(nnx.state((m2, opt2)))
    nnx.update((m2, opt2), restored)
    ck.close()
    again = [float(step(m2, opt2)) for _ in range(4)]
    assert after == again
    assert len(set(after)) == 4              # the restored optimiser really steps
