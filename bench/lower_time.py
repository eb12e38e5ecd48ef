"""The host's share of a compile, without a GPU: trace and lower a model's programs for CUDA.

    PYTHONPATH=. python bench/lower_time.py [--model nsa_125m] [--T 8192] [--B 1]
        [--what grad prefill decode] [--set KEY=VALUE ...] [--out F]

``jax.export`` with ``platforms=["cuda"]`` (``bench/triton_ir.lower_for_cuda``) runs what every
compile of the program runs on the host before XLA: Python tracing, and the lowering of each
Pallas kernel to Triton IR. JAX's persistent compilation cache (``exec.compile_cache``) keys on
the lowered program, so this part is paid on every run, cached or not. Programs:

* ``grad``: the model's loss gradient over [B, T] tokens (the train step's heavy part);
* ``prefill``: the decoder's prefill at once of [B, T] tokens into fresh caches;
* ``decode``: one decode step of B rows over caches of T tokens (``exec.decode_impl=pallas``).

Reported per program: seconds to export, and the Triton modules built (one per Pallas kernel
lowering). cuDNN cannot lower without a GPU, so the branches that would take it run the Pallas
kernels here (``exec.kernel.cmp_attn=pallas``, ``exec.kernel.win_attn=pallas``; ``--set`` adds
overrides). Seconds are this machine's; compare trees on one machine (bench/NOTES.md,
fifty-second session).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

import triton_ir  # noqa: E402
from nsa_jax.config import load_config  # noqa: E402
from nsa_jax.model import build_model, lm_loss  # noqa: E402

PALLAS = ["exec.nsa_impl=pallas", "exec.decode_impl=pallas", "exec.kernel.cmp_attn=pallas",
          "exec.kernel.win_attn=pallas"]


def programs(cfg, B: int, T: int) -> dict:
    """name -> (f, abstract args) of the model's programs."""
    model = nnx.eval_shape(lambda: build_model(cfg.model, cfg.nsa, 0, cfg.exec))
    graph, state = nnx.split(model)

    def grad(state, tokens):
        return jax.grad(lambda s: lm_loss(nnx.merge(graph, s), tokens))(state)

    def prefill(state, tokens):
        from nsa_jax.decode import init_cache
        m = nnx.merge(graph, state)
        h, cache = m.extend(tokens, init_cache(m, B, T))
        return m.head_logits(h[:, -1:]), cache

    def decode(state, tokens):
        from nsa_jax.decode import init_cache
        m = nnx.merge(graph, state)
        h, cache = m.extend(tokens, init_cache(m, B, T))
        return m.head_logits(h[:, 0]), cache

    toks = jax.ShapeDtypeStruct
    return {"grad": (grad, (state, toks((B, T + 1), jnp.int32))),
            "prefill": (prefill, (state, toks((B, T), jnp.int32))),
            "decode": (decode, (state, toks((B, 1), jnp.int32)))}


def measure(f, args) -> dict:
    n = [0]

    def count(_):
        n[0] += 1
    t0 = time.perf_counter()
    triton_ir.lower_for_cuda(f, *args, on_module=count)
    return {"export_s": time.perf_counter() - t0, "triton_modules": n[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="nsa_125m")
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--what", nargs="+", default=["grad", "prefill", "decode"],
                    choices=["grad", "prefill", "decode"])
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    cfg = load_config(REPO / "configs" / f"{a.model}.yaml", PALLAS + list(a.set))
    progs = programs(cfg, a.B, a.T)
    res = {"model": a.model, "T": a.T, "B": a.B, "set": a.set, "jax": jax.__version__,
           "programs": {w: measure(*progs[w]) for w in a.what}}
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    for w, r in res["programs"].items():
        print(f"{a.model} {w} B={a.B} T={a.T}: trace + lower for CUDA {r['export_s']:.2f} s, "
              f"{r['triton_modules']} Triton modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
