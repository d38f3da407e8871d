"""The Tree-LSTM of examples/treelstm from Python: trees built by constructor
name, gradients compiled equal to the interpreter's, an optimizer that trains."""
import numpy as np
import pytest

import pejit

VOCAB, EMBED, HIDDEN, CLASSES = 16, 8, 6, 4


def init_params(rng):
    def m(*shape):
        return (rng.standard_normal(shape) * 0.3).astype(np.float32)
    return (m(VOCAB, EMBED), m(3 * HIDDEN, EMBED), m(3 * HIDDEN, HIDDEN), np.zeros(3 * HIDDEN, np.float32),
            m(HIDDEN, EMBED), m(HIDDEN, HIDDEN), np.ones(HIDDEN, np.float32), m(CLASSES, HIDDEN),
            np.zeros(CLASSES, np.float32))


def random_tree(m, rng, depth):
    if depth == 0 or rng.random() < 0.3:
        return m.Leaf(int(rng.integers(VOCAB)))
    return m.Node(int(rng.integers(VOCAB)), [random_tree(m, rng, depth - 1) for _ in range(rng.integers(1, 4))])


def engine_with_model(policy, source, generic=True):
    engine = pejit.Engine(policy=policy, workers=1, generic=generic)
    engine.module.add_source(source, "treelstm.pj")
    return engine


def test_compiled_loss_and_gradients_equal_the_interpreters(treelstm_source):
    rng = np.random.default_rng(4)
    # Without the generic tier, a minibatch's own specialization serves it.
    with engine_with_model("sync", treelstm_source, generic=False) as compiled, \
            engine_with_model("interpreter", treelstm_source) as reference:
        trees = [random_tree(compiled.module, rng, 4) for _ in range(6)]
        labels = rng.integers(CLASSES, size=6)
        params = init_params(rng)
        loss = compiled.entry("loss", wrt=2)
        got, got_grads = loss(trees, labels, params)
        want, want_grads = reference.entry("loss", wrt=2)(trees, labels, params)
        assert loss.status(trees, labels, params).tier == "native"
        assert float(got) == pytest.approx(float(want), rel=1e-5)
        for g, w in zip(got_grads, want_grads):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)
        predicted = compiled.entry("infer")(trees, params)
        np.testing.assert_array_equal(predicted, reference.entry("infer")(trees, params))


def test_an_optimizer_trains_the_parameters_in_place(treelstm_source):
    rng = np.random.default_rng(5)
    with engine_with_model("sync", treelstm_source) as engine:
        m = engine.module
        loss = engine.entry("loss", wrt=2)
        trees, labels, params = loss.convert([random_tree(m, rng, 3) for _ in range(8)],
                                             rng.integers(CLASSES, size=8), init_params(rng))
        before = params.numpy()[0].copy()
        optimizer = pejit.Optimizer("adagrad", learning_rate=0.1)
        losses = []
        for _ in range(30):
            value, grads = loss(trees, labels, params)
            optimizer.step(params, grads)
            losses.append(float(value))
        assert losses[-1] < 0.5 * losses[0]
        assert not np.array_equal(params.numpy()[0], before)
        assert loss.stats()["calls_compiled"] == 30
        with pytest.raises(ValueError):
            optimizer.step(params, grads[:3])  # another structure: refused before any change
