#!/usr/bin/env bash
# Each structure check must fail on its violating fixture (tests/scripts/fixtures/<check>_bad),
# naming what is wrong; so a green check on the real tree means something.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fixtures="$repo/tests/scripts/fixtures"
status=0

expect_failure() {  # check, then the strings its message must contain
  local check="$1"; shift
  local out rc
  out="$(python3 "$repo/scripts/checks/check_$check.py" "$fixtures/${check}_bad" 2>&1)"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    echo "FAIL: check_$check passed on its violating fixture:"; echo "$out"; status=1; return
  fi
  for want in "$@"; do
    if ! grep -qF -- "$want" <<<"$out"; then
      echo "FAIL: check_$check's message lacks '$want':"; echo "$out"; status=1; return
    fi
  done
  echo "ok: check_$check fails on its fixture: $(head -n1 <<<"$out")"
}

expect_failure layers "src/loom/low/sub/upward.cpp:2" '"loom/high/high.h"' "loom_low does not link loom_high" \
  "src/loom/high/high.h:3" "outside src/loom/kernels/; call the device-neutral entry"
expect_failure collectives "src/loom/model/rogue.cpp:4" "all_reduce_async" "not a declared communication file"
expect_failure sizes "src/loom/big/long_file.cpp: 611 lines" "function long_function is 89 lines"
exit $status
