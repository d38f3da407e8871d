#!/usr/bin/python3
"""Train a Child-Sum Tree-LSTM inside a PyTorch model: the embedding, the
classifier, the loss and the optimizer are PyTorch's; the recursive tree
encoder is pejit's.

The encoder is `@roots` of examples/treelstm/treelstm.pj, called through
`pejit.torch.function`: a torch.autograd.Function whose arguments are torch
tensors (the parameters of the nn.Modules, passed without copies) and whose
result, the trees' root states, is a torch tensor that the classifier reads.
`loss.backward()` reaches the encoder's parameters, the embedding and the
classifier alike, and `torch.optim.SGD` updates them all.

    examples/python/torch_treelstm.py --size 1000 --epochs 3
    examples/python/torch_treelstm.py --mode torch   # the same model all in PyTorch, node by node
    examples/python/torch_treelstm.py --mode pejit   # all in pejit: the `loss` entry, SGD in numpy

The three modes start from the same parameters and take the same steps, so
they print the same losses (to float rounding). Run with Debian's
/usr/bin/python3 and pejit importable (README: "pejit from Python").
"""
import argparse
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import pejit
import pejit.torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import treelstm as example  # noqa: E402  (data and initial parameters)

NAMES = ("emb", "w_iou", "u_iou", "b_iou", "w_f", "u_f", "b_f", "w_out", "b_out")


class TreeLSTM(torch.nn.Module):
    """The model's parameters in PyTorch modules, named as treelstm.pj's Params."""

    def __init__(self, initial):
        super().__init__()
        p = {n: torch.tensor(np.asarray(a, np.float32)) for n, a in zip(NAMES, initial)}  # torch's memory
        vocabulary, embed = p["emb"].shape
        classes, hidden = p["w_out"].shape
        self.embedding = torch.nn.Embedding(vocabulary, embed, _weight=p["emb"])
        self.cell = torch.nn.ParameterDict({n: torch.nn.Parameter(p[n]) for n in NAMES[1:7]})
        self.classifier = torch.nn.Linear(hidden, classes)
        with torch.no_grad():
            self.classifier.weight.copy_(p["w_out"])
            self.classifier.bias.copy_(p["b_out"])

    def params(self):
        """treelstm.pj's Params record, by field name, of this model's tensors."""
        return dict(self.cell, emb=self.embedding.weight, w_out=self.classifier.weight,
                    b_out=self.classifier.bias)


class WithPejitEncoder(TreeLSTM):
    """The encoder is pejit's @roots; everything else is PyTorch."""

    def __init__(self, initial, engine, pullbacks=True):
        super().__init__(initial)
        self.roots = pejit.torch.function(engine, "roots", pullbacks=pullbacks)

    def forward(self, trees, labels):
        # @roots reads emb and the cell's parameters; w_out and b_out get zero gradients from it.
        return F.cross_entropy(self.classifier(self.roots(trees, self.params())), labels)


class AllTorch(TreeLSTM):
    """The same model in PyTorch, one node at a time (trees are (token, [children]))."""

    def node(self, tree):
        token, children = tree
        c = self.cell
        x = self.embedding.weight[token:token + 1]
        if not children:
            iou = x @ c["w_iou"].T + c["b_iou"]
            i, o, u = iou.chunk(3, dim=1)
            cell = torch.sigmoid(i) * torch.tanh(u)
            return torch.sigmoid(o) * torch.tanh(cell), cell
        wfx = x @ c["w_f"].T + c["b_f"]
        h_sum, fc_sum = 0, 0
        for child in children:
            h, cell = self.node(child)
            f = torch.sigmoid(wfx + h @ c["u_f"].T)
            h_sum, fc_sum = h_sum + h, fc_sum + f * cell
        iou = x @ c["w_iou"].T + c["b_iou"] + h_sum @ c["u_iou"].T
        i, o, u = iou.chunk(3, dim=1)
        cell = torch.sigmoid(i) * torch.tanh(u) + fc_sum
        return torch.sigmoid(o) * torch.tanh(cell), cell

    def forward(self, trees, labels):
        roots = torch.cat([self.node(t)[0] for t in trees], dim=0)
        return F.cross_entropy(self.classifier(roots), labels)


def train(mode, batches, initial, epochs, lr, engine=None, on_step=None, pullbacks=True):
    """Losses of `epochs` passes of SGD over `batches` ([(trees, pejit trees, labels)]) in `mode`
    (pullbacks: pejit.torch.function's)."""
    losses = []
    if mode == "pejit":
        loss = engine.entry("loss", wrt=2)
        params = {n: pejit_array(a) for n, a in zip(NAMES, initial)}
        for _ in range(epochs):
            for _, trees, labels in batches:
                value, grads = loss(trees, labels, params)
                for n in NAMES:
                    params[n] -= np.float32(lr) * grads[n]
                losses.append(float(value))
                if on_step:
                    on_step()
        return losses
    model = WithPejitEncoder(initial, engine, pullbacks) if mode == "interop" else AllTorch(initial)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(epochs):
        for raw, trees, labels in batches:
            optimizer.zero_grad(set_to_none=True)
            value = model(trees if mode == "interop" else raw, torch.from_numpy(labels))
            value.backward()
            optimizer.step()
            losses.append(float(value))
            if on_step:
                on_step()
    return losses


def pejit_array(a):
    """A float32 copy pejit can share (64-byte aligned), as torch's allocator gives."""
    return torch.from_numpy(np.array(a, np.float32)).clone().numpy()


def make_batches(engine, examples, batch):
    m = engine.module
    out = []
    for i in range(0, len(examples), batch):
        chunk = examples[i:i + batch]
        out.append(([t for t, _ in chunk], [example.tree_value(m, t) for t, _ in chunk],
                    np.array([y for _, y in chunk], np.int64)))
    return out


def main():
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    a.add_argument("--mode", choices=["interop", "torch", "pejit"], default="interop",
                   help="interop: the encoder in pejit, the rest in PyTorch")
    a.add_argument("--size", type=int, default=1000, help="generated ListOps training expressions")
    a.add_argument("--batch", type=int, default=25)
    a.add_argument("--embed", type=int, default=64)
    a.add_argument("--hidden", type=int, default=64)
    a.add_argument("--epochs", type=int, default=3)
    a.add_argument("--lr", type=float, default=0.05)
    a.add_argument("--seed", type=int, default=1)
    a.add_argument("--policy", default="eager", help="eager, hot:N, interpreter or sync")
    a.add_argument("--log", default="", help="the JIT's log on stderr: off, info, debug or trace")
    o = a.parse_args()
    if o.batch < 1 or o.size < 1 or o.epochs < 0:
        a.error("--batch and --size must be at least 1, --epochs at least 0")
    torch.set_num_threads(1)  # small matrices; the engine has its own threads
    pejit.set_blas_threads(1)
    rng = random.Random(o.seed)
    examples = []
    while len(examples) < o.size:
        tree = example.listops_generate(rng)
        examples.append((tree, example.listops_value(tree)))
    initial = example.init_params(np.random.default_rng(o.seed), example.LISTOPS_VOCABULARY, o.embed, o.hidden,
                                  example.LISTOPS_CLASSES)
    with pejit.Engine(policy=o.policy, log=o.log) as engine:
        with open(example.MODEL) as f:
            engine.module.add_source(f.read(), "treelstm.pj")
        batches = make_batches(engine, examples, o.batch)
        start = time.perf_counter()
        losses = train(o.mode, batches, initial, o.epochs, o.lr, engine)
        seconds = time.perf_counter() - start
    per_epoch = len(batches)
    for e in range(o.epochs):
        chunk = losses[e * per_epoch:(e + 1) * per_epoch]
        print(f"epoch {e}: mean loss {sum(chunk) / len(chunk):.6f}")
    print(f"{o.mode}: {len(losses)} steps in {seconds:.2f} s ({len(losses) / seconds:.1f} steps/s), "
          f"copies in: {pejit.transfers()['copied_in']}")


if __name__ == "__main__":
    main()
