"""The `coldbrew` command's entry point.

The command line belongs to the compiler (coldbrew.compiler.tools.cli); a
runtime-only install (`pip install coldbrew`, numpy only) has the command
but not what it needs, and says how to get it instead of a traceback.
"""
import sys

# what coldbrew.compiler needs beyond the runtime: the `compiler` extra
COMPILER_MODULES = ("click", "onnx", "tvm", "flatbuffers", "nacl", "lz4")


def missing_compiler_modules():
    """The compiler's dependencies that are not installed."""
    from importlib.util import find_spec

    return [m for m in COMPILER_MODULES if find_spec(m) is None]


def main():
    missing = missing_compiler_modules()
    if missing:
        sys.exit(f"coldbrew: the command line comes with the compiler, which is not installed here "
                 f"(missing: {', '.join(missing)}). Install it with: pip install 'coldbrew[compiler]'. "
                 f"This installation runs bundles from Python: import coldbrew; coldbrew.load('model.brew')")
    from coldbrew.compiler.tools.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    main()
