#!/usr/bin/env bash
# `loom grpo` with every role placed by a launcher (grpo.launch = external): one mpirun with
# several programs (MPMD) runs the controller, an environment server, a generation worker and a
# learner of 2 MPI ranks (tp 2) for 40 steps with grpo.verify_refit; the generation worker's
# server is killed once registered (its supervisor restarts it, the controller refits it)
# and the run still finishes every step. The refit over the communication layer from a tp 2 x
# pp 2 learner and from a dp 2 ZeRO-3 learner to two workers (with two environments, one server
# each), verified bit for bit. A whole job stopped and resumed. The roles as
# one process each with the learner under `loom launch`, killed and resumed. Then the errors: a
# role out of restarts, a role that never registers, an unknown --role, a duplicate index.
# Usage: grpo_mpmd.sh LOOM_BINARY MPIEXEC
set -euo pipefail
loom="$1"
mpiexec="$2"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
fail() { echo "FAIL: $1"; shift; for f in "$@"; do echo "--- $f"; cat "$f"; done; exit 1; }
rows() { local n; n=$(grep -c . "$1" 2>/dev/null) || true; echo "${n:-0}"; }
# shellcheck source=grpo_tiny_run.sh
source "$(dirname "$0")/grpo_tiny_run.sh"
prepare_grpo_run "$loom" "$work" || fail "the starting checkpoint" "$work/tiny.log"
g=("$loom" grpo "$work/grpo.yaml")
# Synchronous (max_staleness 0): each step's groups come from the weights of the refit before,
# so after the kill no step goes on until the restarted server generates (at most one refit
# misses it).
k=("${g[@]}" grpo.max_staleness=0 train.steps=40)
"$mpiexec" --allow-run-as-root --oversubscribe \
  -np 1 "${k[@]}" --role controller : -np 1 "${k[@]}" --role environment : -np 1 "${k[@]}" --role generation : \
  -np 2 "${k[@]}" --role learner runtime.backend=auto parallel.tp=2 > "$work/mpmd.log" 2>&1 &
job=$!
# The generation worker's server is killed as soon as it is registered, and the run is 40 steps
# long, so that the kill lands mid-run: a step of this model takes a few milliseconds, and a run
# of five steps could end before the kill (a killed zombie then counts as a clean exit).
server=""
for _ in $(seq 1 1200); do
  server=$(python3 -c "import json; r = json.load(open('$work/run/grpo/roles.json')); print(r['pids'][r['generation_workers'][0]])" 2>/dev/null) && break
  kill -0 $job 2>/dev/null || break
  sleep 0.1
done
[ -n "$server" ] || fail "no generation worker registered within 120 s" "$work/mpmd.log"
kill -9 "$server"
wait $job || fail "the MPMD run exited with $?" "$work/mpmd.log"
python3 - "$work/run" <<'PY' || fail "metrics or roles.json" "$work/mpmd.log"
import json, sys
run = sys.argv[1]
rows = [json.loads(l) for l in open(run + "/metrics.jsonl") if l.strip()]
assert len(rows) == 40, f"{len(rows)} metrics rows, expected 40"
# Each refit is verified, but the one the killed server missed (its restart loads the weights then).
verified = [r.get("refit_verified_workers") for r in rows]
assert all(v in (0, 1) for v in verified) and verified.count(0) <= 1 and verified[-1] == 1, f"refit_verified_workers {verified}"
roles = json.load(open(run + "/grpo/roles.json"))
assert roles["launch"] == "external" and roles["finished"] is True, roles
assert len(roles["environments"]) == 1 and len(roles["generation_workers"]) == 1, roles
registered = {(r["role"], r["index"]) for r in roles["registered"]}
assert registered == {("environment", 0), ("generation", 0), ("learner", 0)}, registered
learner = [r for r in roles["registered"] if r["role"] == "learner"][0]
assert learner["ranks"] == 2, learner
assert not roles["controller"].startswith("http://127.0.0.1"), roles["controller"]
gen = [r for r in roles["registered"] if r["role"] == "generation"][0]
assert gen["starts"] == 2, f"the generation worker's server started {gen['starts']} times, expected 2 (one restart)"
print(f"40 steps, refits verified {verified}, roles: {sorted(registered)}, generation worker restarted once")
PY
grep -q "generation 0: its server (pid $server) killed by signal 9" "$work/mpmd.log" ||
  fail "no restart of the killed generation server" "$work/mpmd.log"

# A whole MPMD job stopped (SIGTERM to mpirun ends every role) after at least 3 of its 1000 steps
# (so many that it cannot finish first), then launched again with train.resume=true for 4 steps
# more: the controller goes on from the learner's newest checkpoint, the roles register anew (the
# dead ones' registrations are left behind), and every step is done once.
r=("${g[@]}" train.steps=1000 run.dir="$work/resumed")
"$mpiexec" --allow-run-as-root --oversubscribe -np 1 "${r[@]}" --role controller : -np 1 "${r[@]}" --role environment : \
  -np 1 "${r[@]}" --role generation : -np 1 "${r[@]}" --role learner runtime.backend=auto > "$work/stopped.log" 2>&1 &
job=$!
for _ in $(seq 1 1200); do [ "$(rows "$work/resumed/metrics.jsonl")" -ge 3 ] && break; kill -0 $job 2>/dev/null || break; sleep 0.1; done
kill -TERM $job 2>/dev/null || true
wait $job || true
# mpirun returns before its processes have all ended (a launcher's next job starts after them).
for pid in $(cat "$work"/resumed/grpo/roles/*.json | python3 -c "import json, sys
for l in sys.stdin: r = json.loads(l); print(r['pid'], r['server_pid'] or '')"); do  # the learner has no server
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
done
stopped=$(rows "$work/resumed/metrics.jsonl")
[ "$stopped" -ge 3 ] && [ "$stopped" -lt 1000 ] || fail "the job to resume ran $stopped of 1000 steps" "$work/stopped.log"
total=$((stopped + 4))  # the learner saved at most one step more than was reported
r+=(train.resume=true train.steps=$total)
"$mpiexec" --allow-run-as-root --oversubscribe -np 1 "${r[@]}" --role controller : -np 1 "${r[@]}" --role environment : \
  -np 1 "${r[@]}" --role generation : -np 1 "${r[@]}" --role learner runtime.backend=auto > "$work/resumed.log" 2>&1 ||
  fail "the resumed MPMD job exited with $?" "$work/resumed.log"
grep -q "train.resume: resuming at step \($stopped\|$((stopped + 1))\) from $work/resumed/learner/checkpoints/step-" \
  "$work/resumed.log" || fail "the controller did not resume from the learner's checkpoint" "$work/resumed.log"
python3 - "$work/resumed" "$total" <<'PY' || fail "the resumed job's metrics" "$work/resumed.log"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
assert steps == list(range(int(sys.argv[2]))), f"metrics rows of steps {steps}"
PY
echo "a whole MPMD job stopped after $stopped steps resumed with train.resume=true: $total steps, each once"

# The refit over the communication layer (grpo.refit = comm): the learner's ranks send their
# shards in buckets of 1 MiB to the workers' processes; every refit is verified bit for bit (each
# worker's weights digest equals the learner's checkpoint's). A tp 2 x pp 2 learner (4 MPI
# ranks) to one tp 1 worker, then a dp 2 ZeRO-3 learner to two workers, its prompts drawn from two
# environments (grpo.environments: arithmetic named sums, and countdown), one launched process
# each: each process serves its entry's task (every episode checks it), roles.json names them.
comm_run() {  # NAME WORKERS LEARNER_RANKS ENVIRONMENTS ('' or a grpo.environments list) LEARNER_OVERRIDES...
  local name="$1" workers="$2" ranks="$3" environments="$4" servers=1 names='["arithmetic"]'
  shift 4
  local c=("${g[@]}" grpo.refit=comm grpo.refit_bucket_mb=1 grpo.generation_workers="$workers" run.dir="$work/$name")
  if [ -n "$environments" ]; then
    c+=("grpo.environments=$environments")
    servers=2 names='["sums", "countdown"]'
  fi
  "$mpiexec" --allow-run-as-root --oversubscribe -np 1 "${c[@]}" --role controller : \
    -np "$servers" "${c[@]}" --role environment : -np "$workers" "${c[@]}" --role generation : -np "$ranks" "${c[@]}" --role learner runtime.backend=auto "$@" \
    > "$work/$name.log" 2>&1 || fail "the MPMD run $name with grpo.refit=comm exited with $?" "$work/$name.log"
  python3 - "$work/$name" "$workers" "$names" <<'PY' || fail "metrics of the comm refit $name" "$work/$name.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
verified = [r.get("refit_verified_workers") for r in rows]
workers = int(sys.argv[2])
assert len(rows) == 3 and verified == [workers] * 3, f"{len(rows)} rows, refit_verified_workers {verified}"
names = json.loads(sys.argv[3])
roles = json.load(open(sys.argv[1] + "/grpo/roles.json"))
assert roles["environment_names"] == names, roles["environment_names"]
seen = set().union(*(r["reward"].keys() for r in rows))
assert seen == set(names), f"rewards of {seen}, expected {names}"
PY
  [ "$(grep -c "refit over the communication layer: .* from $ranks learner rank(s), loaded by .* as step-" "$work/$name.log")" = $((3 * workers)) ] ||
    fail "the workers did not receive 3 refits each over the communication layer" "$work/$name.log"
  echo "grpo.refit=comm, $name: 3 steps, $ranks learner ranks to $workers worker(s), every refit bit for bit," \
    "environments $names"
}
comm_run tp2pp2 1 4 '' parallel.tp=2 parallel.pp=2 train.micro_batch=2
comm_run zero3 2 2 "[{name: sums}, {task: countdown, task_numbers: 2}]" \
  parallel.zero=3 train.micro_batch=2

# One process per role, as one `srun` step each would start them (no MPI job; indices 0), the
# learner under `loom launch` (6 steps): the learner kills itself when it reaches its third step
# (fault.kill_step, first attempt only), the supervisor restarts it from its checkpoint, it
# registers anew, the controller takes it up and the run finishes.
"${g[@]}" --role controller run.dir="$work/solo" train.steps=6 > "$work/solo.log" 2>&1 &
controller=$!
"${g[@]}" --role environment run.dir="$work/solo" > "$work/solo-env.log" 2>&1 &
"${g[@]}" --role generation run.dir="$work/solo" > "$work/solo-gen.log" 2>&1 &
"$loom" launch --max-restarts 2 --hang-timeout-s 0 -- "${g[@]}" --role learner run.dir="$work/solo" train.steps=6 \
  fault.kill_rank=0 fault.kill_step=3 > "$work/solo-learner.log" 2>&1 &
launcher=$!
wait $controller || fail "the controller of one process per role exited with $?" "$work/solo.log" "$work/solo-learner.log"
wait $launcher || fail "the learner's loom launch exited with $?" "$work/solo-learner.log"
wait
[ "$(rows "$work/solo/metrics.jsonl")" = 6 ] || fail "not 6 metrics rows" "$work/solo.log"
grep -q "training finished on attempt 2" "$work/solo-learner.log" || fail "the learner was not restarted" "$work/solo-learner.log"
grep -q "learner 0 on .* registered (1 ranks)" "$work/solo.log" || fail "the restarted learner was not taken up" "$work/solo.log"
echo "one process per role: the learner killed at step 3 resumed under loom launch; 6 steps"

# A server that keeps dying: with grpo.max_role_restarts = 0 its supervisor gives up at the first
# death, saying why in its registration, and the controller fails naming it. The run is long
# (1000 steps) so that it cannot have finished before the kill.
long=(train.steps=1000)
"${g[@]}" --role controller run.dir="$work/giveup" grpo.max_role_restarts=0 "${long[@]}" > "$work/giveup.log" 2>&1 &
controller=$!
"${g[@]}" --role environment run.dir="$work/giveup" grpo.max_role_restarts=0 > "$work/giveup-env.log" 2>&1 &
"${g[@]}" --role generation run.dir="$work/giveup" > "$work/giveup-gen.log" 2>&1 &
"${g[@]}" --role learner run.dir="$work/giveup" "${long[@]}" > "$work/giveup-learner.log" 2>&1 &
for _ in $(seq 1 600); do [ -s "$work/giveup/grpo/roles.json" ] && break; sleep 0.1; done
kill -9 "$(python3 -c "import json; print(json.load(open('$work/giveup/grpo/roles/environment-0.json'))['server_pid'])")"
if wait $controller; then fail "the controller went on without its environment" "$work/giveup.log"; fi
grep -q "environment 0 on .* gave up: its server (pid [0-9]*) killed by signal 9 (Killed), after 0 restarts (grpo.max_role_restarts = 0)" \
  "$work/giveup.log" || fail "the controller does not name the role that gave up" "$work/giveup.log" "$work/giveup-env.log"
kill $(jobs -p) 2>/dev/null || true
wait || true
echo "a role out of restarts: the controller fails naming it"

# A role that never registers: the controller alone gives up naming the missing ones.
if "${g[@]}" --role controller run.dir="$work/lonely" grpo.register_timeout_s=2 > "$work/lonely.log" 2>&1; then
  fail "a controller without roles succeeded" "$work/lonely.log"
fi
grep -q "these roles have not registered in .*: environment 0, generation 0, learner 0" "$work/lonely.log" ||
  fail "the missing roles are not named" "$work/lonely.log"
# An unknown role.
if "${g[@]}" --role trainer > "$work/unknown.log" 2>&1; then fail "--role trainer succeeded" "$work/unknown.log"; fi
grep -q "loom grpo --role 'trainer' is not a role; valid: controller, environment, generation, learner" "$work/unknown.log" ||
  fail "the unknown role is not named" "$work/unknown.log"
# Two processes launched as environment 0.
"${g[@]}" --role environment run.dir="$work/twice" > "$work/first.log" 2>&1 &
first=$!
for _ in $(seq 1 300); do [ -s "$work/twice/grpo/roles/environment-0.json" ] && break; sleep 0.1; done
if "${g[@]}" --role environment run.dir="$work/twice" > "$work/second.log" 2>&1; then fail "a duplicate index succeeded" "$work/second.log"; fi
kill "$first"; wait "$first" || true
grep -q "environment 0 is registered twice: by process $first on" "$work/second.log" ||
  fail "the duplicate index is not named" "$work/second.log" "$work/first.log"
echo "errors: a missing role, an unknown role and a duplicate index are named"
