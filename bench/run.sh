#!/bin/sh
# `bazel run --config=opt //bench:treelstm -- --quick` (or //bench:mlp): runs
# bench.py for the suite this wrapper is named after (//bench:python:
# python_binding.py), with Debian's python3, the one python3-torch is
# installed for (a pyenv python3 first on PATH has no torch). The script's
# --help says what it does.
set -eu
suite=$(basename "$0")
script=bench.py
[ "$suite" = python ] && script=python_binding.py
[ "$suite" = torch_interop ] && script=torch_interop.py
dir="$0.runfiles/pejit/bench"
[ -f "$dir/$script" ] || dir=$(dirname "$0")
case "$suite" in python|torch_interop) exec /usr/bin/python3 "$dir/$script" "$@" ;; esac
exec /usr/bin/python3 "$dir/$script" "$suite" "$@"
