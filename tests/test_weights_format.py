"""`dalle_nb.weights._unpack` (the weights files' reader, over the file mapped into memory) against the msgpack library.

Property-based (hypothesis): any value msgpack can write — nested maps and arrays of every scalar type, every width of
integer, string, binary and container header — reads back as the library reads it, and ends where the bytes end;
Flax's arrays of every dtype read back equal and as views of the bytes; every truncation of a weights file is refused
by `read_params` in one `WeightsError`.
"""
import jax.numpy as jnp
import msgpack
import numpy as np
import pytest
from flax import serialization
from hypothesis import assume, given, settings, strategies as st
from dalle_nb.weights import WeightsError, _unpack, read_params

SOME = settings(max_examples=300, deadline=None, derandomize=True)
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 63, 2 ** 64 - 1), st.floats(allow_nan=False),
                 st.text(max_size=300), st.binary(max_size=70_000))
TREE = st.recursive(LEAF, lambda inner: st.one_of(st.lists(inner, max_size=20),
                                                  st.dictionaries(st.text(max_size=12), inner, max_size=20)),
                    max_leaves=80)


def plain(x):
    "`_unpack`'s value with its `bin` views as bytes, to compare with the library's."
    if isinstance(x, memoryview): return bytes(x)
    if isinstance(x, list): return [plain(v) for v in x]
    if isinstance(x, dict): return {k: plain(v) for k, v in x.items()}
    return x


@SOME
@given(TREE, st.booleans())
def test_reads_what_msgpack_writes(value, single):
    try: packed = msgpack.packb(value, use_bin_type=True, use_single_float=single)
    except OverflowError: assume(False)                   # a float beyond float32's range, which the packer refuses
    got, end = _unpack(memoryview(packed))
    assert end == len(packed)
    assert plain(got) == msgpack.unpackb(packed, raw=False, strict_map_key=False)


@SOME
@given(st.dictionaries(st.text(min_size=1, max_size=8),
                       st.tuples(st.sampled_from(["float16", "bfloat16", "float32", "int8", "int32", "uint8"]),
                                 st.lists(st.integers(0, 5), max_size=3)), min_size=1, max_size=6))
def test_flax_arrays_read_back_as_views(specs):
    rng = np.random.default_rng(0)
    arrays = {k: rng.normal(size=shape).astype(jnp.dtype(d)) for k, (d, shape) in specs.items()}
    packed = serialization.msgpack_serialize(arrays)
    got = _unpack(memoryview(packed))[0]
    for k, a in arrays.items():
        assert got[k].dtype == a.dtype and got[k].shape == a.shape and np.array_equal(got[k], a)
        if a.size: assert np.shares_memory(got[k], np.frombuffer(packed, np.uint8))


def test_every_truncation_is_refused(tmp_path):
    packed = serialization.msgpack_serialize({"a": {"k": np.ones((3, 4), np.float16)}, "b": np.zeros(2, np.float32)})
    for n in range(len(packed)):
        (tmp_path / "w.msgpack").write_bytes(packed[:n])
        with pytest.raises(WeightsError, match="not a readable msgpack weights file"):
            read_params(tmp_path / "w.msgpack")
