#!/usr/bin/env bash
# The GPU benchmark's table makers on fixed inputs (no GPU needed): bench/cuda/kernel_profile.py
# sums an ncu CSV's kernel times by name (units mixed, long names and short: the H200 machine's
# ncu writes "ns"; thousands separators, ncu's own lines before the table) per step and against a
# step time, with each kernel's DRAM TB/s and occupancy when the CSV has them, and refuses what is
# not such a table;
# bench/cuda/gpu_table.py gives a loom recipe's tokens/s over loom's bf16 run; bench/cuda/
# loss_curves.py tells two loss curves within 5% of each other from ones that are not;
# bench/cuda/gpu_clocks.py sums up nvidia-smi's clock, power and clock-event samples of a run;
# bench/cuda/step_timeline.py cuts a CUPTI timeline into steps and finds where the GPU sat idle.
# Usage: gpu_bench_tables.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bench="$here/../../bench/cuda"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $1"; [ -f "${2:-}" ] && cat "$2"; exit 1; }

python3 "$bench/kernel_profile.py" "$here/fixtures/ncu_kernel_times.csv" --steps 2 --step-ms 2 > "$work/profile.txt" ||
  fail "kernel_profile.py exited with $?" "$work/profile.txt"
# Two launches of each kernel over 2 steps: the GEMM 1.25 ms each, RMSNorm 12.5 us and 7,500 ns.
grep -Eq '^sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64 +1\.250 +99\.2% +1 +1250\.0$' "$work/profile.txt" ||
  fail "the GEMM's row" "$work/profile.txt"
grep -Eq '^void loom::kernels::cuda::rmsnorm_forward<float> +0\.010 +0\.8% +1 +10\.0$' "$work/profile.txt" ||
  fail "the RMSNorm row (argument list dropped, units converted)" "$work/profile.txt"
grep -q "kernel time per step: 1.260 ms over 2 launches; the step's wall time 2.000 ms: the GPU busy 63.0% of it" \
  "$work/profile.txt" || fail "the total" "$work/profile.txt"
printf 'not,a,profile\n1,2,3\n' > "$work/bad.csv"
if python3 "$bench/kernel_profile.py" "$work/bad.csv" > "$work/bad.txt" 2>&1; then fail "a CSV without ncu's columns was taken"; fi
grep -q "kernel_profile: .*bad.csv: not an ncu --csv table" "$work/bad.txt" || fail "the bad table is not named" "$work/bad.txt"
echo "kernel_profile.py: per-kernel sums, shares and the GPU-busy fraction"
# With DRAM bytes and occupancy (mixed units): 800 MB over 400 us, 50% for 100 us and 70% for 300.
python3 "$bench/kernel_profile.py" "$here/fixtures/ncu_kernel_bytes.csv" > "$work/bytes.txt" ||
  fail "kernel_profile.py exited with $? on the bytes table" "$work/bytes.txt"
grep -Eq '^void loom::kernels::cuda::cast4_kernel<float> +0\.400 +100\.0% +2 +200\.0 +2\.00 +65\.0$' "$work/bytes.txt" ||
  fail "the cast's TB/s and time-weighted occupancy" "$work/bytes.txt"
echo "kernel_profile.py: DRAM TB/s and achieved occupancy per kernel"

printf 'GPU|NVIDIA H100 80GB HBM3\nTRAIN|loom|llama-1b|4|2048|30000|273|15\nTRAIN|loom fp8_current|llama-1b|4|2048|39000|210|15\n' \
  > "$work/bench.txt"
(cd "$bench" && python3 -c "import gpu_table, sys; print(gpu_table.training(sys.argv[1]))" "$work/bench.txt") > "$work/table.txt" ||
  fail "gpu_table.py's training table" "$work/table.txt"
grep -Eq '^llama-1b +4 x 2048 loom fp8_current +39000 .* 1\.30$' "$work/table.txt" || fail "the fp8 run over bf16" "$work/table.txt"
grep -Eq '^llama-1b +4 x 2048 loom +30000 .* -$' "$work/table.txt" || fail "the bf16 run's own row" "$work/table.txt"
echo "gpu_table.py: a loom recipe over loom's bf16 run"

# Kernel rows: loom's attention on cuDNN against torch's row of the same operation and shape.
printf 'RESULT|loom|attention fwd bf16|gpt2 B8|0.400|10.0\nRESULT|torch|attention fwd bf16|gpt2 B8|0.200|20.0\nRESULT|loom|attention fwd bf16 via cuDNN|gpt2 B8|0.100|40.0\n' \
  > "$work/kernels.txt"
(cd "$bench" && python3 -c "import gpu_table, sys; print(gpu_table.bench(sys.argv[1]))" "$work/kernels.txt") > "$work/kernels_table.txt" ||
  fail "gpu_table.py's kernel table" "$work/kernels_table.txt"
grep -Eq '^attention fwd bf16 via cuDNN +gpt2 B8 +0\.100 +40\.0 +0\.200 +20\.0 +2\.00$' "$work/kernels_table.txt" ||
  fail "the cuDNN row against torch's" "$work/kernels_table.txt"
grep -Eq '^attention fwd bf16 +gpt2 B8 +0\.400 +10\.0 +0\.200 +20\.0 +0\.50$' "$work/kernels_table.txt" ||
  fail "loom's own kernel row" "$work/kernels_table.txt"
echo "gpu_table.py: a cuDNN row against torch's same operation"

# Loss curves: bf16 falling from 10 to 4 over 60 steps; fp8 3% above it (within 5%), then 8%.
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
for name, factor in (("bf16", 1.0), ("close", 1.03), ("far", 1.08)):
    with open(f"{work}/{name}.jsonl", "w") as f:
        for step in range(1, 61):
            f.write(json.dumps({"step": step, "loss": (10 - step * 0.1) * factor}) + "\n")
PY
python3 "$bench/loss_curves.py" "$work/bf16.jsonl" "$work/close.jsonl" --names bf16,fp8 --csv "$work/curve.csv" > "$work/close.txt" ||
  fail "curves 3% apart were judged beyond 5%" "$work/close.txt"
grep -q "^LOSS|bf16|fp8|60 steps|10-step averages from step 20: largest difference 3.00% (step .*within 5%" "$work/close.txt" ||
  fail "the close curves' line" "$work/close.txt"
[ "$(head -2 "$work/curve.csv" | tail -1)" = "1,9.900000,10.197000" ] || fail "the curves' CSV" "$work/curve.csv"
rc=0; python3 "$bench/loss_curves.py" "$work/bf16.jsonl" "$work/far.jsonl" > "$work/far.txt" || rc=$?
[ $rc = 1 ] || fail "curves 8% apart were not judged beyond 5%" "$work/far.txt"
grep -q "largest difference 8.00% .*BEYOND 5%" "$work/far.txt" || fail "the far curves' line" "$work/far.txt"
echo '{"step": 1}' > "$work/broken.jsonl"
rc=0; python3 "$bench/loss_curves.py" "$work/bf16.jsonl" "$work/broken.jsonl" > "$work/broken.txt" 2>&1 || rc=$?
[ $rc = 2 ] || fail "a record without a loss was taken" "$work/broken.txt"
grep -q "loss_curves: .*broken.jsonl:1: not a metrics record with step and loss" "$work/broken.txt" ||
  fail "the broken record is not named" "$work/broken.txt"
echo "loss_curves.py: within and beyond 5%, a broken record named"

# nvidia-smi's samples through a run: idle samples left out, the clock's median and lowest, the
# power's median and highest, and the share of busy samples each reason held the clock down.
printf '%s\n' '1980, 450.2, 0x0000000000000000' '1755, 699.0, 0x0000000000000004' '300, 80.0, 0x0000000000000001' \
  '1700, 700.1, 0x000000000000000C' '[N/A], [N/A], [N/A]' > "$work/clocks.csv"
python3 "$bench/gpu_clocks.py" "$work/clocks.csv" > "$work/clocks.txt" || fail "gpu_clocks.py exited with $?" "$work/clocks.txt"
expected="# clocks over 3 busy samples: SM median 1755 MHz (lowest 1700), power median 699 W (highest 700);"
expected+=" held down by: hardware slowdown 33%, power cap 67%"
grep -qxF "$expected" "$work/clocks.txt" || fail "the clocks' line" "$work/clocks.txt"
echo "gpu_clocks.py: busy samples' clock, power and reasons"

# A hand-made timeline (tests/scripts/fixtures/step_timeline.csv): 4 steps of 1 ms, each ending with
# 2 AdamW launches; the GPU idle 150 us after the loss's copy while the host sits in
# cudaStreamSynchronize, 80 us (the last step 120) while it is inside a slow cudaLaunchKernel, 10 us
# around a few short calls. The first step (with a warm-up kernel) is left out.
python3 "$bench/step_timeline.py" "$here/fixtures/step_timeline.csv" > "$work/timeline.txt" ||
  fail "step_timeline.py exited with $?" "$work/timeline.txt"
grep -q "4 step ends ('adamw'), 3 complete steps after the first; the last 3$" "$work/timeline.txt" ||
  fail "the steps found" "$work/timeline.txt"
expected="step 2: wall 1.000 ms, GPU busy 0.760 ms, idle 0.240 ms (24.0%), 6 kernels, host in synchronisation 0.340 ms"
grep -qxF "$expected" "$work/timeline.txt" || fail "step 2's times" "$work/timeline.txt"
expected="  gap 150.0 us at +0.310 ms, host waiting in cudaStreamSynchronize: after memcpy DtoH 4 B,"
expected+=" before loom::kernels::cuda::rmsnorm_forward<float>"
[ "$(grep -cxF "$expected" "$work/timeline.txt")" = 3 ] || fail "the gap while the host waits" "$work/timeline.txt"
expected="  gap 120.0 us at +0.560 ms, host launching in cudaLaunchKernel:"
expected+=" after loom::kernels::cuda::rmsnorm_forward<float>, before loom::kernels::cuda::rmsnorm_backward<float>"
grep -qxF "$expected" "$work/timeline.txt" || fail "the gap while the host launches" "$work/timeline.txt"
grep -q "warmup" "$work/timeline.txt" && fail "the first step was not left out" "$work/timeline.txt"
expected="mean over 3 steps: wall 1.000 ms, GPU busy 0.747 ms, idle 0.253 ms (25.3%), host in synchronisation 0.340 ms"
grep -qxF "$expected" "$work/timeline.txt" || fail "the means" "$work/timeline.txt"
# Idle 253.3 us a step: 150 waiting, 95.3 launching (79, 79, 119 in the slow launches; 3 in the
# short ones), 4 between calls, 4 in cudaMemsetAsync.
expected="idle per step by what the host did: waiting in a synchronisation 0.150 ms (59.2%); the GPU starved"
expected+=" 0.099 ms (39.2%): launching 0.095 ms (37.6%), between CUDA calls 0.004 ms (1.6%);"
expected+=" in other CUDA calls 0.004 ms (1.6%)"
grep -qxF "$expected" "$work/timeline.txt" || fail "the idle time by what the host did" "$work/timeline.txt"
grep -Eq '^ +0\.093 +3  loom::kernels::cuda::rmsnorm_backward<float>$' "$work/timeline.txt" ||
  fail "the gaps by the kernel after them" "$work/timeline.txt"
# The GPU work of the 3 steps by kind and by name, per step: the GEMM 200 us, 2 AdamW launches of
# 80 and 100, the RMSNorm backward 160, 160 and 120 us, a 4-byte copy and a set of 10 us each.
expected="GPU work per step by kind: products 0.200 ms (26.8%), attention 0.000 ms (0.0%), other kernels"
expected+=" 0.527 ms (70.5%), copies and sets 0.020 ms (2.7%); 0.747 ms in all"
grep -qxF "$expected" "$work/timeline.txt" || fail "the GPU work by kind" "$work/timeline.txt"
grep -Eq '^ +0\.180 +2\.0  loom::kernels::cuda::adamw_many_kernel$' "$work/timeline.txt" ||
  fail "the AdamW launches' time per step" "$work/timeline.txt"
grep -Eq '^ +0\.147 +1\.0  loom::kernels::cuda::rmsnorm_backward<float>$' "$work/timeline.txt" ||
  fail "the RMSNorm backward's mean time per step" "$work/timeline.txt"
python3 "$bench/step_timeline.py" "$here/fixtures/step_timeline.csv" --steps 1 --gap-us 130 > "$work/last.txt" ||
  fail "step_timeline.py --steps 1 exited with $?" "$work/last.txt"
grep -q "^step 4: wall 1.000 ms, GPU busy 0.720 ms, idle 0.280 ms (28.0%)" "$work/last.txt" ||
  fail "the last step alone" "$work/last.txt"
[ "$(grep -c "^  gap " "$work/last.txt")" = 1 ] || fail "the gaps over 130 us" "$work/last.txt"
line=$(grep -n ",10005000," "$here/fixtures/step_timeline.csv" | cut -d: -f1)
sed "${line}s/,10005000,/,10x05000,/" "$here/fixtures/step_timeline.csv" > "$work/bad_timeline.csv"
rc=0; python3 "$bench/step_timeline.py" "$work/bad_timeline.csv" > "$work/bad_timeline.txt" 2>&1 || rc=$?
[ $rc = 2 ] || fail "a timeline with a broken time was taken" "$work/bad_timeline.txt"
expected="step_timeline: $work/bad_timeline.csv:$line: start_ns '10x05000' is not a whole number"
grep -qxF "$expected" "$work/bad_timeline.txt" || fail "the broken line is not named" "$work/bad_timeline.txt"
echo "step_timeline.py: steps, GPU idle gaps and what the host did in them, the work by kind and name, a broken line named"
