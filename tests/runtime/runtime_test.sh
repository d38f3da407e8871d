#!/usr/bin/env bash
# Deployment without the compiler: `pejit export` writes the compiled code of
# an entry for the structures of example arguments; `pejit-runtime` (no LLVM
# linked: its dynamic links are checked) runs it with `pejit run`'s results,
# refuses a structure that was not exported and a damaged artifact, saying so.
set -euo pipefail
pejit="$1"
runtime="$2"
dir="$3"
fail() { echo "FAIL: $*" >&2; exit 1; }
# A command that fails under `set -e` says which, instead of ending the test silently.
trap 'echo "FAIL: line $LINENO: $BASH_COMMAND exited with $?" >&2' ERR
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

# A second tree structure (three leaves on the left).
cat > "$tmp/left.json" <<'JSON'
[
  {"ctor": "Node", "fields": [
    {"ctor": "Node", "fields": [
      {"ctor": "Leaf", "fields": [{"dtype": "i64", "shape": [], "data": [2]}]},
      {"ctor": "Leaf", "fields": [{"dtype": "i64", "shape": [], "data": [0]}]}
    ]},
    {"ctor": "Leaf", "fields": [{"dtype": "i64", "shape": [], "data": [1]}]}
  ]},
  {"dtype": "f32", "shape": [3, 2], "data": [0.5, -1, 2, 0.25, -3, 4]}
]
JSON
# A third, one leaf: never exported.
cat > "$tmp/leaf.json" <<'JSON'
[{"ctor": "Leaf", "fields": [{"dtype": "i64", "shape": [], "data": [1]}]},
 {"dtype": "f32", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6]}]
JSON

out=$("$pejit" export "$dir/trees.pj" --entry loss --grad --args "$dir/trees_args.json" --args "$tmp/left.json" \
      --out "$tmp/loss.pjx")
[[ "$out" == "# exported 2 specialization(s) of @loss"* ]] || fail "export: $out"
for args in "$dir/trees_args.json" "$tmp/left.json"; do
  want=$("$pejit" run "$dir/trees.pj" --entry loss --grad --args "$args")
  got=$("$runtime" "$tmp/loss.pjx" --entry loss --grad --args "$args")
  [[ "$got" == "$want" ]] || fail "runtime on $args: $got, want $want"
done
"$pejit" export "$dir/trees.pj" --entry encode --args "$dir/trees_args.json" --out "$tmp/encode.pjx" >/dev/null
want=$("$pejit" run "$dir/trees.pj" --entry encode --args "$dir/trees_args.json")
got=$("$runtime" "$tmp/encode.pjx" --entry encode --args "$dir/trees_args.json")
[[ "$got" == "$want" ]] || fail "runtime value mode: $got, want $want"

# What was not exported is an error that says what to do.
if err=$("$runtime" "$tmp/loss.pjx" --entry loss --grad --args "$tmp/leaf.json" 2>&1); then fail "an unexported structure ran"; fi
[[ "$err" == "pejit-runtime: no exported code for @loss (grad:1) on arguments of structure "*"the artifact has 2 specialization(s) of @loss: export it with these arguments too" ]] ||
  fail "unexported structure: $err"
if err=$("$runtime" "$tmp/loss.pjx" --entry loss --args "$dir/trees_args.json" 2>&1); then fail "an unexported mode ran"; fi
[[ "$err" == *"no exported code for @loss (value)"* ]] || fail "unexported mode: $err"
# A model.pj edited after the export is refused: its code computes the old one.
cp "$tmp/loss.pjx/model.pj" "$tmp/model.pj.orig"
sed -i 's/0\.5)/0.25)/' "$tmp/loss.pjx/model.pj"
cmp -s "$tmp/loss.pjx/model.pj" "$tmp/model.pj.orig" && fail "the edit changed nothing"
if err=$("$runtime" "$tmp/loss.pjx" --entry loss --grad --args "$dir/trees_args.json" 2>&1); then fail "an edited model ran"; fi
[[ "$err" == *"model.pj is not the model its code was exported from"*"export the model again" ]] || fail "edited model: $err"
cp "$tmp/model.pj.orig" "$tmp/loss.pjx/model.pj"
# A damaged artifact is refused.
printf 'x' >> "$tmp/loss.pjx/entries.pjx"
if err=$("$runtime" "$tmp/loss.pjx" --entry loss --grad --args "$dir/trees_args.json" 2>&1); then fail "a damaged artifact ran"; fi
[[ "$err" == *"entries.pjx: checksum mismatch (corrupted)" ]] || fail "damaged artifact: $err"

# The specializations a run produced: a replay fills a code cache, and
# --from-cache exports what it holds for the program as it is.
"$pejit" replay "$dir/trees.pj" --entry loss --calls "$dir/trees_calls.jsonl" --grad --wrt 1 --policy sync \
  --no-generic --cache-dir "$tmp/cache" >/dev/null || fail "replay into a code cache"
out=$("$pejit" export "$dir/trees.pj" --entry loss --from-cache "$tmp/cache" --out "$tmp/run.pjx")
[[ "$out" == "# exported "[1-9]*" specialization(s) of @loss"* ]] || fail "export --from-cache: $out"
# (sed reads all its input: a reader that stops early, as head does, can
# kill the writer with SIGPIPE, which pipefail turns into a failure.)
grep -v '^#' "$dir/trees_calls.jsonl" | sed -n 3p > "$tmp/call.json"
want=$("$pejit" run "$dir/trees.pj" --entry loss --grad --wrt 1 --args "$tmp/call.json")
got=$("$runtime" "$tmp/run.pjx" --entry loss --grad --wrt 1 --args "$tmp/call.json")
[[ "$got" == "$want" ]] || fail "runtime on a replayed call: $got, want $want"
# Code stored for other definitions is not exported for these.
sed 's/0\.5)/0.25)/' "$dir/trees.pj" > "$tmp/edited.pj"
if err=$("$pejit" export "$tmp/edited.pj" --entry loss --from-cache "$tmp/cache" --out "$tmp/stale.pjx" 2>&1); then
  fail "code of other definitions was exported"
fi
[[ "$err" == *"holds no code of @loss for these definitions on this CPU"* ]] || fail "stale export: $err"

# No LLVM among the runtime's links.
if ldd "$runtime" | grep -i llvm; then fail "pejit-runtime links LLVM"; fi
[[ "$("$runtime" --help)" == *"--entry"* ]] || fail "--help"
echo "PASS"
