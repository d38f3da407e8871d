"""`python3 -m pip install --no-build-isolation .`: the pejit Python package.

Installs python/pejit (its Python files, type stubs and py.typed) with the
extension module pejit._pejit, which Bazel builds (`bazel build --config=opt
//python:package`; tools/setup.sh installs what that needs). Offline: it
uses Debian's setuptools and wheel (hence --no-build-isolation) and Bazel's
own offline build. PEJIT_EXTENSION=path/to/_pejit.so installs that file
instead of building one (a build made elsewhere, tests).

Debian's /usr/bin/python3 is "externally managed" (PEP 668): install into a
virtual environment that sees Debian's numpy and torch,

    python3 -m venv --system-site-packages ~/pejit-env
    ~/pejit-env/bin/python -m pip install --no-build-isolation .

or into the system's Python with --break-system-packages.
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def built_extension():
    given = os.environ.get("PEJIT_EXTENSION")
    if given:
        if not os.path.isfile(given):
            raise SystemExit(f"PEJIT_EXTENSION={given}: no such file")
        return given
    bazel = shutil.which("bazel")
    if not bazel:
        raise SystemExit("pejit: building the extension needs Bazel (as root: bash tools/setup.sh), or "
                         "PEJIT_EXTENSION=path/to/_pejit.so")
    flags = ["--config=opt"]
    subprocess.run([bazel, "build", *flags, "//python:package"], cwd=HERE, check=True)
    bin_dir = subprocess.run([bazel, "info", *flags, "bazel-bin"], cwd=HERE, check=True, capture_output=True,
                             text=True).stdout.strip()
    return os.path.join(bin_dir, "python", "pejit", "_pejit.so")


class BuildWithBazel(build_py):
    """The package's Python files, and the extension Bazel built beside them."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "pejit", "_pejit.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built_extension(), target)
        os.chmod(target, 0o755)


class BinaryDistribution(Distribution):
    """A wheel for this Python and platform: the package holds a compiled extension."""

    def has_ext_modules(self):
        return True


setup(
    name="pejit",
    version="0.3.0",
    description="A tiered JIT for dynamic deep-learning programs",
    long_description=open(os.path.join(HERE, "python", "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires="==3.11.*",
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    packages=["pejit"],
    package_dir={"": "python"},
    package_data={"pejit": ["*.pyi", "py.typed"]},
    cmdclass={"build_py": BuildWithBazel},
    distclass=BinaryDistribution,
    zip_safe=False,
)
