#!/usr/bin/env bash
# One MoE layer per router against PyTorch: test_model writes loom's forward and backward on
# fixed weights and inputs (MoeReferenceDump), moe_torch_reference.py recomputes them with torch
# autograd in float64 and compares every tensor. Exit 77 (skipped) where torch is not installed
# (scripts/test.sh installs Debian's python3-torch: scripts/setup.sh --test-references).
# Usage: moe_torch_reference.sh TEST_MODEL_BINARY [PYTHON]
#   PYTHON: default the first of python3 and /usr/bin/python3 (Debian's, which python3-torch
#   serves) that imports torch.
set -euo pipefail
test_model=$1
python=${2:-}
if [ -z "$python" ]; then
  python=python3
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c "import torch" >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
LOOM_MOE_REFERENCE_DIR=$dir "$test_model" --gtest_filter='MoeReferenceDump.*' >/dev/null
exec "$python" "$here/moe_torch_reference.py" "$dir"
