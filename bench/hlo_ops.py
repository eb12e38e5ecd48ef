"""Name the source of the XLA ops a profile lists: read an XLA dump and print, for each op, its
optimized-HLO instruction (shape, fusion kind) and the JAX source it came from.

    XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text" python bench/profile_step.py ... --out P.json
    python bench/hlo_ops.py DIR --profile P.json [--model nsa_125m --seq-len 8192] [--top 40]
    python bench/hlo_ops.py DIR --ops loop_slice_fusion_35 input_concatenate_fusion_59

The profile's op names are HLO instruction names of the largest ``*after_optimizations.txt``
module in DIR (the train step), so the two must come from the same process. Pallas, cuDNN and
gemm custom calls are skipped unless named with ``--ops``. For each fusion the fused
computation's root and the ``op_name`` / ``source_file:source_line`` metadata of its
instructions (the JAX primitives it was built from) are printed, most frequent first.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import sys

SKIP = re.compile(r"nsa_|cudnn|fmha|gemm|nvjet|xmma|cublas|memset|memcpy|triton|custom", re.I)
META = re.compile(r'op_name="([^"]*)"(?:.*?source_file="([^"]*)")?(?:.*?source_line=(\d+))?')


def hlo_name(name: str) -> str:
    """The profiler writes an instruction ``loop_slice_fusion.35`` as ``loop_slice_fusion_35``."""
    return re.sub(r"_(\d+)$", r".\1", name)


def pick_module(dump_dir: str, names) -> str:
    """The optimized module that defines most of ``names`` (the largest one if none given)."""
    files = glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))
    if not files:
        sys.exit(f"hlo_ops: no *after_optimizations.txt under {dump_dir} (XLA_FLAGS dump flags set?)")
    if not names:
        return max(files, key=os.path.getsize)

    def hits(path):
        text = open(path).read()
        return sum(f"%{n} =" in text or f"%{hlo_name(n)} =" in text for n in names)
    return max(files, key=lambda f: (hits(f), os.path.getsize(f)))


TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def parse(path: str):
    """-> (instructions: name -> line, computations: name -> [lines], frames: id -> text)

    Newer XLA prints source locations as ``stack_frame_id=N`` into tables at the top of the
    module (FileNames, FunctionNames, FileLocations, StackFrames); a frame's printed
    ``parent_frame_id`` is the parent's id + 1 (1 = no parent)."""
    instrs, comps, cur = {}, {}, None
    tables = {t: {} for t in TABLES}
    table = None
    with open(path) as f:
        for line in f:
            s = line.strip()
            if s in TABLES:
                table = s
                continue
            if table is not None:
                m = re.match(r"(\d+)\s+(.*)$", s)
                if m:
                    tables[table][int(m.group(1))] = m.group(2)
                    continue
                if not s:
                    continue
                table = None
            m = re.match(r"(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", s)
            if m and not s.startswith("ROOT") and "=" not in s.split("{")[0]:
                cur = m.group(1)
                comps[cur] = []
                continue
            if s == "}":
                cur = None
                continue
            m = re.match(r"(?:ROOT\s+)?%?([\w.\-]+)\s*=", s)
            if m:
                instrs[m.group(1)] = s
                if cur is not None:
                    comps[cur].append(s)
    return instrs, comps, frames_of(tables)


def frames_of(tables) -> dict[int, str]:
    """stack frame id -> 'file:line fn <- file:line fn ...' (project frames only, innermost first)"""
    files = {k: v.strip('"') for k, v in tables["FileNames"].items()}
    funcs = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
    locs = {}
    for k, v in tables["FileLocations"].items():
        d = dict(re.findall(r"(\w+)=(\d+)", v))
        locs[k] = (files.get(int(d.get("file_name_id", 0)), "?"),
                   funcs.get(int(d.get("function_name_id", 0)), "?"), d.get("line", "?"))
    frames = {}
    for k, v in tables["StackFrames"].items():
        d = dict(re.findall(r"(\w+)=(\d+)", v))
        frames[k] = (int(d.get("file_location_id", 0)), int(d.get("parent_frame_id", 1)) - 1)
    out = {}
    for k in frames:
        chain, every, seen, f = [], [], set(), k
        while f and f in frames and f not in seen:
            seen.add(f)
            loc, parent = frames[f]
            file, fn, line = locs.get(loc, ("?", "?", "?"))
            here = f"{file.split('nsa_jax/')[-1]}:{line} {fn}"
            every.append(here)
            if "nsa_jax" in file or "/bench/" in file:
                chain.append(here)
            f = parent
        out[k] = " <- ".join((chain or every)[:3]) or "-"
    return out


def short_meta(line: str, frames) -> str:
    m = META.search(line)
    if not m:
        return "-"
    op, src, ln = m.groups()
    op = re.sub(r"^jit\([^)]*\)/", "", op)
    where = f"  [{os.path.basename(src)}:{ln}]" if src else ""
    sf = re.search(r"stack_frame_id=(\d+)", line)
    if sf:
        where = f"  [{frames.get(int(sf.group(1)), '-')}]"
    return f"{op[-120:]}{where}"


def describe(name: str, instrs, comps, frames) -> str:
    line = instrs.get(name, instrs.get(hlo_name(name)))
    if line is None:
        return f"{name}: not in the module"
    head = line.split(", metadata=")[0]
    out = [f"{name}: {head[:400]}", f"    meta: {short_meta(line, frames)}"]
    m = re.search(r"calls=%?([\w.\-]+)", line)
    if m and m.group(1) in comps:
        body = comps[m.group(1)]
        roots = [b for b in body if b.startswith("ROOT")]
        if roots:
            out.append(f"    root: {roots[0].split(', metadata=')[0][:300]}")
        metas = collections.Counter(short_meta(b, frames) for b in body if "metadata=" in b)
        for meta, k in metas.most_common(6):
            out.append(f"    {k:3d}x {meta}")
    return "\n".join(out)


def ops_from_profile(path: str, model: str | None, seq_len: int | None, top: int):
    d = json.load(open(path))
    names = []
    for r in d.get("points", [d]):
        if model and r.get("model") != model:
            continue
        if seq_len and r.get("seq_len", r.get("T")) != seq_len:
            continue
        for o in r.get("top_ops", []):
            if not SKIP.search(o["name"]):
                names.append((o["name"], o["ms_per_step"], o.get("calls_per_step")))
    return names[:top]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump_dir")
    ap.add_argument("--profile", help="profile_step.py / profile_op.py JSON of the same process")
    ap.add_argument("--model")
    ap.add_argument("--seq-len", type=int)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--ops", nargs="*", default=[])
    a = ap.parse_args(argv)
    rows = [(n, None, None) for n in a.ops]
    if a.profile:
        rows += ops_from_profile(a.profile, a.model, a.seq_len, a.top)
    path = pick_module(a.dump_dir, [r[0] for r in rows])
    instrs, comps, frames = parse(path)
    print(f"# module {os.path.basename(path)}: {len(instrs)} instructions")
    for name, ms, calls in rows:
        tag = f"  ({ms:.3f} ms/step, {calls:g} calls)" if ms is not None else ""
        print(describe(name, instrs, comps, frames) + tag)


if __name__ == "__main__":
    main()
