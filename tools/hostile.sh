#!/usr/bin/env bash
# Hostile and careless inputs against pejit's surfaces, each with the outcome
# it must have: a clear refusal (an exit status and the words that say why)
# or a run that goes on correctly; never a crash (a signal), never a hang
# (each case has a deadline), never silence about what was refused.
#
#   tools/hostile.sh [--pejit BIN] [--runtime BIN] [--train BIN] [--python DIR] [--no-mpi] [--only CLASS]
#
# BIN default to bazel-bin/tools/pejit, bazel-bin/runtime/pejit-runtime and
# bazel-bin/examples/treelstm/train; DIR holds the `pejit` Python package
# (pejit/_pejit.so) for the Python cases, run by /usr/bin/python3 (none: skipped,
# and said so); the MPI cases need mpirun (none, or --no-mpi: skipped, and
# said so).
# Prints a line per case and a JSON summary by class; exits 1 if any case
# misbehaved. CI runs it (//tests/tools:hostile_test). The classes are those
# of the hostile rounds (issues 24 and 52): input (programs and arguments:
# shapes that overflow, depth, size, recursion, answers that must be exact),
# options, checkpoint (training state), trace, cache (the code cache's trust
# boundary, docs/cache.md), export (artifacts), python, mpi.
set -uo pipefail
[[ -n "${TEST_SRCDIR:-}" ]] || cd "$(dirname "$0")/.."  # under bazel test: the runfiles root already
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
pejit=bazel-bin/tools/pejit
runtime=bazel-bin/runtime/pejit-runtime
train=bazel-bin/examples/treelstm/train
python_dir=""
mpi=1
only=""
while (($#)); do
  case "$1" in
    --pejit) pejit="$2"; shift 2 ;;
    --runtime) runtime="$2"; shift 2 ;;
    --train) train="$2"; shift 2 ;;
    --python) python_dir="$2"; shift 2 ;;
    --no-mpi) mpi=0; shift ;;
    --only) only="$2"; shift 2 ;;
    *) echo "hostile.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
for b in "$pejit" "$runtime" "$train"; do
  [[ -x "$b" ]] || { echo "hostile.sh: $b is not built (bazel build //tools:pejit //runtime:pejit-runtime //examples/treelstm:train)" >&2; exit 2; }
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
# Shapes whose element count wraps (2^62 x 4), from JSON and from an attribute.
printf 'def @f(%%x: Tensor[(2, 2), f32]) -> Tensor[(?, ?), f32] { reshape(%%x, shape=[4611686018427387904, 4]) }\n' > "$tmp/wrap.pj"
printf 'def @f(%%x: Tensor[(2, 2), f32]) -> Tensor[(2, 2), f32] { %%x }\n' > "$tmp/id.pj"
printf '[{"dtype": "f32", "shape": [4611686018427387904, 4], "data": [1]}]\n' > "$tmp/wrap.json"
case_ input "a JSON shape of 2^62 x 4 elements" fail "got shape (4611686018427387904, 4)" -- "$pejit" run "$tmp/id.pj" --entry f --args "$tmp/wrap.json"
printf '[{"dtype": "f32", "shape": [2, 2], "data": [1, 2, 3, 4]}]\n' > "$tmp/x22.json"
case_ input "reshape to 2^62 x 4: file:line:col" fail "wrap.pj:1:58: reshape" -- "$pejit" run "$tmp/wrap.pj" --entry f --args "$tmp/x22.json"
# Depth the input controls: an explicit limit or stack, never the native stack.
python3 -c "print('def @f(%x: Tensor[(), f32]) -> Tensor[(), f32] { ' + '(' * 10000 + '%x' + ')' * 10000 + ' }')" > "$tmp/parens.pj"
case_ input "10,000 nested parentheses" fail "parens.pj:1:" -- "$pejit" check "$tmp/parens.pj"
python3 -c "print('[' * 5000 + ']' * 5000)" > "$tmp/deep.json"
case_ input "JSON arguments nested 5,000 deep" fail "deep.json: args[0]" -- "$pejit" run "$tmp/id.pj" --entry f --args "$tmp/deep.json"
python3 -c "
print('def @d0(%x: Tensor[(), f32]) -> Tensor[(), f32] { @d1(%x) }')
for i in range(1, 2500): print('def @d%d(%%x: Tensor[(), f32]) -> Tensor[(), f32] { @d%d(%%x) }' % (i, i + 1))
print('def @d2500(%x: Tensor[(), f32]) -> Tensor[(), f32] { %x }')" > "$tmp/chain.pj"
case_ input "2,500 definitions each calling the next, defined later" 0 "2501 definitions" -- "$pejit" check "$tmp/chain.pj"
python3 -c "
for i in range(100000): print('def @g%d(%%x: Tensor[(), f32]) -> Tensor[(), f32] { %%x }' % i)" > "$tmp/many.pj"
case_ input "a module of 100,000 definitions (linear, in the deadline)" 0 "100000 definitions" -- "$pejit" check "$tmp/many.pj"
printf 'def @f(%%x: Tensor[(), f32]) -> Tensor[(), f32] { add(@f(%%x), %%x) }\n' > "$tmp/forever.pj"
printf '[{"dtype": "f32", "shape": [], "data": [1]}]\n' > "$tmp/scalar.json"
case_ input "non-tail infinite recursion: the frame limit" fail "recursion too deep" -- "$pejit" run "$tmp/forever.pj" --entry f --args "$tmp/scalar.json"
# Answers that must be exact, and what has no answer.
printf 'def @f(%%x: Tensor[(), i64]) -> Tensor[(), i64] { %%x }\n' > "$tmp/i64.pj"
printf '[{"dtype": "i64", "shape": [], "data": [9007199254740993]}]\n' > "$tmp/i64.json"
case_ input "an i64 past 2^53 printed exactly" 0 "[9007199254740993]" -- "$pejit" run "$tmp/i64.pj" --entry f --args "$tmp/i64.json"
printf '[{"dtype": "i64", "shape": [], "data": [-9223372036854775809]}]\n' > "$tmp/i64_past.json"
case_ input "an integer below i64's range" fail "out of i64's range" -- "$pejit" run "$tmp/i64.pj" --entry f --args "$tmp/i64_past.json"
case_ input "the gradient of an integer argument" fail "cannot hold a float tensor" -- "$pejit" run "$tmp/i64.pj" --entry f --args "$tmp/i64.json" --grad --wrt 0
case_ input "--wrt 1,1" fail "given twice" -- "$pejit" run "$data/trees.pj" --entry loss --args "$data/trees_args.json" --grad --wrt 1,1
printf 'def @f(%%x: Tensor[(3, 2), f32]) -> Tensor[(4, 2), f32] { %%x }\n' > "$tmp/declared.pj"
printf '[{"dtype": "f32", "shape": [3, 2], "data": [1, 2, 3, 4, 5, 6]}]\n' > "$tmp/x32.json"
case_ input "a result of another shape than declared" fail "declared type is Tensor[(4, 2), f32]" -- "$pejit" run "$tmp/declared.pj" --entry f --args "$tmp/x32.json"
printf 'def @f(%%x: Tensor[(3), f32]) -> Tensor[(3), f32] { %%x }\n' > "$tmp/vec.pj"
printf '[{"dtype": "f32", "shape": [3], "data": ["nan", "-inf", "inf"]}]\n' > "$tmp/nonfinite.json"
case_ input "NaN and infinities in and out" 0 '["nan","-inf","inf"]' -- "$pejit" run "$tmp/vec.pj" --entry f --args "$tmp/nonfinite.json"
printf '[{"dtype": "f32", "shape": [3], "data": [1e300, 1, 2]}]\n' > "$tmp/e300.json"
case_ input "1e300 as an f32" fail "out of f32's range" -- "$pejit" run "$tmp/vec.pj" --entry f --args "$tmp/e300.json"
case_ input "inline JSON where --args takes a file" fail "JSON array" -- "$pejit" run "$tmp/vec.pj" --entry f --args '{"a": 1}'

# ---- options: the trainer's and the tools' ------------------------------------------------------
small=("$train" --listops-train-size 40 --listops-dev-size 8 --hidden 8 --embed 8 --batch 8 --train-sample 8
       --policy interpreter --lookahead 0)
case_ options "a negative learning rate" fail "--lr: must be a positive number" -- "${small[@]}" --lr -1
case_ options "--workers 100000" fail "--workers: must be a whole number from 0 to 256" -- "${small[@]}" --workers 100000
case_ options "--clip nan" fail "--clip" -- "${small[@]}" --clip nan
case_ options "--lookahead 100000" fail "--lookahead: must be a whole number" -- "$pejit" replay "$data/trees.pj" --entry loss --calls "$data/trees_calls.jsonl" --lookahead 100000
printf '3\t[MAX 2 9 0 5 ]\n' > "$tmp/label.tsv"
case_ options "a ListOps label that is not its expression's value" fail "label.tsv:1: label 3 is not the expression's value 9" -- "${small[@]}" --train "$tmp/label.tsv" --strict
printf '9\t[MAX 2 9 ] 0 5 ]\n' > "$tmp/stray.tsv"
case_ options "a ListOps line with a stray bracket" fail "stray.tsv:1:" -- "${small[@]}" --train "$tmp/stray.tsv" --strict

# ---- checkpoint: training state ----------------------------------------------------------------
# fixed CKPT OUT OLD NEW: the checkpoint with OLD replaced by NEW and its
# checksum line (FNV-1a 64 of the bytes before it) made to match, so that
# what is checked is the value, not the checksum. NEW "nan": the first
# value of the first tensor made NaN instead.
fixed() {
  python3 - "$@" <<'PY'
import struct, sys
src, dst, old, new = sys.argv[1:5]
b = bytearray(open(src, 'rb').read())
body = bytes(b[:b.rfind(b'fnv1a64 ')])
if new == 'nan':
    at = body.index(b'\n') + 1
    body = body[:at] + struct.pack('<f', float('nan')) + body[at + 4:]
else:
    body = body.replace(old.encode(), new.encode(), 1)
h = 0xcbf29ce484222325
for c in body:
    h = ((h ^ c) * 0x100000001b3) & 0xffffffffffffffff
open(dst, 'wb').write(body + b'fnv1a64 %016x\n' % h)
PY
}
if "${small[@]}" --epochs 1 --save "$tmp/ck" >/dev/null 2>&1 &&
   "${small[@]}" --epochs 1 --optimizer adam --save "$tmp/ck_adam" >/dev/null 2>&1; then
  python3 -c "import sys; b = bytearray(open(sys.argv[1], 'rb').read()); b[len(b) // 2] ^= 0x40; open(sys.argv[2], 'wb').write(b)" "$tmp/ck" "$tmp/ck_flip"
  case_ checkpoint "a flipped bit" fail "checksum mismatch" -- "${small[@]}" --epochs 2 --resume "$tmp/ck_flip"
  case_ checkpoint "resumed on other training data" fail "written by a run with train_data" -- \
    "$train" --listops-train-size 41 --listops-dev-size 8 --hidden 8 --embed 8 --batch 8 --train-sample 8 --policy interpreter --epochs 2 --resume "$tmp/ck"
  case_ checkpoint "resumed with another learning rate" fail "learning_rate 0.05, this run has 0.1" -- "${small[@]}" --epochs 2 --lr 0.1 --resume "$tmp/ck"
  fixed "$tmp/ck" "$tmp/ck_epoch" '"epoch":1,' '"epoch":2147483648,'
  case_ checkpoint "epoch 2^31 in its header" fail "epoch 2147483648 is out of range" -- "${small[@]}" --epochs 2 --resume "$tmp/ck_epoch"
  steps=$(grep -ao '"steps":[0-9]*' "$tmp/ck_adam" | head -1)
  fixed "$tmp/ck_adam" "$tmp/ck_steps" "$steps" '"steps":9223372036854775807'
  case_ checkpoint "an Adam step count of 2^63-1" fail "out of range (0 to 2^53)" -- "${small[@]}" --optimizer adam --epochs 2 --resume "$tmp/ck_steps"
  fixed "$tmp/ck" "$tmp/ck_nan" '' nan
  case_ checkpoint "NaN parameters" fail "holds nan" -- "${small[@]}" --epochs 2 --resume "$tmp/ck_nan"
  case_ checkpoint "resumed as saved" 0 "epoch 1:" -- "${small[@]}" --epochs 2 --resume "$tmp/ck"
else
  echo "FAIL  checkpoint the trainer did not save"; ((bad++))
fi
printf '9\t[MAX 2 9 0 5 ]\n5\t[MIN 7 5 ]\n' > "$tmp/set.tsv"
case_ checkpoint "--save onto the training file" fail "which this run reads" -- \
  bash -c 'f=$1; shift; cp "$f" "$f.orig"; "$@"; rc=$?; cmp -s "$f" "$f.orig" || { echo "the training file changed"; exit 0; }; exit $rc' \
  _ "$tmp/set.tsv" "$train" --train "$tmp/set.tsv" --epochs 1 --policy interpreter --save "$tmp/set.tsv"
case_ checkpoint "--save onto a device" fail "not a regular file" -- "${small[@]}" --epochs 1 --save /dev/null
ln -s "$tmp/ck" "$tmp/ck_link"
case_ checkpoint "--save onto a symbolic link" fail "symbolic link" -- "${small[@]}" --epochs 1 --save "$tmp/ck_link"
case_ checkpoint "--save into a missing directory: before any training" fail "cannot write" -- \
  bash -c 'out=$("$@" 2>&1); echo "$out"; [[ "$out" != *"epoch 0"* ]] || { echo "trained first"; exit 0; }; exit 1' _ "${small[@]}" --epochs 1 --save "$tmp/missing/ck"
case_ checkpoint "a loss that explodes: a warning" 0 "the run is diverging" -- "${small[@]}" --epochs 3 --lr 30 --optimizer sgd --blowup 2
case_ checkpoint "a loss that explodes, --stop-on-blowup" fail "the run is diverging" -- "${small[@]}" --epochs 3 --lr 30 --optimizer sgd --blowup 2 --stop-on-blowup

# ---- trace: files `pejit trace` reads -----------------------------------------------------------
printf '{"event":"enqueue","entry":"e","signature":"s","thread":1,"start_us":1,"duration_us":0,"job":1e20}\n' > "$tmp/job.trace"
case_ trace "a job number of 1e20" fail 'job.trace:1: "job" must be an integer >= 0' -- "$pejit" trace summary "$tmp/job.trace"
python3 -c "import json; print(json.dumps({'event': 'call', 'entry': 'E' * (30 << 20), 'signature': 's', 'thread': 1, 'start_us': 1, 'duration_us': 2, 'tier': 'interpreter', 'mode': 'grad'}))" > "$tmp/name.trace"
case_ trace "a 30 MB entry name is printed bounded" 0 "" -- \
  bash -c 'n=$("$0" trace summary "$1" 2>&1 | wc -c); ((n < 5000)) || { echo "printed $n bytes"; exit 1; }' "$pejit" "$tmp/name.trace"

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
[[ -d "$tmp/own/cache" ]] && touch -d '2 hours ago' "$tmp/own/cache/notes.tmp.1"
case_ cache "a file the cache did not write survives" 0 "" -- bash -c '"$0" replay "$1" --entry loss --calls "$2" --grad --wrt 1 --policy sync --no-generic --cache-dir "$3" >/dev/null && [[ -e "$3/notes.tmp.1" ]]' \
  "$pejit" "$data/trees.pj" "$data/trees_calls.jsonl" "$tmp/own/cache"
if [[ -e "$tmp/own/cache/key" ]]; then
  chmod 644 "$tmp/own/cache/key"
  case_ cache "a key others can read" fail "others can read it (mode 0644)" -- "${replay[@]}" --cache-dir "$tmp/own/cache"
  chmod 600 "$tmp/own/cache/key"
fi

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
if [[ -n "$python_dir" && -f "$python_dir/pejit/_pejit.so" && -x /usr/bin/python3 ]]; then
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
  case_ python "Ctrl-C during a call that does not end" 0 "KeyboardInterrupt, still serving: -1.0" -- "${py[@]}" "
import os, signal, threading, pejit
e = pejit.Engine(policy='eager')
e.module.add_source('def @spin(%x: Tensor[(), f32]) -> Tensor[(), f32] { if (greater(%x, 0f32)) { @spin(add(%x, 1f32)) } else { %x } }')
spin = e.entry('spin')
threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    spin(1.0)
except KeyboardInterrupt:
    print('KeyboardInterrupt, still serving:', float(spin(-1.0)))
"
  case_ python "a static array changed after the call" 0 "static values kept: [2.0, 2.0] [5.0, 5.0]" -- "${py[@]}" "
import numpy as np, pejit
e = pejit.Engine(policy='eager')
e.module.add_source('def @scale(%x: Tensor[(2), f32], %s: Tensor[(2), f32]) -> Tensor[(2), f32] { mul(%x, %s) }')
scale = e.entry('scale', static_argnums=[1])
x, s = np.ones(2, dtype=np.float32), np.full(2, 2.0, dtype=np.float32)
first = scale(x, s)
s[:] = 5.0  # while its specialization may still be queued
e.drain()
again = scale(x, np.full(2, 2.0, dtype=np.float32))
changed = scale(x, s)
print('static values kept:', [float(v) for v in again], [float(v) for v in changed])
"
elif [[ -z "$only" || "$only" == python ]]; then
  echo "skip  python     (no --python DIR with pejit/_pejit.so)"
fi

# ---- mpi: ranks that disagree ------------------------------------------------------------------
if ((mpi)) && command -v mpirun >/dev/null && [[ -z "$only" || "$only" == mpi ]]; then
  mpirun=(env OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --oversubscribe)
  ((EUID == 0)) && mpirun+=(--allow-run-as-root)
  case_ mpi "ranks with another --hidden" fail "--hidden" -- "${mpirun[@]}" -np 1 "${small[@]}" --epochs 1 : -np 1 "${small[@]}" --epochs 1 --hidden 9
  case_ mpi "ranks with another --lr" fail "--lr" -- "${mpirun[@]}" -np 1 "${small[@]}" --epochs 1 : -np 1 "${small[@]}" --epochs 1 --lr 0.1
elif [[ -z "$only" || "$only" == mpi ]]; then
  echo "skip  mpi        (no mpirun, or --no-mpi)"
fi

printf '{"cases":%d,"misbehaved":%d,"by_class":{' "$cases" "$bad"
sep=""
for c in input options checkpoint trace cache export python mpi; do
  [[ -z "${passed[$c]:-}${failed[$c]:-}" ]] && continue
  printf '%s"%s":{"ok":%d,"failed":%d}' "$sep" "$c" "${passed[$c]:-0}" "${failed[$c]:-0}"
  sep=","
done
printf '}}\n'
((bad == 0))
