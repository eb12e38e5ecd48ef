# Shared by bench/ab_step.sh and bench/ab_op.sh (sourced, not run): the before tree's check, one profiling process in
# a tree, and the GPU tests with the time left. Each script sets OUT, log, t0, budget and rc before calling these.

ab_check_tree() {   # ab_check_tree TOOL TREE: exit 2 unless TREE holds this project
  [ -d "$2/nsa_jax" ] || { echo "$1: $2 is not a tree of this project (no nsa_jax/)" >&2; exit 2; }
}

ab_profile() {   # ab_profile TREE TAG SECONDS SCRIPT ARGS...: one process, its busy line prefixed by TAG
  local tree=$1 tag=$2 secs=$3; shift 3
  (cd "$tree" && PYTHONPATH=. timeout "$secs" python3 -W ignore::DeprecationWarning "$@") 2>&1 \
    | grep -E "busy|rror" | grep -v "^WARNING" | sed "s/^/$tag /" | tee -a "$log" || rc=1
  echo "  ($tag done at $((SECONDS - t0)) s)" | tee -a "$log"
}

ab_gpu_tests() {   # ab_gpu_tests KEXPR: the GPU tests named by -k, in the budget's time left (none if < 30 s)
  local left=$((budget - (SECONDS - t0)))
  if [ -n "$1" ] && [ "$left" -gt 30 ]; then
    timeout "$left" python3 -m pytest -q -m gpu tests -p no:cacheprovider -W ignore::DeprecationWarning -k "$1" 2>&1 \
      | grep -E "passed|failed|rror|assert" | tail -8 | tee -a "$log"
  fi
  echo "done: $((SECONDS - t0)) s" | tee -a "$log"
}
