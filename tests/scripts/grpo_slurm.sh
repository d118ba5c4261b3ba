#!/usr/bin/env bash
# `loom grpo` with every role placed by Slurm, on a real one-node Slurm cluster started here
# (slurm_one_node.sh: needs slurm-wlm, munge and root; exits 77 without them). Not part of CTest
# (scripts/setup.sh does not install Slurm); run by hand: grpo_slurm.sh LOOM_BINARY
#  1. `srun --mpi=pmix --multi-prog`: the 5 tasks of one step are one MPI job; the refit goes
#     over the communication layer (grpo.refit = comm), every refit verified bit for bit.
#  2. one `srun` per role (the checkpoint refit), the learner's 2 MPI ranks in a step of their
#     own under `loom launch`.
set -euo pipefail
loom="$(realpath "$1")"
work="$(mktemp -d)"
here="$(dirname "$0")"
# shellcheck source=slurm_one_node.sh
source "$here/slurm_one_node.sh"
trap 'stop_slurm "$work/slurm"; rm -rf "$work"' EXIT
fail() { echo "FAIL: $1"; shift; for f in "$@"; do echo "--- $f"; cat "$f"; done; exit 1; }
verified() {  # RUN_DIR: every one of the 3 rows has refit_verified_workers 1
  python3 - "$1" <<'PY'
import json, sys
v = [json.loads(l).get("refit_verified_workers") for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
assert v == [1, 1, 1], f"refit_verified_workers {v}"
PY
}
status=0
start_slurm "$work/slurm" || status=$?
[ $status = 77 ] && { echo "skipped: no Slurm, munge or root"; exit 77; }
[ $status = 0 ] || exit 1
# shellcheck source=grpo_tiny_run.sh
source "$here/grpo_tiny_run.sh"
prepare_grpo_run "$loom" "$work" || fail "the starting checkpoint" "$work/tiny.log"
g="$loom grpo $work/grpo.yaml"

cat > "$work/roles.conf" <<CONF
0 $g --role controller grpo.refit=comm
1 $g --role environment grpo.refit=comm
2 $g --role generation grpo.refit=comm
3-4 $g --role learner grpo.refit=comm runtime.backend=auto parallel.tp=2
CONF
timeout 300 srun --mpi=pmix -n 5 --overcommit --multi-prog "$work/roles.conf" > "$work/multi.log" 2>&1 ||
  fail "srun --multi-prog exited with $?" "$work/multi.log"
verified "$work/run" || fail "refits of srun --multi-prog" "$work/multi.log"
[ "$(grep -c "refit over the communication layer" "$work/multi.log")" = 3 ] || fail "not 3 refits over MPI" "$work/multi.log"
echo "srun --multi-prog: 3 steps, 3 refits over the communication layer, each verified"

per="run.dir=$work/per"
# shellcheck disable=SC2086
srun -n1 --overcommit $g --role controller "$per" > "$work/per-controller.log" 2>&1 &
controller=$!
# shellcheck disable=SC2086
srun -n1 --overcommit $g --role environment "$per" > "$work/per-environment.log" 2>&1 &
# shellcheck disable=SC2086
srun -n1 --overcommit $g --role generation "$per" > "$work/per-generation.log" 2>&1 &
# shellcheck disable=SC2086
timeout 300 "$loom" launch --max-restarts 1 --hang-timeout-s 0 -- srun --mpi=pmix -n2 --overcommit $g --role learner "$per" \
  runtime.backend=auto parallel.tp=2 > "$work/per-learner.log" 2>&1 || fail "the learner's step exited with $?" "$work/per-learner.log"
wait $controller || fail "the controller's step exited with $?" "$work/per-controller.log"
wait
verified "$work/per" || fail "refits of one srun per role" "$work/per-controller.log"
echo "one srun per role: 3 steps, each refit verified"
