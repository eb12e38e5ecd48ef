"""Instruction counts of the NSA op's Pallas kernels for sm_90, without a GPU.

    python bench/kernel_sass.py OUT_DIR --triton-python /path/to/venv/bin/python \
        [--tree DIR] [--route tiled|block|query|packed-tiled|packed-block|decode] \
        [--shape 125m|bench] [--T 2048] [--B 8] [--num-warps 4] [--choice KEY=VALUE ...]
    python bench/kernel_sass.py --compare OLD_DIR NEW_DIR

The first form lowers the op's forward + backward (bf16, the compressed branch through the Pallas
kernels; cuDNN, which does not lower without a GPU, patched out of the window branch), or with
``--route decode`` one decode step at context T and batch B (``triton_ir.decode_route``), with the
Pallas -> Triton lowering of the jax in this environment (``triton_ir.lower_for_cuda``), writes
each kernel's Triton IR to OUT_DIR, and compiles it to a cubin for sm_90 with the pip ``triton``
package of ``--triton-python`` (a separate environment: ``python3 -m venv V && V/bin/pip install
triton==3.6.0``; the CPU jaxlib ships no Triton compiler, and ``triton`` is never a dependency of
nsa_jax). It then disassembles each cubin (the ``cuobjdump`` that comes with that package) and
prints, per kernel, registers per thread and the instruction count of each loop body (a backward
branch's span) with its opcode histogram. ``--tree`` lowers another checkout's ``nsa_jax`` (a
tree before a change, e.g. ``.old/preXX``). ``--compare`` sets two such directories side by side.

A proxy, not the device's code: pip Triton 3.6 is not the Triton inside the device's jaxlib, and
``--num-warps`` is one value for every kernel (the IR does not carry each kernel's launch
warps). Triton's own TTIR passes (canonicalize, combine, CSE, LICM) run on the lowered IR, as
the device's pipeline runs them (until the thirty-seventh session they were skipped). Instruction-count *differences* between two trees compiled the same way are what it is
for (bench/NOTES.md, twenty-fourth session); timings come only from the device.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys

ROUTES = ("tiled", "block", "query", "packed-tiled", "packed-block", "decode")

_COMPILE = r"""
import glob, json, os, sys
os.environ["TRITON_ALWAYS_COMPILE"] = "1"   # never a cached cubin from another pipeline
import triton.compiler.compiler as tcc
from triton.backends.compiler import GPUTarget
from triton.compiler import compile as tcompile
out, nw = sys.argv[1], int(sys.argv[2])
# Triton skips the passes of the stage an IR file is given at ("ttir": canonicalize, combine,
# CSE, LICM, ...); the device's pipeline runs them on the TTIR jax hands it. So the IR enters at
# a no-op "ttir" stage, and the real one runs next.
_make_backend = tcc.make_backend
def make_backend(target):
    backend = _make_backend(target)
    add_stages = backend.add_stages
    def add_all(stages, options, language):
        add_stages(stages, options, language)
        rest = dict(stages)
        stages.clear()
        stages["ttir"] = lambda mod, metadata: mod
        stages["ttir-passes"] = rest.pop("ttir")
        stages.update(rest)
    backend.add_stages = add_all
    return backend
tcc.make_backend = make_backend
for path in sorted(glob.glob(os.path.join(out, "*.ttir"))):
    k = tcompile(path, target=GPUTarget("cuda", 90, 32), options={"num_warps": nw, "num_stages": 2})
    open(path[:-5] + ".cubin", "wb").write(k.asm["cubin"])
    open(path[:-5] + ".shared", "w").write(str(k.metadata.shared))   # dynamic shared memory, bytes
import triton
print(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin"))
"""


def lower(tree: str, out: str, route: str, shape: str, T: int, B: int = 8,
          choices: list[str] | None = None):
    """Write each Triton kernel of the op's fwd+bwd for ``route`` (or of one decode step) as
    OUT/NN_name.ttir; ``choices``: more ``KernelChoices`` fields for the op's routes, as
    "field=value" (typed by ``harness.fields``)."""
    sys.path.insert(0, os.path.abspath(tree))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import jax.numpy as jnp

    import nsa_jax
    if not os.path.abspath(nsa_jax.__file__).startswith(os.path.abspath(tree)):
        raise SystemExit(f"--tree {tree}: imported nsa_jax from {nsa_jax.__file__}")
    import nsa_jax.pallas.nsa as pnsa
    import nsa_jax.pallas.window as pwin
    import triton_ir
    from harness import fields
    from nsa_jax.nsa.options import KernelChoices

    pwin.cudnn_applies = pnsa.cudnn_applies = lambda *a: False
    sel = route.split("-")[-1]
    if route == "decode":   # one decode step at context T, batch B
        f, shapes = triton_ir.decode_route(shape, T, B)
    else:
        f, shapes = triton_ir.op_route(jnp.bfloat16, route.startswith("packed"),
                                       "tiled" if sel == "tiled" else "gather",
                                       "block" if sel == "block" else "query", shape, T,
                                       choices=fields(choices, KernelChoices))

    modules = []
    triton_ir.lower_for_cuda(f, *shapes, on_module=lambda m: modules.append(
        m.operation.get_asm(enable_debug_info=False)))
    os.makedirs(out, exist_ok=True)
    for i, text in enumerate(modules):
        name = re.search(r"tt.func (?:public )?@(\w+)", text).group(1)
        with open(os.path.join(out, f"{i:02d}_{name}.ttir"), "w") as fh:
            fh.write(text)


def loops(sass: str):
    """[(instructions, Counter of opcodes)] for each loop body (a branch back to an earlier
    address) of a cuobjdump -sass listing."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
           re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    found = []
    for addr, text in ins:
        m = re.search(r"BRA(?:\.\w+)*\s+.*?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            body = [re.sub(r"^@!?U?P\w+\s+", "", t) for a, t in ins if lo <= a <= addr]
            found.append((len(body), collections.Counter(t.split()[0].split(".")[0]
                                                         for t in body)))
    return found


def analyse(out: str, bin_dir: str) -> dict:
    """Per kernel: registers and loop bodies, from each cubin under ``out`` (-> out/sass.json)."""
    res = {}
    for cubin in sorted(glob.glob(os.path.join(out, "*.cubin"))):
        sass = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", cubin],
                              capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "--dump-resource-usage",
                                cubin], capture_output=True, text=True, check=True).stdout
        regs = re.search(r"REG:(\d+)", usage)
        shared = cubin[:-6] + ".shared"
        res[os.path.basename(cubin)[:-6]] = {
            "registers": int(regs.group(1)) if regs else None,
            "shared_bytes": int(open(shared).read()) if os.path.exists(shared) else None,
            "loops": [{"instructions": n, "ops": dict(c.most_common())} for n, c in loops(sass)],
            "instructions": len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+\S", sass))}
    with open(os.path.join(out, "sass.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    return res


def show(res: dict):
    for name, r in res.items():
        print(f"{name:32s} regs {r['registers']}  smem {r.get('shared_bytes')}  "
              f"total {r['instructions']}  loops " + " ".join(str(lp["instructions"]) for lp in r["loops"]))


def compare(old: str, new: str):
    a = json.load(open(os.path.join(old, "sass.json")))
    b = json.load(open(os.path.join(new, "sass.json")))
    print(f"{'kernel':32s} {'regs':>9s}  loop instructions (old -> new)")
    for name in b:
        ra, rb = a.get(name), b[name]
        if ra is None:
            print(f"{name:32s} (new)")
            continue
        la = " ".join(str(lp["instructions"]) for lp in ra["loops"]) or f"total {ra['instructions']}"
        lb = " ".join(str(lp["instructions"]) for lp in rb["loops"]) or f"total {rb['instructions']}"
        print(f"{name:32s} {ra['registers']:>4} {rb['registers']:>4}  {la} -> {lb}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    ap.add_argument("--triton-python", help="python of an environment with pip triton")
    ap.add_argument("--tree", default=".", help="checkout whose nsa_jax to lower")
    ap.add_argument("--route", choices=ROUTES, default="tiled")
    ap.add_argument("--shape", choices=("125m", "bench"), default="125m")
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--B", type=int, default=8, help="batch of --route decode")
    ap.add_argument("--num-warps", type=int, default=4)
    ap.add_argument("--choice", action="append", default=[], metavar="KEY=VALUE",
                    help="a KernelChoices field for the op's routes (repeatable), e.g. "
                         "sel_bwd=atomic")
    a = ap.parse_args(argv)
    for kv in a.choice:
        if "=" not in kv:
            ap.error(f"--choice takes KEY=VALUE, got {kv!r}")
    if a.compare:
        return compare(*a.compare)
    if not a.out or not a.triton_python:
        ap.error("OUT_DIR and --triton-python are required (or --compare OLD NEW)")
    if a.choice and a.route == "decode":
        ap.error("--choice applies to the op's routes, not --route decode")
    lower(a.tree, a.out, a.route, a.shape, a.T, a.B, a.choice)
    done = subprocess.run([a.triton_python, "-c", _COMPILE, a.out, str(a.num_warps)],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"--triton-python {a.triton_python}: compile failed:\n"
                         f"{done.stderr[-2000:]}")
    show(analyse(a.out, done.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    sys.exit(main())
