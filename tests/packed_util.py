"""Packed-document test inputs: a row of several documents and the same documents run alone."""
import jax
import jax.numpy as jnp
import numpy as np

from nsa_bruteforce import documents

NAMES = ("q", "k_cmp", "v_cmp", "k_slc", "v_slc", "k_win", "v_win", "gates")


def segments(lengths_per_row):
    """int32 [B, T] segment ids from document lengths per row (each row sums to T)."""
    rows = [np.repeat(np.arange(len(ls)) * 3 + 7, ls) for ls in lengths_per_row]  # any ids
    return jnp.asarray(np.stack(rows), jnp.int32)


def packed_inputs(seed, lengths_per_row, Hq, G, Dk, Dv, cfg, dtype=jnp.float32, scale=2.0):
    """Random NSA inputs (numpy-made, cheap) for a packed batch; k_cmp/v_cmp slots past the
    documents' blocks are filled with large garbage (no query may see them)."""
    B, T = len(lengths_per_row), sum(lengths_per_row[0])
    Tc = cfg.num_cmp_blocks(T)
    rng = np.random.default_rng(seed)
    n = lambda *s: scale * rng.standard_normal(s).astype(np.float32)
    args = [n(B, T, Hq, Dk), n(B, Tc, G, Dk), n(B, Tc, G, Dv), n(B, T, G, Dk), n(B, T, G, Dv),
            n(B, T, G, Dk), n(B, T, G, Dv), 1 / (1 + np.exp(-rng.standard_normal((B, T, Hq, 3))))]
    for b in range(B):
        used = sum(max(0, (L - cfg.block_l) // cfg.stride_d + 1) for L in lengths_per_row[b])
        args[1][b, used:] = args[2][b, used:] = 1e3
    return tuple(jnp.asarray(a, dtype) for a in args), segments(lengths_per_row)


def alone(args, seg, cfg, b):
    """[(start, L, inputs of that document alone)] for batch row b."""
    out = []
    for start, L, off in documents(np.asarray(seg[b]), cfg.block_l, cfg.stride_d):
        Tc = max(0, (L - cfg.block_l) // cfg.stride_d + 1)
        doc = []
        for name, a in zip(NAMES, args):
            doc.append(a[b:b + 1, off:off + Tc] if name in ("k_cmp", "v_cmp")
                       else a[b:b + 1, start:start + L])
        out.append((start, L, off, tuple(doc)))
    return out


def cotangent(seed, shape):
    return jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)
