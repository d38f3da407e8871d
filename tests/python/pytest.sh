#!/usr/bin/env bash
# tests/python: pytest over the built `pejit` module with /usr/bin/python3,
# writing the JUnit XML that tools/test.sh counts test cases from.
set -euo pipefail
xml=${XML_OUTPUT_FILE:-/dev/null}
if [[ "${1:-}" == "--sanitized" ]]; then
  source tests/support/skip.sh
  skip_test tests/python pytest "a sanitizer build's pejit extension cannot load into an uninstrumented /usr/bin/python3"
fi
export PYTHONPATH="$PWD/python"  # the package python/pejit, its extension built beside it
export PEJIT_TREELSTM="$PWD/examples/treelstm/treelstm.pj"
exec /usr/bin/python3 -m pytest -q -p no:cacheprovider --junitxml="$xml" tests/python
