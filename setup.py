"""Package build: the Python packages plus the C runtime (runtime/build.py).

One distribution, `coldbrew`, laid out from the source folders by ROOTS;
every folder below a root that holds an `__init__.py` is found and shipped
(packages()), so a new module or subpackage cannot be left out.
Dependencies (pyproject.toml): the runtime needs only numpy; the `compiler`
extra adds what compiling needs (TVM, onnx, ...).
"""
import os
import shutil
import sys

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
# package -> source folder
ROOTS = {"coldbrew": "runtime/python", "coldbrew.compiler": "compiler", "coldbrew.schemas": "schemas",
         "coldbrew.targets": "targets", "coldbrew.examples": "examples"}


def packages():
    """{package: source folder} for every package under ROOTS."""
    found = {}
    for pkg, folder in ROOTS.items():
        found[pkg] = folder
        for sub in find_packages(os.path.join(HERE, folder)):
            found[f"{pkg}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return found


class BuildWithRuntime(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, os.path.join(HERE, "runtime"))
        import build as runtime_build

        if getattr(self, "editable_mode", False):
            out = os.path.join(HERE, "runtime", "python")
        else:  # an installed package: the library and its public header, for C programs too
            out = os.path.join(self.build_lib, "coldbrew")
            os.makedirs(os.path.join(out, "include"), exist_ok=True)
            shutil.copy(os.path.join(HERE, "runtime", "include", "coldbrew.h"), os.path.join(out, "include"))
        runtime_build.build(out)


class WithNativeCode(Distribution):
    """The wheel carries libcoldbrew.so: tag it for this platform, not as pure Python."""

    def has_ext_modules(self):
        return True


if __name__ == "__main__":
    found = packages()
    setup(packages=sorted(found), package_dir=found, distclass=WithNativeCode,
          cmdclass={"build_py": BuildWithRuntime})
