#!/usr/bin/python3
"""The level-batched PyTorch peer of bench/fold.cc: the binary Tree-LSTM of
bench/fold_treelstm.pj over the trees `fold --write-trees FILE` timed, one
minibatch a line (a leaf is its word, a node [left, right]), in the same
order. Every tree height is one batched step over all the minibatch's nodes
of that height, as Fold's dynamic batching runs them; the children's states
are gathered from the levels below. Prints one JSON line: trees/s of
inference and of training steps (forward and backward) per minibatch size.

    /usr/bin/python3 bench/fold_peer.py --trees FILE --threads 2 [--hidden 1024 --embed 1024]

Run under Debian's /usr/bin/python3 (python3-torch); the BLAS it loaded is in
the output."""
import argparse
import json
import resource
import time

import torch

import torch_peers


def levels_of(trees):
    """Per height, its nodes' children as (height, index) pairs; leaves' words."""
    words, inner = [], []  # inner[h - 1]: [(left, right)] of the nodes of height h

    def walk(t):
        if isinstance(t, int):
            words.append(t)
            return (0, len(words) - 1)
        left, right = walk(t[0]), walk(t[1])
        h = max(left[0], right[0]) + 1
        while len(inner) < h:
            inner.append([])
        inner[h - 1].append((left, right))
        return (h, len(inner[h - 1]) - 1)

    roots = [walk(t) for t in trees]
    return words, inner, roots


def gather_plan(refs):
    """How to gather rows (height, index) from per-height tensors: per height
    its indices, and the permutation back to the order of `refs`."""
    by_height = {}
    for position, (h, i) in enumerate(refs):
        by_height.setdefault(h, []).append((position, i))
    heights, order = [], []
    for h, items in sorted(by_height.items()):
        heights.append((h, torch.tensor([i for _, i in items])))
        order.extend(position for position, _ in items)
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return heights, inverse


def gather(states, plan):
    heights, inverse = plan
    return torch.cat([states[h].index_select(0, idx) for h, idx in heights])[inverse]


def prepare(trees):
    words, inner, roots = levels_of(trees)
    levels = [(gather_plan([n[0] for n in level]), gather_plan([n[1] for n in level])) for level in inner]
    return torch.tensor(words), levels, gather_plan(roots)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--embed", type=int, default=1024)
    parser.add_argument("--vocabulary", type=int, default=1000)
    parser.add_argument("--classes", type=int, default=5)
    parser.add_argument("--calls", type=int, default=4, help="calls a size in the file (fold --calls)")
    parser.add_argument("--no-infer", action="store_true")
    parser.add_argument("--no-train", action="store_true")
    o = parser.parse_args()
    torch.set_num_threads(o.threads)
    torch.manual_seed(1)
    h, e = o.hidden, o.embed

    def param(*shape, scale=0.05):
        return (torch.rand(*shape) * 2 * scale - scale).requires_grad_()

    emb, w_leaf, b_leaf = param(o.vocabulary, e), param(3 * h, e), param(3 * h)
    u_l, u_r, b, w_out, b_out = param(5 * h, h), param(5 * h, h), param(5 * h), param(o.classes, h), param(o.classes)
    params = [emb, w_leaf, b_leaf, u_l, u_r, b, w_out, b_out]

    def roots_of(batch):
        words, levels, roots = batch
        g = (emb[words] @ w_leaf.T + b_leaf).chunk(3, 1)
        c = torch.sigmoid(g[0]) * torch.tanh(g[2])
        hs, cs = [torch.sigmoid(g[1]) * torch.tanh(c)], [c]
        for left, right in levels:
            hl, hr, cl, cr = gather(hs, left), gather(hs, right), gather(cs, left), gather(cs, right)
            g = (hl @ u_l.T + hr @ u_r.T + b).chunk(5, 1)
            c = torch.sigmoid(g[0]) * torch.tanh(g[2]) + torch.sigmoid(g[3]) * cl + torch.sigmoid(g[4]) * cr
            hs.append(torch.sigmoid(g[1]) * torch.tanh(c))
            cs.append(c)
        return gather(hs, roots) @ w_out.T + b_out

    lines = [json.loads(line) for line in open(o.trees)]
    sizes, start = [], time.perf_counter()
    for first in range(0, len(lines), o.calls):
        group = lines[first:first + o.calls]
        batches = [prepare(trees) for trees in group]  # outside the timed loop, as fold.cc builds its values
        labels = [torch.randint(o.classes, (len(trees),)) for trees in group]
        row = {"trees_a_call": len(group[0])}
        trees = sum(len(t) for t in group)
        # One untimed step first (PyTorch's allocator and BLAS buffers), as fold.cc's warm-up calls.
        torch.nn.functional.cross_entropy(roots_of(batches[0]), labels[0], reduction="sum").backward()
        if not o.no_infer:
            t0 = time.perf_counter()
            with torch.no_grad():
                for batch in batches:
                    roots_of(batch)
            row["infer"] = {"trees_per_s": trees / (time.perf_counter() - t0)}
        if not o.no_train:
            t0 = time.perf_counter()
            for batch, label in zip(batches, labels):
                loss = torch.nn.functional.cross_entropy(roots_of(batch), label, reduction="sum")
                torch.autograd.grad(loss, params)
            row["train"] = {"trees_per_s": trees / (time.perf_counter() - t0)}
        sizes.append(row)
    print(json.dumps({"impl": "torch_level_batched", "threads": torch.get_num_threads(), "hidden": h, "embed": e,
                      "sizes": sizes, "seconds": time.perf_counter() - start, **torch_peers.loaded_blas(torch),
                      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
