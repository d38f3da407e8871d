#!/usr/bin/env bash
# `pejit check` and `pejit run` on a recursive tree program: exact JSON out,
# and errors as file:line:col with a non-zero exit. `pejit replay` of a file
# of calls through the engine, checked against the interpreter. `pejit trace`
# on a recorded trace.
set -euo pipefail
# (Help texts are matched whole, not piped to `grep -q`: grep quitting at
# the first match can kill the writer with SIGPIPE, which pipefail turns
# into a failure.)
pejit="$1"
dir="$2"
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$("$pejit" run "$dir/trees.pj" --entry encode --args "$dir/trees_args.json")
[[ "$out" == '{"value":{"dtype":"f32","shape":[1,2],"data":[2.5,3.5]}}' ]] || fail "run: $out"

out=$("$pejit" run "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --grad --wrt 1)
want='{"value":{"dtype":"f32","shape":[],"data":[18.5]},"grads":[{"dtype":"f32","shape":[3,2],"data":[2.5,3.5,1.25,1.75,1.25,1.75]}],"wrt":[1]}'
[[ "$out" == "$want" ]] || fail "run --grad: $out"
grad_want="$want"
# Without --wrt, every argument whose type can hold a float tensor; naming the
# tree of integer tokens is an error, not the tree handed back as a gradient.
out=$("$pejit" run "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --grad)
[[ "$out" == "$want" ]] || fail "run --grad without --wrt: $out"
if err=$("$pejit" run "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --grad --wrt 0 2>&1); then
  fail "--wrt naming the tree accepted"
fi
[[ "$err" == "pejit: @loss: wrt argument 0 (%t: Tree) cannot hold a float tensor, so it has no gradient" ]] ||
  fail "--wrt error: $err"
# compile refuses what run refuses, and a repeated index (it compiled
# without the gradient, or with one gradient for two).
if err=$("$pejit" compile "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --grad --wrt 0 2>&1); then
  fail "compile --wrt naming the tree accepted"
fi
[[ "$err" == "pejit: @loss: wrt argument 0 (%t: Tree) cannot hold a float tensor, so it has no gradient" ]] ||
  fail "compile --wrt error: $err"
if err=$("$pejit" compile "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --grad --wrt 1,1 2>&1); then
  fail "compile --wrt 1,1 accepted"
fi
[[ "$err" == "pejit: --wrt: argument 1 is given twice" ]] || fail "compile --wrt 1,1: $err"
# compile --run runs the compiled code and prints what run prints.
out=$("$pejit" compile "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --grad --run | tail -n 1)
[[ "$out" == "$want" ]] || fail "compile --grad --run: $out"
# --print-after all: the program after every pass (jit/pass.h), in their
# order; a name that is no pass is refused with the names.
passes=$("$pejit" compile "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --grad --print-after all |
         sed -n 's/^# after \([a-z-]*\) (.*/\1/p' | grep -v pack-gemm | tr '\n' ' ')
[[ "$passes" == "residual batch autodiff fold-constants combine-sums cse dce " ]] || fail "--print-after all: $passes"
if err=$("$pejit" compile "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --print-after lower 2>&1); then
  fail "--print-after lower accepted"
fi
[[ "$err" == *"--print-after: lower not in {all,batch,autodiff,"* ]] || fail "--print-after lower: $err"
out=$("$pejit" compile "$dir/trees.pj" --entry encode --args "$dir/trees_args.json" --run | tail -n 1)
[[ "$out" == '{"value":{"dtype":"f32","shape":[1,2],"data":[2.5,3.5]}}' ]] || fail "compile --run: $out"
# A loop the data ends (halving until the norm is below 1, at most 50 times):
# compiled as native regions between the driver's branches and calls.
loop="${TEST_TMPDIR:-/tmp}/halve.pj"
cat > "$loop" <<'PJ'
def @halve(%x: Tensor[(2,), f32], %n: Tensor[(), i64]) -> Tensor[(2,), f32] {
  if (logical_or(less(norm(%x), 1f32), less_equal(%n, 0))) { %x } else { @halve(mul(%x, 0.5f32), sub(%n, 1)) }
}
def @main(%x: Tensor[(2,), f32]) -> Tensor[(2,), f32] { @halve(%x, 50) }
PJ
args='[{"dtype":"f32","shape":[2],"data":[24,-40]}]'
want=$("$pejit" run "$loop" --entry main --args "$args")
[[ "$want" == '{"value":{"dtype":"f32","shape":[2],"data":[0.375,-0.625]}}' ]] || fail "run of the loop: $want"
out=$("$pejit" compile "$loop" --entry main --args "$args" --run)
[[ "$(tail -n 1 <<<"$out")" == "$want" ]] || fail "compile --run of the loop: $out"
grep -q "control flow: [0-9]* native regions between" <<<"$out" || fail "compile of the loop: $out"
for command in run replay; do
  calls=(--args "$dir/trees_args.json")
  [[ $command == replay ]] && calls=(--calls "$dir/trees_calls.jsonl")
  err=$("$pejit" $command "$dir/trees.pj" --entry loss "${calls[@]}" --grad --wrt 1,1 2>&1) &&
    fail "$command --wrt 1,1 accepted"
  [[ "$err" == "pejit: --wrt: argument 1 is given twice" ]] || fail "$command --wrt 1,1: $err"
done
# An inline argument that is not an array is taken for a file name: the error says so.
err=$("$pejit" run "$dir/trees.pj" --entry loss --args '{"a":1}' 2>&1) && fail "--args {...} accepted"
[[ "$err" == "pejit: --args: there is no file '{\"a\":1}' (arguments given inline are a JSON array, starting with '[')" ]] ||
  fail "--args {...}: $err"
err=$("$pejit" replay "$dir/trees.pj" --entry loss --calls "$dir/trees_calls.jsonl" --check --rtol nan 2>&1) &&
  fail "--rtol nan accepted"
[[ "$err" == "--rtol: must be a number >= 0, not nan"* ]] || fail "--rtol nan: $err"
err=$("$pejit" replay "$dir/trees.pj" --entry loss --calls "$dir/trees_calls.jsonl" --log verbose 2>&1) &&
  fail "--log verbose accepted"
[[ "$err" == "--log: 'verbose' is not a log level"* ]] || fail "--log verbose: $err"
err=$("$pejit" run "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --wrt 1 2>&1) && fail "--wrt without --grad accepted"
[[ "$err" == *"it needs --grad"* ]] || fail "--wrt without --grad: $err"
if "$pejit" pe "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --fuel -1 > /dev/null 2>&1; then
  fail "pe --fuel -1 accepted"
fi

# --args inline: a JSON array is the arguments, not a file name.
out=$("$pejit" run "$dir/trees.pj" --entry encode --args "$(cat "$dir/trees_args.json")")
[[ "$out" == '{"value":{"dtype":"f32","shape":[1,2],"data":[2.5,3.5]}}' ]] || fail "run --args inline: $out"

out=$("$pejit" check "$dir/trees.pj")
[[ "$out" == *"ok, 2 definitions, 1 types" ]] || fail "check: $out"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's/Leaf(%word)/Lief(%word)/' "$dir/trees.pj" > "$tmp/bad.pj"
if err=$("$pejit" check "$tmp/bad.pj" 2>&1); then fail "check accepted a bad program"; fi
[[ "$err" == "pejit: $tmp/bad.pj:10:5: unknown constructor 'Lief'; did you mean 'Leaf'?" ]] || fail "check error: $err"

echo '[1]' > "$tmp/args.json"
if err=$("$pejit" run "$dir/trees.pj" --entry encode --args "$tmp/args.json" 2>&1); then fail "bad args accepted"; fi
[[ "$err" == "pejit: $tmp/args.json: @encode takes 2 arguments, not 1" ]] || fail "args error: $err"

out=$("$pejit" pe "$dir/trees.pj" --entry loss --args "$dir/trees_args.json")
[[ "$out" == *"def @main(%p0: Tensor[(), i64], %p1: Tensor[(), i64], %p2: Tensor[(), i64], %p3: Tensor[(3, 2), f32])"* ]] \
  || fail "pe: $out"
[[ "$out" == *"12 residual ops, 4 params, 0 residual functions"* ]] || fail "pe counts: $out"
# The residual is a program of its own: it checks and runs to the same value.
"$pejit" pe "$dir/trees.pj" --entry encode --args "$dir/trees_args.json" | grep -v '^#' > "$tmp/residual.pj"
echo '[{"dtype":"i64","shape":[],"data":[0]},{"dtype":"i64","shape":[],"data":[1]},
       {"dtype":"i64","shape":[],"data":[2]},{"dtype":"f32","shape":[3,2],"data":[1,2,3,4,5,6]}]' > "$tmp/leaves.json"
out=$("$pejit" run "$tmp/residual.pj" --entry main --args "$tmp/leaves.json")
[[ "$out" == '{"value":{"dtype":"f32","shape":[1,2],"data":[2.5,3.5]}}' ]] || fail "residual run: $out"

# Without fuel, partial evaluation leaves every call residual: both modes
# compile them as native regions between residual calls (grad mode with each
# region's VJP), with run's answer.
out=$("$pejit" compile "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --fuel 0 --run)
grep -q "control flow: [0-9]* native regions between 0 branches and [1-9][0-9]* residual calls" <<<"$out" ||
  fail "compile --fuel 0: $out"
[[ "$(tail -n 1 <<<"$out")" == '{"value":{"dtype":"f32","shape":[],"data":[18.5]}}' ]] || fail "compile --fuel 0 --run: $out"
out=$("$pejit" compile "$dir/trees.pj" --entry loss --args "$dir/trees_args.json" --fuel 0 --grad --run)
grep -q "control flow: [0-9]* native regions ([1-9][0-9]* with a compiled VJP) between 0 branches and [1-9][0-9]* residual calls" <<<"$out" ||
  fail "compile --fuel 0 --grad: $out"
[[ "$(tail -n 1 <<<"$out")" == "$grad_want" ]] || fail "compile --fuel 0 --grad --run: $out"
[[ "$("$pejit" compile --help)" == *"--fuel"* ]] || fail "compile --help"
# An entry that returns a structure runs in the interpreter; compile says why.
cat > "$tmp/list.pj" <<'PJ'
type List[T] { Nil, Cons(T, List[T]) }
def @double(%l: List[Tensor[(2,), f32]]) -> List[Tensor[(2,), f32]] {
  match (%l) {
    Nil => Nil,
    Cons(%x, %rest) => Cons(add(%x, %x), @double(%rest)),
  }
}
PJ
echo '[{"ctor":"Cons","fields":[{"dtype":"f32","shape":[2],"data":[1,2]},{"ctor":"Nil","fields":[]}]}]' > "$tmp/list.json"
if err=$("$pejit" compile "$tmp/list.pj" --entry double --args "$tmp/list.json" 2>&1); then fail "compiled a List result"; fi
[[ "$err" == "pejit: $tmp/list.pj:2:1: the result must be tensors in tuples, not a List value (Cons): an entry returning a structure runs in the interpreter" ]] \
  || fail "compile of a List result: $err"
[[ "$("$pejit" run --help)" == *"--wrt"* ]] || fail "run --help"
[[ "$("$pejit" pe --help)" == *"--static"* ]] || fail "pe --help"
# `pejit trace` on the trace of a small Tree-LSTM run (train --trace, 1
# worker); treelstm_trace.summary is the statistics block that run's engine
# logged when it was destroyed: the summary of the file must be the same text.
out=$("$pejit" trace summary "$dir/treelstm_trace.jsonl")
[[ "$out" == "$(cat "$dir/treelstm_trace.summary")" ]] || fail "trace summary: $out"
out=$("$pejit" trace chrome "$dir/treelstm_trace.jsonl" -o "$tmp/chrome.json")
[[ "$out" == "$tmp/chrome.json: 40 events from $dir/treelstm_trace.jsonl" ]] || fail "trace chrome: $out"
python3 - "$tmp/chrome.json" <<'PY' || fail "trace chrome: not the expected Chrome trace"
import json, sys
doc = json.load(open(sys.argv[1]))
names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
assert any(n.startswith("calls") for n in names) and any(n.startswith("worker") for n in names), names
outs = sorted(e["bind_id"] for e in doc["traceEvents"] if e.get("flow_out"))
ins = sorted(e["bind_id"] for e in doc["traceEvents"] if e.get("flow_in"))
assert outs and outs == ins, (outs, ins)
assert any(e["name"] == "call native" for e in doc["traceEvents"])
PY
out=$("$pejit" trace log "$dir/treelstm_trace.jsonl" --level info)
grep -q '^\[pejit\] swap       loss        sig=[0-9a-f]\{8\}  native  job=[0-9]*  mode=grad:2  pe=' <<< "$out" \
  || fail "trace log: $out"
grep -q '^\[pejit\] pe ' <<< "$out" && fail "trace log --level info shows debug events"
printf '{"event":"nope"}\n' > "$tmp/bad.jsonl"
if err=$("$pejit" trace summary "$tmp/bad.jsonl" 2>&1); then fail "a bad trace was accepted"; fi
[[ "$err" == "pejit: $tmp/bad.jsonl:1: unknown event \"nope\"" ]] || fail "bad trace error: $err"
[[ "$("$pejit" trace --help)" == *"summary"* ]] || fail "trace --help"
[[ "$("$pejit" trace chrome --help)" == *"--output"* ]] || fail "trace chrome --help"
if [[ -w /dev/full ]]; then  # a full disk is named as such
  err=$("$pejit" trace chrome "$dir/treelstm_trace.jsonl" -o /dev/full 2>&1) && fail "trace chrome to /dev/full succeeded"
  [[ "$err" == "pejit: writing /dev/full: No space left on device" ]] || fail "trace chrome -o /dev/full: $err"
fi
# A trace whose fields a reader interprets must have their documented types.
head -1 "$dir/treelstm_trace.jsonl" | sed 's/}$/,"job":1e20}/' > "$tmp/bad_job.jsonl"
err=$("$pejit" trace summary "$tmp/bad_job.jsonl" 2>&1) && fail "a job of 1e20 accepted"
[[ "$err" == "pejit: $tmp/bad_job.jsonl:1: \"job\" must be an integer >= 0" ]] || fail "job 1e20: $err"
# --print-after, for every tool that runs the engine: the generic tier's
# segment variants, vectorized and then lowered (each forward and backward
# compiled), on stderr; stdout keeps the results alone. No signature's own
# specialization (--specialize-after 0): whether a repeated one is admitted
# depends on measured times, and its lowering would be printed too.
printed=$("$pejit" replay "$dir/trees.pj" --entry loss --calls "$dir/trees_calls.jsonl" --grad --wrt 1 --policy sync \
            --specialize-after 0 --print-after vectorize,dce 2>&1 >/dev/null | sed -n 's/^# after \([a-z-]*\) (.*/\1/p' | sort | uniq -c)
vectorized=$(awk '$2 == "vectorize" {print $1}' <<< "$printed")
lowered=$(awk '$2 == "dce" {print $1}' <<< "$printed")
[[ -n "$vectorized" && "$lowered" == $((2 * vectorized)) ]] || fail "replay --print-after: $printed"

# `pejit replay`: the calls of trees_calls.jsonl (12 random trees, 8 distinct
# shapes) through the engine, every compiled result checked against the
# interpreter. Policy sync compiles each new shape before its call, so the
# first epoch compiles the 8 and the second runs natively throughout.
out=$("$pejit" replay "$dir/trees.pj" --entry loss --calls "$dir/trees_calls.jsonl" --grad --wrt 1 --epochs 2 \
        --reshuffle --policy sync --check --no-generic 2>/dev/null)
[[ "$(grep -c '^epoch [01]: 12 calls in' <<< "$out")" == 2 ]] || fail "replay epoch lines: $out"
python3 - "$(tail -n 1 <<< "$out")" <<'PY' || fail "replay: not the expected final line: $out"
import json, sys
r = json.loads(sys.argv[1])
assert r["calls"] == 12 and r["mode"] == "grad" and r["divergences"] == 0, r
assert [e["epoch"] for e in r["epochs"]] == [0, 1], r
assert r["epochs"][0]["compiled_specializations"] == 8 and r["specializations_compiled"] == 8, r
assert all(e["compiled_share"] == 1.0 and e["native_share"] == 1.0 for e in r["epochs"]), r
assert r["epochs"][1]["compiled_specializations"] == 0 and r["epochs"][1]["code_bytes"] > 0, r
PY
{ head -n 2 "$dir/trees_calls.jsonl"; echo '[{"ctor": "Leaf", "fields": [{"dtype": "i64", "shape": [], "data": [0]}]}]'; } \
  > "$tmp/calls.jsonl"
if err=$("$pejit" replay "$dir/trees.pj" --entry loss --calls "$tmp/calls.jsonl" 2>&1); then fail "bad calls accepted"; fi
[[ "$err" == "pejit: $tmp/calls.jsonl:3: @loss takes 2 arguments, not 1" ]] || fail "replay calls error: $err"
if err=$("$pejit" replay "$dir/trees.pj" --entry loss --calls "$dir/trees_calls.jsonl" --grad --wrt 2 2>&1); then
  fail "replay --wrt 2 accepted"
fi
[[ "$err" == "pejit: --wrt: @loss has no argument 2" ]] || fail "replay --wrt error: $err"
[[ "$("$pejit" replay --help)" == *"--reshuffle"* ]] || fail "replay --help"
echo PASS
