#!/usr/bin/env bash
# README command 2: set up if needed, run every test, and end with one line
# `N passed, N failed` counting GoogleTest test cases (from the test XML).
#
#   tools/test.sh                       all tests, default config
#   tools/test.sh --config=tsan         any bazel flags are passed on
#   tools/test.sh -- //tests/ops/...    targets after --
set -uo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi

bash tools/setup.sh || exit 1

flags=()
targets=()
while (($#)); do
  if [[ "$1" == "--" ]]; then shift; targets=("$@"); break; fi
  flags+=("$1"); shift
done
((${#targets[@]})) || targets=(//...)

events=$(mktemp)
trap 'rm -f "$events"' EXIT
bazel test "${flags[@]}" --build_event_json_file="$events" -- "${targets[@]}"
bazel_status=$?

python3 - "$events" "$bazel_status" <<'PY'
import json, sys, xml.etree.ElementTree as ET
from urllib.parse import urlparse, unquote

events_file, bazel_status = sys.argv[1], int(sys.argv[2])
passed = failed = skipped = 0
targets_without_xml = []
for line in open(events_file):
    event = json.loads(line)
    result = event.get("testResult")
    if result is None:
        continue
    label = event["id"]["testResult"]["label"]
    xml = [o["uri"] for o in result.get("testActionOutput", []) if o.get("name") == "test.xml"]
    if not xml:
        targets_without_xml.append(label)
        continue
    root = ET.parse(unquote(urlparse(xml[0]).path)).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.get("result") == "skipped" or case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
for label in targets_without_xml:
    print(f"no test XML from {label}; counted as failed", file=sys.stderr)
    failed += 1
if bazel_status != 0 and failed == 0:
    print(f"bazel test exited with {bazel_status} (build failure?); counted as failed", file=sys.stderr)
    failed = 1
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
sys.exit(1 if failed or passed == 0 else 0)
PY
