"""Plot bench/results/kernels_<device>.json: ms vs T per operation, one panel per head shape.

    python bench/plot_kernels.py bench/results/kernels_h200.json [out.png]
"""
from __future__ import annotations

import json
import sys

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OPS = [("nsa_fwd_bwd", "NSA fwd+bwd", "k", "-"),
       ("dense_fwd_bwd", "cuDNN dense fwd+bwd", "r", "-"),
       ("nsa_fwd", "NSA fwd", "k", "--"), ("dense_fwd", "cuDNN dense fwd", "r", "--"),
       ("sel_fwd", "selection fwd", "tab:blue", "--"),
       ("sel_bwd_inverted", "selection bwd", "tab:blue", "-"),
       ("cmp_score_topn_fwd", "cmp+score+top-n fwd", "tab:green", "--"),
       ("cmp_bwd", "cmp bwd", "tab:green", "-"),
       ("win_fwd_bwd", "window fwd+bwd", "tab:orange", "-")]


def main(path, out=None):
    with open(path) as f:
        doc = json.load(f)
    shapes = sorted({r["shape"] for r in doc["results"]})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6.5 * len(shapes), 5), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rs = sorted((r for r in doc["results"] if r["shape"] == shape), key=lambda r: r["T"])
        for key, label, color, ls in OPS:
            pts = [(r["T"], r["ms"].get(key)) for r in rs if r["ms"].get(key)]
            if pts:
                ax.plot(*zip(*pts), color=color, ls=ls, marker="o", ms=3, label=label)
        r0 = rs[0]
        ax.set(xscale="log", yscale="log", xlabel="T (tokens, B=1)", ylabel="ms (median)",
               title=f"{shape}: Hq={r0['Hq']} G={r0['G']} D={r0['D']}, bf16")
        ax.set_xticks([r["T"] for r in rs], [f"{r['T'] // 1024}k" for r in rs])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"NSA Pallas kernels vs cuDNN dense — {doc['device']}, jax {doc['jax']}")
    fig.tight_layout()
    out = out or path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:])
