"""The Child-Sum Tree-LSTM of examples/treelstm/treelstm.pj, written in Python.

`program` is the same program as treelstm.pj (the engine prints the same
module for both, tests/python/test_lang.py): the types as classes, the
functions as Python functions that pejit reads, never runs (pejit.lang).
examples/python/treelstm.py --model python trains it.
"""
from pejit import lang as pj
from pejit.lang import List, Tensor, f32, i64

program = pj.Program()


@program.type
class Tree:
    Leaf: Tensor[(), i64]
    Node: (Tensor[(), i64], List["Tree"])


Matrix = program.alias("Matrix", Tensor[(None, None), f32])
Vector = program.alias("Vector", Tensor[(None,), f32])
Row = program.alias("Row", Tensor[(1, None), f32])  # one node's vector


@program.record
class State:  # a node's hidden state and cell
    h: Row
    c: Row


@program.record
class Params:
    emb: Matrix    # (V, E) embeddings of the tokens
    w_iou: Matrix  # (3H, E) input, output and update gates, from the node's input
    u_iou: Matrix  # (3H, H)   ... from the sum of the children's hidden states
    b_iou: Vector  # (3H,)
    w_f: Matrix    # (H, E) forget gate (one per child), from the node's input
    u_f: Matrix    # (H, H)   ... from that child's hidden state
    b_f: Vector    # (H,)
    w_out: Matrix  # (C, H) classifier on the root's hidden state
    b_out: Vector  # (C,)


@program.define
def embed(token: Tensor[(), i64], emb: Matrix) -> Row:
    return pj.take(emb, pj.reshape(token, shape=[1]))


@program.define
def leaf(x: Row, p: Params) -> State:
    iou = pj.chunk(pj.dense(x, p.w_iou, p.b_iou), chunks=3, axis=1)
    c = pj.sigmoid(iou[0]) * pj.tanh(iou[2])
    return (pj.sigmoid(iou[1]) * pj.tanh(c), c)


@program.define
def cell(x: Row, h_sum: Row, fc_sum: Row, p: Params) -> State:
    iou = pj.chunk(pj.dense(x, p.w_iou, p.b_iou) + pj.matmul(h_sum, p.u_iou, transpose_b=True), chunks=3, axis=1)
    c = pj.sigmoid(iou[0]) * pj.tanh(iou[2]) + fc_sum
    return (pj.sigmoid(iou[1]) * pj.tanh(c), c)


@program.define
def gated(child: State, wfx: Row, p: Params) -> State:
    f = pj.sigmoid(wfx + pj.matmul(child.h, p.u_f, transpose_b=True))
    return (child.h, f * child.c)


@program.define
def children(cs: List[Tree], wfx: Row, p: Params) -> State:
    match cs:
        case Cons(t, Nil()):
            return gated(tree(t, p), wfx, p)
        case Cons(t, rest):
            first = gated(tree(t, p), wfx, p)
            others = children(rest, wfx, p)
            return (first.h + others.h, first.c + others.c)


@program.define
def tree(t: Tree, p: Params) -> State:
    match t:
        case Leaf(digit):
            return leaf(embed(digit, p.emb), p)
        case Node(op, cs):
            x = embed(op, p.emb)
            sums = children(cs, pj.dense(x, p.w_f, p.b_f), p)
            return cell(x, sums.h, sums.c, p)


@program.define
def roots(ts: List[Tree], p: Params) -> Matrix:
    match ts:
        case Cons(t, Nil()):
            return tree(t, p).h
        case Cons(t, rest):
            return pj.concat(tree(t, p).h, roots(rest, p), axis=0)


@program.define
def logits(ts: List[Tree], p: Params) -> Matrix:
    return pj.dense(roots(ts, p), p.w_out, p.b_out)


@program.define
def loss(ts: List[Tree], labels: Tensor[(None,), i64], p: Params) -> Tensor[(), f32]:
    return pj.cross_entropy(logits(ts, p), labels)


@program.define
def infer(ts: List[Tree], p: Params) -> Tensor[(None,), i64]:
    return pj.argmax(logits(ts, p), axis=1)
