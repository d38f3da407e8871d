#!/usr/bin/env bash
# README command 1: set up if needed, build with --config=opt, run the main
# demo. Until the Tree-LSTM demo lands this is the toolchain smoke program.
# Arguments go to the demo (`tools/demo.sh --help` shows its options).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel run --config=opt //examples/smoke -- "$@"
