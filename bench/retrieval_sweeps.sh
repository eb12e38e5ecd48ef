#!/usr/bin/env bash
# The retrieval sweeps of bench/NOTES.md ("Retrieval study", "What made NSA learn it"): many small
# runs side by side on ONE GPU, each its own process. Run from the repo root:
#
#   bench/retrieval_sweeps.sh SET      # SET: gates | cmp | needle | scale512 | scale2048 | scale2048b
#
# gates, cmp, needle: bench/retrieval_probe.py at CPU scale (seq 256; 3000 steps; answer loss, gates,
#   selection recall every 100 steps); scale*: the product's train command on the study's model
#   (held-out answer loss = eval_loss every 100 steps). The calls that measured them (grouped a
#   little differently) took 203-266 s each on an H200.
# Writes $OUT (default /tmp/retrieval_sweeps)/SET/<run>.{json,log}; prints one line per run last.
# Environment: PYTHON (default python3), STEPS (probe sets, default 3000), T (seconds per scale run).
set -u
SET=${1:?usage: bench/retrieval_sweeps.sh gates|cmp|needle|scale512|scale2048|scale2048b}
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/retrieval_sweeps}/$SET
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${MEMF:-0.06}
P="exec.nsa_impl=reference train.steps=${STEPS:-3000}"
R1="data.retrieval.value_repeat=1"          # the 3-token pairs PAIR key value
S="--config configs/quality_retrieval.yaml train.lr=1.5e-3 train.eval_every=100 train.ckpt_every=0 train.log_every=100"
M="model.vocab_size=512 model.dim=64 model.n_layers=2 model.n_heads=2 model.n_kv_groups=1 model.head_dim=32 model.mlp_hidden=192 nsa.window=32 nsa.block_l=16 nsa.stride_d=8 nsa.sel_block=32 nsa.n_sel=4 nsa.n_local=1 data.seq_len=512 data.retrieval.pairs=8 data.retrieval.queries=8 data.retrieval.keys=32 data.retrieval.values=256 data.retrieval.value_repeat=16 train.batch_size=32 train.lr=2e-3 train.warmup_steps=50 train.steps=2000"
K="data.seq_len=2048 nsa.window=128 data.retrieval.pairs=16 data.retrieval.queries=16"
declare -A V
case $SET in
  gates)       # 3-token pairs: the gated mix, every block selected (n = 16) or n = 4; gates 0
    R1="$R1 model.gate_bias=[0,0,0]"      # unless a run sets its own (the config's is 0,3,-3)
    V[dense]="model.attention=dense $R1 $P"; V[nsa4]="$R1 $P"; V[nsa16]="nsa.n_sel=16 $R1 $P"
    V[slc16]="nsa.n_sel=16 nsa.branches=[slc] $R1 $P"; V[slc4]="nsa.branches=[slc] $R1 $P"
    V[nsa16_gs]="model.gate_bias=[-3,3,-3] nsa.n_sel=16 $R1 $P"
    V[nsa16_g8]="model.gate_bias=[8,8,8] nsa.n_sel=16 $R1 $P"
    V[nsa4_gs]="model.gate_bias=[-3,3,-3] $R1 $P"; V[nsa4_g333]="model.gate_bias=[3,3,3] $R1 $P"
    V[nsa4_g8]="model.gate_bias=[8,8,8] $R1 $P"; V[nsa4_h4]="model.n_heads=4 $R1 $P"
    V[nsa4_lr4]="train.lr=4e-3 $R1 $P"; V[nsa4_eps]="train.eps=1e-15 $R1 $P"
    V[cmpslc4]="nsa.branches=[cmp,slc] $R1 $P"; V[slcwin16]="nsa.n_sel=16 nsa.branches=[slc,win] $R1 $P" ;;
  cmp)         # 3-token pairs: the compressed branch alone, its gate held open
    G="model.gate_bias=[8,8,8] nsa.branches=[cmp] $R1"
    V[cmp4_g8]="$G $P"; V[cmp4_g8_l4d4]="$G nsa.block_l=4 nsa.stride_d=4 $P"
    V[cmp4_g8_l4d2]="$G nsa.block_l=4 nsa.stride_d=2 $P"; V[cmp4_g8_eps]="$G train.eps=1e-15 $P"
    V[cmp4_g8_lr4]="$G train.lr=4e-3 $P"; V[cmp4_g8_phi]="$G model.phi_hidden=512 $P"
    V[cmp4_g8_long]="$G exec.nsa_impl=reference train.steps=6000"
    V[cmp_l1]="$G nsa.block_l=1 nsa.stride_d=1 $P" ;;
  needle)      # needles that fill a compressed block (value_repeat r); nsa4_r8: the config's gates
    V[dense_r8]="model.attention=dense $P"; V[nsa4_r8]="$P"
    V[nsa4_r8_gs]="model.gate_bias=[-3,3,-3] $P"; V[nsa4_r8_g033]="model.gate_bias=[0,3,-3] $P"
    V[nsa4_r8_g333]="model.gate_bias=[3,3,3] $P"; V[cmp4_r8]="model.gate_bias=[8,8,8] nsa.branches=[cmp] $P"
    V[win_r8]="model.gate_bias=[0,0,3] nsa.branches=[win] $P"
    V[nsa4_r4_g033]="model.gate_bias=[0,3,-3] data.retrieval.value_repeat=4 $P"
    V[nsa4_r1_g033]="model.gate_bias=[0,3,-3] $R1 $P" ;;
  scale512)    # Pallas vs reference, float32 vs bfloat16, seq 512
    V[M_ref_f32]="$M exec.nsa_impl=reference model.compute_dtype=float32"
    V[M_pal_f32]="$M exec.nsa_impl=pallas model.compute_dtype=float32"
    V[M_pal_bf16]="$M exec.nsa_impl=pallas"; V[M_ref_bf16]="$M exec.nsa_impl=reference"
    V[M_dense]="$M model.attention=dense" ;;
  scale2048)   # the study's model at seq 2048, lr 1.5e-3
    V[K_pal]="$K exec.nsa_impl=pallas train.steps=4000"; V[K_ref]="$K exec.nsa_impl=reference train.steps=4000"
    V[K_dense]="$K model.attention=dense train.steps=4000" ;;
  scale2048b)  # what changes it (2500 steps)
    B="$K train.steps=2500"
    V[K_cmp]="$B nsa.branches=[cmp] model.gate_bias=[3,3,3]"; V[K_g300]="$B model.gate_bias=[3,0,-3]"
    V[K_g0]="$B model.gate_bias=[0,0,0]"; V[K_G4]="$B model.n_kv_groups=4"; V[K_G1]="$B model.n_kv_groups=1"
    V[K_l16]="$B nsa.block_l=16 nsa.stride_d=8"; V[K_n8]="$B nsa.n_sel=8"; V[K_lr5]="$B train.lr=5e-4"
    V[K_dim64]="$B model.dim=64 model.n_layers=2 model.n_heads=2 model.n_kv_groups=1 model.head_dim=32 model.mlp_hidden=192" ;;
  *) echo "unknown set $SET" >&2; exit 2 ;;
esac
for n in "${!V[@]}"; do
  if [[ $SET == scale* ]]; then
    rm -rf "$OUT/$n"
    timeout "${T:-500}" $PY -m nsa_jax.train $S ${V[$n]} run.dir="$OUT/$n" name="$n" > "$OUT/$n.log" 2>&1 &
  else
    $PY bench/retrieval_probe.py "$n" --out "$OUT" ${V[$n]} > "$OUT/$n.log" 2>&1 &
  fi
done
wait
$PY - "$OUT" <<'PYEOF'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
for f in sorted(d.glob("*.json")):                      # probe runs
    log = json.loads(f.read_text()); last = log[-1]
    row = " ".join(f"{e['eval_ce']:.2f}" for e in log if e["step"] % 500 == 0)
    print(f"{f.stem:14s} {row} | >4w {last['far_acc']:.3f} recall {last.get('recall_far')} gates {last.get('gates')}")
for m in sorted(d.glob("*/metrics.jsonl")):             # train-command runs
    ev = [(e["step"], round(e["eval_loss"], 2)) for e in map(json.loads, m.read_text().splitlines()) if "eval_loss" in e]
    print(f"{m.parent.name:14s} {ev}")
PYEOF
