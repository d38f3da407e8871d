"""A pejit encoder inside a PyTorch model against the same model all in pejit (issue 55).

    bazel run --config=opt //bench:torch_interop -- [--size 1000] [--rounds 3] [--hidden 64]

The Child-Sum Tree-LSTM of examples/python/torch_treelstm.py in four modes,
on the same generated ListOps minibatches and initial parameters:
`interop` (PyTorch's embedding, classifier, loss and SGD around pejit's
`@roots` through pejit.torch.function, whose backward is the pullback of
its forward), `interop_vjp` (the same, its backward a vector-Jacobian
product entry that computes the forward again: pullbacks=False), `pejit`
(the `loss` entry, SGD in numpy) and `torch` (the model in PyTorch, node by
node: the cost of staying in PyTorch).

1. Whole runs from process start: each mode trains `--epochs` epochs on a
   fresh engine, in turn; steps/s per epoch.
2. Steady state: each mode's engine, after those epochs and a drain (every
   compile done), runs one more epoch, alternately, `--rounds` times each;
   the median epoch's steps/s. The goal: interop within 10% of pejit
   (interop / pejit >= 0.9). The same minibatches come back every epoch, so
   the `pejit` mode's loss (and `interop_vjp`'s VJP entry) gets per-minibatch
   code for them (EngineOptions::specialize_after_calls), which pullbacks do
   not get (they run on the generic tier).
3. Reshuffled steady state: the same, each round on minibatches drawn anew
   from the shuffled examples (the same for every mode), as training sees
   them: every mode on the generic tier.

Losses of the three modes are checked equal (to 1e-4) first. Prints one JSON
line per measurement and a summary line.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from python_binding import find  # noqa: E402  (a file of the runfiles or source tree)


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a.add_argument("--size", type=int, default=1000, help="ListOps training expressions")
    a.add_argument("--batch", type=int, default=25)
    a.add_argument("--hidden", type=int, default=64, help="hidden and embedding size")
    a.add_argument("--epochs", type=int, default=3, help="epochs of the whole runs")
    a.add_argument("--rounds", type=int, default=3, help="alternating steady epochs of each mode")
    a.add_argument("--torch-steps", type=int, default=40, help="steps of the all-PyTorch mode per measurement")
    a.add_argument("--policy", default="eager")
    o = a.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(find("python/pejit/_pejit.so"))))
    sys.path.insert(0, os.path.dirname(find("examples/python/torch_treelstm.py")))
    import numpy as np
    import torch
    import pejit
    import torch_treelstm as model
    import treelstm as example

    torch.set_num_threads(1)
    pejit.set_blas_threads(1)
    rng = random.Random(1)
    examples = []
    while len(examples) < o.size:
        tree = example.listops_generate(rng)
        examples.append((tree, example.listops_value(tree)))
    initial = example.init_params(np.random.default_rng(1), example.LISTOPS_VOCABULARY, o.hidden, o.hidden,
                                  example.LISTOPS_CLASSES)
    source = open(example.MODEL).read()

    def engine():
        e = pejit.Engine(policy=o.policy)
        e.module.add_source(source, "treelstm.pj")
        return e

    def emit(record):
        print(json.dumps(record), flush=True)

    def train(m, chunk, e):
        if m == "interop_vjp":
            return model.train("interop", chunk, initial, 1, 0.05, e, pullbacks=False)
        return model.train(m, chunk, initial, 1, 0.05, e)

    # The modes take the same steps.
    with engine() as e:
        batches = model.make_batches(e, examples[:4 * o.batch], o.batch)
        losses = {m: train(m, batches, e) for m in ("interop", "interop_vjp", "pejit", "torch")}
    for m in ("interop", "interop_vjp", "pejit"):
        np.testing.assert_allclose(losses[m], losses["torch"], rtol=1e-4, atol=1e-4, err_msg=m)

    engines = {m: engine() for m in ("interop", "interop_vjp", "pejit")}
    batches = {m: model.make_batches(e, examples, o.batch) for m, e in engines.items()}
    for m, e in engines.items():
        for epoch in range(o.epochs):
            start = time.perf_counter()
            train(m, batches[m], e)
            seconds = time.perf_counter() - start
            emit({"measure": "whole_run", "mode": m, "epoch": epoch, "steps_per_s": len(batches[m]) / seconds})
        e.drain()

    def steady(m):
        if m == "torch":
            chunk = batches["pejit"][:o.torch_steps]
            start = time.perf_counter()
            model.train("torch", chunk, initial, 1, 0.05)
            return len(chunk) / (time.perf_counter() - start)
        start = time.perf_counter()
        train(m, batches[m], engines[m])
        return len(batches[m]) / (time.perf_counter() - start)

    rates = {m: [] for m in ("interop", "interop_vjp", "pejit", "torch")}
    for r in range(o.rounds):
        for m in rates:
            rates[m].append(steady(m))
            emit({"measure": "steady", "mode": m, "round": r, "steps_per_s": rates[m][-1]})
    shuffled = {m: [] for m in engines}
    order = random.Random(2)
    for r in range(o.rounds):
        drawn = list(examples)
        order.shuffle(drawn)
        fresh = {m: model.make_batches(e, drawn, o.batch) for m, e in engines.items()}
        for m, e in engines.items():
            start = time.perf_counter()
            train(m, fresh[m], e)
            shuffled[m].append(len(fresh[m]) / (time.perf_counter() - start))
            emit({"measure": "steady_reshuffled", "mode": m, "round": r, "steps_per_s": shuffled[m][-1]})
    for e in engines.values():
        e.close()
    median = {m: statistics.median(v) for m, v in rates.items()}
    reshuffled = {m: statistics.median(v) for m, v in shuffled.items()}
    ratio = median["interop"] / median["pejit"]
    ratio_reshuffled = reshuffled["interop"] / reshuffled["pejit"]
    emit({"measure": "summary", "hidden": o.hidden, "batch": o.batch,
          **{f"{m}_steps_per_s": v for m, v in median.items()},
          **{f"{m}_reshuffled_steps_per_s": v for m, v in reshuffled.items()},
          "interop_over_pejit": ratio, "interop_vjp_over_pejit": median["interop_vjp"] / median["pejit"],
          "interop_over_pejit_reshuffled": ratio_reshuffled,
          "interop_vjp_over_pejit_reshuffled": reshuffled["interop_vjp"] / reshuffled["pejit"],
          "goal_interop_over_pejit": 0.9, "met": ratio >= 0.9 and ratio_reshuffled >= 0.9,
          "interop_over_torch": median["interop"] / median["torch"]})


if __name__ == "__main__":
    main()
