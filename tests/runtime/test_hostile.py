"""No tests here any more: the hostile-bundle tests moved to the files named
after runtime/src's folders (test_bundle.py, test_cpu.py, test_exec.py) and
their helpers to hostile.py. Only tests/compiler/test_precision.py still
imports expect and repack from this name; delete this file once it imports
them from hostile."""
from hostile import expect, repack

__all__ = ["expect", "repack"]
