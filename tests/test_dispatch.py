"""Backend dispatch of the NSA op (``nsa_jax.nsa.attention``): one enum, one resolver, kernels
imported lazily, no silent fallback."""
import subprocess
import sys

import jax.numpy as jnp
import pytest

from nsa_jax.model import resolve_nsa_impl
from nsa_jax.nsa import Backend, KernelChoices, NSAConfig, nsa_attention, resolve_impl, select_blocks
from nsa_testutil import ROOT, random_inputs

CFG = NSAConfig(block_l=8, stride_d=4, sel_block=16, n_sel=3, window=8)


def test_resolve_impl_by_name_and_device():
    assert resolve_impl("reference") is Backend.REFERENCE
    assert resolve_impl("pallas", backend="cpu") is Backend.PALLAS  # explicit: interpreted
    assert resolve_impl(Backend.PALLAS) is Backend.PALLAS
    assert resolve_impl("auto", backend="cpu") is Backend.REFERENCE
    assert resolve_impl("auto", backend="gpu") is Backend.PALLAS
    with pytest.raises(ValueError, match="impl: unknown impl 'triton'"):
        resolve_impl("triton")
    assert resolve_nsa_impl("pallas") == "pallas"  # the model's name delegates to resolve_impl
    with pytest.raises(ValueError, match="unknown impl"):
        resolve_nsa_impl("cuda")


def test_importing_the_op_imports_no_kernels():
    """nsa_jax.nsa never imports nsa_jax.pallas at import time (no registration, no cycle), and
    nsa_jax.pallas imports on its own."""
    code = ("import sys, nsa_jax.nsa, nsa_jax.model; "
            "assert not any(m.startswith('nsa_jax.pallas') for m in sys.modules), 'eager'; "
            "import nsa_jax.pallas")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_options_are_checked_per_backend():
    args = random_inputs(0, 1, 40, 4, 2, 8, 8, CFG)
    from nsa_jax.pallas import BlockSizes
    with pytest.raises(ValueError, match="block_sizes: tile sizes of the Pallas kernels"):
        nsa_attention(*args, CFG, impl="reference", block_sizes=BlockSizes())
    with pytest.raises(TypeError, match="choices must be a KernelChoices"):
        nsa_attention(*args, CFG, impl="reference", choices={"sel_impl": "tiled"})
    # choices are how, not what: the reference accepts and ignores them
    a = nsa_attention(*args, CFG, choices=KernelChoices(sel_impl="gather"))
    b = nsa_attention(*args, CFG)
    assert bool(jnp.all(a == b))
    with pytest.raises(ValueError, match="block_sizes"):
        select_blocks(args[0], args[1], CFG, block_sizes=BlockSizes())
