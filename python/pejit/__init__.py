"""pejit: a tiered JIT for dynamic deep-learning programs.

Programs are written in the pejit language (docs/language.md) and added to an
engine's live module; entries of the module are called from Python with numpy
arrays, torch tensors, numbers and the module's constructors:

    import pejit
    engine = pejit.Engine(policy="eager")
    engine.module.add_source(open("treelstm.pj").read(), "treelstm.pj")
    loss = engine.entry("loss", wrt=2)
    value, grads = loss(trees, labels, params)

`pejit.torch.function(engine, "entry")` makes an entry a differentiable
function of torch tensors (imported on first use: torch is optional), and
`pejit.lang` reads models written as Python functions.
docs/python.md is the guide.
"""
import importlib
import os

try:
    from . import _pejit
except ImportError as error:  # a source checkout: the extension is where Bazel built it
    _built = os.path.join(os.path.dirname(__file__), "..", "..", "bazel-bin", "python", "pejit")
    if not os.path.exists(os.path.join(_built, "_pejit.so")):
        raise ImportError(
            "pejit's extension module _pejit.so is not built: run `python3 -m pip install .` in the pejit "
            "checkout, or `bazel build --config=opt //python:package` there and put its python/ directory on "
            "PYTHONPATH") from error
    __path__.append(os.path.normpath(_built))
    from . import _pejit

from ._pejit import (CodeStatus, Constructor, Engine, Entry, Error, EvalError, IrError, Lookahead, Module,
                     OpError, Optimizer, Value, from_dlpack, reset_transfers, set_blas_threads, to_dlpack,
                     transfers)

__all__ = [
    "CodeStatus", "Constructor", "Engine", "Entry", "Error", "EvalError", "IrError", "Lookahead", "Module",
    "OpError", "Optimizer", "Value", "from_dlpack", "reset_transfers", "set_blas_threads", "to_dlpack",
    "transfers",
]

# The classes and exceptions are defined in pejit._pejit; they are shown as
# pejit's (help(), repr, tracebacks).
for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        try:
            _obj.__module__ = "pejit"
        except (AttributeError, TypeError):
            pass
del _name, _obj


def __getattr__(name):
    # pejit.torch and pejit.lang on first use: importing torch takes a
    # second, and not every user has it.
    if name in ("torch", "lang"):
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'pejit' has no attribute '{name}'")
