"""Records by field name everywhere (issue 55): a dict argument's gradients
come back as a dict, and the optimizer takes parameters and gradients by
name, updating the caller's arrays in place."""
import numpy as np
import pytest

import pejit

from test_values import aligned


def pair(rng, shareable=True):
    """The fixture's Pair record as a dict of float32 arrays."""
    make = aligned if shareable else (lambda shape: np.zeros(shape, dtype=np.float32))
    w, b = make((3, 2)), make((2,))
    w[:] = rng.standard_normal((3, 2))
    b[:] = rng.standard_normal(2)
    return {"w": w, "b": b}


def test_a_dict_arguments_gradients_come_back_as_a_dict_with_its_keys(compiled, reference):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    p = pair(rng)
    value, grads = compiled.entry("loss", wrt=1)(x, {"b": p["b"], "w": p["w"]})
    assert isinstance(grads, dict) and list(grads) == ["b", "w"]
    want_value, (want_w, want_b) = reference.entry("loss", wrt=1)(x, (p["w"], p["b"]))
    assert float(value) == pytest.approx(float(want_value), rel=1e-5)
    np.testing.assert_allclose(grads["w"], want_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["b"], want_b, rtol=1e-5, atol=1e-6)
    # A tuple argument keeps tuple gradients.
    _, by_position = compiled.entry("loss", wrt=1)(x, (p["w"], p["b"]))
    assert isinstance(by_position, tuple) and len(by_position) == 2


@pytest.mark.parametrize("shareable", [True, False])
def test_the_optimizer_steps_a_dict_of_arrays_in_place_as_it_steps_a_value(compiled, shareable):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    loss = compiled.entry("loss", wrt=1)
    by_name = pair(rng, shareable)
    if not shareable:  # strided views pejit cannot share: copied in, written back
        by_name = {"w": np.asfortranarray(by_name["w"]), "b": by_name["b"]}
    held = pejit.Value((by_name["w"].copy(), by_name["b"].copy()))
    named, positional = pejit.Optimizer("adam", learning_rate=0.1), pejit.Optimizer("adam", learning_rate=0.1)
    w_array = by_name["w"]
    for _ in range(5):
        _, grads = loss(x, by_name)
        _, held_grads = loss(x, held)
        assert named.step(by_name, grads) == pytest.approx(positional.step(held, held_grads), rel=1e-6)
    assert by_name["w"] is w_array  # the caller's own array, updated
    np.testing.assert_array_equal(by_name["w"], held.numpy()[0])
    np.testing.assert_array_equal(by_name["b"], held.numpy()[1])
    # The same dict rebuilt in another key order reaches the same optimizer state.
    reordered = {"b": by_name["b"], "w": by_name["w"]}
    _, grads = loss(x, reordered)
    _, held_grads = loss(x, held)
    named.step(reordered, grads)
    positional.step(held, held_grads)
    np.testing.assert_array_equal(reordered["w"], held.numpy()[0])


def test_gradients_by_name_step_a_converted_value(compiled):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    loss = compiled.entry("loss", wrt=1)
    p = pair(rng)
    _, params = loss.convert(x, p)
    before = params.numpy()[0].copy()
    _, grads = loss(x, {"w": p["w"], "b": p["b"]})
    pejit.Optimizer("sgd", learning_rate=1.0).step(params, {"b": grads["b"], "w": grads["w"]})
    np.testing.assert_allclose(params.numpy()[0], before - grads["w"], rtol=1e-6)


def test_mismatched_names_are_refused_naming_the_field_and_nothing_changes(compiled):
    rng = np.random.default_rng(4)
    p = pair(rng)
    w_before = p["w"].copy()
    optimizer = pejit.Optimizer("sgd", learning_rate=1.0)
    with pytest.raises(TypeError, match=r"grads: has no 'b'"):
        optimizer.step(p, {"w": np.ones((3, 2), np.float32)})
    with pytest.raises(TypeError, match=r"grads: has 'bias', which params has not"):
        optimizer.step(p, {"w": p["w"], "b": p["b"], "bias": p["b"]})
    with pytest.raises(TypeError, match=r"grads: a dict by field name, as params is, expected; got tuple"):
        optimizer.step(p, (p["w"], p["b"]))
    with pytest.raises(TypeError, match=r"params\['w'\]: a writeable float32 numpy array"):
        optimizer.step({"w": p["w"].astype(np.float64)}, {"w": p["w"]})
    with pytest.raises(TypeError, match=r"grads\['w'\]: Tensor\[\(2, 3\), f32\] for a parameter of Tensor\[\(3, 2\), f32\]"):
        optimizer.step({"w": p["w"]}, {"w": np.ones((2, 3), np.float32)})
    np.testing.assert_array_equal(p["w"], w_before)


def test_a_dict_needs_a_type_to_order_its_fields(compiled):
    rng = np.random.default_rng(5)
    p = pair(rng)
    with pytest.raises(TypeError, match="a dict is a record by field name, whose field order only its type gives"):
        pejit.Value(p)
    held = pejit.Value((p["w"], p["b"]))
    with pytest.raises(TypeError, match="gradients by field name need the parameters' record type"):
        pejit.Optimizer("sgd").step(held, {"w": p["w"], "b": p["b"]})
