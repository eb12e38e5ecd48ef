"""Plot bench/decode.py results: time per token vs context per batch, NSA vs dense (the 16-token
decode loop solid, the synced single step faded).

    python bench/plot_decode.py bench/results/decode_h200.json bench/results/decode_h200.png
"""
from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> int:
    d = json.load(open(src))
    pts = [p for p in d["points"] if "step_ms" in p]
    batches = sorted({p["batch"] for p in pts})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.6), sharey=True)
    for ax, B in zip(axes if len(batches) > 1 else [axes], batches):
        for model, style in (("nsa_125m", "o-"), ("dense_125m", "s--")):
            row = sorted((p["context"], p["loop_ms"], p["step_ms"]) for p in pts
                         if p["model"] == model and p["batch"] == B)
            if row:
                x = [r[0] // 1024 for r in row]
                ax.plot(x, [r[1] for r in row], style, label=f"{model} (decode loop)")
                ax.plot(x, [r[2] for r in row], style, alpha=0.3, label=f"{model} (synced step)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context (k tokens)")
        ax.set_title(f"batch {B}")
        ax.grid(alpha=0.3)
    (axes[0] if len(batches) > 1 else axes).set_ylabel("ms per token")
    (axes[-1] if len(batches) > 1 else axes).legend(fontsize=7)
    fig.suptitle(f"decode, {d['device']}, jax {d['jax']}, 125M bf16")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
