#!/usr/bin/env python3
"""Models written as new users write them, run whole from process start
through `pejit replay` (reshuffled epochs of minibatches, gradients), beside
a PyTorch peer where one can be written (level-batched for the tree models,
masked for ACT, padded for the char LM). Prints a table and a JSON line.

    python3 bench/dynamic_models.py [--models tree_rnn,tree_rnn_fold] [--minibatches 60]
        [--batch 24] [--hidden 64] [--epochs 3] [--policies interpreter,eager,sync] [--torch]

Models (the .pj files the tests check against the interpreter):
  tree_rnn        binary tree RNN with a loss at every node; minibatch loss a plain recursion
                  over the list (tests/tools/testdata/tree_rnn.pj)
  tree_rnn_fold   the same network, its minibatch loss the prelude's @fold with a closure
                  (tests/generic/models/tree_rnn_fold.pj)
  tree_rnn_map    the same network, its minibatch loss the prelude's @map, then a recursion
                  summing the list it built (tests/generic/models/tree_rnn_map.pj)
  tree_rnn_gated  the same trees, each node's cell chosen by `if`s on its children's states
                  (nested: a tanh cell or one of two sigmoid-gated mixes), each leaf's by the
                  sign of its embedding's sum (tests/generic/models/tree_rnn_gated.pj)
  char_lm         a character LSTM language model over sentences as lists of words of
                  characters, nested @folds with closures (tests/generic/models/char_lm.pj)
  act             adaptive computation time: a step iterated per example until its halting
                  sum passes 0.99, sizes declared open (tests/generic/models/act.pj)
  typed_ast       a typed AST encoder, a cell per constructor, statement lists folded with
                  closures (tests/generic/models/typed_ast.pj)
  nmn             a neural module network: layouts of Find/Transform/And modules over each
                  example's 9-region feature map (tests/generic/models/nmn.pj)
  dag             a DAG encoder: parses whose leaves `take` rows of each example's sentence
                  matrix (5-25 rows, each example its own), attention over the rows at the
                  root (tests/generic/models/dag.pj)
  spinn           a SPINN shift-reduce encoder: each example its transitions, the stack a list
                  the program builds, a binary Tree-LSTM cell at each reduce
                  (tests/generic/models/spinn.pj)
  gnn             a graph network: graphs of 5-25 nodes (each its own count), 3 rounds of
                  message passing over the adjacency, a mean readout (tests/generic/models/gnn.pj)
  attention       a self-attention encoder: sentences of 5-25 tokens (each its own length), 2
                  layers of attention and feed-forward blocks with layer norms, weights shared,
                  a mean readout (tests/generic/models/attention.pj)

A policy may carry replay's flags after slashes: `sync/no-batch` compiles
each example's operations, branches and loops apart (what batching gives).
Each policy's run is its own process (`pejit replay --policy P --reshuffle`),
timed from its start: epoch 0 includes what compiling costs it. `compiled`
is the share of calls that ran native code only; `baseline` the share of
generic calls some of whose runs took a segment variant's baseline code
(registered kernels, no code generator: generic/executor.h) while its native
code compiled (the JSON's `generic_interpreted_share`).

Build first: bazel build --config=opt //tools:pejit. The PyTorch peer
(--torch) needs Debian's python3-torch (tools/setup.sh bench) and runs under
/usr/bin/python3."""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests/tools"))
import make_calls  # noqa: E402  the tests' JSON builders and random programs

MODELS = {
    "tree_rnn": "tests/tools/testdata/tree_rnn.pj",
    "tree_rnn_fold": "tests/generic/models/tree_rnn_fold.pj",
    "tree_rnn_map": "tests/generic/models/tree_rnn_map.pj",
    "tree_rnn_gated": "tests/generic/models/tree_rnn_gated.pj",
    "char_lm": "tests/generic/models/char_lm.pj",
    "act": "tests/generic/models/act.pj",
    "typed_ast": "tests/generic/models/typed_ast.pj",
    "nmn": "tests/generic/models/nmn.pj",
    "dag": "tests/generic/models/dag.pj",
    "spinn": "tests/generic/models/spinn.pj",
    "gnn": "tests/generic/models/gnn.pj",
    "attention": "tests/generic/models/attention.pj",
}


tensor, i64, cons_list = make_calls.tensor, make_calls.i64, make_calls.cons_list


def uniform(rng, *shape, scale=0.1):  # the benchmarks' weights are smaller than the tests'
    return make_calls.uniform(rng, *shape, scale=scale)


def binary_tree(rng, leaves, vocab, classes):
    """A random binary tree over `leaves` words (as a parse of a sentence)."""
    if leaves == 1:
        return {"ctor": "Leaf", "fields": [i64(rng.randrange(vocab)), i64(rng.randrange(classes))]}
    left = rng.randint(1, leaves - 1)
    return {"ctor": "Node", "fields": [binary_tree(rng, left, vocab, classes),
                                       binary_tree(rng, leaves - left, vocab, classes), i64(rng.randrange(classes))]}


def tree_rnn_calls(rng, minibatches, batch, hidden, vocab=1000, classes=5):
    params = [uniform(rng, vocab, hidden), uniform(rng, hidden, 2 * hidden), uniform(rng, hidden),
              uniform(rng, classes, hidden), uniform(rng, classes)]
    lines = []
    for _ in range(minibatches):
        trees = [binary_tree(rng, rng.randint(2, 20), vocab, classes) for _ in range(batch)]
        lines.append(json.dumps([cons_list(trees), params]))
    return lines


def char_lm_calls(rng, minibatches, batch, hidden, vocab=30, embed=32):
    params = [uniform(rng, vocab, embed), uniform(rng, 4 * hidden, embed), uniform(rng, 4 * hidden, hidden),
              uniform(rng, 4 * hidden), uniform(rng, vocab, hidden), uniform(rng, vocab)]
    zero = tensor("f32", [1, hidden], [0.0] * hidden)
    lines = []
    for _ in range(minibatches):
        sentences = [cons_list([cons_list([i64(rng.randrange(vocab)) for _ in range(rng.randint(1, 7))])
                                for _ in range(rng.randint(1, 5))]) for _ in range(batch)]
        lines.append(json.dumps([cons_list(sentences), zero, params]))
    return lines


def act_calls(rng, minibatches, batch, hidden, classes=5):
    params = [uniform(rng, hidden, hidden, scale=0.3), uniform(rng, hidden, hidden, scale=0.3), uniform(rng, hidden),
              uniform(rng, 1, hidden, scale=0.5), uniform(rng, classes, hidden), uniform(rng, classes)]
    lines = []
    for _ in range(minibatches):
        examples = [[uniform(rng, 1, hidden, scale=1.0), i64(rng.randrange(classes))] for _ in range(batch)]
        lines.append(json.dumps([cons_list(examples), params]))
    return lines


def typed_ast_calls(rng, minibatches, batch, hidden, vocab=100, classes=5):
    params = [uniform(rng, vocab, hidden), uniform(rng, hidden, hidden), uniform(rng, hidden, 2 * hidden),
              uniform(rng, hidden), uniform(rng, hidden, hidden), uniform(rng, hidden, hidden),
              uniform(rng, hidden, hidden), uniform(rng, classes, hidden), uniform(rng, classes)]
    lines = []
    for _ in range(minibatches):
        programs = [make_calls.ast_program(rng, 4, vocab, classes) for _ in range(batch)]
        lines.append(json.dumps([cons_list(programs), params]))
    return lines


def nmn_calls(rng, minibatches, batch, hidden, vocab=100, regions=9, classes=5):
    params = [uniform(rng, vocab, hidden), uniform(rng, hidden, hidden), uniform(rng, hidden),
              uniform(rng, classes, hidden), uniform(rng, classes)]
    lines = []
    for _ in range(minibatches):
        examples = [[make_calls.nmn_layout(rng, 4, vocab), uniform(rng, regions, hidden, scale=1.0),
                     i64(rng.randrange(classes))] for _ in range(batch)]
        lines.append(json.dumps([cons_list(examples), params]))
    return lines


def dag_calls(rng, minibatches, batch, hidden, classes=5, lengths=(5, 25)):
    embed = hidden
    params = [uniform(rng, hidden, embed), uniform(rng, hidden), uniform(rng, hidden, 2 * hidden), uniform(rng, hidden),
              uniform(rng, hidden, embed), uniform(rng, classes, hidden + embed), uniform(rng, classes)]
    lines = []
    for _ in range(minibatches):
        examples = []
        for _ in range(batch):
            n = rng.randint(*lengths)  # the sentence's length: each example its own
            examples.append([make_calls.dag_parse(rng, rng.randint(2, 12), n), uniform(rng, n, embed, scale=1.0),
                             i64(rng.randrange(classes))])
        lines.append(json.dumps([cons_list(examples), params]))
    return lines


def spinn_calls(rng, minibatches, batch, hidden, vocab=1000, classes=5):
    params = [uniform(rng, vocab, hidden), uniform(rng, 2 * hidden, hidden), uniform(rng, 2 * hidden),
              uniform(rng, 5 * hidden, 2 * hidden), uniform(rng, 5 * hidden), uniform(rng, classes, hidden),
              uniform(rng, classes)]
    lines = []
    for _ in range(minibatches):
        examples = []
        for _ in range(batch):
            ops = []
            make_calls.spinn_transitions(binary_tree(rng, rng.randint(2, 20), vocab, classes), ops)
            examples.append([cons_list(ops), i64(rng.randrange(classes))])
        lines.append(json.dumps([cons_list(examples), params]))
    return lines


def gnn_calls(rng, minibatches, batch, hidden, features=16, classes=5, nodes=(5, 25), rounds=3):
    params = [uniform(rng, hidden, features), uniform(rng, hidden, hidden), uniform(rng, hidden, hidden),
              uniform(rng, hidden), uniform(rng, classes, hidden), uniform(rng, classes)]
    lines = []
    for _ in range(minibatches):
        graphs = []
        for _ in range(batch):
            n = rng.randint(*nodes)  # each graph its own node count
            adj = make_calls.adjacency(rng, n, 0.2)
            graphs.append([uniform(rng, n, features, scale=1.0), adj, i64(rng.randrange(classes))])
        lines.append(json.dumps([cons_list(graphs), make_calls.nat(rounds), params]))
    return lines


def attention_calls(rng, minibatches, batch, hidden, vocab=50, classes=5, tokens=(5, 25), layers=2):
    params = make_calls.attention_params(rng, vocab, hidden, classes)
    lines = []
    for _ in range(minibatches):
        sentences = []
        for _ in range(batch):
            n = rng.randint(*tokens)  # each sentence its own length
            sentences.append([make_calls.tensor("i64", [n], [rng.randrange(vocab) for _ in range(n)]),
                              i64(rng.randrange(classes))])
        lines.append(json.dumps([cons_list(sentences), make_calls.nat(layers), params]))
    return lines


def tree_rnn_gated_calls(rng, minibatches, batch, hidden):
    """tree_rnn's minibatches, under a name of their own: the peer differs."""
    return tree_rnn_calls(rng, minibatches, batch, hidden)


CALLS = {"tree_rnn": tree_rnn_calls, "tree_rnn_fold": tree_rnn_calls, "tree_rnn_map": tree_rnn_calls,
         "tree_rnn_gated": tree_rnn_gated_calls, "char_lm": char_lm_calls, "act": act_calls,
         "typed_ast": typed_ast_calls, "nmn": nmn_calls, "dag": dag_calls, "spinn": spinn_calls,
         "gnn": gnn_calls, "attention": attention_calls}


# Gradients of the parameters only, as training takes them, where the
# minibatch holds float tensors too (a feature map, a sentence matrix); the
# older models keep replay's default (every argument that can hold a float:
# ACT's gradients include its input rows').
WRT = {"nmn": "1", "dag": "1", "act": "1", "spinn": "1", "gnn": "2", "attention": "2"}


def run_pejit(pejit, model, calls, policy, epochs, seed):
    policy, *flags = policy.split("/")  # e.g. sync/no-batch: replay's --no-batch too
    cmd = [pejit, "replay", os.path.join(ROOT, MODELS[model]), "--entry", "loss", "--calls", calls, "--grad",
           "--epochs", str(epochs), "--reshuffle", "--seed", str(seed), "--policy", policy] + ["--" + f for f in flags]
    if model in WRT:
        cmd += ["--wrt", WRT[model]]
    start = time.monotonic()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.monotonic() - start
    result = json.loads(out.strip().splitlines()[-1])
    result["process_seconds"] = wall
    return result


# The PyTorch peers: PEER_HEAD, then a model's code defining `params`,
# `batches` (each minibatch's inputs, prepared before timing) and
# `loss_of(batch)`, then PEER_TAIL, which times forward and backward.
PEER_HEAD = r'''
import json, sys, time
import torch
torch.set_num_threads(int(sys.argv[2]))
lines = open(sys.argv[1]).read().splitlines()
epochs = int(sys.argv[3])

def tensor_of(t):
    return torch.tensor(t["data"], dtype=torch.float32).reshape(t["shape"])

def unlist(v):
    out = []
    while v["ctor"] == "Cons":
        out.append(v["fields"][0])
        v = v["fields"][1]
    return out

def count(v):  # a Nat
    k = 0
    while v["ctor"] == "S":
        v, k = v["fields"][0], k + 1
    return k
'''

# Level-batched: the nodes of one height of every tree in one product.
TREE_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[1]]
emb, w, b, w_out, b_out = params
batches = []
for line in lines:
    trees = unlist(json.loads(line)[0])
    # Nodes by height: leaves (word, label), inner nodes (left, right, label) by index.
    heights, words, leaf_labels, inner = [], [], [], []  # inner[h]: (left, right, label) ids
    node_id = []
    def walk(t):
        if t["ctor"] == "Leaf":
            words.append(t["fields"][0]["data"][0]); leaf_labels.append(t["fields"][1]["data"][0])
            return ("leaf", len(words) - 1, 0)
        l, r = walk(t["fields"][0]), walk(t["fields"][1])
        h = max(l[2], r[2]) + 1
        while len(inner) < h: inner.append([])
        inner[h - 1].append((l, r, t["fields"][2]["data"][0]))
        return ("inner", (h - 1, len(inner[h - 1]) - 1), h)
    for t in trees: walk(t)
    batches.append((torch.tensor(words), torch.tensor(leaf_labels), inner))

def leaf(e):  # a leaf's state from its embedding rows
    return torch.tanh(e)

def cell(left, right):  # a level's states from its children's
    return torch.tanh(torch.cat([left, right], 1) @ w.T + b)

def loss_of(batch):
    words, leaf_labels, inner = batch
    h_leaf = leaf(emb[words])
    loss = torch.nn.functional.cross_entropy(h_leaf @ w_out.T + b_out, leaf_labels, reduction="sum")
    levels = []
    def rows(ids):
        return torch.stack([h_leaf[i] if kind == "leaf" else levels[i[0]][i[1]] for kind, i, _ in ids])
    for level in inner:
        h = cell(rows([n[0] for n in level]), rows([n[1] for n in level]))
        levels.append(h)
        labels = torch.tensor([n[2] for n in level])
        loss = loss + torch.nn.functional.cross_entropy(h @ w_out.T + b_out, labels, reduction="sum")
    return loss

'''

# Level-batched with masks: each level computes every branch for all its
# nodes and torch.where picks each node's (as a PyTorch user writes gates);
# loss_of calls these in place of TREE_PEER's.
GATED_PEER = TREE_PEER + r'''
def leaf(e):
    return torch.where((e.sum(1) > 0)[:, None], torch.tanh(e), e)

def cell(left, right):
    z = torch.cat([left, right], 1) @ w.T + b
    g = torch.sigmoid(z)
    heavier = ((left * left).sum(1) > (right * right).sum(1))[:, None]
    gated = (g.sum(1) > (1 - g).sum(1))[:, None]
    return torch.where(heavier, torch.tanh(z), torch.where(gated, g * left, (1 - g) * right + g))

'''

# Batched with a mask: the i-th step of every example still pondering is one
# step over the minibatch; a halted example keeps its output.
ACT_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[1]]
w, u, b, w_halt, w_out, b_out = params
batches = []
for line in lines:
    examples = unlist(json.loads(line)[0])
    batches.append((torch.cat([tensor_of(e[0]) for e in examples]), torch.tensor([e[1]["data"][0] for e in examples])))

def loss_of(batch):
    x, labels = batch
    n = x.shape[0]
    h = torch.zeros_like(x); out = torch.zeros_like(x); halted = torch.zeros(n)
    y = torch.zeros_like(x)
    active = torch.ones(n, dtype=torch.bool)
    for step in range(12):
        left = 12 - step
        nxt = torch.tanh(x @ w.T + b + h @ u.T)
        halt = torch.sigmoid((nxt @ w_halt.T).sum(1))
        total = halted + halt
        stop = (total > 0.99) | (left <= 1)
        done = (active & stop)[:, None]
        y = torch.where(done, out + nxt * (1 - halted)[:, None], y)
        going = active & ~stop
        out = torch.where(going[:, None], out + nxt * halt[:, None], out)
        h = torch.where(going[:, None], nxt, h)
        halted = torch.where(going, total, halted)
        active = going
        if not bool(active.any()):
            break
    return torch.nn.functional.cross_entropy(y @ w_out.T + b_out, labels, reduction="sum")
'''

# Padded: the characters of every sentence (its words run together, as the
# fold carries the state across them), one LSTM step over the minibatch per
# position, each character predicted from the state before it.
CHAR_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[2]]
emb, w, u, b, w_out, b_out = params
hidden = u.shape[1]
batches = []
for line in lines:
    sentences = unlist(json.loads(line)[0])
    seqs = [[c["data"][0] for word in unlist(s) for c in unlist(word)] for s in sentences]
    length = max(len(q) for q in seqs)
    chars = torch.tensor([q + [0] * (length - len(q)) for q in seqs])
    mask = torch.tensor([[1.0] * len(q) + [0.0] * (length - len(q)) for q in seqs])
    batches.append((chars, mask))

def loss_of(batch):
    chars, mask = batch
    n, length = chars.shape
    h = torch.zeros(n, hidden); c = torch.zeros(n, hidden)
    loss = 0
    for t in range(length):
        logp = torch.log_softmax(h @ w_out.T + b_out, 1)
        loss = loss - (logp.gather(1, chars[:, t:t + 1])[:, 0] * mask[:, t]).sum()
        g = (emb[chars[:, t]] @ w.T + b + h @ u.T).chunk(4, 1)
        c = torch.sigmoid(g[0]) * c + torch.sigmoid(g[1]) * torch.tanh(g[2])
        h = torch.sigmoid(g[3]) * torch.tanh(c)
    return loss
'''

# Eager, an example at a time (no batching across the minibatch): what a
# PyTorch user writes for a module network first.
NMN_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[1]]
emb, w_t, b_t, w_out, b_out = params

def layout(v):
    f = v["fields"]
    if v["ctor"] == "Find":
        return ("find", f[0]["data"][0])
    if v["ctor"] == "Transform":
        return ("transform", f[0]["data"][0], layout(f[1]))
    return ("and", layout(f[0]), layout(f[1]))

batches = []
for line in lines:
    examples = unlist(json.loads(line)[0])
    batches.append([(layout(e[0]), tensor_of(e[1]), torch.tensor([e[2]["data"][0]])) for e in examples])

def attend(q, fmap):
    return torch.softmax(q @ fmap.T, dim=1)

def module(m, fmap):
    if m[0] == "find":
        return attend(emb[m[1]:m[1] + 1], fmap)
    if m[0] == "transform":
        read = module(m[2], fmap) @ fmap
        return attend(torch.tanh(read @ w_t.T + b_t + emb[m[1]:m[1] + 1]), fmap)
    both = module(m[1], fmap) * module(m[2], fmap)
    return both / both.sum()

def loss_of(batch):
    total = 0
    for m, fmap, label in batch:
        read = module(m, fmap) @ fmap
        total = total + torch.nn.functional.cross_entropy(read @ w_out.T + b_out, label, reduction="sum")
    return total
'''

# Eager, an example at a time: each parse recursively, then its attention.
DAG_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[1]]
w_tok, b_tok, w_join, b_join, w_att, w_out, b_out = params

def parse(v):
    if v["ctor"] == "Tok":
        return v["fields"][0]["data"][0]
    return (parse(v["fields"][0]), parse(v["fields"][1]))

batches = []
for line in lines:
    examples = unlist(json.loads(line)[0])
    batches.append([(parse(e[0]), tensor_of(e[1]), torch.tensor([e[2]["data"][0]])) for e in examples])

def node(t, sentence):
    if isinstance(t, int):
        return torch.tanh(sentence[t:t + 1] @ w_tok.T + b_tok)
    return torch.tanh(torch.cat([node(t[0], sentence), node(t[1], sentence)], 1) @ w_join.T + b_join)

def loss_of(batch):
    total = 0
    for t, sentence, label in batch:
        h = node(t, sentence)
        att = torch.softmax(h @ (sentence @ w_att.T).T, dim=1)
        context = att @ sentence
        total = total + torch.nn.functional.cross_entropy(torch.cat([h, context], 1) @ w_out.T + b_out, label,
                                                          reduction="sum")
    return total
'''

# Eager, an example at a time: each expression recursively, the statements
# summed in order as the fold does.
AST_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[1]]
emb, w_neg, w_bin, b_bin, w_call, w_assign, w_ret, w_out, b_out = params

def token(t):
    return t["data"][0]

def expr(v):
    f = v["fields"]
    if v["ctor"] in ("Num", "Var"):
        return (v["ctor"], token(f[0]))
    if v["ctor"] == "Neg":
        return ("Neg", expr(f[0]))
    if v["ctor"] == "Bin":
        return ("Bin", token(f[0]), expr(f[1]), expr(f[2]))
    return ("Call", token(f[0]), [expr(a) for a in unlist(f[1])])

def stmt(v):
    f = v["fields"]
    return ("Assign", token(f[0]), expr(f[1])) if v["ctor"] == "Assign" else ("Return", expr(f[0]))

batches = []
for line in lines:
    programs = unlist(json.loads(line)[0])
    batches.append([([stmt(s) for s in unlist(p[0])], torch.tensor([token(p[1])])) for p in programs])

def embed(t):
    return emb[t:t + 1]

def encode(e):
    if e[0] == "Num":
        return torch.tanh(embed(e[1]))
    if e[0] == "Var":
        return embed(e[1])
    if e[0] == "Neg":
        return torch.tanh(encode(e[1]) @ w_neg.T)
    if e[0] == "Bin":
        return torch.tanh(torch.cat([encode(e[2]), encode(e[3])], 1) @ w_bin.T + b_bin + embed(e[1]))
    total = embed(e[1])
    for a in e[2]:
        total = total + encode(a)
    return torch.tanh(total @ w_call.T)

def loss_of(batch):
    total = 0
    for body, label in batch:
        h = embed(label.item()) * 0
        for s in body:
            if s[0] == "Assign":
                h = h + torch.tanh(encode(s[2]) @ w_assign.T + embed(s[1]))
            else:
                h = h + torch.tanh(encode(s[1]) @ w_ret.T)
        total = total + torch.nn.functional.cross_entropy(h @ w_out.T + b_out, label, reduction="sum")
    return total
'''

# Eager, an example at a time: its transitions on a Python list as the stack.
SPINN_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[1]]
emb, w_leaf, b_leaf, w, b, w_out, b_out = params

def transitions(v):
    return [op["fields"][0]["data"][0] if op["ctor"] == "Shift" else None for op in unlist(v)]

batches = []
for line in lines:
    examples = unlist(json.loads(line)[0])
    batches.append([(transitions(e[0]), torch.tensor([e[1]["data"][0]])) for e in examples])

def leaf(t):
    g0, g1 = (emb[t:t + 1] @ w_leaf.T + b_leaf).chunk(2, 1)
    c = torch.tanh(g0)
    return torch.sigmoid(g1) * torch.tanh(c), c

def compose(l, r):
    g = (torch.cat([l[0], r[0]], 1) @ w.T + b).chunk(5, 1)
    c = torch.sigmoid(g[0]) * torch.tanh(g[4]) + torch.sigmoid(g[1]) * l[1] + torch.sigmoid(g[2]) * r[1]
    return torch.sigmoid(g[3]) * torch.tanh(c), c

def loss_of(batch):
    total = 0
    for ops, label in batch:
        stack = []
        for t in ops:
            if t is not None:
                stack.append(leaf(t))
            else:
                right, left = stack.pop(), stack.pop()
                stack.append(compose(left, right))
        total = total + torch.nn.functional.cross_entropy(stack[-1][0] @ w_out.T + b_out, label, reduction="sum")
    return total
'''

# Padded: a minibatch's graphs as one (graphs, most nodes, ...) batch, the
# adjacency zero past each graph's nodes and the readout's mean masked.
GNN_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[2]]
w_in, w_msg, w_self, b, w_out, b_out = params

batches = []
for line in lines:
    call = json.loads(line)
    graphs = unlist(call[0])
    most = max(g[0]["shape"][0] for g in graphs)
    x = torch.zeros(len(graphs), most, graphs[0][0]["shape"][1])
    adj = torch.zeros(len(graphs), most, most)
    mask = torch.zeros(len(graphs), most, 1)
    for i, g in enumerate(graphs):
        n = g[0]["shape"][0]
        x[i, :n], adj[i, :n, :n], mask[i, :n] = tensor_of(g[0]), tensor_of(g[1]), 1
    labels = torch.tensor([g[2]["data"][0] for g in graphs])
    batches.append((x, adj, mask, mask.sum(1), labels, count(call[1])))

def loss_of(batch):
    x, adj, mask, nodes, labels, k = batch
    h = torch.tanh(x @ w_in.T)
    for _ in range(k):
        h = h + torch.relu(h @ w_self.T + b + (adj @ h) @ w_msg.T)
    readout = (h * mask).sum(1) / nodes
    return torch.nn.functional.cross_entropy(readout @ w_out.T + b_out, labels, reduction="sum")
'''

# Padded: a minibatch's sentences as one (sentences, longest, ...) batch,
# the keys past each sentence's length masked and the readout's mean too.
ATTENTION_PEER = r'''
first = json.loads(lines[0])
params = [tensor_of(p).requires_grad_() for p in first[2]]
emb, wq, wk, wv, wo, w1, b1, w2, b2, g, beta, w_out, b_out = params

batches = []
for line in lines:
    call = json.loads(line)
    sentences = unlist(call[0])
    longest = max(s[0]["shape"][0] for s in sentences)
    tokens = torch.zeros(len(sentences), longest, dtype=torch.long)
    mask = torch.zeros(len(sentences), longest, dtype=torch.bool)
    for i, s in enumerate(sentences):
        n = s[0]["shape"][0]
        tokens[i, :n], mask[i, :n] = torch.tensor(s[0]["data"]), True
    labels = torch.tensor([s[1]["data"][0] for s in sentences])
    keys = torch.zeros(len(sentences), 1, longest).masked_fill(~mask[:, None, :], float("-inf"))
    batches.append((tokens, keys, mask[:, :, None].float(), labels, count(call[1])))

def loss_of(batch):
    tokens, keys, rows, labels, k = batch
    x = emb[tokens]
    d = (x.shape[-1],)
    for _ in range(k):
        att = torch.softmax((x @ wq.T) @ (x @ wk.T).transpose(1, 2) * 0.125 + keys, -1)
        a = torch.nn.functional.layer_norm(x + (att @ (x @ wv.T)) @ wo.T, d, g, beta, 1e-5)
        x = torch.nn.functional.layer_norm(a + torch.relu(a @ w1.T + b1) @ w2.T + b2, d, g, beta, 1e-5)
    readout = (x * rows).sum(1) / rows.sum(1)
    return torch.nn.functional.cross_entropy(readout @ w_out.T + b_out, labels, reduction="sum")
'''

PEER_TAIL = r'''
rates = []
for epoch in range(epochs):
    start = time.perf_counter()
    for batch in batches:
        loss = loss_of(batch)
        grads = torch.autograd.grad(loss, params)
    rates.append(len(batches) / (time.perf_counter() - start))
# Which BLAS this process runs (Debian's torch may load the reference one through libblas.so.3).
blas = sorted({line.split()[-1] for line in open("/proc/self/maps") if "blas" in line.split()[-1]})
print(json.dumps({"calls_per_s": rates, "threads": torch.get_num_threads(), "blas": blas}))
'''

PEERS = {"tree_rnn_calls": ("level-batched", TREE_PEER), "tree_rnn_gated_calls": ("level-batched, masked", GATED_PEER),
         "act_calls": ("masked", ACT_PEER),
         "char_lm_calls": ("padded", CHAR_PEER), "nmn_calls": ("eager", NMN_PEER), "dag_calls": ("eager", DAG_PEER),
         "typed_ast_calls": ("eager", AST_PEER), "spinn_calls": ("eager", SPINN_PEER),
         "gnn_calls": ("padded", GNN_PEER), "attention_calls": ("padded", ATTENTION_PEER)}


def run_torch(peer, calls, epochs, threads):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    code = PEER_HEAD + PEERS[peer][1] + PEER_TAIL
    out = subprocess.run(["/usr/bin/python3", "-c", code, calls, str(threads), str(epochs)],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tree_rnn,tree_rnn_fold")
    parser.add_argument("--minibatches", type=int, default=60)
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--policies", default="interpreter,eager,sync")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--torch", action="store_true",
                        help="also the PyTorch peers (tree models level-batched, act masked, char_lm, gnn and "
                             "attention padded, nmn, dag, typed_ast and spinn eager), on 1 and 2 threads")
    parser.add_argument("--pejit", default=os.path.join(ROOT, "bazel-bin/tools/pejit"))
    o = parser.parse_args()
    results = {"minibatches": o.minibatches, "batch": o.batch, "hidden": o.hidden, "epochs": o.epochs, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        calls_of = {}
        for model in o.models.split(","):
            make = CALLS[model]
            calls = calls_of.setdefault(make, os.path.join(tmp, make.__name__ + ".jsonl"))
            if not os.path.exists(calls):
                with open(calls, "w") as f:
                    f.write("\n".join(make(random.Random(o.seed), o.minibatches, o.batch, o.hidden)) + "\n")
            for policy in o.policies.split(","):
                r = run_pejit(o.pejit, model, calls, policy, o.epochs, o.seed)
                row = {"model": model, "policy": policy, "process_seconds": r["process_seconds"],
                       "calls_per_s": [e["calls_per_s"] for e in r["epochs"]],
                       "compiled_share": [e["compiled_share"] for e in r["epochs"]],
                       "generic_interpreted_share": [e["generic_interpreted_share"] for e in r["epochs"]],
                       "interpreter_share": [e["interpreter_share"] for e in r["epochs"]]}
                results["runs"].append(row)
                print(f"{model:14s} {policy:12s} calls/s " + " ".join(f"{x:8.1f}" for x in row["calls_per_s"]) +
                      "  compiled " + " ".join(f"{100 * x:3.0f}%" for x in row["compiled_share"]) +
                      "  baseline " + " ".join(f"{100 * x:3.0f}%" for x in row["generic_interpreted_share"]) +
                      f"  ({r['process_seconds']:.1f} s)", flush=True)
        for make, calls in calls_of.items() if o.torch else []:
            peer = make.__name__
            if peer not in PEERS:
                continue
            for threads in (1, 2):
                r = run_torch(peer, calls, o.epochs, threads)
                results["runs"].append({"model": "torch_" + peer[:-6], "policy": f"{threads} threads",
                                        "peer": PEERS[peer][0], "calls_per_s": r["calls_per_s"], "blas": r["blas"]})
                print(f"{'torch ' + peer[:-6]:14s} {str(threads) + ' threads':12s} calls/s " +
                      " ".join(f"{x:8.1f}" for x in r["calls_per_s"]) + f"  ({PEERS[peer][0]}; " +
                      ", ".join(r["blas"]) + ")", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
