#!/usr/bin/env bash
# `pejit check` and `pejit run` on a recursive tree program: exact JSON out,
# and errors as file:line:col with a non-zero exit.
set -euo pipefail
pejit="$1"
dir="$2"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$pejit" run "$dir/trees.pj" --entry encode --args "$dir/trees_args.json")
[[ "$out" == '{"value":{"data":[2.5,3.5],"dtype":"f32","shape":[1,2]}}' ]] || fail "run: $out"

out=$("$pejit" run "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --grad --wrt 1)
want='{"grads":[{"data":[2.5,3.5,1.25,1.75,1.25,1.75],"dtype":"f32","shape":[3,2]}],"value":{"data":[18.5],"dtype":"f32","shape":[]},"wrt":[1]}'
[[ "$out" == "$want" ]] || fail "run --grad: $out"

out=$("$pejit" check "$dir/trees.pj")
[[ "$out" == *"ok, 2 definitions, 1 types" ]] || fail "check: $out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's/Leaf(%word)/Lief(%word)/' "$dir/trees.pj" > "$tmp/bad.pj"
if err=$("$pejit" check "$tmp/bad.pj" 2>&1); then fail "check accepted a bad program"; fi
[[ "$err" == "pejit: $tmp/bad.pj:10:5: unknown constructor 'Lief'; did you mean 'Leaf'?" ]] || fail "check error: $err"

echo '[1]' > "$tmp/args.json"
if err=$("$pejit" run "$dir/trees.pj" --entry encode --args "$tmp/args.json" 2>&1); then fail "bad args accepted"; fi
[[ "$err" == "pejit: @encode takes 2 arguments, $tmp/args.json has 1" ]] || fail "args error: $err"

out=$("$pejit" pe "$dir/trees.pj" --entry loss --args "$dir/trees_args.json")
[[ "$out" == *"def @main(%p0: Tensor[(), i64], %p1: Tensor[(), i64], %p2: Tensor[(), i64], %p3: Tensor[(3, 2), f32])"* ]] \
  || fail "pe: $out"
[[ "$out" == *"12 residual ops, 4 params, 0 residual functions"* ]] || fail "pe counts: $out"
# The residual is a program of its own: it checks and runs to the same value.
"$pejit" pe "$dir/trees.pj" --entry encode --args "$dir/trees_args.json" | grep -v '^#' > "$tmp/residual.pj"
echo '[{"dtype":"i64","shape":[],"data":[0]},{"dtype":"i64","shape":[],"data":[1]},
       {"dtype":"i64","shape":[],"data":[2]},{"dtype":"f32","shape":[3,2],"data":[1,2,3,4,5,6]}]' > "$tmp/leaves.json"
out=$("$pejit" run "$tmp/residual.pj" --entry main --args "$tmp/leaves.json")
[[ "$out" == '{"value":{"data":[2.5,3.5],"dtype":"f32","shape":[1,2]}}' ]] || fail "residual run: $out"

"$pejit" run --help | grep -q -- "--wrt" || fail "run --help"
"$pejit" pe --help | grep -q -- "--static" || fail "pe --help"
echo PASS
