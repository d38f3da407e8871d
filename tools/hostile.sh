#!/usr/bin/env bash
# Hostile and careless inputs against pejit's surfaces, each with the outcome
# it must have: a clear refusal (an exit status and the words that say why)
# or a run that goes on correctly; never a crash (a signal), never a hang
# (each case has a deadline), never silence about what was refused.
#
#   tools/hostile.sh [--pejit BIN] [--runtime BIN] [--python DIR] [--only CLASS]
#
# BIN default to bazel-bin/tools/pejit and bazel-bin/runtime/pejit-runtime;
# DIR holds the `pejit` Python module (pejit.so) for the Python cases, run
# by /usr/bin/python3 (none: those cases are skipped, and said so). Prints a
# line per case and a JSON summary by class; exits 1 if any case misbehaved.
# CI runs it (//tests/tools:hostile_test). Classes: input (programs and
# arguments), cache (the code cache's trust boundary, docs/cache.md), export
# (artifacts), checkpoint, python.
set -uo pipefail
[[ -n "${TEST_SRCDIR:-}" ]] || cd "$(dirname "$0")/.."  # under bazel test: the runfiles root already
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
pejit=bazel-bin/tools/pejit
runtime=bazel-bin/runtime/pejit-runtime
python_dir=""
only=""
while (($#)); do
  case "$1" in
    --pejit) pejit="$2"; shift 2 ;;
    --runtime) runtime="$2"; shift 2 ;;
    --python) python_dir="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    *) echo "hostile.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for b in "$pejit" "$runtime"; do
  [[ -x "$b" ]] || { echo "hostile.sh: $b is not built (bazel build //tools:pejit //runtime:pejit-runtime)" >&2; exit 2; }
done
data=tools/testdata
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/hostile.XXXXXX")
trap 'chmod -R u+rwx "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
declare -A passed failed
cases=0 bad=0

# case CLASS NAME WANT_RC PATTERN -- COMMAND...: runs COMMAND (60 s at most)
# and checks its exit status (0, "fail": 1-125 without a signal) and that its
# output (stdout and stderr) holds PATTERN (a bash glob; "" for any).
case_() {
  local class="$1" name="$2" want="$3" pattern="$4"
  shift 5
  [[ -n "$only" && "$only" != "$class" ]] && return
  ((cases++))
  local out rc ok=1
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  if ((rc == 124)); then ok=0; why="hung (60 s)"
  elif ((rc > 125)); then ok=0; why="killed by signal $((rc - 128))"
  elif [[ "$want" == 0 && $rc != 0 ]]; then ok=0; why="exit $rc, want 0"
  elif [[ "$want" == fail && $rc == 0 ]]; then ok=0; why="exit 0, want a refusal"
  elif [[ -n "$pattern" && "$out" != *"$pattern"* ]]; then ok=0; why="output lacks: $pattern"
  fi
  if ((ok)); then
    passed[$class]=$((${passed[$class]:-0} + 1))
    printf 'ok    %-10s %s\n' "$class" "$name"
  else
    failed[$class]=$((${failed[$class]:-0} + 1))
    ((bad++))
    printf 'FAIL  %-10s %s: %s\n      %s\n' "$class" "$name" "$why" "$(printf '%s' "$out" | head -c 400)"
  fi
}

# A short training replay through the engine (and a code cache, appended).
replay=("$pejit" replay "$data/trees.pj" --entry loss --calls "$data/trees_calls.jsonl" --grad --wrt 1 --policy sync
        --no-generic)

# ---- input: programs and arguments ------------------------------------------------------------
mkdir -p "$tmp/a_directory.pj"
case_ input "a directory as the program" fail "a_directory.pj" -- "$pejit" check "$tmp/a_directory.pj"
mkfifo "$tmp/fifo.pj"
case_ input "a FIFO as the program (no hang)" fail "fifo.pj" -- "$pejit" check "$tmp/fifo.pj"
case_ input "/dev/zero as the calls" fail "/dev/zero" -- "$pejit" replay "$data/trees.pj" --entry loss --calls /dev/zero
printf 'def @f(%%x: Tensor[(), f32]) -> Tensor[(), f32] { add(%%x, }\n' > "$tmp/syntax.pj"
case_ input "a syntax error: file:line:col" fail "syntax.pj:1:" -- "$pejit" check "$tmp/syntax.pj"
python3 -c "import sys; sys.stdout.write('type T { A(Tensor[(), f32]) }\ndef @f(%x: Tensor[(), f32]) { Ctor' + 'x' * (20 << 20) + '(%x) }\n')" > "$tmp/huge_name.pj"
case_ input "a 20 MB constructor name is echoed bounded" fail "bytes)..." -- \
  bash -c '"$0" check "$1" 2>&1 | head -c 100000 | { out=$(cat); ((${#out} < 5000)) || { echo "echoed ${#out} bytes"; exit 0; }; echo "$out"; exit 1; }' \
  "$pejit" "$tmp/huge_name.pj"
printf '[{"ctor": "Leaf", "fields": [{"dtype": "i64", "shape": [], "data": [1]}]}, {"dtype": "f32", "shape": [3, 2], "data": [1, 2]}]\n' > "$tmp/short.json"
case_ input "a tensor with too few values: named" fail "args[1] (%emb)" -- "$pejit" run "$data/trees.pj" --entry loss --args "$tmp/short.json"
printf '[{"ctor": "Leaf", "fields": [{"dtype": "i64", "shape": [], "data": [1]}]}, ' > "$tmp/cut.json"
case_ input "a JSON file cut short" fail "cut.json" -- "$pejit" run "$data/trees.pj" --entry loss --args "$tmp/cut.json"

# ---- cache: the code cache's trust boundary (docs/cache.md) -----------------------------------
mkdir -p "$tmp/shared" && chmod 1777 "$tmp/shared"
case_ cache "a cache directory others can write (1777)" fail "others can write it (mode 1777)" -- "${replay[@]}" --cache-dir "$tmp/shared"
ln -s "$tmp/shared" "$tmp/linked"
case_ cache "a symbolic link as the cache directory" fail "symbolic link" -- "${replay[@]}" --cache-dir "$tmp/linked"
mkdir -p "$tmp/own"
case_ cache "a cache of one's own fills" 0 "" -- "${replay[@]}" --cache-dir "$tmp/own/cache"
entry=$(ls "$tmp/own/cache"/*.pjc 2>/dev/null | head -1)
if [[ -n "$entry" ]]; then
  # A planted entry: another entry's bytes with its image changed, its old
  # checksum recomputed (what the FNV-guarded format accepted).
  python3 - "$entry" <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, 'rb').read())
b[-1] ^= 1
open(p, 'wb').write(bytes(b))
PY
  case_ cache "an entry changed without the key: refused, run correct" 0 "" -- "${replay[@]}" --cache-dir "$tmp/own/cache" --check
  rm -f "$entry" && mkfifo "$entry"
  case_ cache "a FIFO in an entry's place (no hang)" 0 "" -- "${replay[@]}" --cache-dir "$tmp/own/cache"
  [[ -p "$entry" ]] || { echo "FAIL  cache      the FIFO was removed"; ((bad++)); }
  rm -f "$entry" && mkdir "$entry"
  case_ cache "a directory in an entry's place" 0 "" -- "${replay[@]}" --cache-dir "$tmp/own/cache"
  rmdir "$entry"
fi
touch -d '2 hours ago' "$tmp/own/cache/notes.tmp.1" 2>/dev/null || { touch "$tmp/own/cache/notes.tmp.1"; }
case_ cache "a file the cache did not write survives" 0 "" -- bash -c '"$0" replay "$1" --entry loss --calls "$2" --grad --wrt 1 --policy sync --no-generic --cache-dir "$3" >/dev/null && [[ -e "$3/notes.tmp.1" ]]' \
  "$pejit" "$data/trees.pj" "$data/trees_calls.jsonl" "$tmp/own/cache"
chmod 644 "$tmp/own/cache/key"
case_ cache "a key others can read" fail "others can read it (mode 0644)" -- "${replay[@]}" --cache-dir "$tmp/own/cache"
chmod 600 "$tmp/own/cache/key"

# ---- export: artifacts that do not belong together --------------------------------------------
if "$pejit" export "$data/trees.pj" --entry loss --grad --args "$data/trees_args.json" --out "$tmp/art" >/dev/null 2>&1; then
  cp -r "$tmp/art" "$tmp/edited"
  printf '# edited\n' >> "$tmp/edited/model.pj"
  case_ export "model.pj edited after the export" fail "is not the model its code was exported from" -- \
    "$runtime" "$tmp/edited" --entry loss --grad --args "$data/trees_args.json"
  cp -r "$tmp/art" "$tmp/damaged"
  printf 'x' >> "$tmp/damaged/entries.pjx"
  case_ export "entries.pjx damaged" fail "checksum mismatch" -- "$runtime" "$tmp/damaged" --entry loss --grad --args "$data/trees_args.json"
  case_ export "the artifact as exported runs" 0 '"value"' -- "$runtime" "$tmp/art" --entry loss --grad --args "$data/trees_args.json"
else
  echo "FAIL  export     pejit export failed"; ((bad++))
fi

# ---- python ------------------------------------------------------------------------------------
if [[ -n "$python_dir" && -f "$python_dir/pejit.so" && -x /usr/bin/python3 ]]; then
  py=(env LD_PRELOAD=libtcmalloc_minimal.so.4 PYTHONPATH="$python_dir" /usr/bin/python3 -c)
  tree_src='def @s(%t: Tree) -> Tensor[(), f32] { match (%t) { Leaf(%x) => %x, Node(%l, %r) => add(@s(%l), @s(%r)) } }'
  case_ python "another engine's constructor order: a TypeError" 0 "TypeError @s argument 0 (%t): a Tree made by another module" -- "${py[@]}" "
import pejit
a, b = pejit.Engine(policy='interpreter'), pejit.Engine()
a.module.add_source('type Tree { Leaf(Tensor[(), f32]), Node(Tree, Tree) }\n$tree_src')
b.module.add_source('type Tree { Node(Tree, Tree), Leaf(Tensor[(), f32]) }\n$tree_src')
t = a.module.Node(a.module.Leaf(1.0), a.module.Leaf(2.0))
try:
    b.entry('s')(t)
except TypeError as e:
    print('TypeError', e)
"
  case_ python "an int past 64 bits: its range" 0 "does not fit in i64 (-2^63 to 2^63-1)" -- "${py[@]}" "
import pejit
e = pejit.Engine(policy='interpreter')
e.module.add_source('type T { Leaf(Tensor[(), i64]) }')
try:
    e.module.Leaf(2**70)
except TypeError as x:
    print(x)
"
else
  echo "skip  python     (no --python DIR with pejit.so)"
fi

printf '{"cases":%d,"misbehaved":%d,"by_class":{' "$cases" "$bad"
sep=""
for c in input cache export checkpoint python; do
  [[ -z "${passed[$c]:-}${failed[$c]:-}" ]] && continue
  printf '%s"%s":{"ok":%d,"failed":%d}' "$sep" "$c" "${passed[$c]:-0}" "${failed[$c]:-0}"
  sep=","
done
printf '}}\n'
((bad == 0))
