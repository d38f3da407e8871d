#!/usr/bin/env bash
# Before a release (issue 24): the whole suite under ASan + UBSan and under
# TSan, every fuzz target for a while, and the random-program differential at
# scale. Takes hours on 2 cores; CI runs only the default suite.
#
#   tools/check.sh [FUZZ_SECONDS] [PROGRAMS]     defaults: 600 s per target, 10,000 programs
#
# Installs clang first (tools/setup.sh check). Prints each part's summary
# and ends with one JSON line; exits non-zero when any part fails.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
fuzz_seconds=${1:-600}
programs=${2:-10000}
bash tools/setup.sh check || exit 1
logs=${PEJIT_CHECK_DIR:-/tmp/pejit-check}
mkdir -p "$logs"
status=0
part() {  # name, command...: runs it, keeps its log, prints its last line
  local name=$1
  shift
  local start
  start=$(date +%s)
  "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  ((rc == 0)) || status=1
  echo "$name: exit $rc in $(( $(date +%s) - start )) s: $(grep -v '^\s*$' "$logs/$name.log" | tail -1)"
}
part asan bash tools/test.sh --config=asan
part tsan bash tools/test.sh --config=tsan
part fuzz bash tools/fuzz.sh "$fuzz_seconds"
grep '^{"target"' "$logs/fuzz.log" || true
part differential bash tools/differential.sh "$programs"
echo "{\"check\":\"$( ((status == 0)) && echo passed || echo failed)\",\"logs\":\"$logs\"}"
exit $status
