"""Errors the compiler raises for bad input: one type, clear messages."""


class CompileError(Exception):
    """The model cannot be compiled; the message says why."""


class UnsupportedOperatorError(CompileError):
    """The model uses operators coldbrew does not support (all are listed)."""

    def __init__(self, unsupported):
        # unsupported: {op_type: [node names]}
        self.unsupported = dict(sorted(unsupported.items()))
        parts = []
        for op, names in self.unsupported.items():
            shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            parts.append(f"{op} (nodes {shown})")
        super().__init__(f"unsupported operators: {'; '.join(parts)}")


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
