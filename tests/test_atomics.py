"""``nsa_jax.pallas.atomics.add`` in interpret mode (the CPU twin of the relaxed GPU atomic): a
gathered tile whose lanes repeat an address adds every lane (as the GPU's atomics do; jax's own
rule for ``atomic_add`` sets old + val, so one of two adds at an address was lost), lanes past the
end are dropped, slices add in place; bf16 refs are refused."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

from nsa_jax.pallas import atomics


def _gather_add(buf, rows, val):
    def kern(rows_ref, val_ref, _in, out_ref):
        r = rows_ref[...]
        atomics.add(out_ref, (r[:, None], jnp.arange(val.shape[1])[None, :]), val_ref[...])
    return pl.pallas_call(kern, out_shape=jax.ShapeDtypeStruct(buf.shape, buf.dtype),
                          input_output_aliases={2: 0}, interpret=True)(rows, val, buf)


def test_gathered_lanes_at_one_address_all_add():
    buf = jnp.arange(24, dtype=jnp.float32).reshape(6, 4)
    rows = jnp.array([1, 3, 1, 1, 6, 0, 3, 9], jnp.int32)     # repeats; 6 and 9 past the end
    val = jax.random.normal(jax.random.PRNGKey(0), (8, 4))
    want = np.array(buf)
    for r, v in zip(np.array(rows), np.array(val)):
        if r < 6:
            want[r] += v
    np.testing.assert_allclose(np.array(_gather_add(buf, rows, val)), want, rtol=1e-6, atol=1e-6)


def test_slice_adds_in_place():
    buf = jnp.ones((8, 4), jnp.float32)

    def kern(val_ref, _in, out_ref):
        atomics.add(out_ref, (pl.ds(2, 4), pl.ds(0, 4)), val_ref[...])
    got = pl.pallas_call(kern, out_shape=jax.ShapeDtypeStruct(buf.shape, buf.dtype),
                         input_output_aliases={1: 0}, interpret=True)(jnp.full((4, 4), 2.0), buf)
    want = np.ones((8, 4), np.float32)
    want[2:6] += 2.0
    np.testing.assert_array_equal(np.array(got), want)


def test_bf16_accumulator_is_refused():
    buf = jnp.zeros((4, 4), jnp.bfloat16)

    def kern(_in, out_ref):
        atomics.add(out_ref, (pl.ds(0, 4), pl.ds(0, 4)), jnp.ones((4, 4), jnp.bfloat16))
    with pytest.raises(TypeError, match="float32 accumulators only"):
        pl.pallas_call(kern, out_shape=jax.ShapeDtypeStruct(buf.shape, buf.dtype),
                       input_output_aliases={0: 0}, interpret=True)(buf)
