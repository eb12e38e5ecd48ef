"""Steady-state training throughput: nsa_125m vs dense_125m from 2k to 64k tokens (GPU).

    PYTHONPATH=. python bench/train_throughput.py [--out bench/results/train_throughput_<dev>.json]
        [--points 2048:16 8192:4 32768:1 65536:1] [--steps 10] [--models nsa_125m dense_125m]
        [--mesh-data N] [--fsdp F] [--no-loader] [--packing concat documents] [--smoke]
    # a point may name its devices: T:B@N uses the first N devices, T:B@N/F also mesh.fsdp=F

For every model config and (seq_len T, global batch B) point it builds the product's own train step
(``nsa_jax.train.step.make_train_step``: AdamW, clipping, donated state, bf16 compute from the
config) on the ('data','fsdp') mesh over all local devices, feeds the same synthetic token batches
(``data.source=synthetic``, train.seed 0) to both models, compiles, runs 2 warm-up steps and then
times ``--steps`` steps one by one (``block_until_ready`` on the loss). Reported per point:
median step ms, tokens/s (B*T / median step time), peak device memory of the compiled step
(``memory_analysis``: arguments + outputs + temporaries - donated aliases; the process-wide
``memory_stats`` peak is recorded too, but it only grows across points), and
model FLOPs utilisation against ``--peak-tflops`` (default 989, the H200/H100 SXM dense bf16
datasheet figure). Model FLOPs per token = 6 x (matmul parameters, LM head included)
+ 3 x attention-matmul FLOPs, where the forward attention cost per token and layer is
4 * Hq * D * (keys attended): T/2 on average for dense causal, and for NSA the mean over positions
of (visible compressed blocks + min(n*l', t+1) + min(w, t+1)). The loader's own throughput
(synthetic and pretokenized ``tokens`` shards of the bundled sample) is measured first.
The JSON is rewritten after every point, so a run cut short keeps what it measured.

``--packing MODE ...`` (issue #16) feeds pretokenized ``tokens`` shards of the bundled FineWeb-Edu
sample (documents of ~1-2k tokens) instead of synthetic batches, once per ``data.packing`` mode:
``concat`` (documents joined, attention across them) against ``documents`` (segment ids,
attention inside each document), same tokens; each point records its ``packing``.

``--smoke`` shrinks everything for a CPU check of the script (numbers meaningless).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from nsa_jax.config import load_config  # noqa: E402
from nsa_jax.data import build_loader  # noqa: E402
from nsa_jax.train import mesh as meshlib  # noqa: E402
from nsa_jax.train.optim import make_optimizer  # noqa: E402
from nsa_jax.train.state import ModelSpec, init_state  # noqa: E402
from nsa_jax.train.step import make_train_step  # noqa: E402

SMOKE = ["model.n_layers=2", "model.dim=64", "model.n_heads=4", "model.n_kv_groups=2",
         "model.head_dim=16", "model.mlp_hidden=128", "model.vocab_size=512",
         "model.compute_dtype=float32", "nsa.block_l=8", "nsa.stride_d=4", "nsa.sel_block=16",
         "nsa.n_sel=4", "nsa.window=32"]


def device_name() -> str:
    d = jax.devices()[0]
    kind = getattr(d, "device_kind", d.platform).lower()
    for tag in ("h200", "h100", "a100"):
        if tag in kind:
            return tag
    return d.platform


def keys_attended(cfg, T: int) -> float:
    """Mean keys per query per KV group over positions 0..T-1 (see module docstring)."""
    t = np.arange(T)
    if cfg.model.attention == "dense":
        return float(np.mean(t + 1))
    n = cfg.nsa
    total = np.zeros(T)
    if "cmp" in n.branches:
        total += np.maximum((t + 1 - n.block_l) // n.stride_d + 1, 0)
    if "slc" in n.branches:
        total += np.minimum(n.n_sel * n.sel_block, t + 1)
    if "win" in n.branches:
        total += np.minimum(n.window, t + 1)
    return float(total.mean())


def model_flops_per_token(cfg, params, T: int) -> float:
    m = cfg.model
    matmul = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params) if x.ndim == 2)
    # 2-D params are matmul weights; with tied embeddings the table counts once, as the LM head
    # (the lookup itself does no FLOPs). φ's pos_emb [l, D] is 2-D but tiny; it is included.
    attn_fwd = 4 * m.n_heads * m.head_dim * keys_attended(cfg, T) * m.n_layers
    return 6.0 * matmul + 3.0 * attn_fwd


def peak_memory_gb() -> float | None:
    stats = jax.devices()[0].memory_stats() or {}
    v = stats.get("peak_bytes_in_use")
    return None if v is None else v / 2**30


def loader_throughput(cfg_path, smoke: bool) -> dict:
    """tokens/s of build_loader for synthetic and tokens shards (host side, prefetch off)."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tok = prepare_sample(tmp, smoke)
        for src, extra, T, B in (("synthetic", [], 2048, 16),
                                 ("tokens", [f"data.path={tok}"], 2048, 16)):
            c = load_config(cfg_path, [f"data.source={src}", *extra, f"data.seq_len={T}",
                                       "data.prefetch=0", "data.eval_fraction=0.05"])
            with build_loader(c, "train", batch_size=B) as ld:
                next(ld)
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 1.0:
                    next(ld)
                    n += 1
                dt = time.perf_counter() - t0
            out[src] = {"tokens_per_s": n * B * T / dt, "batch": B, "seq_len": T}
    return out


def prepare_sample(tmp: str, smoke: bool) -> str:
    """Pretokenized shards (GPT-2 tokenizer, document boundaries kept) of the bundled sample."""
    from nsa_jax.data.prepare import main as prepare_main
    ov = ["data.source=text", "data.path=nsa_jax/assets/data/fineweb_edu_sample.jsonl",
          f"data.out_dir={tmp}/tok", "data.tokenizer=gpt2"]
    prepare_main(["--config", str(REPO / "configs" / "nsa_125m.yaml"), *ov])
    return f"{tmp}/tok"


def build_point(name: str, T: int, B: int, steps: int, smoke: bool, mesh_data: int | None,
                fsdp: int = 1, extra=()):
    """The product's train step for one (model, T, B) point on the first ``mesh_data`` devices
    (all by default), its initial state and 4 placed synthetic batches."""
    ov = [f"data.seq_len={T}", f"train.batch_size={B}", "data.source=synthetic",
          "data.prefetch=2", f"train.steps={steps + 3}", "train.warmup_steps=1"]
    ndev = mesh_data or len(jax.devices())
    ov += [f"mesh.data={ndev // fsdp}", f"mesh.fsdp={fsdp}"]
    cfg = load_config(REPO / "configs" / f"{name}.yaml", ov + (SMOKE if smoke else []) + list(extra))
    devices = jax.devices()[:ndev]
    mesh = meshlib.build_mesh(cfg.mesh, devices)
    meshlib.check_batch(cfg, len(devices), 1)
    spec = ModelSpec(cfg.model, cfg.nsa, cfg.train.seed, cfg.exec)
    tx = make_optimizer(cfg.train)
    abstract = jax.eval_shape(lambda: init_state(spec, tx, cfg.train.seed))
    st_sh = meshlib.state_shardings(mesh, abstract)
    state = jax.jit(lambda: init_state(spec, tx, cfg.train.seed), out_shardings=st_sh)()
    step = jax.jit(make_train_step(spec, cfg.train, tx, mesh), donate_argnums=(0,),
                   in_shardings=(st_sh, meshlib.batch_sharding(mesh)), out_shardings=(st_sh, None))
    bsh = meshlib.batch_sharding(mesh)
    loader = build_loader(cfg, "train", batch_size=B)
    batches = [meshlib.place_batch(next(loader), bsh, B) for _ in range(4)]
    loader.close()
    return cfg, devices, step, state, batches


def run_point(name: str, T: int, B: int, steps: int, smoke: bool, mesh_data: int | None,
              fsdp: int = 1, extra=()) -> dict:
    cfg, devices, step, state, batches = build_point(name, T, B, steps, smoke, mesh_data, fsdp,
                                                     extra)
    t0 = time.perf_counter()
    step = step.lower(state, batches[0]).compile()
    compile_s = time.perf_counter() - t0
    mem = step.memory_analysis()
    compiled_peak = None
    if mem is not None:
        compiled_peak = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                         + mem.temp_size_in_bytes - mem.alias_size_in_bytes) / 2**30
    state, stats = step(state, batches[0])
    jax.block_until_ready(stats["loss"])
    for i in range(2):
        state, stats = step(state, batches[(i + 1) % 4])
    jax.block_until_ready(stats["loss"])
    times, losses = [], []
    for i in range(steps):
        t0 = time.perf_counter()
        state, stats = step(state, batches[i % 4])
        losses.append(float(jax.block_until_ready(stats["loss"])))
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    tps = B * T / (ms / 1e3)
    fpt = model_flops_per_token(cfg, state.params, T)
    return {"model": name, "seq_len": T, "batch": B, "devices": len(devices),
            "mesh": {"data": cfg.mesh.data, "fsdp": cfg.mesh.fsdp},
            "step_ms": ms, "step_ms_all": [t * 1e3 for t in times], "tokens_per_s": tps,
            "compiled_peak_gb": compiled_peak, "process_peak_gb": peak_memory_gb(),
            "compile_s": compile_s,
            "model_tflops_per_s": fpt * tps / 1e12, "flops_per_token": fpt,
            "losses": losses, "finite": bool(np.all(np.isfinite(losses))),
            "nsa_impl": cfg.exec.nsa_impl, "attention": cfg.model.attention,
            "source": cfg.data.source, "packing": cfg.data.packing}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--points", nargs="+", default=["2048:16", "8192:4", "32768:1", "65536:1"])
    ap.add_argument("--models", nargs="+", default=["nsa_125m", "dense_125m"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--mesh-data", type=int, default=None, help="use the first N devices")
    ap.add_argument("--fsdp", type=int, default=1, help="mesh.fsdp (divides the device count)")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--no-loader", action="store_true", help="skip the loader measurement")
    ap.add_argument("--packing", nargs="+", choices=["concat", "documents"], default=None,
                    help="bundled-sample token shards with these data.packing modes "
                         "(default: synthetic batches)")
    ap.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides for every point (e.g. exec.kernel.sel_partial_mib=1024)")
    ap.add_argument("--smoke", action="store_true")
    a = ap.parse_args(argv)
    if a.smoke:
        a.points = ["64:4", "128:2"] if a.points == ap.get_default("points") else a.points
        a.steps = min(a.steps, 3)
    ndev = a.mesh_data or len(jax.devices())
    out = Path(a.out or REPO / "bench" / "results" /
               f"train_throughput_{device_name()}x{ndev}{'_fsdp' if a.fsdp > 1 else ''}"
               f"{'_smoke' if a.smoke else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    res = {"device": jax.devices()[0].device_kind, "n_devices": ndev, "fsdp": a.fsdp,
           "jax": jax.__version__,
           "python": platform.python_version(), "peak_tflops": a.peak_tflops, "smoke": a.smoke,
           "loader": None if a.no_loader else loader_throughput(REPO / "configs" / "nsa_125m.yaml",
                                                                 a.smoke),
           "points": []}
    tmp = tempfile.TemporaryDirectory()
    vocab = ("model.vocab_size=50304",) if a.smoke else ()   # GPT-2 ids in the smoke model
    tok = prepare_sample(tmp.name, a.smoke) if a.packing else None
    feeds = [()] if not a.packing else [
        vocab + ("data.source=tokens", f"data.path={tok}", f"data.packing={m}") for m in a.packing]
    for pt in a.points:   # T:B, or T:B@N (first N devices) or T:B@N/F (and mesh.fsdp=F)
        pt, _, where = pt.partition("@")
        T, B = (int(x) for x in pt.split(":"))
        nd, _, fs = where.partition("/")
        nd, fs = (int(nd) if nd else a.mesh_data), (int(fs) if fs else a.fsdp)
        for name, feed in ((n, f) for n in a.models for f in feeds):
            try:
                r = run_point(name, T, B, a.steps, a.smoke, nd, fs, feed + tuple(a.override))
                r["overrides"] = list(a.override)
                r["mfu"] = r["model_tflops_per_s"] / (a.peak_tflops * r["devices"])
            except Exception as e:  # noqa: BLE001 - an OOM at one point must not lose the rest
                r = {"model": name, "seq_len": T, "batch": B, "error": str(e).splitlines()[0][:300],
                     "packing": feed[-1].split("=")[1] if feed else None}
            res["points"].append(r)
            out.write_text(json.dumps(res, indent=1))
            print(json.dumps({k: v for k, v in r.items() if k not in ("step_ms_all", "losses")}),
                  flush=True)
    tmp.cleanup()
    print(f"\nwrote {out}\n{'model':<11} {'T':>6} {'B':>3} {'dev':>3} {'fsdp':>4} {'packing':>9} "
          f"{'ms/step':>9} {'tok/s':>10} {'peakGB':>7} {'MFU':>6}")
    for r in res["points"]:
        if "error" in r:
            print(f"{r['model']:<11} {r['seq_len']:>6} {r['batch']:>3}  ERROR {r['error'][:60]}")
            continue
        print(f"{r['model']:<11} {r['seq_len']:>6} {r['batch']:>3} {r['devices']:>3} "
              f"{r['mesh']['fsdp']:>4} {r['packing'] if a.packing else '-':>9} {r['step_ms']:>9.1f} "
              f"{r['tokens_per_s']:>10.0f} {r['compiled_peak_gb'] or 0:>7.1f} {r['mfu']:>6.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
