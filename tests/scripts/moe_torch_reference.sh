#!/usr/bin/env bash
# One MoE layer per router against PyTorch: test_model writes loom's forward and backward on
# fixed weights and inputs (MoeReferenceDump), moe_torch_reference.py recomputes them with torch
# autograd in float64 and compares every tensor. Exit 77 (skipped) where torch is not installed.
# Usage: moe_torch_reference.sh TEST_MODEL_BINARY [PYTHON]
set -euo pipefail
test_model=$1
python=${2:-python3}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
LOOM_MOE_REFERENCE_DIR=$dir "$test_model" --gtest_filter='MoeReferenceDump.*' >/dev/null
exec "$python" "$here/moe_torch_reference.py" "$dir"
