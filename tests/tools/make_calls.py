#!/usr/bin/env python3
"""Random calls of a model, as `pejit replay --calls` reads them: one JSON array
of arguments per line. Each call is a new minibatch (its structure drawn at
random, most of them unlike any other); the parameters are the same in every
call. Deterministic for a seed.

    make_calls.py MODEL CALLS SEED > calls.jsonl

MODEL is treelstm (examples/treelstm/treelstm.pj, @loss), seq_lstm or
tree_rnn (tests/tools/testdata, @loss), or char_lm, typed_ast, nmn, dag, act,
spinn, gnn or attention (tests/generic/models, @loss)."""
import argparse
import json
import random


def tensor(dtype, shape, data):
    return {"dtype": dtype, "shape": shape, "data": data}


def i64(v):
    return tensor("i64", [], [v])


def uniform(rng, *shape, scale=0.3):
    n = 1
    for d in shape:
        n *= d
    return tensor("f32", list(shape), [round(rng.uniform(-scale, scale), 5) for _ in range(n)])


def cons_list(items):
    out = {"ctor": "Nil", "fields": []}
    for item in reversed(items):
        out = {"ctor": "Cons", "fields": [item, out]}
    return out


def treelstm_tree(rng, depth):
    if depth == 0 or rng.random() < 0.35:
        return {"ctor": "Leaf", "fields": [i64(rng.randrange(10))]}
    children = [treelstm_tree(rng, depth - 1) for _ in range(rng.randint(1, 4))]
    return {"ctor": "Node", "fields": [i64(rng.randrange(10, 14)), cons_list(children)]}


def binary_tree(rng, depth, vocab, classes):
    if depth == 0 or rng.random() < 0.3:
        return {"ctor": "Leaf", "fields": [i64(rng.randrange(vocab)), i64(rng.randrange(classes))]}
    return {"ctor": "Node", "fields": [binary_tree(rng, depth - 1, vocab, classes),
                                       binary_tree(rng, depth - 1, vocab, classes), i64(rng.randrange(classes))]}


def spinn_transitions(tree, out):
    """A binary_tree's transitions for spinn.pj, appended to out: its leaves' words shifted, each node reduced."""
    if tree["ctor"] == "Leaf":
        out.append({"ctor": "Shift", "fields": [tree["fields"][0]]})
        return
    spinn_transitions(tree["fields"][0], out)
    spinn_transitions(tree["fields"][1], out)
    out.append({"ctor": "Reduce", "fields": []})


def adjacency(rng, n, density):
    """A random graph's (n, n) adjacency for gnn.pj: self-loops, each other edge with probability
    `density`, rows normalized to sum to 1."""
    rows = [[1.0 if i == j or rng.random() < density else 0.0 for j in range(n)] for i in range(n)]
    return tensor("f32", [n, n], [round(x / sum(row), 6) for row in rows for x in row])


def attention_params(rng, vocab, h, classes):
    """attention.pj's P: embeddings, the attention's and feed-forward block's weights, the layer norm's, the classifier."""
    return [uniform(rng, vocab, h, scale=1.0), uniform(rng, h, h), uniform(rng, h, h), uniform(rng, h, h),
            uniform(rng, h, h), uniform(rng, 2 * h, h), uniform(rng, 2 * h), uniform(rng, h, 2 * h), uniform(rng, h),
            tensor("f32", [h], [1.0] * h), tensor("f32", [h], [0.0] * h), uniform(rng, classes, h),
            uniform(rng, classes)]


def nat(n):
    return {"ctor": "Z", "fields": []} if n == 0 else {"ctor": "S", "fields": [nat(n - 1)]}


def ast_expr(rng, depth, vocab):
    kind = rng.choice(["Num", "Var"] if depth == 0 else ["Num", "Var", "Neg", "Bin", "Bin", "Call"])
    if kind in ("Num", "Var"):
        return {"ctor": kind, "fields": [i64(rng.randrange(vocab))]}
    if kind == "Neg":
        return {"ctor": "Neg", "fields": [ast_expr(rng, depth - 1, vocab)]}
    if kind == "Bin":
        return {"ctor": "Bin", "fields": [i64(rng.randrange(vocab)), ast_expr(rng, depth - 1, vocab),
                                          ast_expr(rng, depth - 1, vocab)]}
    args = [ast_expr(rng, depth - 1, vocab) for _ in range(rng.randint(0, 3))]
    return {"ctor": "Call", "fields": [i64(rng.randrange(vocab)), cons_list(args)]}


def ast_program(rng, depth, vocab, classes):
    stmts = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.7:
            stmts.append({"ctor": "Assign", "fields": [i64(rng.randrange(vocab)), ast_expr(rng, depth, vocab)]})
        else:
            stmts.append({"ctor": "Return", "fields": [ast_expr(rng, depth, vocab)]})
    return [cons_list(stmts), i64(rng.randrange(classes))]


def nmn_layout(rng, depth, vocab):
    """A module layout of at most `depth` levels (nmn.pj)."""
    kind = rng.randrange(3) if depth > 1 else 0
    if kind == 0:
        return {"ctor": "Find", "fields": [i64(rng.randrange(vocab))]}
    if kind == 1:
        return {"ctor": "Transform", "fields": [i64(rng.randrange(vocab)), nmn_layout(rng, depth - 1, vocab)]}
    return {"ctor": "And", "fields": [nmn_layout(rng, depth - 1, vocab), nmn_layout(rng, depth - 1, vocab)]}


def dag_parse(rng, leaves, n):
    """A binary parse over `leaves` leaves, each naming one of n positions (dag.pj)."""
    if leaves == 1:
        return {"ctor": "Tok", "fields": [i64(rng.randrange(n))]}
    left = rng.randint(1, leaves - 1)
    return {"ctor": "Join", "fields": [dag_parse(rng, left, n), dag_parse(rng, leaves - left, n)]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", choices=["treelstm", "seq_lstm", "tree_rnn", "char_lm", "typed_ast", "nmn", "dag", "act",
                                                     "spinn", "gnn", "attention"])
    parser.add_argument("calls", type=int, help="calls (lines) to write")
    parser.add_argument("seed", type=int)
    args = parser.parse_args()
    model, calls, seed = args.model, args.calls, args.seed
    rng = random.Random(seed)
    e, h, c = 6, 8, 3
    if model == "treelstm":
        c, v = 10, 14
        params = [uniform(rng, v, e), uniform(rng, 3 * h, e), uniform(rng, 3 * h, h), uniform(rng, 3 * h),
                  uniform(rng, h, e), uniform(rng, h, h), uniform(rng, h), uniform(rng, c, h), uniform(rng, c)]
        for _ in range(calls):
            n = rng.randint(1, 4)
            trees = [treelstm_tree(rng, 4) for _ in range(n)]
            labels = tensor("i64", [n], [rng.randrange(c) for _ in range(n)])
            print(json.dumps([cons_list(trees), labels, params]))
    elif model == "seq_lstm":
        v = 20
        params = [uniform(rng, v, e), uniform(rng, 4 * h, e), uniform(rng, 4 * h, h), uniform(rng, 4 * h),
                  uniform(rng, c, h), uniform(rng, c)]
        zero = tensor("f32", [1, h], [0.0] * h)
        for _ in range(calls):
            n = rng.randint(1, 4)
            seqs = [cons_list([i64(rng.randrange(v)) for _ in range(rng.randint(0, 7))]) for _ in range(n)]
            labels = tensor("i64", [n], [rng.randrange(c) for _ in range(n)])
            print(json.dumps([cons_list(seqs), labels, zero, params]))
    elif model == "typed_ast":
        v = 16
        params = [uniform(rng, v, h), uniform(rng, h, h), uniform(rng, h, 2 * h), uniform(rng, h), uniform(rng, h, h),
                  uniform(rng, h, h), uniform(rng, h, h), uniform(rng, c, h), uniform(rng, c)]
        for _ in range(calls):
            programs = [ast_program(rng, 3, v, c) for _ in range(rng.randint(1, 3))]
            print(json.dumps([cons_list(programs), params]))
    elif model == "char_lm":
        v = 12
        params = [uniform(rng, v, e), uniform(rng, 4 * h, e), uniform(rng, 4 * h, h), uniform(rng, 4 * h),
                  uniform(rng, v, h), uniform(rng, v)]
        zero = tensor("f32", [1, h], [0.0] * h)
        for _ in range(calls):
            sentences = [cons_list([cons_list([i64(rng.randrange(v)) for _ in range(rng.randint(1, 4))])
                                    for _ in range(rng.randint(1, 3))]) for _ in range(rng.randint(1, 3))]
            print(json.dumps([cons_list(sentences), zero, params]))
    elif model == "nmn":
        v, regions = 10, 4
        params = [uniform(rng, v, e), uniform(rng, e, e), uniform(rng, e), uniform(rng, c, e), uniform(rng, c)]
        for _ in range(calls):
            examples = [[nmn_layout(rng, 3, v), uniform(rng, regions, e, scale=1.0), i64(rng.randrange(c))]
                        for _ in range(rng.randint(1, 3))]
            print(json.dumps([cons_list(examples), params]))
    elif model == "dag":
        params = [uniform(rng, h, e), uniform(rng, h), uniform(rng, h, 2 * h), uniform(rng, h), uniform(rng, h, e),
                  uniform(rng, c, h + e), uniform(rng, c)]
        for _ in range(calls):
            examples = []
            for _ in range(rng.randint(1, 3)):
                n = rng.randint(2, 5)  # the sentence's length: each example its own
                examples.append([dag_parse(rng, rng.randint(1, 5), n), uniform(rng, n, e, scale=1.0),
                                 i64(rng.randrange(c))])
            print(json.dumps([cons_list(examples), params]))
    elif model == "act":
        # A halting weight large enough that the sigmoid saturates either way:
        # examples ponder from 1 to 12 steps.
        params = [uniform(rng, h, h, scale=0.5), uniform(rng, h, h, scale=0.5), uniform(rng, h),
                  uniform(rng, 1, h, scale=3.0), uniform(rng, c, h), uniform(rng, c)]
        for _ in range(calls):
            examples = [[uniform(rng, 1, h, scale=1.0), i64(rng.randrange(c))] for _ in range(rng.randint(1, 4))]
            print(json.dumps([cons_list(examples), params]))
    elif model == "spinn":
        v = 12
        params = [uniform(rng, v, h), uniform(rng, 2 * h, h), uniform(rng, 2 * h), uniform(rng, 5 * h, 2 * h),
                  uniform(rng, 5 * h), uniform(rng, c, h), uniform(rng, c)]
        for _ in range(calls):
            examples = []
            for _ in range(rng.randint(1, 3)):
                ops = []
                spinn_transitions(binary_tree(rng, 4, v, c), ops)
                if rng.random() < 0.1:
                    ops.append({"ctor": "Reduce", "fields": []})  # one reduce too many: the stack as it stands
                examples.append([cons_list(ops), i64(rng.randrange(c))])
            print(json.dumps([cons_list(examples), params]))
    elif model == "gnn":
        params = [uniform(rng, h, e), uniform(rng, h, h), uniform(rng, h, h), uniform(rng, h), uniform(rng, c, h),
                  uniform(rng, c)]
        for _ in range(calls):
            graphs = []
            for _ in range(rng.randint(1, 3)):
                n = rng.randint(1, 5)  # each graph its own node count
                adj = adjacency(rng, n, 0.4)
                graphs.append([uniform(rng, n, e, scale=1.0), adj, i64(rng.randrange(c))])
            print(json.dumps([cons_list(graphs), nat(rng.randint(0, 3)), params]))
    elif model == "attention":
        v = 12
        params = attention_params(rng, v, h, c)
        for _ in range(calls):
            sentences = []
            for _ in range(rng.randint(1, 3)):
                n = rng.randint(1, 6)  # each sentence its own length
                sentences.append([tensor("i64", [n], [rng.randrange(v) for _ in range(n)]), i64(rng.randrange(c))])
            print(json.dumps([cons_list(sentences), nat(rng.randint(0, 2)), params]))
    else:  # tree_rnn
        v = 20
        params = [uniform(rng, v, h), uniform(rng, h, 2 * h), uniform(rng, h), uniform(rng, c, h), uniform(rng, c)]
        for _ in range(calls):
            trees = [binary_tree(rng, 4, v, c) for _ in range(rng.randint(1, 3))]
            print(json.dumps([cons_list(trees), params]))


if __name__ == "__main__":
    main()
