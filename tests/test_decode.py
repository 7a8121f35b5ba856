"""`decode.decode_attend` (the GPU's token-step attention) against `bart.attend_cached` (XLA's), property-based:
any rows, heads, positions (splits of the largest power of two up to 64), written length, cache dtype and block size,
run in Pallas's interpreter on this CPU. The notebook (`nbs/06a_decode.ipynb`) checks chosen lengths; this draws them.
"""
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from dalle_nb.bart import CACHE_DTYPES, Int8KV, attend_cached
from dalle_nb.decode import decode_attend
from dalle_nb.layers import quantize_rows


@st.composite
def caches(draw):
    B, H = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    D, T = draw(st.sampled_from([8, 16, 32])), draw(st.sampled_from([16, 24, 48, 64, 128]))
    return B, H, D, T, draw(st.integers(1, T)), draw(st.sampled_from(CACHE_DTYPES)), \
        draw(st.sampled_from([4, 8, 16])), draw(st.integers(0, 2**31 - 1))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(caches())
def test_the_kernel_attends_as_xla_does(case):
    B, H, D, T, n, dtype, block, seed = case
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, H, D)), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((B, H, D, T)), jnp.float32) for _ in range(2))
    if dtype == "int8": k, v = (Int8KV(*quantize_rows(c, axis=-2)) for c in (k, v))
    elif dtype != "float32": k, v = k.astype(dtype), v.astype(dtype)
    parts = [(c.q, c.scale) if isinstance(c, Int8KV) else (c, None) for c in (k, v)]
    mine = decode_attend(q, parts[0][0], parts[1][0], n, parts[0][1], parts[1][1], block=block, interpret=True)
    xla = attend_cached(q[:, None], k, v, jnp.arange(T) < n)[:, 0]
    # the XLA path rounds a 16-bit cache's probabilities to its dtype before the weighted sum; the kernel does not
    assert float(jnp.abs(mine - xla).max()) < {"bfloat16": 1e-2, "float16": 2e-3}.get(dtype, 1e-5), (case, mine - xla)
