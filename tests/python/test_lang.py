"""pejit.lang: models written as Python functions, read (never run) into the
pejit language, with every error at its Python line."""
import inspect
import os
import re
import sys

import numpy as np
import pytest

import pejit
from pejit import lang as pj
from pejit.lang import Fn, List, Tensor, f32, i64

sys.path.insert(0, os.path.join(os.path.dirname(os.environ["PEJIT_TREELSTM"]), "..", "python"))
import treelstm_model  # noqa: E402
from test_treelstm import CLASSES, init_params, random_tree  # noqa: E402

HERE = os.path.abspath(__file__)


def line_of(fn, text):
    """The line of this file where `text` first appears inside fn's source."""
    lines, first = inspect.getsourcelines(fn.fn if isinstance(fn, pj.Definition) else fn)
    return first + next(i for i, l in enumerate(lines) if text in l)


def test_the_tree_lstm_written_in_python_is_the_same_program_as_treelstm_pj(treelstm_source):
    with pejit.Engine(policy="interpreter") as text_engine, pejit.Engine(policy="sync", workers=1) as py_engine:
        text_engine.module.add_source(treelstm_source, "treelstm.pj")
        treelstm_model.program.add_to(py_engine)
        assert py_engine.module.text() == text_engine.module.text()  # the same IR, printed
        rng = np.random.default_rng(11)
        params = init_params(rng)
        for _ in range(3):
            trees = [random_tree(text_engine.module, rng, 4) for _ in range(5)]
            py_trees = [random_tree(py_engine.module, np.random.default_rng(0), 0)]  # warm the constructors
            labels = rng.integers(CLASSES, size=5)
            want, want_grads = text_engine.entry("loss", wrt=2)(trees, labels, params)
            got, got_grads = py_engine.entry("loss", wrt=2)(_rebuild(py_engine.module, trees), labels, params)
            assert float(got) == pytest.approx(float(want), rel=1e-5)
            for g, w in zip(got_grads, want_grads):
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
            del py_trees


def _rebuild(m, trees):
    """Trees made by one engine's constructors, rebuilt with another's."""
    def one(t):
        token = int(t.fields[0])
        if t.ctor == "Leaf":
            return m.Leaf(token)
        children, node = [], t.fields[1]
        while node.ctor == "Cons":
            children.append(one(node.fields[0]))
            node = node.fields[1]
        return m.Node(token, children)
    return [one(t) for t in trees]


closures = pj.Program()


@closures.define
def weighted_sum(xs: List[Tensor[(None,), f32]], w: Tensor[(None,), f32]) -> Tensor[(None,), f32]:
    def step(acc: Tensor[(None,), f32], x: Tensor[(None,), f32]) -> Tensor[(None,), f32]:
        return acc + w * x  # w is captured
    return fold(step, pj.zeros_like(w), xs)  # noqa: F821  (the prelude's)


@closures.define
def relu_or_double(x: Tensor[(None,), f32]) -> Tensor[(None,), f32]:
    if pj.sum(x) > 0.0:
        return pj.relu(x)
    scale = 2.0
    return x * scale


@closures.define
def depth(t: "Tree2") -> Tensor[(), i64]:  # declared below: a forward reference
    match t:
        case Tip():
            return 0
        case Fork(left, right):
            a, b = (depth(left), depth(right))
            return 1 + (a if a > b else b)


@closures.type
class Tree2:
    Tip: ()
    Fork: ("Tree2", "Tree2")


@closures.define
def apply_twice(f: Fn[[Tensor[(None,), f32]], Tensor[(None,), f32]], x: Tensor[(None,), f32]) -> Tensor[(None,), f32]:
    return f(f(x))


@closures.define
def use_apply_twice(x: Tensor[(None,), f32]) -> Tensor[(None,), f32]:
    def halve(v: Tensor[(None,), f32]) -> Tensor[(None,), f32]:
        return v * 0.5
    return apply_twice(halve, -x)


CLOSURES_TEXT = """
def @weighted_sum(%xs: List[Tensor[(?,), f32]], %w: Tensor[(?,), f32]) -> Tensor[(?,), f32] {
  let %step = fn (%acc: Tensor[(?,), f32], %x: Tensor[(?,), f32]) -> Tensor[(?,), f32] { add(%acc, mul(%w, %x)) };
  @fold(%step, zeros_like(%w), %xs)
}
def @relu_or_double(%x: Tensor[(?,), f32]) -> Tensor[(?,), f32] {
  if (greater(sum(%x), 0.0f32)) { relu(%x) } else { let %scale = 2.0f32; mul(%x, %scale) }
}
def @depth(%t: Tree2) -> Tensor[(), i64] {
  match (%t) {
    Tip => { 0 },
    Fork(%left, %right) => {
      let %tuple_1_ = (@depth(%left), @depth(%right)); let %a = %tuple_1_.0; let %b = %tuple_1_.1;
      add(1, if (greater(%a, %b)) { %a } else { %b })
    },
  }
}
type Tree2 { Tip, Fork(Tree2, Tree2) }
def @apply_twice(%f: fn(Tensor[(?,), f32]) -> Tensor[(?,), f32], %x: Tensor[(?,), f32]) -> Tensor[(?,), f32] { %f(%f(%x)) }
def @use_apply_twice(%x: Tensor[(?,), f32]) -> Tensor[(?,), f32] {
  let %halve = fn (%v: Tensor[(?,), f32]) -> Tensor[(?,), f32] { mul(%v, 0.5f32) };
  @apply_twice(%halve, neg(%x))
}
"""


@pytest.mark.parametrize("policy", ["interpreter", "sync"])
def test_closures_the_prelude_branches_and_matches_read_as_their_text(policy):
    with pejit.Engine(policy=policy, workers=1) as py_engine, pejit.Engine(policy="interpreter") as text_engine:
        closures.add_to(py_engine)
        text_engine.module.add_source(CLOSURES_TEXT, "closures.pj")
        assert py_engine.module.text() == text_engine.module.text()
        xs = [np.array([1, 2], np.float32), np.array([3, -5], np.float32)]
        w = np.array([0.5, 2], np.float32)
        np.testing.assert_allclose(py_engine.entry("weighted_sum")(xs, w), [2.0, -6.0])
        np.testing.assert_allclose(py_engine.entry("relu_or_double")(np.array([3, -1], np.float32)), [3, 0])
        np.testing.assert_allclose(py_engine.entry("relu_or_double")(np.array([-3, 1], np.float32)), [-6, 2])
        m = py_engine.module
        t = m.Fork(m.Fork(m.Tip(), m.Fork(m.Tip(), m.Tip())), m.Tip())
        assert int(py_engine.entry("depth")(t)) == 3
        np.testing.assert_allclose(py_engine.entry("use_apply_twice")(np.array([4, -8], np.float32)), [-1, 2])


def test_errors_of_the_engine_point_at_the_python_line():
    bad = pj.Program()

    @bad.define
    def wrong_result(x: Tensor[(None,), f32]) -> Tensor[(None,), f32]:
        y = pj.tanh(x)
        return pj.sum(y, axes=[0]) > 1.0  # a bool scalar, not the declared tensor

    with pejit.Engine(policy="interpreter") as engine:
        with pytest.raises(pejit.IrError) as error:
            bad.add_to(engine)
    location = re.match(r"(.*):(\d+):(\d+): ", str(error.value))
    assert location, str(error.value)
    assert location.group(1) == HERE
    # The checker names the body (its first statement's line), inside the function's lines.
    assert line_of(wrong_result, "def wrong_result") <= int(location.group(2)) <= line_of(wrong_result, "return pj.sum")
    assert "result of @wrong_result is Tensor[(), bool], but its declared type is Tensor[(?,), f32]" in str(error.value)


def _syntax_error(fn_source_marker, build):
    program = pj.Program()
    fn = build(program)
    with pytest.raises(SyntaxError) as error:
        program.text()
    assert error.value.filename == HERE
    assert error.value.lineno == line_of(fn, fn_source_marker), (error.value.lineno, str(error.value))
    return str(error.value.msg)


def test_what_is_not_read_is_a_syntax_error_at_its_line():
    def loop(p):
        @p.define
        def f(x: Tensor[(), f32]) -> Tensor[(), f32]:
            for _ in range(3):
                x = x + 1.0
            return x
        return f
    assert "recursion" in _syntax_error("for _ in", loop)

    def lam(p):
        @p.define
        def f(x: Tensor[(), f32]) -> Tensor[(), f32]:
            g = lambda y: y  # noqa: E731
            return g(x)
        return f
    assert "nested def with annotations" in _syntax_error("lambda", lam)

    def untyped(p):
        @p.define
        def f(x) -> Tensor[(), f32]:
            return x
        return f
    assert "needs a type annotation" in _syntax_error("def f(x)", untyped)

    def falls_through(p):
        @p.define
        def f(x: Tensor[(), f32]) -> Tensor[(), f32]:
            if x > 0.0:
                return x
        return f
    assert "goes on when this if's condition is false" in _syntax_error("if x > 0.0", falls_through)

    def unknown(p):
        @p.define
        def f(x: Tensor[(), f32]) -> Tensor[(), f32]:
            return helper(x)  # noqa: F821
        return f
    assert "helper is not a local" in _syntax_error("return helper", unknown)


def test_a_definition_is_not_called_from_python():
    with pytest.raises(TypeError, match=r"engine.entry\('loss'\)"):
        treelstm_model.loss(1, 2, 3)
