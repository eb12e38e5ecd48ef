"""The memory generate's checks count for one batch (issue 14): KV caches, the prefill call and
the decode calls (``Decoder.cache`` bytes, ``prefill_bytes``, ``decode_bytes``), from XLA's
analysis of the compiled calls, for a config's model with random weights.

    PYTHONPATH=. python bench/decode_memory.py [--model nsa_125m] [--batch 64] [--prompt 2048]
        [--max-len 4096] [--steps 16] [--out F.json]

Prints MiB per item, greedy and top-p 0.9 decode calls. Compiles the calls (no prefill or
decode runs)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nsa_jax.config import load_config  # noqa: E402
from nsa_jax.decode import Decoder, cache_bytes  # noqa: E402
from nsa_jax.model import build_model  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="nsa_125m")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--prompt", type=int, default=2048)
    p.add_argument("--max-len", type=int, default=4096)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    cfg = load_config(REPO / "configs" / f"{a.model}.yaml", a.set)
    model = build_model(cfg.model, cfg.nsa, seed=0, exec_cfg=cfg.exec)
    dec = Decoder(model, a.batch, a.max_len)
    mib = 2.0 ** -20
    d = jax.devices()[0]
    res = {"device": getattr(d, "device_kind", d.platform), "jax": jax.__version__,
           "model": a.model, "batch": a.batch, "prompt": a.prompt, "max_len": a.max_len,
           "steps": a.steps, "kv_caches_mib": cache_bytes(dec.cache) * mib}
    pre = dec.prefill_bytes(a.batch, a.prompt)
    res["prefill_mib"] = None if pre is None else pre * mib
    for name, kw in (("greedy", dict(temperature=0.0)), ("top_p_0.9", dict(top_p=0.9))):
        n = dec.decode_bytes(a.steps, **kw)
        res[f"decode_{name}_mib"] = None if n is None else n * mib
    res["compile_s"] = dec.compile_s
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    for k, v in res.items():
        print(f"{k:>22}: {v:.1f}" if isinstance(v, float) else f"{k:>22}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
