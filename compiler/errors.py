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
