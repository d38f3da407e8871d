#!/usr/bin/python3
"""Train the Child-Sum Tree-LSTM of examples/treelstm/treelstm.pj from Python.

The training loop is plain Python: minibatches of trees built with the
module's constructors, `loss` in grad mode on the engine (interpreted at once,
compiled in the background, generic over tree shapes from the first epoch),
the next minibatches prefetched so that their code is ready when the loop gets
there, and the optimizer step on pejit's parameters in place.

    # ListOps expressions generated here (the demo's data set, smaller)
    examples/python/treelstm.py --size 2000 --epochs 5
    # the same model written in Python (treelstm_model.py, pejit.lang)
    examples/python/treelstm.py --model python
    # Stanford Sentiment Treebank files, one bracketed tree a line
    examples/python/treelstm.py --data sst --train train.txt --dev dev.txt
    # the data, minibatches and initial parameters of a bench/ plan
    examples/python/treelstm.py --train listops.tsv --plan listops.tsv.plan.json

Run with Debian's /usr/bin/python3 and the built module on PYTHONPATH
(README: "pejit from Python").
"""
import argparse
import json
import os
import random
import sys
import time

import numpy as np

import pejit

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = os.path.join(HERE, "..", "treelstm", "treelstm.pj")

# ListOps tokens: digits are themselves, operators follow (as listops.h).
OPERATORS = {"MAX": 10, "MIN": 11, "MED": 12, "SM": 13}
OPERATOR_NAMES = {token: name for name, token in OPERATORS.items()}
LISTOPS_VOCABULARY, LISTOPS_CLASSES = 14, 10
SST_CLASSES, SST_NODE, SST_UNKNOWN = 5, 0, 1


# ---- Data: a tree is (token, [children]) ------------------------------------

def listops_value(tree):
    token, children = tree
    if not children:
        return token
    args = [listops_value(c) for c in children]
    op = OPERATOR_NAMES[token]
    if op == "MAX":
        return max(args)
    if op == "MIN":
        return min(args)
    if op == "MED":  # the median; of an even count, the middle two's mean rounded down
        v, n = sorted(args), len(args)
        return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) // 2
    return sum(args) % 10


def listops_generate(rng, depth=0, max_depth=10):
    op = rng.choice(list(OPERATORS.values()))
    children = []
    for _ in range(rng.randint(2, 5)):
        if depth + 1 < max_depth and rng.random() < 0.25:
            children.append(listops_generate(rng, depth + 1, max_depth))
        else:
            children.append((rng.randint(0, 9), []))
    return (op, children)


def listops_parse(text, where):
    """ "[MAX 2 9 [MIN 4 7 ] 1 ]" -> (10, [(2, []), ...]); '(' and ')' are ignored."""
    stack, root = [], None
    for word in text.split():
        if word in ("(", ")"):
            continue
        if word.startswith("["):
            if word[1:] not in OPERATORS:
                raise ValueError(f"{where}: unknown operator '{word}'")
            stack.append((OPERATORS[word[1:]], []))
        elif word == "]":
            if not stack:
                raise ValueError(f"{where}: ']' closes nothing")
            node = stack.pop()
            if stack:
                stack[-1][1].append(node)
            elif root is None:
                root = node
            else:
                raise ValueError(f"{where}: more than one expression")
        elif word.isdigit() and len(word) == 1:
            if not stack:
                raise ValueError(f"{where}: a digit outside any expression")
            stack[-1][1].append((int(word), []))
        else:
            raise ValueError(f"{where}: unexpected '{word}'")
    if stack or root is None:
        raise ValueError(f"{where}: unbalanced brackets")
    return root


def read_listops(path):
    examples = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            label, _, text = line.rstrip("\n").partition("\t")
            tree = listops_parse(text, f"{path}:{n}")
            if not label.isdigit() or int(label) != listops_value(tree):
                raise ValueError(f"{path}:{n}: label '{label}' is not the expression's value")
            examples.append((tree, int(label)))
    return examples


def sst_parse(line, where):
    """ "(3 (2 It) (4 (2 's) (4 treat)))" -> (label, tree of words)."""
    pos, stack, root = 0, [], None
    tokens = line.replace("(", " ( ").replace(")", " ) ").split()
    while pos < len(tokens):
        t = tokens[pos]
        if t == "(":
            if pos + 1 >= len(tokens) or not tokens[pos + 1].isdigit():
                raise ValueError(f"{where}: expected a label after '('")
            stack.append([int(tokens[pos + 1]), None, []])
            pos += 2
        elif t == ")":
            if not stack:
                raise ValueError(f"{where}: ')' closes nothing")
            node = stack.pop()
            if stack:
                stack[-1][2].append(node)
            else:
                root = node
            pos += 1
        else:
            if not stack or stack[-1][1] is not None or stack[-1][2]:
                raise ValueError(f"{where}: unexpected word '{t}'")
            stack[-1][1] = t
            pos += 1
    if stack or root is None:
        raise ValueError(f"{where}: unbalanced brackets")
    return root


def read_sst(path):
    with open(path) as f:
        return [sst_parse(line, f"{path}:{n}") for n, line in enumerate(f, 1) if line.strip()]


def sst_examples(trees, vocabulary, grow):
    def tokens(node):
        label, word, children = node
        if word is not None:
            if word not in vocabulary and grow:
                vocabulary[word] = len(vocabulary)
            return (vocabulary.get(word, SST_UNKNOWN), [])
        return (SST_NODE, [tokens(c) for c in children])
    return [(tokens(t), t[0]) for t in trees]


# ---- The model --------------------------------------------------------------

def init_params(rng, vocabulary, embed, hidden, classes):
    """Xavier-uniform matrices, normal(0, 0.1) embeddings, the forget gate's bias 1."""
    def xavier(rows, cols):
        bound = np.sqrt(6.0 / (rows + cols))
        return rng.uniform(-bound, bound, (rows, cols)).astype(np.float32)
    return (rng.normal(0, 0.1, (vocabulary, embed)).astype(np.float32), xavier(3 * hidden, embed),
            xavier(3 * hidden, hidden), np.zeros(3 * hidden, np.float32), xavier(hidden, embed),
            xavier(hidden, hidden), np.ones(hidden, np.float32), xavier(classes, hidden),
            np.zeros(classes, np.float32))


def params_from_plan(plan):
    names = ["emb", "w_iou", "u_iou", "b_iou", "w_f", "u_f", "b_f", "w_out", "b_out"]
    return tuple(np.array(plan["params"][n]["data"], np.float32).reshape(plan["params"][n]["shape"]) for n in names)


def tree_value(module, tree):
    """A (token, [children]) tree as a `Tree` value, built bottom-up without recursion."""
    leaf, node = module.Leaf, module.Node
    done = {}
    stack = [(tree, False)]
    while stack:
        t, expanded = stack.pop()
        token, children = t
        if not children:
            done[id(t)] = leaf(token)
        elif expanded:
            done[id(t)] = node(token, [done.pop(id(c)) for c in children])
        else:
            stack.append((t, True))
            stack.extend((c, False) for c in children)
    return done[id(tree)]


class Progress:
    """One line on stderr: redrawn on a terminal, every 10% otherwise."""

    def __init__(self, label, total):
        self.label, self.total, self.tty = label, total, sys.stderr.isatty()
        self.every = max(1, total // 10)

    def update(self, done, status):
        if self.tty:
            width = 30
            filled = width * done // max(1, self.total)
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} {status}")
            if done == self.total:
                sys.stderr.write("\n")
        elif done % self.every == 0 or done == self.total:
            sys.stderr.write(f"{self.label}: {done}/{self.total} steps, {status}\n")
        sys.stderr.flush()


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a.add_argument("--data", choices=["listops", "sst"], default="listops")
    a.add_argument("--model", choices=["pj", "python"], default="pj",
                   help="the model as examples/treelstm/treelstm.pj, or as written in Python (treelstm_model.py)")
    a.add_argument("--train", help="training file (ListOps: label<TAB>expression; SST: bracketed trees); "
                                   "none: generate ListOps")
    a.add_argument("--dev", help="dev file of the same kind")
    a.add_argument("--plan", help="a bench/ plan (treelstm_pejit --write-data): its minibatches of --train "
                                  "and its initial parameters")
    a.add_argument("--no-dev", action="store_true", help="no evaluation after each epoch")
    a.add_argument("--size", type=int, default=2000, help="generated ListOps training expressions")
    a.add_argument("--dev-size", type=int, default=200, help="generated ListOps dev expressions")
    a.add_argument("--batch", type=int, default=25)
    a.add_argument("--embed", type=int, default=64)
    a.add_argument("--hidden", type=int, default=64)
    a.add_argument("--epochs", type=int, default=5)
    a.add_argument("--optimizer", choices=["adagrad", "sgd", "adam"], default="adagrad")
    a.add_argument("--lr", type=float, default=0.05)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--lookahead", type=int, default=8, help="minibatches prefetched ahead of the step")
    a.add_argument("--policy", default="eager", help="eager, hot:N, interpreter or sync")
    a.add_argument("--workers", type=int, default=0, help="background compile workers (0: cores - 1)")
    a.add_argument("--log", default="", help="the JIT's log on stderr: off, info, debug or trace")
    a.add_argument("--trace", default="", help="write the JIT's events to this JSON-lines file")
    a.add_argument("--cache-dir", default="", help="keep compiled code here for later runs")
    a.add_argument("--until-compiled", action="store_true",
                   help="after --epochs, carry on until --steady-epochs in a row ran compiled code in every step "
                        "with no compile ending meanwhile (for benchmarks: bench/python_binding.py)")
    a.add_argument("--steady-epochs", type=int, default=3)
    a.add_argument("--max-epochs", type=int, default=30, help="--until-compiled stops here")
    o = a.parse_args()
    if o.batch < 1 or o.epochs < 0 or o.size < 1:
        a.error("--batch and --size must be at least 1, --epochs at least 0")

    start = time.perf_counter()
    pejit.set_blas_threads(1)  # small GEMMs, inside the engine's own parallelism
    rng = random.Random(o.seed)
    plan = None
    if o.data == "sst":
        if not o.train:
            a.error("--data sst needs --train")
        vocabulary = {"<node>": SST_NODE, "<unk>": SST_UNKNOWN}
        train = sst_examples(read_sst(o.train), vocabulary, grow=True)
        dev = sst_examples(read_sst(o.dev), vocabulary, grow=False) if o.dev else []
        vocabulary_size, classes = len(vocabulary), SST_CLASSES
    else:
        if o.train:
            train = read_listops(o.train)
            dev = read_listops(o.dev) if o.dev else []
        else:
            seen, examples = set(), []
            while len(examples) < o.size + o.dev_size:
                tree = listops_generate(rng)
                key = repr(tree)
                if key not in seen:
                    seen.add(key)
                    examples.append((tree, listops_value(tree)))
            train, dev = examples[:o.size], examples[o.size:]
        vocabulary_size, classes = LISTOPS_VOCABULARY, LISTOPS_CLASSES
    if o.plan:
        with open(o.plan) as f:
            plan = json.load(f)
        for key in ("batch", "embed", "hidden"):
            if plan[key] != getattr(o, key):
                a.error(f"{o.plan} was written for --{key} {plan[key]}, not {getattr(o, key)}")
        train_batches = [[train[n] for n in b] for b in plan["train_batches"]]
        dev_batches = [[train[n] for n in b] for b in plan["infer_batches"]]
    else:
        train_batches = None
        dev_batches = [dev[i:i + o.batch] for i in range(0, len(dev), o.batch)]

    engine = pejit.Engine(policy=o.policy, workers=o.workers, log=o.log, trace=o.trace, cache_dir=o.cache_dir)
    if o.model == "python":
        sys.path.insert(0, HERE)
        import treelstm_model
        treelstm_model.program.add_to(engine)
    else:
        with open(MODEL) as f:
            engine.module.add_source(f.read(), "treelstm.pj")
    m = engine.module
    loss = engine.entry("loss", wrt=2)
    infer = engine.entry("infer")
    params_np = params_from_plan(plan) if plan else init_params(
        np.random.default_rng(o.seed), vocabulary_size, o.embed, o.hidden, classes)
    params = pejit.Value(params_np)  # updated in place by the optimizer
    optimizer = pejit.Optimizer(o.optimizer, learning_rate=o.lr)

    # Every tree is built once; a minibatch is a List of them and its labels.
    def batch_values(batch):
        trees, labels, _ = loss.convert([tree_value(m, t) for t, _ in batch],
                                        np.array([y for _, y in batch], np.int64), params)
        return trees, labels, len(batch)

    dev_values = [] if o.no_dev else [batch_values(b) for b in dev_batches]
    if plan:
        plan_values = [batch_values(b) for b in train_batches]
    else:
        values = {id(e): tree_value(m, e[0]) for e in train}
    data_seconds = time.perf_counter() - start

    def dev_accuracy():
        right = total = 0
        for trees, labels, n in dev_values:
            predicted = infer(trees, params)
            right += int(np.sum(predicted == labels.numpy()))
            total += n
        return right / total if total else float("nan")

    epochs = []
    print(f"pejit Tree-LSTM from Python on {o.data}: {len(train)} train / {len(dev)} dev trees, "
          f"batch {o.batch}, embed {o.embed}, hidden {o.hidden}, {o.optimizer} lr {o.lr}, policy {o.policy}, "
          f"{engine.stats()['workers']} workers", file=sys.stderr)
    def more():
        n = len(epochs)
        if n < o.epochs:
            return True
        if not o.until_compiled or n >= o.max_epochs:
            return False
        if n < o.steady_epochs:
            return True
        return not all(e["compiled_share"] == 1 and e["jobs_ended"] == 0 for e in epochs[-o.steady_epochs:])

    epoch = -1
    while more():
        epoch += 1
        if plan:
            batches = plan_values
        else:  # reshuffled every epoch, as real training does
            order = list(train)
            rng.shuffle(order)
            batches = []
            for i in range(0, len(order), o.batch):
                chunk = order[i:i + o.batch]
                trees, labels, _ = loss.convert([values[id(e)] for e in chunk],
                                                np.array([y for _, y in chunk], np.int64), params)
                batches.append((trees, labels, len(chunk)))
        before = loss.stats()
        progress = Progress(f"epoch {epoch}", len(batches))
        lookahead = pejit.Lookahead(
            loss, lambda step: batches[step][:2] + (params,) if step < len(batches) else None, o.lookahead)
        total_loss = trees_done = 0
        epoch_start = time.perf_counter()
        for step, (trees, labels, n) in enumerate(batches):
            lookahead.before_step(step)
            value, grads = loss.value_and_grad(trees, labels, params)
            optimizer.step(params, grads)
            total_loss += float(value) * n
            trees_done += n
            if (step + 1) % 10 == 0 or step + 1 == len(batches):
                seconds = time.perf_counter() - epoch_start
                progress.update(step + 1, f"loss {total_loss / trees_done:.3f}  {trees_done / seconds:.0f} trees/s")
        seconds = time.perf_counter() - epoch_start
        after = loss.stats()
        compiled = (after["calls_compiled"] - before["calls_compiled"]) / len(batches)
        jobs_ended = sum(after[k] - before[k] for k in ("compiled", "failed", "loaded"))
        accuracy = dev_accuracy() if dev_values else float("nan")
        print(f"epoch {epoch}: loss {total_loss / trees_done:.4f}, dev acc {100 * accuracy:.1f}%, "
              f"{trees_done / seconds:.0f} trees/s, {100 * compiled:.0f}% of steps compiled, {seconds:.1f} s",
              flush=True)
        epochs.append({"epoch": epoch, "loss": total_loss / trees_done, "dev_acc": accuracy,
                       "trees_per_s": trees_done / seconds, "compiled_share": compiled, "jobs_ended": jobs_ended,
                       "seconds": seconds})
    print(json.dumps({"data": o.data, "epochs": epochs, "data_seconds": data_seconds,
                      "seconds": time.perf_counter() - start}))
    engine.close()


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError, pejit.Error) as e:
        sys.exit(f"treelstm.py: {e}")
