"""coldbrew compiler: ONNX model -> cold-start bundle.

    compile_model(model, "model.brew", target="host", plan="cold")

compiler/driver.py is the driver (its stages and the passes, in order);
compiler/options.py the options it takes. This module only re-exports.
"""
from coldbrew.command import missing_compiler_modules

_missing = missing_compiler_modules()
if _missing:  # a runtime-only install (pip install coldbrew)
    raise ImportError(f"coldbrew's compiler needs packages that are not installed here "
                      f"(missing: {', '.join(_missing)}): pip install 'coldbrew[compiler]'")

from .errors import CompileError, InternalError, UnsupportedOperatorError  # noqa: E402
from .ir.forms import NARROW, PRECISIONS  # noqa: E402  (stored weight precisions)

_LAZY = {"compile_model": "driver", "compile": "driver", "Options": "options", "Choices": "options",
         "PASSES": "pipeline", "GPU_PASSES": "pipeline", "compile_graph": "pipeline", "front_end": "pipeline",
         "Compilation": "pipeline", "pipeline": None, "driver": None}


def __getattr__(name):
    """The driver's and the pipeline's names, imported on first use:
    importing the pipeline imports every pass, and with them TVM (a second
    or so), which `coldbrew run` and `inspect` do not need."""
    if name not in _LAZY:
        raise AttributeError(f"module 'coldbrew.compiler' has no attribute '{name}'")
    import importlib

    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    return module if _LAZY[name] is None else getattr(module, name)


__all__ = ["compile_model", "Options", "Choices", "compile_graph", "front_end", "Compilation",
           "CompileError", "InternalError", "UnsupportedOperatorError", "PASSES", "GPU_PASSES", "NARROW", "PRECISIONS"]
