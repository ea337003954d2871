"""Errors the compiler raises for bad input: one type, clear messages; and
quiet(), which keeps what TVM prints and logs off the user's terminal."""
import contextlib
import io
import os
import sys


class CompileError(Exception):
    """The model cannot be compiled; the message says why."""


class UnsupportedOperatorError(CompileError):
    """The model uses operators coldbrew does not support (all are listed)."""

    def __init__(self, unsupported, reasons=None):
        # unsupported: {op_type: [node names]}; reasons: {op_type: why} where known
        self.unsupported = dict(sorted(unsupported.items()))
        parts = []
        for op, names in self.unsupported.items():
            shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            why = (reasons or {}).get(op)
            parts.append(f"{op} (nodes {shown}{': ' + why if why else ''})")
        super().__init__(f"unsupported operators: {'; '.join(parts)}")


class ScheduleFallbackWarning(UserWarning):
    """Kernels whose variant's schedule failed run on the generic one
    (schedule_kernels.py): correct, slower, a bug; each is named."""


class InternalError(CompileError):
    """An exception coldbrew did not expect while compiling: a bug. Its
    message names where it happened and the exception's first line (never
    a traceback or TVM's IR) and asks for a report; the exception itself
    is kept as __cause__ for whoever debugs it."""

    def __init__(self, where, error):
        self.where, self.error = where, error
        lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
        first = lines[0] if lines else ""
        first = first if len(first) <= 300 else first[:297] + "..."
        super().__init__(f"internal error in {where}: {type(error).__name__}{': ' + first if first else ''}. "
                         f"This is a coldbrew bug: please report it with the model (coldbrew compile --dump-ir "
                         f"DIR writes the IR after each pass)")


@contextlib.contextmanager
def quiet():
    """Nothing TVM says while a pass runs reaches the terminal: its prints (a
    failed node's inputs, with their IR, from the ONNX importer), its Python
    warnings, and what its C++ logs to stderr (topi's warnings while
    lowering; a BlockBuilder dropped after a failure, logged when it is
    collected, so collected here on a failure: a collection on every pass
    would double a small model's compile time)."""
    import gc
    import tempfile
    import warnings

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                try:
                    yield
                except BaseException:
                    gc.collect()  # what the failure dropped logs as it is collected: here, not later
                    raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
