#!/usr/bin/env bash
# The random-program differential test at scale (issue 24): N generated
# programs (default 10,000; the suite runs 300), each through the
# interpreter, partial evaluation, batching, autodiff and the JIT, values and
# gradients compared (tests/jit/differential_test.cc says how).
#
#   tools/differential.sh [N] [bazel options...]     e.g. tools/differential.sh 10000 --config=asan
#
# Builds with --config=opt unless options are given. Prints the per-case
# lines and a JSON summary; exits non-zero on any divergence.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
n=${1:-10000}
shift || true
options=("$@")
((${#options[@]})) || options=(--config=opt)
start=$(date +%s)
set +e
bazel test "${options[@]}" //tests/jit:differential_test --test_env=PEJIT_DIFFERENTIAL_PROGRAMS="$n" \
  --test_timeout=86400 --cache_test_results=no --test_output=errors >&2
rc=$?
set -e
logs=$(ls bazel-testlogs/tests/jit/differential_test/shard_*/test.log bazel-testlogs/tests/jit/differential_test/test.log 2>/dev/null || true)
# shellcheck disable=SC2086
grep -h "^programs [0-9]*-[0-9]*:" $logs | sort -t' ' -k2 -n >&2 || true
# shellcheck disable=SC2086
checked=$({ grep -ho "^programs [0-9]*-[0-9]*: [0-9]* checked" $logs || true; } | awk '{s += $3} END {print s + 0}')
# shellcheck disable=SC2086
native=$({ grep -ho "checked, [0-9]* compiled natively" $logs || true; } | awk '{s += $2} END {print s + 0}')
# shellcheck disable=SC2086
regions=$({ grep -ho "refused; [0-9]* residuals with control flow" $logs || true; } | awk '{s += $2} END {print s + 0}')
# shellcheck disable=SC2086
loops=$({ grep -ho "[0-9]* of them with loops" $logs || true; } | awk '{s += $1} END {print s + 0}')
# shellcheck disable=SC2086
failures=$({ grep -h "^\[  FAILED  \].*programs_" $logs || true; } | wc -l)  # grep finds none: exit 1
echo "{\"programs\":$n,\"checked\":$checked,\"native_in_both_modes\":$native,\"control_flow_as_native_regions\":$regions,\"with_loops\":$loops,\"failed_cases\":$failures,\"exit\":$rc,\"seconds\":$(( $(date +%s) - start ))}"
exit $rc
