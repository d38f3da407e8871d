"""Python objects in, numpy out: the conversions docs/python.md states."""
import numpy as np
import pytest

import pejit


def aligned(shape, dtype=np.float32):
    """An array whose data start on a 64-byte boundary (shareable)."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(n + 64, dtype=np.uint8)
    offset = (-raw.ctypes.data) % 64
    return raw[offset:offset + n].view(dtype).reshape(shape)


def test_arrays_and_numbers_become_tensors_of_the_declared_dtype(compiled):
    scale = compiled.entry("scale")
    out = scale(np.arange(4, dtype=np.float64), 3)  # f64 and int cast to the declared f32
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [0, 3, 6, 9])


def test_a_float_array_is_not_silently_truncated_to_integers(compiled):
    count_down = compiled.entry("count_down")
    with pytest.raises(TypeError, match=r"@count_down argument 0 \(%n\): expected i64, got a float"):
        count_down(2.5, 1.0)
    with pytest.raises(TypeError, match=r"@count_down argument 0 \(%n\): expected i64, got an array of float64"):
        count_down(np.array(2.0), 1.0)
    assert count_down(3, 1.5) == np.float32(12.0)


def test_results_are_read_only_numpy_arrays_and_scalars(compiled):
    neg, seven = compiled.entry("both")(np.ones(3, dtype=np.float32))
    assert isinstance(neg, np.ndarray) and not neg.flags.writeable
    np.testing.assert_array_equal(neg, [-1, -1, -1])
    assert isinstance(seven, np.int64) and seven == 7
    with pytest.raises(ValueError):
        neg[0] = 5


def test_records_take_tuples_or_dicts_by_field_name(compiled):
    affine = compiled.entry("affine")
    x = np.eye(2, dtype=np.float32)
    w = np.array([[1, 2], [3, 4]], dtype=np.float32)
    b = np.array([10, 20], dtype=np.float32)
    by_position = affine(x, (w, b))
    by_name = affine(x, {"b": b, "w": w})
    np.testing.assert_array_equal(by_position, w + b)
    np.testing.assert_array_equal(by_name, by_position)
    with pytest.raises(TypeError, match="the dict has no field 'b'"):
        affine(x, {"w": w})
    with pytest.raises(TypeError, match="the record has no field 'bias'"):
        affine(x, {"w": w, "b": b, "bias": b})


def test_python_lists_become_list_values_and_constructors_build_them_too(compiled):
    pick = compiled.entry("pick")
    assert pick([1.0, 2.0, 3.5]) == np.float32(6.5)
    m = compiled.module
    built = m.Cons(1.0, m.Cons(2.0, m.Nil()))
    assert built.ctor == "Cons"
    assert pick(built) == np.float32(3.0)
    assert pick([]) == 0


def test_a_list_the_generic_tier_returns_comes_back_as_constructors(compiled, reference):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 4)).astype(np.float32)
    rows = [rng.standard_normal((1, 4)).astype(np.float32) for _ in range(3)]

    def items(v):
        out = []
        while v.ctor == "Cons":
            out.append(v.fields[0])
            v = v.fields[1]
        assert v.ctor == "Nil"
        return out

    got, want = compiled.entry("each")(rows, w), reference.entry("each")(rows, w)
    assert len(items(got)) == 3
    for g, r in zip(items(got), items(want)):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    stats = compiled.entry("each").stats()
    assert stats["calls_generic"] == 1, stats  # served compiled, not by the interpreter


def test_a_value_made_once_is_passed_again_without_conversion(compiled):
    pick = compiled.entry("pick")
    (converted,) = pick.convert([1.0, 2.0])
    assert isinstance(converted, pejit.Value) and converted.ctor == "Cons"
    for _ in range(3):
        assert pick(converted) == np.float32(3.0)
    assert pick.stats()["calls"] == 3


def test_an_aligned_writeable_array_is_shared_and_others_are_copied():
    shared = aligned((4,))
    shared[:] = [1, 2, 3, 4]
    v = pejit.Value(shared)
    shared[0] = 100  # the value sees it: no copy was made
    assert v.numpy()[0] == 100
    unaligned = aligned((5,))[1:]
    copied = pejit.Value(unaligned)
    unaligned[0] = 100
    assert copied.numpy()[0] == 0


def test_a_returned_array_passed_back_is_not_copied(compiled):
    neg, _ = compiled.entry("both")(np.ones(3, dtype=np.float32))
    again = pejit.Value(neg)
    assert again.numpy().__array_interface__["data"][0] == neg.__array_interface__["data"][0]


@pytest.mark.parametrize("bad", [None, "text", object(), [[1, 2], [3]], {"a": 1}])
def test_objects_that_are_no_tensor_raise_type_error_naming_the_argument(compiled, bad):
    with pytest.raises(TypeError, match=r"@scale argument 0 \(%x\)"):
        compiled.entry("scale")(bad, 1.0)


def test_an_adt_argument_must_be_built_by_a_constructor(treelstm_source):
    with pejit.Engine(policy="interpreter") as engine:
        engine.module.add_source(treelstm_source, "treelstm.pj")
        with pytest.raises(TypeError, match=r"@infer argument 0 \(%ts\) element 0: expected a Tree value"):
            engine.entry("infer")([5], None)
        with pytest.raises(AttributeError, match="no constructor 'Nod'"):
            engine.module.Nod


def test_containers_nested_past_the_bound_are_refused_not_recursed_into():
    deep = ()
    for _ in range(100_000):
        deep = (deep,)
    with pytest.raises(TypeError, match="nested deeper than 1000 containers"):
        pejit.Value(deep)


def test_an_int_past_64_bits_is_refused_with_the_range_and_every_digit_below_is_kept():
    with pejit.Engine(policy="interpreter") as engine:
        engine.module.add_source("type T { Leaf(Tensor[(), i64]) }\n"
                                 "def @f(%x: Tensor[(), i64]) -> Tensor[(), i64] { %x }\n", "ints.pj")
        f = engine.entry("f")
        with pytest.raises(TypeError, match=r"@f argument 0 \(%x\): an int of 71 bits does not fit in i64 "
                                            r"\(-2\^63 to 2\^63-1\)"):
            f(2**70)
        with pytest.raises(TypeError, match=r"Leaf field 0: an int of 71 bits does not fit in i64"):
            engine.module.Leaf(-2**70)
        with pytest.raises(TypeError, match=r"an int of 132878 bits"):  # too long for Python to print
            f(10**40000)
        assert int(f(2**53 + 1)) == 2**53 + 1  # not through a double
        assert int(f(-2**63)) == -2**63


def test_a_structure_made_by_another_engines_constructors_is_a_type_error():
    source = "def @s(%t: Tree) -> Tensor[(), f32] {{ match (%t) {{ Leaf(%x) => %x, Node(%l, %r) => add(@s(%l), @s(%r)) }} }}\n"
    with pejit.Engine(policy="interpreter") as a, pejit.Engine() as b:
        a.module.add_source("type Tree { Leaf(Tensor[(), f32]), Node(Tree, Tree) }\n" + source.format(), "a.pj")
        b.module.add_source("type Tree { Node(Tree, Tree), Leaf(Tensor[(), f32]) }\n" + source.format(), "b.pj")
        t = a.module.Node(a.module.Leaf(1.0), a.module.Leaf(2.0))
        assert a.entry("s")(t) == 3.0
        with pytest.raises(TypeError, match=r"@s argument 0 \(%t\): a Tree made by another module's constructors "
                                            r"\(Leaf\(1\), Node\(2\)\), not this program's \(Node\(2\), Leaf\(1\)\)"):
            b.entry("s")(t)
        with pytest.raises(TypeError, match=r"Node field 0: a Tree made by another module's constructors"):
            b.module.Node(t, b.module.Leaf(1.0))
        # The same constructors in another engine: one type.
        with pejit.Engine() as c:
            c.module.add_source("type Tree { Leaf(Tensor[(), f32]), Node(Tree, Tree) }\n" + source.format(), "c.pj")
            assert c.entry("s")(t) == 3.0
