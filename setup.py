"""Package build: the Python packages plus the C runtime (runtime/build.py)."""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithRuntime(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, os.path.join(HERE, "runtime"))
        import build as runtime_build

        if getattr(self, "editable_mode", False):
            out = os.path.join(HERE, "runtime", "python")
        else:
            out = os.path.join(self.build_lib, "coldbrew")
        runtime_build.build(out)


setup(cmdclass={"build_py": BuildWithRuntime})
