#!/usr/bin/env bash
# tests/python: pytest over the built `pejit` module with /usr/bin/python3,
# writing the JUnit XML that tools/test.sh counts test cases from.
set -euo pipefail
xml=${XML_OUTPUT_FILE:-/dev/null}
if [[ "${1:-}" == "--sanitized" ]]; then
  echo "skipped: a sanitizer build's pejit.so cannot load into an uninstrumented /usr/bin/python3"
  cat > "$xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="tests/python" tests="1" skipped="1"><testcase classname="tests.python" name="pytest"><skipped message="sanitizer build"/></testcase></testsuite></testsuites>
XML
  exit 0
fi
export PYTHONPATH="$PWD/python"
export PEJIT_TREELSTM="$PWD/examples/treelstm/treelstm.pj"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --junitxml="$xml" tests/python
