#!/usr/bin/env bash
# tests/dist: data-parallel training across real ranks, `mpirun -np 2` on
# this machine: the all-reduce; two ranks training as one process does (the
# same step losses and parameters to 1e-5); a rank that fails ends every
# rank with a message naming it; a 2-rank checkpoint resumed by one process.
set -euo pipefail
if [[ "${1:-}" == "--sanitized" ]]; then
  source tests/support/skip.sh
  skip_test tests/dist mpi_test "the sanitizer configs do not run mpirun (libmpi is not instrumented)"
fi
trap 'echo "mpi_test.sh: line $LINENO failed: $BASH_COMMAND" >&2' ERR
tmp=${TEST_TMPDIR:-$(mktemp -d)}
export TMPDIR=$tmp
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # no cross-process memory attach in sandboxes
export OMPI_MCA_rmaps_base_oversubscribe=1
root=()
[[ $(id -u) -eq 0 ]] && root=(--allow-run-as-root)
mpirun=(mpirun "${root[@]}" --oversubscribe)
compare=(/usr/bin/python3 tests/dist/compare.py)
train=(examples/treelstm/train --listops-train-size 200 --listops-dev-size 20 --batch 20 --embed 16 --hidden 16
       --policy sync --workers 1)

echo "== the all-reduce and broadcast"
"${mpirun[@]}" -np 2 tests/dist/allreduce_check

echo "== 2 ranks train as 1 process: 20 steps of a global minibatch of 20 (Tree-LSTM)"
tests/dist/data_parallel_steps treelstm "$tmp/one.ckpt" > "$tmp/one.json"
"${mpirun[@]}" -np 2 tests/dist/data_parallel_steps treelstm "$tmp/two.ckpt" > "$tmp/two.json"
grep -q '"ranks":2' "$tmp/two.json"
"${compare[@]}" losses "$tmp/one.json" "$tmp/two.json"
"${compare[@]}" checkpoints "$tmp/one.ckpt" "$tmp/two.ckpt"

echo "== ... and the MLP"
tests/dist/data_parallel_steps mlp > "$tmp/mlp_one.json"
"${mpirun[@]}" -np 2 tests/dist/data_parallel_steps mlp > "$tmp/mlp_two.json"
"${compare[@]}" losses "$tmp/mlp_one.json" "$tmp/mlp_two.json"

echo "== a rank that fails ends the run on every rank, naming itself"
status=0
"${mpirun[@]}" -np 1 "${train[@]}" --epochs 2 : -np 1 "${train[@]}" --epochs 2 --train "$tmp/missing.tsv" \
  > "$tmp/fail.out" 2> "$tmp/fail.err" || status=$?
cat "$tmp/fail.err"
[[ $status -ne 0 ]]
grep -q "pejit: rank 1 of 2: train: .*missing.tsv" "$tmp/fail.err"
grep -q "pejit: rank 0 of 2: stopped by mpirun" "$tmp/fail.err"

echo "== ranks started with different options end the run before any step, naming the option"
for pair in "--epochs 2|--epochs 3" "--lr 0.05|--lr 0.5" "--seed 1|--seed 2"; do
  status=0
  # shellcheck disable=SC2086  # an option and its value: two words
  "${mpirun[@]}" -np 1 "${train[@]}" ${pair%%|*} : -np 1 "${train[@]}" ${pair##*|} \
    > "$tmp/differ.out" 2> "$tmp/differ.err" || status=$?
  [[ $status -ne 0 ]]
  option=${pair%% *}
  grep -q "pejit: rank 0 of 2: the ranks were started differently: $option is .* on rank 0 and .* on rank 1" "$tmp/differ.err" ||
    { cat "$tmp/differ.err"; false; }
done

echo "== a rank that stops (SIGSTOP: a wedged node) ends the run past the deadline, named by the others"
status=0
"${mpirun[@]}" -np 1 "${train[@]}" --epochs 1000 --allreduce-deadline 4 : \
  -np 1 "${train[@]}" --epochs 1000 --allreduce-deadline 4 --train-sample 77 > "$tmp/stop.out" 2> "$tmp/stop.err" &
job=$!
for _ in $(seq 1 600); do  # until the ranks train (MPI's start has no deadline of ours)
  if grep -q "epoch 1 \[" "$tmp/stop.err"; then break; fi
  sleep 0.1
done
stopped=""
for _ in $(seq 1 300); do  # rank 1 (the marker is its --train-sample)
  for p in $(pgrep -f -- "--train-sample 77" || true); do
    if [[ "$(cat "/proc/$p/comm" 2> /dev/null)" == train ]]; then stopped=$p; break; fi
  done
  if [[ -n "$stopped" ]]; then break; fi
  sleep 0.1
done
[[ -n "$stopped" ]]
kill -STOP "$stopped"
# Until rank 0 has said it; then rank 1 may run again to take mpirun's SIGTERM.
for _ in $(seq 1 600); do
  if grep -q "did not arrive" "$tmp/stop.err"; then break; fi
  sleep 0.1
done
kill -CONT "$stopped" 2> /dev/null || true
wait "$job" || status=$?
[[ $status -ne 0 ]] || { echo "rank 1 (pid $stopped) stopped, yet the run ended well:"; tail -5 "$tmp/stop.err"; false; }
grep -q "pejit: rank 0 of 2: the .* waited 4 s (--allreduce-deadline) for rank 1, which did not arrive" "$tmp/stop.err" ||
  { cat "$tmp/stop.err"; false; }

echo "== a 2-rank checkpoint resumes in 1 process"
"${mpirun[@]}" -np 2 "${train[@]}" --epochs 2 --save "$tmp/whole.ckpt" > "$tmp/whole.json"
"${mpirun[@]}" -np 2 "${train[@]}" --epochs 1 --save "$tmp/half.ckpt" > /dev/null
"${train[@]}" --epochs 2 --resume "$tmp/half.ckpt" --save "$tmp/resumed.ckpt" > "$tmp/resumed.json"
"${compare[@]}" last-epoch-loss "$tmp/whole.json" "$tmp/resumed.json"
"${compare[@]}" checkpoints "$tmp/whole.ckpt" "$tmp/resumed.ckpt"
echo "mpi_test.sh: all passed"
