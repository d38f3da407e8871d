"""Fixtures of the pejit module's tests: engines over a small program."""
import os

import pytest

import pejit

PROGRAM = """
type Pair = {w: Tensor[(?, ?), f32], b: Tensor[(?,), f32]};

def @scale(%x: Tensor[(?,), f32], %k: Tensor[(), f32]) -> Tensor[(?,), f32] { mul(%x, %k) }

def @affine(%x: Tensor[(?, ?), f32], %p: Pair) -> Tensor[(?, ?), f32] {
  add(matmul(%x, %p.w), %p.b)
}

def @loss(%x: Tensor[(?, ?), f32], %p: Pair) -> Tensor[(), f32] {
  sum(tanh(@affine(%x, %p)))
}

def @pick(%xs: List[Tensor[(), f32]]) -> Tensor[(), f32] {
  match (%xs) { Cons(%x, %rest) => add(%x, @pick(%rest)), Nil => 0f32 }
}

def @both(%x: Tensor[(?,), f32]) -> (Tensor[(?,), f32], Tensor[(), i64]) { (neg(%x), 7) }

def @each(%xs: List[Tensor[(1, ?), f32]], %w: Tensor[(?, ?), f32]) -> List[Tensor[(1, ?), f32]] {
  match (%xs) { Cons(%x, %rest) => Cons(tanh(matmul(%x, %w)), @each(%rest, %w)), Nil => Nil }
}

def @count_down(%n: Tensor[(), i64], %acc: Tensor[(), f32]) -> Tensor[(), f32] {
  if (greater(%n, 0)) { @count_down(sub(%n, 1), mul(%acc, 2f32)) } else { %acc }
}
"""


def make_engine(policy):
    engine = pejit.Engine(policy=policy, workers=1)
    engine.module.add_source(PROGRAM, "program.pj")
    return engine


@pytest.fixture
def compiled():
    """Compiles each signature before its first call runs (policy sync)."""
    with make_engine("sync") as engine:
        yield engine


@pytest.fixture
def reference():
    """Runs everything in the interpreter: what compiled code must equal."""
    with make_engine("interpreter") as engine:
        yield engine


@pytest.fixture
def treelstm_source():
    with open(os.environ["PEJIT_TREELSTM"]) as f:
        return f.read()
