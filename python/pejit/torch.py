"""pejit entries as differentiable functions of torch tensors.

    import pejit.torch
    encode = pejit.torch.function(engine, "encode")
    h = encode(trees, embedding(tokens), {"w": cell.w, "b": cell.b})
    loss = torch.nn.functional.cross_entropy(classifier(h), labels)
    loss.backward()   # gradients reach the embedding, cell.w, cell.b, ...

Arguments are passed as the entry declares them; torch tensors may stand at
any tensor position of an argument, also inside tuples, lists and dicts
(records by field name), and cross without a copy when they are CPU,
row-major and 64-byte aligned (torch's allocator aligns to 64 bytes):
pejit.transfers() counts what was shared and what was copied. Results are
tensors or (nested) tuples of tensors, returned as torch tensors viewing
pejit's memory. Do not write them in place.

Gradients: an entry whose declared result is a scalar (a loss) runs once in
grad mode when a tensor requires a gradient, and backward scales the saved
gradients. Any other result runs forward with `Entry.value_and_pullback`,
and backward hands torch's cotangent to the pullback, which runs the
backward pass from the forward's own state (per-minibatch code's residuals,
the generic tier's runs, or the interpreter's tape): nothing is computed
twice. With `pullbacks=False`, the forward runs in value mode and backward
runs a vector-Jacobian product `sum(mul(@entry(args), %cotangent))` in grad
mode instead: a definition this module adds to the engine's module once per
result type (the forward pass is computed again there).
"""
import hashlib

import torch
from torch.utils import dlpack as _dlpack

from . import _pejit

__all__ = ["Function", "function"]


def function(engine, name, static_argnums=(), pullbacks=True):
    """The entry `name` of `engine` as a differentiable function of torch tensors.

    pullbacks=False: a non-scalar result's backward always runs the
    vector-Jacobian product entry (computing the forward again), never a
    pullback of the forward's state."""
    return Function(engine, name, static_argnums, pullbacks)


class _Leaf:
    """Where a torch tensor stood in the arguments: its index among them."""
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


def _flatten(obj, leaves):
    """obj with every torch tensor replaced by a _Leaf, the tensors appended to leaves."""
    if isinstance(obj, torch.Tensor):
        leaves.append(obj)
        return _Leaf(len(leaves) - 1)
    if isinstance(obj, dict):
        return {k: _flatten(v, leaves) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        items = [_flatten(v, leaves) for v in obj]
        return tuple(items) if isinstance(obj, tuple) else items
    return obj


def _fill(template, leaves):
    """The inverse of _flatten: the leaves put back where they stood."""
    if isinstance(template, _Leaf):
        return leaves[template.index]
    if isinstance(template, dict):
        return {k: _fill(v, leaves) for k, v in template.items()}
    if isinstance(template, (tuple, list)):
        items = [_fill(v, leaves) for v in template]
        return tuple(items) if isinstance(template, tuple) else items
    return template


def _leaf_indices(template):
    if isinstance(template, _Leaf):
        yield template.index
    elif isinstance(template, dict):
        for v in template.values():
            yield from _leaf_indices(v)
    elif isinstance(template, (tuple, list)):
        for v in template:
            yield from _leaf_indices(v)


def _match_grads(template, grad, out):
    """Puts the gradient of each leaf of `template` (a structure pejit shaped
    like the argument: dicts by key, tuples) into out[leaf index]."""
    if isinstance(template, _Leaf):
        out[template.index] = grad
    elif isinstance(template, dict) and isinstance(grad, dict):
        for k, v in template.items():
            _match_grads(v, grad.get(k), out)
    elif isinstance(template, (tuple, list)) and isinstance(grad, tuple) and len(grad) == len(template):
        for v, g in zip(template, grad):
            _match_grads(v, g, out)


def _leaf_grads(fn, template, wrt, grads, needs):
    """The gradient of each leaf that needs one (torch tensors; None for the
    others), from a grad-mode call's gradients of the `wrt` arguments. A
    leaf that needs one where pejit returns none is a TypeError."""
    per_leaf = [None] * len(needs)
    for k, i in enumerate(wrt):
        _match_grads(template[i], grads[k], per_leaf)
    out = []
    for j, g in enumerate(per_leaf):
        if needs[j] and g is None:
            raise TypeError(f"@{fn.name}: a torch tensor (leaf {j} of the arguments) requires a gradient, but it "
                            "stands where pejit returns none (inside a List or another ADT value): pass it in a "
                            "tensor, tuple or record argument")
        out.append(_to_torch(g, fn.stats) if needs[j] else None)
    return out


def _to_torch(x, counts):
    """A tensor pejit returned (a numpy array viewing it, or a numpy scalar) as a torch tensor."""
    if hasattr(x, "ndim") and getattr(x, "ndim") > 0:
        if x.dtype == bool:  # torch 1.13's DLPack has no bool: a copy
            counts["bool_copies_out"] += 1
            return torch.from_numpy(x.copy())
        return _dlpack.from_dlpack(_pejit.to_dlpack(x))
    counts["scalars_out"] += 1
    return torch.tensor(x)


def _flatten_result(value, where):
    """A result (tensors in nested tuples) as a flat list and a template."""
    flat = []

    def walk(v):
        if isinstance(v, tuple):
            return tuple(walk(x) for x in v)
        if isinstance(v, _pejit.Value):
            raise TypeError(f"{where}: returns a {v.ctor or v.kind} value; a torch function returns tensors and "
                            "tuples of tensors")
        flat.append(v)
        return _Leaf(len(flat) - 1)

    return walk(value), flat


class _Result:
    """A result's shape and dtype, kept for backward."""
    __slots__ = ("shape", "dtype")

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.int64: "i64", torch.bool: "bool"}


def _type_text(template, outputs):
    """The pejit type of a result's structure, each dimension `?`."""
    if isinstance(template, _Leaf):
        t = outputs[template.index]
        dims = ", ".join("?" for _ in t.shape)
        return f"Tensor[({dims}{',' if len(t.shape) == 1 else ''}), {_DTYPES[t.dtype]}]"
    return "(" + ", ".join(_type_text(x, outputs) for x in template) + ("," if len(template) == 1 else "") + ")"


def _float_paths(template, outputs, path=()):
    """(path of tuple indices, leaf index) of each floating-point result."""
    if isinstance(template, _Leaf):
        if outputs[template.index].dtype.is_floating_point:
            yield path, template.index
        return
    for i, x in enumerate(template):
        yield from _float_paths(x, outputs, path + (i,))


class Function:
    """A pejit entry called with torch tensors; see the module's docstring."""

    def __init__(self, engine, name, static_argnums=(), pullbacks=True):
        self.engine, self.name = engine, name
        self.static_argnums = list(static_argnums)
        signature = engine.module.signature(name)
        if signature["generic"]:
            raise TypeError(f"@{name} is generic: give pejit.torch.function an entry with declared types")
        self.params = signature["params"]
        returns = signature["returns"] or ""
        self.scalar_result = returns in ("Tensor[(), f32]", "Tensor[(), f64]")
        self._value = engine.entry(name, static_argnums=self.static_argnums)
        self._grad = {}  # wrt -> the entry in grad mode (scalar results)
        self._vjp = {}  # (wrt, cotangent type) -> the VJP's entry in grad mode
        self._pullbacks = pullbacks
        self.stats = {"calls": 0, "grad_calls": 0, "pullback_calls": 0, "vjp_calls": 0, "scalars_out": 0,
                      "bool_copies_out": 0}

    def __repr__(self):
        return f"<pejit.torch.function @{self.name}>"

    def __call__(self, *args):
        leaves = []
        template = _flatten(args, leaves)
        result_template = []  # set by forward
        flat = _Apply.apply(self, template, result_template, *leaves)
        if not isinstance(flat, tuple):
            flat = (flat,)
        return _fill(result_template[0], list(flat))

    def _grad_entry(self, wrt):
        if wrt not in self._grad:
            self._grad[wrt] = self.engine.entry(self.name, static_argnums=self.static_argnums, wrt=wrt)
        return self._grad[wrt]

    def _vjp_entry(self, wrt, result_template, outputs):
        """The grad-mode entry of sum(mul(@name(args), %cotangent)) for this result type."""
        ct_type = _type_text(result_template, outputs)
        key = (wrt, ct_type)
        if key in self._vjp:
            return self._vjp[key]
        paths = list(_float_paths(result_template, outputs))
        if not paths:
            raise TypeError(f"@{self.name}: no floating-point result to differentiate")
        if len({outputs[i].dtype for _, i in paths}) > 1:
            raise TypeError(f"@{self.name}: results of several float dtypes; differentiate one dtype at a time")
        names = {p for p, _ in self.params}
        ct = "cotangent"
        while ct in names:
            ct += "_"
        params = ", ".join(f"%{p}: {t}" for p, t in self.params)
        digest = hashlib.sha1(f"{params}|{ct_type}".encode()).hexdigest()[:12]
        vjp_name = f"__pejit_vjp_{self.name}_{digest}"
        call = f"@{self.name}(" + ", ".join(f"%{p}" for p, _ in self.params) + ")"
        lets, terms = [f"let %{ct}_r = {call};"], []
        for k, (path, _) in enumerate(paths):
            value, seed = f"%{ct}_r", f"%{ct}"
            for depth, i in enumerate(path):
                lets.append(f"let %{ct}_v{k}_{depth} = {value}.{i}; let %{ct}_s{k}_{depth} = {seed}.{i};")
                value, seed = f"%{ct}_v{k}_{depth}", f"%{ct}_s{k}_{depth}"
            terms.append(f"sum(mul({value}, {seed}))")
        body = terms[0]
        for term in terms[1:]:
            body = f"add({body}, {term})"
        text = (f"def @{vjp_name}({params}, %{ct}: {ct_type}) {{\n  " + "\n  ".join(lets) + f"\n  {body}\n}}\n")
        if vjp_name not in self.engine.module.names():
            self.engine.module.add_source(text, f"<pejit.torch: vector-Jacobian product of @{self.name}>")
        entry = self.engine.entry(vjp_name, static_argnums=self.static_argnums, wrt=wrt)
        self._vjp[key] = entry
        return entry


class _Apply(torch.autograd.Function):
    @staticmethod
    def forward(ctx, fn, template, result_template, *leaves):
        fn.stats["calls"] += 1
        args = _fill(template, [t.detach() for t in leaves])
        needs = ctx.needs_input_grad[3:]
        wrt = tuple(sorted({i for i, arg in enumerate(template)
                            if any(needs[j] for j in _leaf_indices(arg))}))
        ctx.fn, ctx.template, ctx.wrt, ctx.grads, ctx.pullback = fn, template, wrt, None, None
        if wrt and fn.scalar_result:
            fn.stats["grad_calls"] += 1
            value, grads = fn._grad_entry(wrt)(*args)
            ctx.grads = _leaf_grads(fn, template, wrt, grads, needs)
        elif wrt and fn._pullbacks:
            value, ctx.pullback = fn._grad_entry(wrt).value_and_pullback(*args)
            ctx.save_for_backward(*leaves)  # a second backward (retain_graph) takes the VJP entry
        else:
            value = fn._value(*args)
            if wrt:
                ctx.save_for_backward(*leaves)
        shape, flat = _flatten_result(value, f"@{fn.name}")
        outputs = [_to_torch(x, fn.stats) for x in flat]
        result_template.append(shape)
        ctx.result_template, ctx.outputs = shape, [_Result(o.shape, o.dtype) for o in outputs]
        for o in outputs:
            if not o.is_floating_point():
                ctx.mark_non_differentiable(o)
        return tuple(outputs) if len(outputs) != 1 else outputs[0]

    @staticmethod
    def backward(ctx, *grad_outputs):
        fn, template, wrt = ctx.fn, ctx.template, ctx.wrt
        nones = (None, None, None)
        if not wrt:
            return nones + (None,) * len(ctx.needs_input_grad[3:])
        if ctx.grads is not None:  # a scalar result: gradients saved by forward
            g_out = grad_outputs[0]
            return nones + tuple(None if g is None else g * g_out for g in ctx.grads)
        seeds = [torch.zeros(o.shape, dtype=o.dtype) if g is None else g.detach()
                 for g, o in zip(grad_outputs, ctx.outputs)]
        if ctx.pullback is not None:
            fn.stats["pullback_calls"] += 1
            pullback, ctx.pullback = ctx.pullback, None
            grads = pullback(_fill(ctx.result_template, seeds))
            return nones + tuple(_leaf_grads(fn, template, wrt, grads, ctx.needs_input_grad[3:]))
        leaves = ctx.saved_tensors
        args = _fill(template, [t.detach() for t in leaves])
        entry = fn._vjp_entry(wrt, ctx.result_template, ctx.outputs)
        fn.stats["vjp_calls"] += 1
        _, grads = entry(*args, _fill(ctx.result_template, seeds))
        return nones + tuple(_leaf_grads(fn, template, wrt, grads, ctx.needs_input_grad[3:]))
