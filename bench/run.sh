#!/bin/sh
# `bazel run --config=opt //bench:treelstm -- --quick` (or //bench:mlp): runs
# bench.py for the suite this wrapper is named after, with Debian's python3,
# the one python3-torch is installed for (a pyenv python3 first on PATH has
# no torch). bench.py --help says what it does.
set -eu
suite=$(basename "$0")
dir="$0.runfiles/pejit/bench"
[ -f "$dir/bench.py" ] || dir=$(dirname "$0")
exec /usr/bin/python3 "$dir/bench.py" "$suite" "$@"
