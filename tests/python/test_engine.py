"""Entries, modes, edits, errors and the GIL: the engine as Python sees it."""
import sys
import threading

import numpy as np
import pytest

import pejit

from conftest import PROGRAM


def params(rng):
    return (rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32))


def test_compiled_values_and_gradients_equal_the_interpreters(compiled, reference):
    rng = np.random.default_rng(1)
    x, p = rng.standard_normal((4, 3)).astype(np.float32), params(rng)
    got_value, (got_dx, got_dp) = compiled.entry("loss", wrt=(0, 1)).value_and_grad(x, p)
    want_value, (want_dx, want_dp) = reference.entry("loss", wrt=(0, 1)).value_and_grad(x, p)
    assert compiled.entry("loss", wrt=(0, 1)).status(x, p).tier == "native"
    np.testing.assert_allclose(got_value, want_value, rtol=1e-5)
    np.testing.assert_allclose(got_dx, want_dx, rtol=1e-5, atol=1e-6)
    for g, w in zip(got_dp, want_dp):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_gradients_match_finite_differences(reference):
    rng = np.random.default_rng(2)
    x, (w, b) = rng.standard_normal((2, 3)).astype(np.float64), params(rng)
    loss = reference.entry("loss", wrt=1)  # an int: one gradient, not a tuple
    _, (dw, db) = loss(x, (w, b))
    plain = reference.entry("loss")
    eps = 1e-2
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            up, down = w.copy(), w.copy()
            up[i, j] += eps
            down[i, j] -= eps
            numeric = (float(plain(x, (up, b))) - float(plain(x, (down, b)))) / (2 * eps)
            assert dw[i, j] == pytest.approx(numeric, rel=2e-2, abs=2e-3)


def test_a_handle_has_one_mode_and_its_prefetch_warms_that_mode():
    engine = pejit.Engine(policy="eager", workers=1)
    engine.module.add_source(PROGRAM, "program.pj")
    rng = np.random.default_rng(3)
    x, p = rng.standard_normal((5, 3)).astype(np.float32), params(rng)
    train = engine.entry("loss", wrt=(1,))
    infer = engine.entry("loss")
    assert train.wrt == (1,) and infer.wrt is None
    train.prefetch(x, p, when="next")
    assert train.wait_ready(x, p).ready
    assert infer.status(x, p).state == "none"
    value, (grads,) = train(x, p)
    assert float(value) == pytest.approx(float(infer(x, p)), rel=1e-5)
    with pytest.raises(TypeError, match="made without wrt"):
        infer.value_and_grad(x, p)
    with pytest.raises(ValueError, match="wrt: @loss takes 2 arguments; there is no argument 2"):
        engine.entry("loss", wrt=(2,))
    with pytest.raises(ValueError, match="when must be 'next' or 'idle'"):
        train.prefetch(x, p, when="soon")
    engine.close()


def test_errors_are_python_exceptions_with_the_cpp_messages(compiled):
    with pytest.raises(pejit.IrError, match=r"bad\.pj:1:\d+:"):
        compiled.module.add_source("def @f(%x: Tensor[(), f32]) -> Tensor[(), f32] { frob(%x) }", "bad.pj")
    with pytest.raises(pejit.EvalError, match="@scale: argument 0"):
        compiled.entry("scale")(np.ones((2, 2), dtype=np.float32), 1.0)
    with pytest.raises(pejit.IrError, match="did you mean '@loss'"):
        compiled.entry("los")
    with pytest.raises(TypeError, match="@scale takes 2 arguments, got 1"):
        compiled.entry("scale")(np.ones(2))
    assert issubclass(pejit.IrError, pejit.Error) and issubclass(pejit.EvalError, pejit.Error)


def test_edits_take_effect_on_the_next_call(compiled):
    scale = compiled.entry("scale")
    x = np.ones(3, dtype=np.float32)
    np.testing.assert_array_equal(scale(x, 2.0), [2, 2, 2])
    compiled.module.replace(
        "def @scale(%x: Tensor[(?,), f32], %k: Tensor[(), f32]) -> Tensor[(?,), f32] { add(%x, %k) }", "edit.pj")
    np.testing.assert_array_equal(scale(x, 2.0), [3, 3, 3])
    assert scale.stats()["invalidated"] == 1


def test_a_closed_engine_refuses_calls_rather_than_crash():
    engine = pejit.Engine(policy="interpreter")
    engine.module.add_source(PROGRAM, "program.pj")
    scale = engine.entry("scale")
    engine.close()
    with pytest.raises(RuntimeError, match="the engine is closed"):
        scale(np.ones(2), 1.0)
    with pytest.raises(RuntimeError, match="the engine is closed"):
        engine.module.names()


@pytest.mark.parametrize("how", ["call", "value_and_grad", "wait_ready", "drain"])
def test_the_gil_is_released_while_a_call_runs(how):
    # With a switch interval far longer than the test, a thread gives up the
    # GIL only when it blocks or releases it. The worker thread makes up to
    # `tries` calls in a row; the main thread, woken by `entered`, can run
    # before the worker's loop ends only if a call released the GIL (were it
    # held, the main thread would run once the worker thread had ended).
    engine = pejit.Engine(policy="eager", workers=1)
    engine.module.add_source(PROGRAM, "program.pj")
    x = np.ones((4, 3), dtype=np.float32)
    p = (np.ones((3, 2), dtype=np.float32), np.ones(2, dtype=np.float32))
    # The loop ends as soon as the main thread ran: `tries` bounds only a
    # failing run, and is large so that a passing one never reaches it (the
    # main thread may miss a few of the GIL's releases before it wins one).
    entered, main_ran, completed, tries = threading.Event(), [], [], 20000

    def drain():
        engine.entry("loss").prefetch(x[: 1 + len(completed) % 4], p)  # a compile for drain to wait for
        engine.drain()

    calls = {
        "call": lambda: engine.entry("loss")(x, p),
        "value_and_grad": lambda: engine.entry("loss", wrt=1)(x, p),
        "wait_ready": lambda: engine.entry("loss").wait_ready(x[: 1 + len(completed) % 4], p),
        "drain": drain,
    }

    def worker():
        entered.set()
        while len(completed) < tries and not main_ran:
            calls[how]()
            completed.append(True)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        thread = threading.Thread(target=worker)
        thread.start()
        entered.wait()
        main_ran.append(len(completed))
    finally:
        sys.setswitchinterval(interval)
    thread.join()
    engine.close()
    assert main_ran[0] < tries


def test_static_arguments_are_specialized_on_and_removed_definitions_are_gone(compiled):
    scale = compiled.entry("scale", static_argnums=[1])
    x = np.ones(3, dtype=np.float32)
    np.testing.assert_array_equal(scale(x, 2.0), [2, 2, 2])
    np.testing.assert_array_equal(scale(x, 3.0), [3, 3, 3])
    assert scale.stats()["compiled"] == 2  # one specialization per static value
    assert scale.stats()["refused"] == 0 and scale.stats()["failed"] == 0
    compiled.module.remove("scale")
    assert "scale" not in compiled.module.names()
    with pytest.raises(pejit.EvalError, match="no longer defined"):
        scale(x, 2.0)
    with pytest.raises(ValueError, match="static_argnums: @affine takes 2 arguments; there is no argument 5"):
        compiled.entry("affine", static_argnums=[5])


def test_step_threads_default_to_the_workers_and_the_caller():
    with pejit.Engine(workers=1) as engine:
        assert engine.stats()["step_threads"] == 2
    with pejit.Engine(workers=1, step_threads=1) as engine:
        assert engine.stats()["step_threads"] == 1
    with pytest.raises(ValueError, match="step_threads"):
        pejit.Engine(step_threads=-1)


def test_a_lookahead_window_asks_for_the_calls_ahead_of_the_loop():
    # train/lookahead.h from Python: steps 1 .. ahead-1 when the window opens,
    # then step + ahead as each step begins; None (past the end) asks nothing.
    with pejit.Engine(policy="eager", workers=1) as engine:
        engine.module.add_source(PROGRAM)
        loss = engine.entry("loss", wrt=1)
        rng = np.random.default_rng(5)
        p = params(rng)
        calls = [rng.standard_normal((k + 1, 3)).astype(np.float32) for k in range(6)]  # six signatures
        asked = []

        def args_of(step):
            asked.append(step)
            return (calls[step], p) if step < len(calls) else None

        window = pejit.Lookahead(loss, args_of, 3)
        assert asked == [1, 2]
        for step in range(len(calls)):
            window.before_step(step)
            loss.value_and_grad(calls[step], p)
        assert asked == [1, 2, 3, 4, 5, 6, 7, 8]
        engine.drain()
        assert loss.status(calls[5], p).ready  # asked for ahead, compiled
        silent = []
        pejit.Lookahead(loss, lambda step: silent.append(step), 0).before_step(0)
        assert silent == []
        with pytest.raises(ValueError, match="ahead must be 0 or more"):
            pejit.Lookahead(loss, args_of, -1)
