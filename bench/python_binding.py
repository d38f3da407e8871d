"""The `pejit` Python module against the C++ library it binds (issue 27).

    bazel run --config=opt //bench:python -- [--size 2000] [--epochs 6] [--rounds 3]

1. Training: the Tree-LSTM loop of examples/python/treelstm.py and the C++
   loop of bench/treelstm_pejit on the same ListOps file, minibatches and
   initial parameters (a plan written by treelstm_pejit --write-data),
   alternately, `--rounds` times each; Python also with tcmalloc preloaded
   (the allocator the C++ binaries link, which an extension module cannot
   bring itself). Each runs until `--steady-epochs` epochs in a row ran
   compiled code in every step with no compile ending meanwhile; steady
   throughput is their median. The losses of the loops must agree.
2. Per-call overhead: an entry that returns its argument, compiled, called
   from Python (a pejit.Value argument, and a Python float converted on each
   call) beside the same call from C++ (bench/trace's BM_EmptyEntryCall).
3. Conversion: a 32-tree minibatch built from (token, children) tuples with
   the module's constructors, and made into `loss` arguments from trees
   built before (what a reshuffled epoch costs per minibatch).

Prints one JSON line per measurement and a Markdown summary.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def find(relative):
    """A file of the runfiles tree (bazel run), or of the source tree and bazel-bin."""
    for base in (ROOT, os.path.join(ROOT, "bazel-bin")):
        path = os.path.join(base, relative)
        if os.path.exists(path):
            return path
    raise FileNotFoundError(relative)


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def steady(epochs, n):
    """The median of the last `n` epochs: both loops run until that many in a
    row were compiled in every step with no compile ending meanwhile."""
    return statistics.median(e["trees_per_s"] for e in epochs[-n:])


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--size", type=int, default=4000, help="ListOps training examples")
    a.add_argument("--epochs", type=int, default=2, help="epochs before looking for steady ones")
    a.add_argument("--steady-epochs", type=int, default=3)
    a.add_argument("--rounds", type=int, default=3, help="alternating runs of each loop")
    a.add_argument("--calls", type=int, default=200000, help="calls timed per-call")
    a.add_argument("--hidden", type=int, default=64)
    o = a.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(find("python/pejit/_pejit.so"))))
    import numpy as np
    import pejit
    sys.path.insert(0, os.path.dirname(find("examples/python/treelstm.py")))
    import treelstm as example

    cpp, trace = find("bench/treelstm_pejit"), find("bench/trace")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(find("python/pejit/_pejit.so"))))
    shape = ["--batch", "25", "--embed", "64", "--hidden", str(o.hidden)]
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "listops.tsv")
        subprocess.run([cpp, "--write-data", data, "--size", str(o.size), "--seed", "1", *shape], check=True,
                       stderr=subprocess.DEVNULL)
        plan = data + ".plan.json"
        tcmalloc = dict(env, LD_PRELOAD="libtcmalloc_minimal.so.4")
        loops = ("cpp", "python", "python_tcmalloc")
        rates = {loop: [] for loop in loops}
        losses = {}
        for r in range(o.rounds):
            for loop in loops:
                if loop == "cpp":
                    cmd = [cpp, "--data", data, "--plan", plan, "--infer-passes", "0", "--max-infer-passes", "0"]
                else:
                    cmd = ["/usr/bin/python3", find("examples/python/treelstm.py"), "--train", data, "--plan", plan,
                           "--no-dev"]
                cmd += ["--epochs", str(o.epochs), "--until-compiled", "--steady-epochs", str(o.steady_epochs),
                        "--max-epochs", "30", *shape]
                out = last_json(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                               env=tcmalloc if loop == "python_tcmalloc" else env).stdout)
                rates[loop].append(steady(out["epochs"], o.steady_epochs))
                losses[loop] = [e["loss"] for e in out["epochs"]]
                print(json.dumps({"measure": "training", "loop": loop, "round": r,
                                  "trees_per_s": [round(e["trees_per_s"]) for e in out["epochs"]],
                                  "steady_trees_per_s": rates[loop][-1]}), flush=True)
        # Epochs both ran (a loop may need more to become steady).
        agree = max(abs(x - y) / abs(y) for x, y in zip(losses["python"], losses["cpp"]))
        summary["training"] = {loop: statistics.median(rates[loop]) for loop in loops}
        summary["training"]["ratios"] = [p / c for p, c in zip(rates["python"], rates["cpp"])]
        summary["training"]["ratios_tcmalloc"] = [p / c for p, c in zip(rates["python_tcmalloc"], rates["cpp"])]
        summary["training"]["loss_max_relative_difference"] = agree
        print(json.dumps({"measure": "training", **summary["training"]}), flush=True)

        # Per-call overhead of an empty compiled entry.
        bench = json.loads(subprocess.run([trace, "--benchmark_filter=BM_EmptyEntryCall", "--benchmark_format=json",
                                           "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true"],
                                          check=True, capture_output=True, text=True).stdout)
        cpp_ns = next(b["real_time"] for b in bench["benchmarks"] if b["name"].endswith("_median"))
        pejit.set_blas_threads(1)
        engine = pejit.Engine(policy="eager", workers=1, log="off")
        engine.module.add_source("def @nothing(%x: Tensor[(), f32]) -> Tensor[(), f32] { %x }", "nothing.pj")
        nothing = engine.entry("nothing")
        (x,) = nothing.convert(1.5)
        assert nothing.wait_ready(x).tier == "native"

        def per_call(arg):
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(o.calls):
                    nothing(arg)
                best = min(best, (time.perf_counter() - t) / o.calls)
            return best * 1e9

        value_ns, float_ns = per_call(x), per_call(1.5)
        engine.close()
        summary["call"] = {"cpp_ns": cpp_ns, "python_value_ns": value_ns, "python_float_ns": float_ns,
                           "binding_ns": value_ns - cpp_ns}
        print(json.dumps({"measure": "empty entry call", **summary["call"]}), flush=True)

        # Conversion of a 32-tree minibatch.
        examples = example.read_listops(data)[:32]
        nodes = 0
        for tree, _ in examples:
            stack = [tree]
            while stack:
                t = stack.pop()
                nodes += 1
                stack.extend(t[1])
        with pejit.Engine(policy="interpreter", log="off") as engine:
            with open(find("examples/treelstm/treelstm.pj")) as f:
                engine.module.add_source(f.read(), "treelstm.pj")
            loss = engine.entry("loss", wrt=2)
            params = pejit.Value(example.init_params(np.random.default_rng(1), 14, 64, o.hidden, 10))
            labels = np.array([y for _, y in examples], np.int64)

            def timed(fn, repeat=200):
                best = float("inf")
                for _ in range(5):
                    t = time.perf_counter()
                    for _ in range(repeat):
                        fn()
                    best = min(best, (time.perf_counter() - t) / repeat)
                return best * 1e6

            build_us = timed(lambda: [example.tree_value(engine.module, t) for t, _ in examples], 50)
            built = [example.tree_value(engine.module, t) for t, _ in examples]
            convert_us = timed(lambda: loss.convert(built, labels, params))
        summary["conversion"] = {"trees": 32, "nodes": nodes, "build_us": build_us, "build_us_per_node": build_us / nodes,
                                 "convert_built_us": convert_us}
        print(json.dumps({"measure": "32-tree minibatch", **summary["conversion"]}), flush=True)

    t, c, v = summary["training"], summary["call"], summary["conversion"]
    print(f"""
| measure | C++ | Python | |
|---|---|---|---|
| steady training, trees/s (median of {o.rounds} alternating runs) | {t['cpp']:.0f} | {t['python']:.0f}; with tcmalloc preloaded {t['python_tcmalloc']:.0f} | Python/C++ {t['python'] / t['cpp']:.2f} (rounds: {', '.join(f'{r:.2f}' for r in t['ratios'])}), with tcmalloc {t['python_tcmalloc'] / t['cpp']:.2f} (rounds: {', '.join(f'{r:.2f}' for r in t['ratios_tcmalloc'])}); losses agree to {t['loss_max_relative_difference']:.1e} |
| empty compiled entry, per call | {c['cpp_ns'] / 1000:.2f} us | {c['python_value_ns'] / 1000:.2f} us (pejit.Value), {c['python_float_ns'] / 1000:.2f} us (a float) | binding {c['binding_ns'] / 1000:.2f} us |
| 32-tree minibatch ({v['nodes']} nodes) | | built by constructors {v['build_us']:.0f} us ({v['build_us_per_node']:.2f} us/node); `convert` of built trees {v['convert_built_us']:.0f} us | |
""")


if __name__ == "__main__":
    main()
