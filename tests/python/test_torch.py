"""pejit.torch: entries as differentiable functions of torch tensors, passed
without copies, inside a model whose other parts are PyTorch's."""
import os
import random
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # tools/setup.sh installs python3-torch: skipped only off CI

import pejit  # noqa: E402
import pejit.torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.environ["PEJIT_TREELSTM"]), "..", "python"))
import torch_treelstm  # noqa: E402
import treelstm as example  # noqa: E402

torch.set_num_threads(1)

PROGRAM = """
type Layer = {w: Tensor[(?, ?), f32], b: Tensor[(?,), f32]};

def @encode(%x: Tensor[(?, ?), f32], %p: Layer) -> Tensor[(?, ?), f32] {
  tanh(add(matmul(%x, %p.w), %p.b))
}

def @two(%x: Tensor[(?, ?), f32], %v: Tensor[(?,), f32]) -> (Tensor[(?, ?), f32], (Tensor[(?,), f32], Tensor[(), i64])) {
  (mul(%x, %x), (sigmoid(%v), 3))
}

def @energy(%x: Tensor[(?, ?), f32], %p: Layer) -> Tensor[(), f32] {
  sum(@encode(%x, %p))
}

def @first(%xs: List[Tensor[(?,), f32]]) -> Tensor[(?,), f32] {
  match (%xs) { Cons(%x, %rest) => %x, Nil => zeros(shape=[1]) }
}

def @generic_id[A](%a: A) -> A { %a }

def @running(%xs: List[Tensor[(1, 4), f32]], %w: Tensor[(4, 4), f32]) -> Tensor[(1, 4), f32] {
  match (%xs) {
    Nil => zeros(shape=[1, 4]),
    Cons(%x, %rest) => tanh(add(%x, matmul(@running(%rest, %w), %w))),
  }
}
"""


@pytest.fixture(params=["interpreter", "sync"])
def engine(request):
    with pejit.Engine(policy=request.param, workers=1) as e:
        e.module.add_source(PROGRAM, "program.pj")
        yield e


def leaves(seed, *shapes):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, requires_grad=True) for s in shapes]


def test_gradients_of_a_matrix_result_reach_every_tensor_as_torchs_own(engine):
    x, w, b = leaves(1, (5, 3), (3, 4), (4,))
    seed = torch.randn(5, 4, generator=torch.Generator().manual_seed(2))
    encode = pejit.torch.function(engine, "encode")
    h = encode(x, {"w": w, "b": b})
    (h * seed).sum().backward()
    rx, rw, rb = (t.detach().clone().requires_grad_() for t in (x, w, b))
    want = torch.tanh(rx @ rw + rb)
    (want * seed).sum().backward()
    torch.testing.assert_close(h.detach(), want.detach(), rtol=1e-5, atol=1e-6)
    for got, ref in ((x, rx), (w, rw), (b, rb)):
        torch.testing.assert_close(got.grad, ref.grad, rtol=1e-5, atol=1e-6)
    assert encode.stats["pullback_calls"] == 1 and encode.stats["grad_calls"] == 0


def test_only_tensors_that_require_gradients_get_them(engine):
    x, w, b = leaves(3, (2, 3), (3, 4), (4,))
    x.requires_grad_(False)
    encode = pejit.torch.function(engine, "encode")
    encode(x, {"w": w, "b": b}).sum().backward()
    assert x.grad is None and w.grad is not None and b.grad is not None
    with torch.no_grad():
        encode(x, {"w": w, "b": b})
    assert encode.stats["pullback_calls"] == 1  # no gradient asked for under no_grad


def test_tuple_results_each_get_their_cotangent(engine):
    x, v = leaves(4, (3, 2), (5,))
    two = pejit.torch.function(engine, "two")
    square, (gate, three) = two(x, v)
    assert three.dtype == torch.int64 and int(three) == 3 and not three.requires_grad
    (2 * square.sum() + (gate * torch.arange(5.0)).sum()).backward()
    torch.testing.assert_close(x.grad, 4 * x.detach())
    s = torch.sigmoid(v.detach())
    torch.testing.assert_close(v.grad, s * (1 - s) * torch.arange(5.0), rtol=1e-5, atol=1e-6)


def test_a_scalar_result_runs_once_in_grad_mode_and_backward_scales_it(engine):
    x, w, b = leaves(5, (4, 3), (3, 2), (2,))
    energy = pejit.torch.function(engine, "energy")
    e = energy(x, (w, b))  # a record given as a tuple in field order
    (3.0 * e).backward()
    rx, rw, rb = (t.detach().clone().requires_grad_() for t in (x, w, b))
    (3.0 * torch.tanh(rx @ rw + rb).sum()).backward()
    assert float(e) == pytest.approx(float(torch.tanh(rx @ rw + rb).sum()), rel=1e-5)
    for got, ref in ((x, rx), (w, rw), (b, rb)):
        torch.testing.assert_close(got.grad, ref.grad, rtol=1e-5, atol=1e-6)
    assert energy.stats == {"calls": 1, "grad_calls": 1, "pullback_calls": 0, "vjp_calls": 0, "scalars_out": 1,
                            "bool_copies_out": 0}


def running_reference(xs, w):
    h = torch.zeros(1, 4)
    for x in reversed(xs):
        h = torch.tanh(x + h @ w)
    return h


def test_a_recursions_backward_runs_from_its_forwards_state(engine):
    """Each backward hands torch's cotangent to the pullback of its forward:
    the forward is not run again, whichever tier served it."""
    running = pejit.torch.function(engine, "running")
    g = torch.Generator().manual_seed(6)
    for n in (3, 5, 2):
        xs = [torch.randn(1, 4, generator=g) for _ in range(n)]
        w = (0.5 * torch.randn(4, 4, generator=g)).requires_grad_()
        seed = torch.randn(1, 4, generator=g)
        (running(xs, w) * seed).sum().backward()
        rw = w.detach().clone().requires_grad_()
        (running_reference(xs, rw) * seed).sum().backward()
        torch.testing.assert_close(w.grad, rw.grad, rtol=1e-5, atol=1e-6)
    assert running.stats["pullback_calls"] == 3 and running.stats["vjp_calls"] == 0
    tier = "calls_interpreter" if engine.policy == "interpreter" else "calls_generic"
    assert engine.entry("running", wrt=(1,)).stats()[tier] == 3


def test_a_second_backward_through_a_retained_graph_computes_the_forward_again(engine):
    """A pullback runs once: backward(retain_graph=True) twice takes the
    vector-Jacobian product entry the second time, with the same gradients."""
    x, w, b = leaves(9, (3, 3), (3, 2), (2,))
    encode = pejit.torch.function(engine, "encode")
    h = encode(x, {"w": w, "b": b})
    h.sum().backward(retain_graph=True)
    first = w.grad.clone()
    h.sum().backward()
    torch.testing.assert_close(w.grad, 2 * first, rtol=1e-5, atol=1e-6)
    assert (encode.stats["pullback_calls"], encode.stats["vjp_calls"]) == (1, 1)


def test_an_entry_the_generic_tier_does_not_serve_gets_its_pullback_compiled_per_minibatch(engine):
    """A function of tensors alone has no structure for the generic tier to
    walk: its pullback is per-minibatch code (a forward keeping its
    residuals, and a backward), or the interpreter's tape under policy
    interpreter; pullbacks=False takes the vector-Jacobian product entry."""
    x, w, b = leaves(8, (2, 3), (3, 4), (4,))
    encode = pejit.torch.function(engine, "encode")
    old_path = pejit.torch.function(engine, "encode", pullbacks=False)
    for fn in (encode, old_path):
        for _ in range(2):
            fn(x, {"w": w, "b": b}).sum().backward()
    rx, rw, rb = (t.detach().clone().requires_grad_() for t in (x, w, b))
    for _ in range(4):
        torch.tanh(rx @ rw + rb).sum().backward()
    for got, ref in ((x, rx), (w, rw), (b, rb)):
        torch.testing.assert_close(got.grad, ref.grad, rtol=1e-5, atol=1e-6)
    assert (encode.stats["pullback_calls"], encode.stats["vjp_calls"]) == (2, 0)
    assert (old_path.stats["pullback_calls"], old_path.stats["vjp_calls"]) == (0, 2)
    stats = engine.entry("encode").stats()  # both modes: the pullbacks and old_path's value calls
    if engine.policy == "interpreter":
        assert stats["calls_interpreter"] == 4
    else:
        assert stats["calls_native"] == 4 and stats["compiled"] == 2


def test_entry_value_and_pullback_takes_a_cotangent_shaped_like_the_value(engine):
    """The engine's own API: jax.vjp's pair; a cotangent is checked against
    the value; None stands for zeros; a pullback runs once."""
    two = engine.entry("two", wrt=(0, 1))
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    v = np.linspace(-1, 1, 5).astype(np.float32)
    (square, (gate, three)), pullback = two.value_and_pullback(x, v)
    assert pullback.tier in ("native", "generic", "interpreter") and int(three) == 3
    with pytest.raises(ValueError, match=r"@two: the cotangent at result.0 is Tensor\[\(2, 2\), f32\] where the "
                                         r"result is Tensor\[\(3, 2\), f32\]"):
        pullback((np.ones((2, 2), np.float32), (None, None)))
    with pytest.raises(TypeError, match="@two cotangent: expected a tuple of 2 like the result"):
        pullback(np.ones((3, 2), np.float32))
    gx, gv = pullback((np.ones((3, 2), np.float32), (None, None)))
    np.testing.assert_allclose(gx, 2 * x)
    np.testing.assert_allclose(gv, np.zeros(5, np.float32))
    with pytest.raises(RuntimeError, match="a pullback runs once"):
        pullback((np.ones((3, 2), np.float32), (None, None)))


def test_aligned_contiguous_tensors_cross_without_copies_others_are_copied(engine):
    x, w, b = leaves(6, (8, 3), (3, 4), (4,))
    encode = pejit.torch.function(engine, "encode")
    pejit.reset_transfers()
    (encode(x, {"w": w, "b": b}) * torch.ones(8, 4)).sum().backward()
    t = pejit.transfers()
    assert t["copied_in"] == 0 and t["shared_in"] >= 4  # the cotangent too
    pejit.reset_transfers()
    encode(x, {"w": w, "b": b}).sum().backward()  # sum's cotangent is one number broadcast: copied
    assert pejit.transfers()["copied_in"] == 1 and pejit.transfers()["copied_in_bytes"] == 8 * 4 * 4
    assert t["exported"] >= 4  # the result and three gradients, through DLPack
    strided = x.detach()[:, 1:3]  # not row-major compact
    pejit.reset_transfers()
    got = encode(strided, {"w": w[1:3], "b": b})
    assert pejit.transfers()["copied_in"] == 2 and pejit.transfers()["copied_in_bytes"] == (8 * 2 + 2 * 4) * 4
    torch.testing.assert_close(got, torch.tanh(strided @ w[1:3] + b), rtol=1e-5, atol=1e-6)


def test_a_result_shares_pejits_memory_and_an_argument_shares_torchs():
    x = torch.arange(6.0).reshape(2, 3)
    v = pejit.from_dlpack(x)
    x[0, 0] = 42.0  # torch writes; pejit's view sees it
    assert v.numpy()[0, 0] == 42.0
    back = torch.utils.dlpack.from_dlpack(pejit.to_dlpack(v))
    assert back.data_ptr() == x.data_ptr()
    capsule = torch.utils.dlpack.to_dlpack(torch.ones(3))
    pejit.from_dlpack(capsule)
    with pytest.raises(RuntimeError):  # consumed once: a second owner would free the memory under the first
        torch.utils.dlpack.from_dlpack(capsule)
    with pytest.raises(TypeError, match="already consumed"):
        pejit.from_dlpack(capsule)


def test_a_bool_result_is_copied_where_torchs_dlpack_has_no_bool(engine):
    engine.module.add_source("def @pos(%x: Tensor[(?,), f32]) -> Tensor[(?,), bool] { greater(%x, 0.0f32) }")
    pos = pejit.torch.function(engine, "pos")
    assert pos(torch.tensor([1.0, -2.0])).tolist() == [True, False]
    assert pos.stats["bool_copies_out"] == 1


def test_errors_name_the_argument_and_say_what_to_do(engine):
    encode = pejit.torch.function(engine, "encode")
    x64 = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"@encode argument 0 \(%x\): expected f32, got a DLPack tensor of f64"):
        encode(x64, {"w": torch.zeros(3, 4), "b": torch.zeros(4)})
    first = pejit.torch.function(engine, "first")
    y = torch.ones(3, requires_grad=True)
    with pytest.raises(TypeError, match="inside a List or another ADT value"):
        first([y]).sum().backward()
    engine.module.add_source("def @total(%xs: List[Tensor[(?,), f32]]) -> Tensor[(), f32] { sum(@first(%xs)) }")
    with pytest.raises(TypeError, match="inside a List or another ADT value"):  # a scalar result: at forward
        pejit.torch.function(engine, "total")([y])
    with pytest.raises(TypeError, match="generic"):
        pejit.torch.function(engine, "generic_id")
    with pytest.raises(TypeError, match="from_dlpack: its __dlpack__ failed: Cannot pack tensors on meta"):
        pejit.from_dlpack(torch.zeros(2, device="meta"))
    with pytest.raises(TypeError, match="a DLPack tensor of uint8 has no pejit dtype"):
        pejit.from_dlpack(torch.zeros(2, dtype=torch.uint8))


def test_a_tree_lstm_with_torch_embedding_and_classifier_trains_as_all_pejit_and_all_torch(treelstm_source):
    """The issue's model: 3 epochs of SGD over 6 minibatches, the same losses in the three modes."""
    rng = random.Random(7)
    examples = []
    while len(examples) < 48:
        tree = example.listops_generate(rng, max_depth=4)
        examples.append((tree, example.listops_value(tree)))
    initial = example.init_params(np.random.default_rng(7), example.LISTOPS_VOCABULARY, 16, 12,
                                  example.LISTOPS_CLASSES)
    losses, copies = {}, {}
    for mode, policy in (("interop", "sync"), ("interop", "interpreter"), ("pejit", "sync"), ("torch", None)):
        with pejit.Engine(policy=policy or "interpreter", workers=1) as engine:
            engine.module.add_source(treelstm_source, "treelstm.pj")
            batches = torch_treelstm.make_batches(engine, examples, 8)
            pejit.reset_transfers()
            losses[mode, policy] = torch_treelstm.train(mode, batches, initial, 3, 0.1, engine)
            copies[mode, policy] = pejit.transfers()["copied_in"]
    reference = losses["torch", None]
    assert sum(reference[12:]) < sum(reference[:6])  # it learns: the last epoch's losses below the first's
    for key, got in losses.items():
        np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5, err_msg=str(key))
    assert copies["interop", "sync"] == 0 and copies["interop", "interpreter"] == 0
