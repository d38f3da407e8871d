"""The PyTorch peers of bench/treelstm and bench/mlp (README.md), one per process.

Run by bench.py with Debian's /usr/bin/python3 (python3-torch). Each run
trains, then infers, and prints one JSON line in the schema of
treelstm_pejit.cc and mlp_pejit.cc, plus which BLAS library the process
actually loaded (read from /proc/self/maps after a matrix product).

  treelstm --impl recursive   the Child-Sum Tree-LSTM as a PyTorch user writes
                              it: a recursive function, one node at a time
                              (its children's states stacked)
  treelstm --impl batched     level by level as TensorFlow Fold does: all the
                              minibatch's nodes of equal height in one GEMM
  mlp                         the 784-256-10 MLP on Fashion-MNIST

With --plan (treelstm_pejit --write-data FILE writes FILE.plan.json) the
Tree-LSTM starts from pejit's initial parameters and trains and infers on its
minibatches; with --reshuffle, epoch e on the plan's epoch-e minibatches.

The model, initialization scheme and optimizer are those of
examples/treelstm (model.cc, train/optimizer.cc): Xavier-uniform matrices,
normal(0, 0.1) embeddings, zero biases but the forget gate's (1), Adagrad
(lr 0.05, epsilon 1e-8, accumulators from 0); and of examples/mlp (Xavier
weights, zero biases, SGD lr 0.1). Random streams differ from pejit's: same
scheme, not the same numbers.
"""

import argparse
import gzip
import json
import math
import os
import random
import resource
import sys
import time

# ListOps tokens (examples/treelstm/listops.h): digits are themselves.
OPERATORS = {"[MAX": 10, "[MIN": 11, "[MED": 12, "[SM": 13}
VOCABULARY, CLASSES = 14, 10
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def cpu_seconds():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def percentile(values, q):
    """Nearest rank, as bench/compile_stats.cc."""
    if not values:
        return 0.0
    v = sorted(values)
    rank = max(1, math.ceil(q * len(v)))
    return v[min(len(v), rank) - 1]


def loaded_blas(torch):
    """The BLAS/LAPACK shared objects this process mapped, after a GEMM, and OpenBLAS's thread count."""
    a = torch.ones(64, 64)
    (a @ a).sum().item()
    libraries = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            if len(parts) >= 6 and any(k in parts[-1].lower() for k in ("blas", "lapack", "mkl")):
                path = os.path.realpath(parts[-1])
                if path not in libraries:
                    libraries.append(path)
    threads = None
    for path in libraries:
        if "openblas" in path:
            import ctypes
            try:
                threads = ctypes.CDLL(path).openblas_get_num_threads()
                break
            except (OSError, AttributeError):
                pass
    return {"blas_libraries": libraries, "openblas_threads": threads}


def sgemm_gflops(torch, n=512, seconds=1.0):
    """f32 GEMM throughput through torch (hence the BLAS it loaded): the best of 5 timings of ~seconds/5."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = a @ b
    best, calls = 0.0, 1
    start = time.perf_counter()
    while time.perf_counter() - start < seconds / 5:
        c = a @ b
        calls += 1
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, b, out=c)
        best = max(best, 2 * n ** 3 * calls / (time.perf_counter() - t) / 1e9)
    return best


# The rows a level of a minibatch gives its products, from one tree to many.
LEVEL_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def gemm_rates(torch, embed, hidden, seconds_each=0.05):
    """GFLOP/s of the Tree-LSTM's four products (rows x K times K x N, as
    nn.Linear computes them) at each of LEVEL_ROWS rows: {"KxN": {rows: rate}}.

    A level of training reads every weight once between two reads of the
    same one: the calls cycle through copies of the weight as large together
    as the four weights, so that a product streams its weight from memory
    where the model's weights outgrow the caches (hidden 1024: 33.6 MB), and
    reads it from the caches where a level would."""
    shapes = ((embed, 3 * hidden), (hidden, 3 * hidden), (embed, hidden), (hidden, hidden))
    model_floats = sum(k * n for k, n in shapes)
    out = {}
    for k, n in shapes:
        ws = [torch.randn(n, k) for _ in range(-(-model_floats // (k * n)))]
        rates = {}
        for m in LEVEL_ROWS:
            x = torch.randn(m, k)
            y = x @ ws[0].T
            calls, start = 1, time.perf_counter()
            while time.perf_counter() - start < seconds_each / 2:
                torch.mm(x, ws[calls % len(ws)].T, out=y)
                calls += 1
            best = 0.0
            for _ in range(3):
                t = time.perf_counter()
                for i in range(calls):
                    torch.mm(x, ws[i % len(ws)].T, out=y)
                best = max(best, 2 * m * k * n * calls / (time.perf_counter() - t) / 1e9)
            rates[m] = best
        out[f"{k}x{n}"] = rates
    return out


def elementwise_gbps(torch, n=1 << 16, seconds=0.2):
    """Bytes/s of an elementwise product over cache-resident f32 vectors (two read, one written)."""
    a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mul(a, b, out=c)
        calls += 1
    return 12 * n * calls / (time.perf_counter() - start) / 1e9


# ---------------------------------------------------------------- ListOps


class Node:
    __slots__ = ("token", "children", "token_tensor")

    def __init__(self, token, children):
        self.token, self.children, self.token_tensor = token, children, None


def parse_expression(text, where):
    stack, root = [], None
    for word in text.split():
        if word in ("(", ")"):
            continue
        if word in OPERATORS:
            stack.append(Node(OPERATORS[word], []))
        elif word == "]":
            if not stack:
                raise ValueError(f"{where}: unbalanced ']'")
            node = stack.pop()
            if stack:
                stack[-1].children.append(node)
            else:
                root = node
        elif word.isdigit() and len(word) == 1:
            leaf = Node(int(word), [])
            if stack:
                stack[-1].children.append(leaf)
            else:
                root = leaf
        else:
            raise ValueError(f"{where}: unknown token {word!r}")
    if stack or root is None:
        raise ValueError(f"{where}: incomplete expression")
    return root


def read_listops(path):
    examples = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            label, sep, expression = line.partition("\t")
            if not sep or not label.isdigit():
                raise ValueError(f"{path}:{number}: expected label<TAB>expression")
            examples.append((parse_expression(expression, f"{path}:{number}"), int(label)))
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def count_nodes(t):
    return 1 + sum(count_nodes(c) for c in t.children)


def make_batches(examples, size, rng):
    """treelstm::MakeBatches' scheme: shuffle, sort stably by node count, cut, shuffle the minibatches."""
    order = list(examples)
    rng.shuffle(order)
    order.sort(key=lambda e: count_nodes(e[0]))
    batches = [order[i:i + size] for i in range(0, len(order), size)]
    rng.shuffle(batches)
    return batches


def xavier_init(torch, model):
    """examples/treelstm/model.cc's scheme on the peer's parameters."""
    torch.nn.init.normal_(model.emb.weight, 0.0, 0.1)
    for linear in (model.w_iou, model.u_iou, model.w_f, model.u_f, model.out):
        torch.nn.init.xavier_uniform_(linear.weight)
        if linear.bias is not None:
            torch.nn.init.zeros_(linear.bias)
    torch.nn.init.ones_(model.w_f.bias)


def tree_lstm_model(torch, embed, hidden):
    nn = torch.nn

    class TreeLstm(nn.Module):
        """treelstm.pj's parameters: emb, w_iou+b_iou, u_iou, w_f+b_f, u_f, w_out+b_out."""

        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCABULARY, embed)
            self.w_iou = nn.Linear(embed, 3 * hidden)
            self.u_iou = nn.Linear(hidden, 3 * hidden, bias=False)
            self.w_f = nn.Linear(embed, hidden)
            self.u_f = nn.Linear(hidden, hidden, bias=False)
            self.out = nn.Linear(hidden, CLASSES)

        # -- recursive: one node at a time, the way a PyTorch user writes it
        def node(self, t):
            x = self.emb(t.token_tensor)
            if not t.children:
                i, o, u = self.w_iou(x).chunk(3, dim=1)
                c = torch.sigmoid(i) * torch.tanh(u)
                return torch.sigmoid(o) * torch.tanh(c), c
            states = [self.node(child) for child in t.children]
            child_h = torch.cat([s[0] for s in states])
            child_c = torch.cat([s[1] for s in states])
            i, o, u = (self.w_iou(x) + self.u_iou(child_h.sum(0, keepdim=True))).chunk(3, dim=1)
            f = torch.sigmoid(self.w_f(x) + self.u_f(child_h))  # (children, H): x's term broadcast
            c = torch.sigmoid(i) * torch.tanh(u) + (f * child_c).sum(0, keepdim=True)
            return torch.sigmoid(o) * torch.tanh(c), c

        def logits_recursive(self, batch):
            return self.out(torch.cat([self.node(t)[0] for t in batch.trees]))

        # -- level-batched (TensorFlow Fold): every node of one height together
        def logits_batched(self, batch):
            hs, cs = [], []
            for level in batch.levels:
                x = self.emb(level["tokens"])
                iou = self.w_iou(x)
                if "children" in level:
                    all_h, all_c = torch.cat(hs), torch.cat(cs)
                    child_h, child_c = all_h[level["children"]], all_c[level["children"]]
                    parent = level["parents"]
                    n = x.shape[0]
                    h_sum = child_h.new_zeros(n, child_h.shape[1]).index_add(0, parent, child_h)
                    f = torch.sigmoid(self.w_f(x)[parent] + self.u_f(child_h))
                    fc_sum = child_c.new_zeros(n, child_c.shape[1]).index_add(0, parent, f * child_c)
                    i, o, u = (iou + self.u_iou(h_sum)).chunk(3, dim=1)
                    c = torch.sigmoid(i) * torch.tanh(u) + fc_sum
                else:
                    i, o, u = iou.chunk(3, dim=1)
                    c = torch.sigmoid(i) * torch.tanh(u)
                hs.append(torch.sigmoid(o) * torch.tanh(c))
                cs.append(c)
            return self.out(torch.cat(hs)[batch.roots])

    return TreeLstm()


class TreeBatch:
    """A minibatch's tensors, built before the timed loop (as pejit's values
    are): token tensors per node (recursive), and the level schedule
    (batched): nodes numbered level by level, each level's tokens, its
    nodes' children's numbers and their parents' positions in the level."""

    def __init__(self, torch, examples, impl):
        self.trees = [t for t, _ in examples]
        self.labels = torch.tensor([label for _, label in examples], dtype=torch.long)
        if impl == "recursive":
            stack = list(self.trees)
            while stack:
                t = stack.pop()
                t.token_tensor = torch.tensor([t.token], dtype=torch.long)
                stack.extend(t.children)
            return
        levels = []  # height -> nodes

        def height(t):
            h = 0 if not t.children else 1 + max(height(c) for c in t.children)
            while len(levels) <= h:
                levels.append([])
            levels[h].append(t)
            return h

        for t in self.trees:
            height(t)
        number, next_number = {}, 0
        for nodes in levels:
            for t in nodes:
                number[id(t)] = next_number
                next_number += 1
        self.levels = []
        for h, nodes in enumerate(levels):
            level = {"tokens": torch.tensor([t.token for t in nodes], dtype=torch.long)}
            if h > 0:
                children, parents = [], []
                for position, t in enumerate(nodes):
                    for c in t.children:
                        children.append(number[id(c)])
                        parents.append(position)
                level["children"] = torch.tensor(children, dtype=torch.long)
                level["parents"] = torch.tensor(parents, dtype=torch.long)
            self.levels.append(level)
        self.roots = torch.tensor([number[id(t)] for t in self.trees], dtype=torch.long)


def load_plan(torch, model, path, args):
    """treelstm_pejit's FILE.plan.json: its initial parameters, copied into the
    model; returns its training and inference minibatches (example numbers)
    and (--reshuffle) epoch e's training minibatches, None without."""
    with open(path) as f:
        plan = json.load(f)
    for key in ("embed", "hidden", "batch"):
        if plan[key] != getattr(args, key):
            raise ValueError(f"{path}: written for {key} {plan[key]}, this run has {getattr(args, key)}")
    targets = {"emb": model.emb.weight, "w_iou": model.w_iou.weight, "u_iou": model.u_iou.weight,
               "b_iou": model.w_iou.bias, "w_f": model.w_f.weight, "u_f": model.u_f.weight, "b_f": model.w_f.bias,
               "w_out": model.out.weight, "b_out": model.out.bias}
    with torch.no_grad():
        for name, target in targets.items():
            p = plan["params"][name]
            target.copy_(torch.tensor(p["data"], dtype=torch.float32).reshape(p["shape"]))
    reshuffled = None
    if args.reshuffle:
        reshuffled = plan.get("reshuffled_train_batches", [])
        if len(reshuffled) < args.epochs:
            raise ValueError(f"{path} holds {len(reshuffled)} reshuffled epochs, this run has {args.epochs} "
                             f"(treelstm_pejit --write-data ... --reshuffle-epochs N)")
    return plan["train_batches"], plan["infer_batches"], reshuffled


def run_treelstm(torch, args):
    F = torch.nn.functional
    # wall_since_start_s: the wall time since here less data loading (the
    # file, the plan, the minibatches' tensors and level schedules).
    run_start, data_seconds = time.perf_counter(), 0.0

    def loading(build):
        nonlocal data_seconds
        t = time.perf_counter()
        value = build()
        data_seconds += time.perf_counter() - t
        return value

    torch.manual_seed(args.seed)
    examples = loading(lambda: read_listops(args.data))
    model = tree_lstm_model(torch, args.embed, args.hidden)
    xavier_init(torch, model)
    reshuffled = None
    if args.plan:
        train_plan, infer_plan, reshuffled = loading(lambda: load_plan(torch, model, args.plan, args))
        train_batches = [[examples[i] for i in b] for b in train_plan]
        infer_batches = [[examples[i] for i in b] for b in infer_plan]
    else:
        train_batches = make_batches(examples, args.batch, random.Random(args.seed))
        infer_batches = make_batches(examples, args.batch, random.Random(args.seed + 1))
    optimizer = torch.optim.Adagrad(model.parameters(), lr=args.lr, eps=1e-8)
    logits_of = model.logits_recursive if args.impl == "recursive" else model.logits_batched

    def epoch_batches(epoch):
        """The same minibatches every epoch, or (--reshuffle) the plan's of this epoch."""
        if reshuffled is None:
            return train_batches
        return [[examples[i] for i in b] for b in reshuffled[epoch]]

    def evaluate(batches, latency_ms=None):
        """(right, trees) of the model's predictions over `batches`; each
        tree's latency (its call's) appended to `latency_ms`."""
        right = trees = 0
        with torch.no_grad():
            for b in batches:
                call_start = time.perf_counter()
                predicted = logits_of(b).argmax(dim=1)
                right += int((predicted == b.labels).sum().item())
                if latency_ms is not None:
                    latency_ms.extend([1e3 * (time.perf_counter() - call_start)] * len(b.trees))
                trees += len(b.trees)
        return right, trees

    # --eval-each-epoch: the dev set, loaded once as a training loop would.
    eval_batches = loading(lambda: [TreeBatch(torch, b, args.impl) for b in infer_batches]) if args.eval_each_epoch else []
    epochs = []
    for epoch in range(args.epochs):
        batches = loading(lambda: [TreeBatch(torch, b, args.impl) for b in epoch_batches(epoch)])
        step_ms, loss_sum, trees = [], 0.0, 0
        cpu_before, start = cpu_seconds(), time.perf_counter()
        for b in batches:
            step_start = time.perf_counter()
            loss = F.cross_entropy(logits_of(b), b.labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            value = loss.item()
            step_ms.append(1e3 * (time.perf_counter() - step_start))
            loss_sum += value * len(b.trees)
            trees += len(b.trees)
        seconds = time.perf_counter() - start
        epochs.append({"epoch": epoch, "trees": trees, "seconds": seconds, "cpu_seconds": cpu_seconds() - cpu_before,
                       "trees_per_s": trees / seconds, "loss": loss_sum / trees, "compiled_share": 0.0,
                       "step_ms_p50": percentile(step_ms, 0.5), "step_ms_p99": percentile(step_ms, 0.99),
                       "step_ms_max": max(step_ms),
                       "wall_since_start_s": time.perf_counter() - run_start - data_seconds})
        print(f"torch {args.impl} {args.threads}t epoch {epoch}: {trees / seconds:.0f} trees/s, "
              f"loss {loss_sum / trees:.4f}", file=sys.stderr)
        if args.eval_each_epoch:
            eval_start = time.perf_counter()
            right, evaluated = evaluate(eval_batches)
            e = epochs[-1]
            e["eval_seconds"] = time.perf_counter() - eval_start
            e["eval_trees_per_s"] = evaluated / e["eval_seconds"]
            e["dev_accuracy"] = right / evaluated
            e["wall_after_eval_s"] = time.perf_counter() - run_start - data_seconds
            print(f"torch {args.impl} {args.threads}t epoch {epoch}: dev accuracy {e['dev_accuracy']:.4f}", file=sys.stderr)

    # --infer-batch N: the inference trees in order, cut into calls of N, as treelstm_pejit does.
    infer_calls = infer_batches
    if args.infer_batch:
        flat = [e for b in infer_batches for e in b]
        infer_calls = [flat[i:i + args.infer_batch] for i in range(0, len(flat), args.infer_batch)]
    passes = []
    for p in range(args.infer_passes):
        batches = loading(lambda: [TreeBatch(torch, b, args.impl) for b in infer_calls])
        latency_ms = []
        cpu_before, start = cpu_seconds(), time.perf_counter()
        right, trees = evaluate(batches, latency_ms)
        seconds = time.perf_counter() - start
        passes.append({"pass": p, "trees": trees, "seconds": seconds, "cpu_seconds": cpu_seconds() - cpu_before,
                       "trees_per_s": trees / seconds, "calls": len(batches),
                       "latency_ms_p50": percentile(latency_ms, 0.5), "latency_ms_p99": percentile(latency_ms, 0.99),
                       "accuracy": right / trees, "compiled_share": 0.0,
                       "wall_since_start_s": time.perf_counter() - run_start - data_seconds})
    return {"suite": "treelstm", "examples": len(examples), "batch": args.batch, "embed": args.embed,
            "hidden": args.hidden, "optimizer": "adagrad", "lr": args.lr, "plan": args.plan,
            "reshuffle": args.reshuffle, "infer_trees": passes[0]["trees"] if passes else 0,
            "data_seconds": data_seconds, "epochs": epochs, "infer": passes}


# ---------------------------------------------------------------- MLP


def read_idx(torch, path, dims):
    """An IDX file (examples/mlp/idx.h), plain or .gz."""
    import numpy as np
    for candidate in (path, path + ".gz"):
        if os.path.exists(candidate):
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(candidate, "rb") as f:
                data = f.read()
            break
    else:
        raise FileNotFoundError(f"{path}(.gz) not found; install the data set: bash tools/setup.sh mlp")
    magic = int.from_bytes(data[0:4], "big")
    if magic != 0x0800 + dims:
        raise ValueError(f"{path}: magic number {magic:#x}, expected {0x800 + dims:#x}")
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)
    return torch.from_numpy(array.copy())


def run_mlp(torch, args):
    F, nn = torch.nn.functional, torch.nn
    torch.manual_seed(args.seed)
    d = args.data or FASHION_MNIST
    x_train = read_idx(torch, f"{d}/train-images-idx3-ubyte", 3).reshape(-1, 784).float() / 255
    y_train = read_idx(torch, f"{d}/train-labels-idx1-ubyte", 1).long()
    x_test = read_idx(torch, f"{d}/t10k-images-idx3-ubyte", 3).reshape(-1, 784).float() / 255
    y_test = read_idx(torch, f"{d}/t10k-labels-idx1-ubyte", 1).long()
    if args.limit > 0:
        x_train, y_train, x_test, y_test = x_train[:args.limit], y_train[:args.limit], x_test[:args.limit], y_test[:args.limit]
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    for layer in (model[0], model[2]):
        nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(layer.bias)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(args.seed)
    epochs = []
    n, b = x_train.shape[0], args.batch
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=generator)
        step_ms, loss_sum = [], 0.0
        cpu_before, start = cpu_seconds(), time.perf_counter()
        for i in range(0, n, b):
            step_start = time.perf_counter()
            idx = order[i:i + b]
            x, y = x_train[idx], y_train[idx]  # the minibatch gathered, as the demo does
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * idx.shape[0]
            step_ms.append(1e3 * (time.perf_counter() - step_start))
        seconds = time.perf_counter() - start
        train_cpu = cpu_seconds() - cpu_before
        right = 0
        cpu_before, start = cpu_seconds(), time.perf_counter()
        with torch.no_grad():
            for i in range(0, x_test.shape[0], b):
                right += int((model(x_test[i:i + b]).argmax(dim=1) == y_test[i:i + b]).sum().item())
        infer_seconds = time.perf_counter() - start
        epochs.append({"epoch": epoch, "images": n, "seconds": seconds, "cpu_seconds": train_cpu,
                       "images_per_s": n / seconds, "loss": loss_sum / n, "compiled_share": 0.0,
                       "step_ms_p50": percentile(step_ms, 0.5), "step_ms_p99": percentile(step_ms, 0.99),
                       "step_ms_max": max(step_ms), "infer_images": x_test.shape[0], "infer_seconds": infer_seconds,
                       "infer_cpu_seconds": cpu_seconds() - cpu_before,
                       "infer_images_per_s": x_test.shape[0] / infer_seconds, "infer_compiled_share": 0.0,
                       "test_acc": right / x_test.shape[0]})
        print(f"torch mlp {args.threads}t epoch {epoch}: train {n / seconds:.0f} images/s, "
              f"infer {x_test.shape[0] / infer_seconds:.0f} images/s, loss {loss_sum / n:.4f}", file=sys.stderr)
    return {"suite": "mlp", "train_images": n, "test_images": x_test.shape[0], "batch": b, "optimizer": "sgd",
            "lr": args.lr, "epochs": epochs}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=["treelstm", "mlp", "blas"],
                        help="blas: only report the BLAS loaded, sgemm GFLOP/s (512x512x512), the Tree-LSTM's "
                             "products' GFLOP/s at 1 to 1024 rows (--embed, --hidden) and an elementwise GB/s")
    parser.add_argument("--impl", choices=["recursive", "batched"], default="batched", help="treelstm only")
    parser.add_argument("--threads", type=int, required=True,
                        help="torch.set_num_threads, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS")
    parser.add_argument("--data", help="treelstm: the ListOps file; mlp: the IDX folder")
    parser.add_argument("--plan", help="treelstm: initial parameters and minibatches from treelstm_pejit "
                                       "(--write-data FILE writes FILE.plan.json); without it, the same scheme "
                                       "from --seed")
    parser.add_argument("--limit", type=int, default=0, help="mlp: first N training and test images (0: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--embed", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--infer-passes", type=int, default=2, help="treelstm only")
    parser.add_argument("--infer-batch", type=int, default=0,
                        help="treelstm: trees per inference call, the inference trees in order (1: a tree a call); "
                             "0: the plan's inference minibatches")
    parser.add_argument("--eval-each-epoch", action="store_true",
                        help="treelstm: after every epoch, a pass over the inference (dev) minibatches, loaded once: "
                             "the epoch's dev_accuracy, eval_seconds and wall_after_eval_s")
    parser.add_argument("--reshuffle", action="store_true",
                        help="treelstm: epoch e trains on the plan's reshuffled_train_batches[e] (treelstm_pejit "
                             "--write-data FILE --reshuffle-epochs N) instead of the same minibatches every epoch")
    args = parser.parse_args()
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    if args.suite == "treelstm" and not args.data:
        parser.error("treelstm needs --data FILE (written by treelstm_pejit --write-data)")
    if args.reshuffle and not args.plan:
        parser.error("--reshuffle needs --plan FILE.plan.json (treelstm_pejit --write-data FILE --reshuffle-epochs N)")
    args.batch = args.batch or (25 if args.suite == "treelstm" else 64)
    args.lr = args.lr or (0.05 if args.suite == "treelstm" else 0.1)
    # Before torch loads OpenMP and OpenBLAS: their pools read these once.
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)
    start = time.perf_counter()
    import torch
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    blas = loaded_blas(torch)
    startup = time.perf_counter() - start  # importing torch, the BLAS probe: before any measured figure
    if args.suite == "blas":
        result = {"sgemm_gflops": sgemm_gflops(torch),
                  "sgemm_level_gflops": gemm_rates(torch, args.embed, args.hidden),
                  "elementwise_gbps": elementwise_gbps(torch)}
    else:
        result = (run_treelstm if args.suite == "treelstm" else run_mlp)(torch, args)
    result.update({"impl": f"torch_{args.impl}" if args.suite == "treelstm" else "torch", "threads": args.threads,
                   "torch_threads": torch.get_num_threads(), "torch_version": torch.__version__,
                   "cpu_seconds": cpu_seconds(), "seconds": time.perf_counter() - start, "startup_seconds": startup,
                   "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **blas})
    print(json.dumps(result))


if __name__ == "__main__":
    try:
        main()
    except (OSError, ValueError) as e:
        print(f"torch_peers: {e}", file=sys.stderr)
        sys.exit(1)
