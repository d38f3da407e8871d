#!/usr/bin/env python3
"""Writes compile_commands.json for clangd and clang-tidy from `bazel aquery`.

Bazel 4 cannot emit it itself. Run from anywhere in the workspace:
    python3 tools/compile_commands.py [TARGETS]   (default //...)
"""
import argparse
import json
import os
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="?", default="//...", help="bazel target pattern")
    args = parser.parse_args()

    root = subprocess.check_output(["bazel", "info", "workspace"], text=True).strip()
    execroot = subprocess.check_output(["bazel", "info", "execution_root"], cwd=root, text=True).strip()
    query = f'mnemonic("CppCompile", {args.targets})'
    out = subprocess.check_output(
        ["bazel", "aquery", query, "--output=jsonproto", "--ui_event_filters=-info"], cwd=root, text=True)
    actions = json.loads(out).get("actions", [])

    entries = []
    for action in actions:
        argv = action["arguments"]
        source = next((argv[i + 1] for i, a in enumerate(argv) if a == "-c" and i + 1 < len(argv)), None)
        if source is None or source.startswith("external/") or source.startswith("bazel-out/"):
            continue
        entries.append({"directory": execroot, "file": os.path.join(root, source), "arguments": argv})

    path = os.path.join(root, "compile_commands.json")
    with open(path, "w") as f:
        json.dump(entries, f, indent=1)
    print(f"wrote {len(entries)} entries to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
