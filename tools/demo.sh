#!/usr/bin/env bash
# README command 1: set up if needed, build with --config=opt, and train the
# Child-Sum Tree-LSTM on built-in ListOps data through the tiered JIT engine.
# Arguments go to the demo (`tools/demo.sh --help` shows its options).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bazel run --config=opt //examples/treelstm:train -- "$@"
