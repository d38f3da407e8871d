#!/usr/bin/env bash
# Fuzzes pejit's input surfaces with libFuzzer (clang, ASan + UBSan).
#
#   tools/fuzz.sh [SECONDS] [TARGET...]
#
# Runs each target (default: all of //fuzz: pj_source json_value listops_line
# sst_line checkpoint trace) for SECONDS of CPU time (default 60), starting
# from its seed corpus fuzz/corpus/TARGET and a working corpus under
# $PEJIT_FUZZ_DIR (default /tmp/pejit-fuzz). A crash leaves its input in
# $PEJIT_FUZZ_DIR/TARGET/crash-*: copy it into fuzz/corpus/TARGET/ and it
# becomes a regression test (//fuzz:TARGET_corpus_test). Builds in a Bazel
# output base of its own (clang) and makes no bazel-* links, so the main
# build's cache and links stay. Needs clang (tools/setup.sh check). Prints
# one JSON line per target.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
seconds=${1:-60}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(pj_source json_value listops_line sst_line checkpoint trace)
command -v clang >/dev/null || { echo "fuzz.sh: clang is missing (run tools/setup.sh check)" >&2; exit 1; }
work=${PEJIT_FUZZ_DIR:-/tmp/pejit-fuzz}
output_base=${PEJIT_FUZZ_OUTPUT_BASE:-$HOME/.cache/pejit-fuzz-bazel}
labels=()
for t in "${targets[@]}"; do labels+=("//fuzz:$t"); done
mkdir -p "$work"
if ! bazel --output_base="$output_base" build --config=fuzz --symlink_prefix=/ "${labels[@]}" > "$work/build.log" 2>&1; then
  grep -E "error|ERROR" "$work/build.log" | head -20 >&2
  echo "fuzz.sh: the build failed; $work/build.log has all of it" >&2
  exit 1
fi
bin=$(bazel --output_base="$output_base" info --config=fuzz bazel-bin 2>/dev/null)
status=0
for t in "${targets[@]}"; do
  mkdir -p "$work/$t/corpus"
  # This run's findings only (an earlier run reported its own).
  rm -f "$work/$t"/crash-* "$work/$t"/timeout-* "$work/$t"/oom-*
  start=$(date +%s)
  set +e
  (cd "$work/$t" && "$bin/fuzz/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
      -print_final_stats=1 corpus "$OLDPWD/fuzz/corpus/$t") > "$work/$t/log.txt" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t/log.txt" | grep -o '[0-9]*$' || echo 0)
  crashes=$(find "$work/$t" -maxdepth 1 \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  echo "{\"target\":\"$t\",\"seconds\":$(( $(date +%s) - start )),\"runs\":${runs:-0},\"findings\":$crashes,\"exit\":$rc,\"log\":\"$work/$t/log.txt\"}"
  ((rc == 0 && crashes == 0)) || status=1
done
bazel --output_base="$output_base" shutdown >/dev/null 2>&1 || true
exit $status
