"""`python3 -m pip install --no-build-isolation .` (setup.py): pejit importable
from any directory, with its docstrings, type stubs and torch module, in a
virtual environment that sees Debian's numpy (PEP 668 keeps pip out of the
system's Python)."""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))  # the runfiles tree: setup.py, python/


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "pejit-src"
    (source / "python").mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, "setup.py"), source)
    shutil.copy(os.path.join(ROOT, "python", "README.md"), source / "python")
    shutil.copytree(os.path.join(ROOT, "python", "pejit"), source / "python" / "pejit",
                    ignore=shutil.ignore_patterns("_pejit.so", "__pycache__"))
    env_dir = tmp / "env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(env_dir)], check=True)
    python = str(env_dir / "bin" / "python")
    env = dict(os.environ, PEJIT_EXTENSION=os.path.join(ROOT, "python", "pejit", "_pejit.so"),
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([python, "-m", "pip", "install", "--no-build-isolation", "."], cwd=source, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return python, tmp, env


def run(installed, code):
    python, tmp, env = installed
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    done = subprocess.run([python, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_pejit_imports_from_any_directory_without_pythonpath(installed):
    out = run(installed, """
import numpy as np, pejit
print(pejit.__file__)
e = pejit.Engine(policy="sync")
e.module.add_source("def @f(%x: Tensor[(?,), f32]) -> Tensor[(?,), f32] { mul(%x, %x) }")
print(list(e.entry("f")(np.arange(3, dtype=np.float32))))
""")
    path, values = out.splitlines()
    assert "site-packages" in path and "pejit-src" not in path
    assert values == "[0.0, 1.0, 4.0]"


def test_docstrings_stubs_and_the_torch_module_are_installed(installed):
    out = run(installed, """
import os, pydoc, pejit
here = os.path.dirname(pejit.__file__)
print(sorted(f for f in os.listdir(here) if not f.startswith("__pycache__")))
text = pydoc.render_doc(pejit.Engine, renderer=pydoc.plaintext)
print("entries run at once in the interpreter" in text, "class Engine in module pejit" in text)
import pejit.torch
print(pejit.torch.function.__doc__.strip())
""")
    files, docs, torch_doc = out.splitlines()[:3]
    assert files == "['__init__.py', '__init__.pyi', '_pejit.so', 'lang.py', 'py.typed', 'torch.py']"
    assert docs == "True True"
    assert torch_doc.startswith("The entry `name` of `engine` as a differentiable function")
