"""Algorithm choices of the NSA kernels: *how* to compute, never *what* (no effect on results
beyond float rounding). Tile sizes live with the kernels (``nsa_jax.pallas.common.BlockSizes``).

This module imports nothing heavy so the config layer can validate ``exec.kernel`` before any
compute.
"""
from __future__ import annotations

import dataclasses

SEL_IMPLS = ("auto", "gather", "tiled")
SEL_BWDS = ("inverted", "atomic")
SEL_FWDS = ("auto", "query", "block")
SEL_DQS = ("auto", "query", "block", "ds")
SEL_FWD_BLOCK_MAX_H = 8   # sel_fwd "auto": block-major forward for groups of at most 8 heads
SCORE_DOTS = ("ieee", "tf32x3")
SCORE_HEADS = ("auto", "rows", "loop")
F32_DOTS = ("ieee", "tf32")
CMP_ATTNS = ("auto", "pallas", "cudnn", "xla")
CMP_GROUPINGS = ("transpose", "repeat")
WIN_ATTNS = ("auto", "cudnn", "pallas", "mosaic")
TILED_BACKENDS = ("auto", "triton", "mosaic")


@dataclasses.dataclass(frozen=True)
class KernelChoices:
    """sel_impl:        selection-attention kernels: "gather" (one program per query gathers its
                        n blocks), "tiled" (block-sparse flash attention over query tiles) or
                        "auto" (tiled when T <= sel_tiled_max_t).
    sel_tiled_max_t:    longest T for which "auto" picks the tiled kernels.
    sel_tiled_fwd:      backend of the tiled selection forward: "triton" (Pallas Triton,
                        ``nsa_jax/pallas/selection_tiled.py``; every GPU, interpret mode on the
                        CPU), "mosaic" (Pallas Mosaic GPU, ``nsa_jax/pallas/mosaic_tiled.py``:
                        wgmma, TMA and a producer warpgroup; compiled on a Hopper GPU only, for
                        bf16/fp16 operands, equal head dims of 64 or 128, groups of an even
                        number of heads, T a multiple of 64, l' = 64 and unpacked rows; an
                        explicit "mosaic" elsewhere is an error naming this key) or "auto"
                        (mosaic where it runs and heads are 128 wide, else triton). On an H100,
                        NSA op at the bench heads (64 / 4 / 128), 2k / B=8: the forward kernel
                        1.86 -> 1.31 ms; at the 125M heads (64 wide) it was 13-15% slower
                        (bench/NOTES.md, thirty-first session), 2.5% with two listed blocks per
                        step (0.362 vs 0.353 ms at 2k / B=16, thirty-second session).
    sel_tiled_dq:       backend of the tiled selection backward's dQ kernel, as sel_tiled_fwd
                        (same rule for "auto"; bench heads 2k / B=8: 2.06 -> 1.65 ms).
    sel_tiled_dkv:      backend of its dK/dV kernel (Mosaic GPU: one CTA per key block, the two
                        compute warpgroups split the group's heads); "auto" takes mosaic where it
                        runs at 64- and 128-wide heads alike (H100, op profile: 125M heads 2k /
                        B=16 0.78 -> 0.53 ms, bench heads 2k / B=8 3.01 -> 2.23 ms).
    sel_bwd:            gather backward: "inverted" (block -> query index) or "atomic".
    sel_fwd:            gather forward: "query" (one program per query and group loads its n
                        blocks), "block" (one program per key block and a chunk of the queries
                        that selected it: K/V loaded once, partial results merged over the n
                        slots, its index reused by the backward; ``nsa_jax/pallas/
                        selection_block.py``) or "auto" (block for groups of h <= 8 heads
                        and bf16/fp16 inputs, packed rows too; on an H200 at h = 6, bf16, NSA
                        fwd+bwd 6.5% faster at 8k and 64k, packed 8k 2.52 -> 2.01 ms busy;
                        at h = 16 the block forward is 2.3x slower; float32 was not timed:
                        "query"). The tiled
                        selection kernels (``sel_impl``) have their own forward and ignore it.
    sel_dq:             gather backward's dQ: "query" (its own per-query kernel loads each
                        query's n blocks again), "block" (formed in the inverted dK/dV kernel,
                        which already has dS for each (query, block): one more tile dot, a
                        partial per (query, slot), rounded to the input dtype if 16-bit,
                        summed in XLA; ``selection_block.sel_backward_block``; needs sel_bwd
                        "inverted") or "auto" (block where the forward resolves to "block" by
                        sel_fwd's "auto" rule, so both share one index, and sel_bwd is
                        "inverted"; query otherwise; never "ds"). On an H200 at h = 6, bf16: NSA
                        fwd+bwd 20.42 -> 18.56 ms at 64k, even at 8k. "ds" (opt-in): the inverted
                        dK/dV kernel also stores each (query, slot)'s dS [h, l'] in the input
                        dtype (what the dQ dot takes anyway), in the index's entry order so that
                        each tile's dS is one contiguous store, and a query-major kernel forms
                        dQ = sum over slots of dS K, loading only K: half the per-query kernel's
                        K/V bytes, no dO, lse or p recomputed (``selection.sel_backward``).
                        Unpacked rows, sel_bwd "inverted"; the dS buffer holds about
                        B*T*Hq*n*l' values (8.6 GB at the bench shape, 64k, bf16). On an H100
                        there the selection backward took 31.0-31.9 ms against 32.3-34.1 for
                        "query" at random selections (the dS stores share the dK/dV kernel's
                        DRAM, which its gathers already run at 72% of peak) and 1.4-2.1 ms more
                        than "query" where neighbouring queries share blocks (bench/NOTES.md,
                        eighteenth session).
    sel_partial_mib:    largest per-slot partial buffer, in MiB, of one block-major selection
                        pass (sel_fwd / sel_dq "block": the forward's o_i and the fused
                        backward's dQ_i, B*T*n*Hq*D values in the stored dtype). More slots run
                        as several passes over slot groups, one after the other, each merged
                        before the next starts. The 64k step's compiled peak holds the largest
                        such buffer: at the 125M shape, 64k, B = 1, one pass is 1.5 GiB. Default
                        1024: 2 passes there (H200: peak 27.45 -> 26.80 GB, 64k training
                        2.16x dense; 512 MiB: 3 passes, 26.70 GB, 2.12x), 1 pass at 8k, B <= 5
                        (bench/NOTES.md).
    cmp_bwd_split:      parts the query range of one compressed dK/dV tile is split into
                        (float32 atomic adds; 1 = plain stores). 16: on an H200 at the 125M
                        shape the Pallas compressed dK/dV took 0.155 / 0.258 ms at 8k (16 / 8
                        parts), 4.93 / 5.43 ms at 64k, packed rows 0.088 / 0.138 at 8k
                        (bench/NOTES.md, eighth session).
    score_dot:          GPU precision of the general scoring path's float32 dots (used when
                        l'/d is not a power of two): "ieee" or "tf32x3" (three tf32 passes;
                        measured 1.9x slower than ieee on an H200).
    score_heads:        tile layout of the selection-scoring kernel (``nsa_jax/pallas/scoring.py``):
                        "rows" ((query, head) rows, h padded to a power of two, heads summed by
                        reshape), "loop" (rows of one head, the group's h heads looped inside
                        each key step and summed in place: no padded head slots) or "auto"
                        (loop where h is not a power of two and its h query tiles fit 48 KB,
                        else rows). On an H100 at the 125M shape (h = 6), bf16: the scoring
                        kernel 2.80 -> 1.49 ms at 64k, 0.19 -> 0.13 ms at 8k; the NSA 64k train
                        step 347.4 -> 329.5 ms. At h = 16 rows is faster (bench/NOTES.md, tenth
                        session).
    f32_dot:            GPU precision of every other matmul of the op on float32 inputs: "ieee"
                        (exact float32 products, whatever ``jax_default_matmul_precision`` says:
                        the Pallas dots and the window branch's XLA einsums) or "tf32" (tensor-
                        core tf32, ~1e-3 relative; faster). bf16 inputs use bf16 tensor cores
                        either way, and the CPU interpreter is exact either way.
    cmp_attn:           compressed attention output and its backward: "pallas" (the NSA
                        kernels), "cudnn" (a causal cuDNN attention over the compressed keys with
                        the d queries of a stride in the head axis; bf16/fp16 on a GPU, equal head
                        dims <= 128; the selection scores still run in Pallas), "xla" (the same
                        grouping in XLA, O(Tc^2) memory: the CPU twin of "cudnn") or "auto"
                        (cudnn where it applies and T > cmp_pallas_max_t, else pallas; measured
                        on an H200 at 64k: NSA fwd+bwd 137.3 -> 115.4 ms at the bench shape,
                        26.7 -> 21.9 ms at 125M).
                        Packed rows: "auto" takes "pallas"; "cudnn"/"xla" group the queries by
                        document slots and add the documents' slot mask (``nsa_jax/pallas/
                        cmp_grouped.py``; measured slower than "pallas" in the whole packed op).
    cmp_grouping:       the head order of cmp_attn's grouped layout ("cudnn", "xla"):
                        "transpose" (heads (group, head, r): q and the cotangents transposed;
                        the keys as they are) or "repeat" (heads (r, group, head): q reshaped,
                        each compressed key and value repeated d times; ``nsa_jax/pallas/
                        cmp_grouped.py``). The same values either way. "transpose" is the
                        default; "repeat" is not yet measured on a GPU (bench/NOTES.md,
                        fifty-second session: the transposes it removes were ~0.96 ms of the
                        125M 8k / B=4 train step on an H200).
    cmp_pallas_max_t:   longest T for which cmp_attn "auto" keeps the Pallas kernels on unpacked
                        rows: at short T cuDNN's fixed costs (its dO.O, fp32 dQ conversion and
                        GQA head-reduction kernels) outweigh its faster matmuls. On an H100 at the
                        125M shape, bf16, NSA fwd+bwd with Pallas / cuDNN: 3.13 / 3.27 ms at 2k
                        (B=16), 4.62 / 4.67 at 4k (B=8), 5.46 / 5.33 at 8k (B=4) (bench/NOTES.md,
                        twenty-fifth session). 4096.
    win_attn:           sliding-window branch of unpacked rows: "cudnn" (cuDNN's fused attention
                        with a local window; bf16/fp16 on a GPU, equal head dims <= 128),
                        "pallas" (the document-local FlashAttention kernel of ``nsa_jax/pallas/
                        local.py`` with one document per row; in interpret mode on the CPU),
                        "mosaic" (the tiled Mosaic GPU kernels on the window's block lists,
                        ``nsa_jax/pallas/mosaic_window.py``: Hopper, bf16/fp16, head dims 64 /
                        128, even h, T and w multiples of 64) or "auto" (cudnn where it applies,
                        else the Pallas kernel on a GPU and masked XLA attention on the CPU).
                        Packed rows always take the document-local kernel.
    """
    sel_impl: str = "auto"
    sel_tiled_max_t: int = 4096
    sel_tiled_fwd: str = "auto"
    sel_tiled_dq: str = "auto"
    sel_tiled_dkv: str = "auto"
    sel_bwd: str = "inverted"
    sel_fwd: str = "auto"
    sel_dq: str = "auto"
    sel_partial_mib: float = 1024.0
    cmp_bwd_split: int = 16
    score_dot: str = "ieee"
    score_heads: str = "auto"
    f32_dot: str = "ieee"
    cmp_attn: str = "auto"
    cmp_pallas_max_t: int = 4096
    cmp_grouping: str = "transpose"
    win_attn: str = "auto"

    def __post_init__(self):
        def fail(field, msg):
            raise ValueError(f"kernel.{field}: {msg}")

        if self.sel_impl not in SEL_IMPLS:
            fail("sel_impl", f"one of {list(SEL_IMPLS)}, got {self.sel_impl!r}")
        for f in ("sel_tiled_fwd", "sel_tiled_dq", "sel_tiled_dkv"):
            if getattr(self, f) not in TILED_BACKENDS:
                fail(f, f"one of {list(TILED_BACKENDS)}, got {getattr(self, f)!r}")
        if self.sel_bwd not in SEL_BWDS:
            fail("sel_bwd", f"one of {list(SEL_BWDS)}, got {self.sel_bwd!r}")
        if self.sel_fwd not in SEL_FWDS:
            fail("sel_fwd", f"one of {list(SEL_FWDS)}, got {self.sel_fwd!r}")
        if self.sel_dq not in SEL_DQS:
            fail("sel_dq", f"one of {list(SEL_DQS)}, got {self.sel_dq!r}")
        if self.sel_dq in ("block", "ds") and self.sel_bwd == "atomic":
            fail("sel_dq", f"{self.sel_dq!r} forms dQ from the inverted dK/dV kernel; it needs "
                 "kernel.sel_bwd: inverted, got 'atomic'")
        if self.score_dot not in SCORE_DOTS:
            fail("score_dot", f"one of {list(SCORE_DOTS)}, got {self.score_dot!r}")
        if self.score_heads not in SCORE_HEADS:
            fail("score_heads", f"one of {list(SCORE_HEADS)}, got {self.score_heads!r}")
        if self.cmp_attn not in CMP_ATTNS:
            fail("cmp_attn", f"one of {list(CMP_ATTNS)}, got {self.cmp_attn!r}")
        if self.cmp_grouping not in CMP_GROUPINGS:
            fail("cmp_grouping", f"one of {list(CMP_GROUPINGS)}, got {self.cmp_grouping!r}")
        if self.win_attn not in WIN_ATTNS:
            fail("win_attn", f"one of {list(WIN_ATTNS)}, got {self.win_attn!r}")
        if self.f32_dot not in F32_DOTS:
            fail("f32_dot", f"one of {list(F32_DOTS)}, got {self.f32_dot!r}")
        for f in ("sel_tiled_max_t", "cmp_pallas_max_t"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                fail(f, f"must be an integer >= 0, got {v!r}")
        if (isinstance(self.sel_partial_mib, bool)
                or not isinstance(self.sel_partial_mib, (int, float))
                or not self.sel_partial_mib > 0):
            fail("sel_partial_mib", f"must be a number > 0, got {self.sel_partial_mib!r}")
        if not isinstance(self.cmp_bwd_split, int) or self.cmp_bwd_split < 1:
            fail("cmp_bwd_split", f"must be an integer >= 1, got {self.cmp_bwd_split!r}")
