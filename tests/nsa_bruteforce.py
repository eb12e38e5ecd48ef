"""An independent brute-force NSA in plain numpy (float64), one loop per (batch, query, group).

Written from the issue's semantics, sharing no code with nsa_jax: the oracle for the reference.
"""
import math

import numpy as np


def _softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


def documents(seg_row, l, d):
    """[(start, length, first compressed slot)] of one row's documents (segment ids per token),
    compressed slots laid out document after document."""
    seg_row = list(np.asarray(seg_row))
    docs, off, s = [], 0, 0
    for t in range(1, len(seg_row) + 1):
        if t == len(seg_row) or seg_row[t] != seg_row[t - 1]:
            L = t - s
            docs.append((s, L, off))
            off += max(0, (L - l) // d + 1)
            s = t
    return docs


def brute_nsa(q, kc, vc, ks, vs, kw, vw, gates, l, d, lp, n, w, n_init=1, n_local=2,
              branches=("cmp", "slc", "win"), seg=None):
    """seg [B,T] (optional): packed documents, each treated as its own sequence; kc/vc hold
    document k's compressed blocks at slots off_k, off_k + 1, ... (see :func:`documents`);
    returned block ids are document-relative."""
    q, kc, vc, ks, vs, kw, vw, gates = (np.asarray(a, np.float64)
                                        for a in (q, kc, vc, ks, vs, kw, vw, gates))
    if seg is None:
        seg = np.zeros(q.shape[:2], np.int64)
    B, T, Hq, Dk = q.shape
    G = ks.shape[2]
    h = Hq // G
    Tc = kc.shape[1]
    Ts = -(-T // lp)
    Dv = vs.shape[-1]
    scale = 1.0 / math.sqrt(Dk)
    out = np.zeros((B, T, Hq, Dv))
    sel = np.full((B, T, G, n), -1, np.int64)
    for b in range(B):
        docs = documents(seg[b], l, d)
        for t in range(T):
            start, L, off = next(x for x in docs if x[0] <= t < x[0] + x[1])
            r = t - start  # document-relative position
            for g in range(G):
                heads = range(g * h, (g + 1) * h)
                # document block i sits in slot off + i
                visible = [i for i in range(max(0, (L - l) // d + 1)) if i * d + l - 1 <= r]
                score = np.zeros(Ts)
                o_cmp = {}
                for hh in heads:
                    if not visible:
                        o_cmp[hh] = np.zeros(Dv)
                        continue
                    p = _softmax([q[b, t, hh] @ kc[b, off + i, g] * scale for i in visible])
                    o_cmp[hh] = sum(pi * vc[b, off + i, g] for pi, i in zip(p, visible))
                    for pi, i in zip(p, visible):
                        for j in range(Ts):
                            ov = min(i * d + l, (j + 1) * lp) - max(i * d, j * lp)
                            score[j] += pi * max(ov, 0) / d
                cur = r // lp
                cands = list(range(cur + 1))
                forced = sorted({j for j in cands if j < n_init} | {j for j in cands if j > cur - n_local})
                rest = sorted((j for j in cands if j not in forced), key=lambda j: (-score[j], j))
                chosen = sorted(forced + rest[: n - len(forced)])
                sel[b, t, g, : len(chosen)] = chosen
                slc_keys = [start + s for s in range(r + 1) if s // lp in chosen]
                win_keys = list(range(max(start, t - w + 1), t + 1))
                for hh in heads:
                    p = _softmax([q[b, t, hh] @ ks[b, s, g] * scale for s in slc_keys])
                    o_slc = sum(pi * vs[b, s, g] for pi, s in zip(p, slc_keys))
                    p = _softmax([q[b, t, hh] @ kw[b, s, g] * scale for s in win_keys])
                    o_win = sum(pi * vw[b, s, g] for pi, s in zip(p, win_keys))
                    o = np.zeros(Dv)
                    for c, (name, oc) in enumerate((("cmp", o_cmp[hh]), ("slc", o_slc), ("win", o_win))):
                        if name in branches:
                            o = o + gates[b, t, hh, c] * oc
                    out[b, t, hh] = o
    return out, sel
