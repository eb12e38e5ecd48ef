"""Markdown tables (and the train-throughput plot) from the JSON files in bench/results/.

    python bench/report.py            # prints the tables used in README.md
    python bench/report.py --plot     # also writes bench/results/train_throughput_h200x1.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"


def kernels(path=RES / "kernels_h200.json") -> str:
    d = json.loads(path.read_text())
    rows = ["| shape | T | sel fwd | sel bwd | cmp+score+top-n fwd | cmp bwd | window fwd+bwd "
            "| **NSA fwd+bwd** | cuDNN dense fwd | **cuDNN dense fwd+bwd** | dense / NSA |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in d["results"]:
        m = r["ms"]
        rows.append(f"| {r['shape']} (Hq={r['Hq']}, G={r['G']}, D={r['D']}) | {r['T'] // 1024}k "
                    f"| {m['sel_fwd']:.2f} | {m['sel_bwd_inverted']:.2f} | {m['cmp_score_topn_fwd']:.2f} "
                    f"| {m['cmp_bwd']:.2f} | {m['win_fwd_bwd']:.2f} | **{m['nsa_fwd_bwd']:.2f}** "
                    f"| {m['dense_fwd']:.2f} | **{m['dense_fwd_bwd']:.2f}** "
                    f"| {m['dense_fwd_bwd'] / m['nsa_fwd_bwd']:.2f}x |")
    return f"{d['device'] if isinstance(d['device'], str) else d['device']}, jax {d['jax']}, ms:\n\n" + "\n".join(rows)


def train(path=RES / "train_throughput_h200x1.json") -> str:
    d = json.loads(path.read_text())
    by = {(p["model"], p["seq_len"]): p for p in d["points"] if "error" not in p}
    rows = ["| T | B | NSA tok/s | dense tok/s | NSA / dense | NSA ms/step | dense ms/step "
            "| NSA MFU | dense MFU |", "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for T in sorted({k[1] for k in by}):
        n, dn = by.get(("nsa_125m", T)), by.get(("dense_125m", T))
        if not (n and dn):
            continue
        rows.append(f"| {T // 1024}k | {n['batch']} | {n['tokens_per_s']:,.0f} | {dn['tokens_per_s']:,.0f} "
                    f"| {n['tokens_per_s'] / dn['tokens_per_s']:.2f}x | {n['step_ms']:.0f} | {dn['step_ms']:.0f} "
                    f"| {n['mfu']:.1%} | {dn['mfu']:.1%} |")
    ld = d.get("loader", {})
    tail = "".join(f"\n- loader `{k}`: {v['tokens_per_s'] / 1e6:,.1f} M tok/s (host, B={v['batch']}, "
                   f"T={v['seq_len']}, no prefetch)" for k, v in ld.items())
    return f"{d['device']} x{d['n_devices']}, jax {d['jax']}:\n\n" + "\n".join(rows) + "\n" + tail


def multi(path=RES / "train_throughput_h200x2.json") -> str:
    """1 GPU vs 2 GPUs (data parallel, FSDP) at T=2048 from one run of train_throughput.py."""
    d = json.loads(path.read_text())
    pts = [p for p in d["points"] if "error" not in p]
    one = {p["model"]: p for p in pts if p["devices"] == 1}
    rows = ["| model | GPUs | mesh | global B | T | tok/s | ms/step | x one GPU | peak GB / GPU | MFU |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for p in pts:
        base = one.get(p["model"])
        scale = f"{p['tokens_per_s'] / base['tokens_per_s']:.2f}x" if base else "-"
        mesh = f"data={p['mesh']['data']} fsdp={p['mesh']['fsdp']}"
        rows.append(f"| {p['model']} | {p['devices']} | {mesh} | {p['batch']} | {p['seq_len']} "
                    f"| {p['tokens_per_s']:,.0f} | {p['step_ms']:.1f} | {scale} "
                    f"| {p['compiled_peak_gb'] or 0:.1f} | {p['mfu']:.1%} |")
    return f"{d['device']} (one host), jax {d['jax']}:\n\n" + "\n".join(rows)


def decode(path=RES / "decode14" / "grid" / "decode_grid14_h200.json") -> str:
    """The README decode grid: ms per token in the 16-token decode loop (what ``generate`` runs),
    the synced single step, and the NSA loop's bytes (its floor) per second."""
    d = json.loads(path.read_text())
    by = {(p["model"], p["context"], p["batch"]): p for p in d["points"] if "step_ms" in p}
    rows = ["| context | batch | NSA loop | dense loop | dense / NSA (loop) | NSA step | dense step "
            "| NSA floor | NSA GB/s (loop) |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (m, N, B), p in sorted(by.items(), key=lambda x: (x[0][1], x[0][2])):
        if m != "nsa_125m" or ("dense_125m", N, B) not in by:
            continue
        q = by[("dense_125m", N, B)]
        rows.append(f"| {N // 1024}k | {B} | {p['loop_ms']:.2f} | {q['loop_ms']:.2f} "
                    f"| {q['loop_ms'] / p['loop_ms']:.2f}x | {p['step_ms']:.2f} | {q['step_ms']:.2f} "
                    f"| {p['floor_ms']:.3f} | {p['floor_bytes'] / p['loop_ms'] / 1e6:.0f} |")
    return f"{d.get('device', '')}, jax {d.get('jax', '')}:\n\n" + "\n".join(rows)


def plot_train(path=RES / "train_throughput_h200x1.json", out=RES / "train_throughput_h200x1.png"):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    d = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, style in (("nsa_125m", "o-"), ("dense_125m", "s--")):
        pts = sorted((p["seq_len"], p["tokens_per_s"]) for p in d["points"]
                     if p.get("model") == m and "error" not in p)
        ax.plot([p[0] for p in pts], [p[1] / 1e3 for p in pts], style, label=m)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("training throughput (k tokens/s)")
    ax.set_title(f"125M LM train step, 1x {d['device']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--plot", action="store_true")
    a = ap.parse_args()
    print("## kernels\n" + kernels() + "\n\n## train\n" + train() + "\n\n## train, 2 GPUs\n"
          + multi() + "\n\n## decode\n" + decode())
    if a.plot:
        plot_train()
