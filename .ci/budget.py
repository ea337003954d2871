"""The code's size, printed, and its limits, checked: growth is a decision.

    python .ci/budget.py

Counts the lines of the compiler (compiler/, targets/ and schemas/ without
generated code) and of the runtime (runtime/src, runtime/include,
runtime/python), tests and bench excluded, against BUDGET; and fails where
a runtime source is over FILE_LINES lines or a function of the compiler or
the runtime is over FUNCTION_LINES lines (split it along the jobs it
does). Run by .ci/run.
"""
import ast
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# lines: fixed; a raise is argued in the issue it serves, never here
BUDGET = {"compiler": 20075, "runtime": 7290}
FILE_LINES = 600  # the most lines of one runtime source
FUNCTION_LINES = 80
PARTS = {
    "compiler": ["compiler/**/*.py", "targets/*.py", "schemas/*.py"],
    "runtime": ["runtime/src/**/*.c", "runtime/src/**/*.cc", "runtime/src/**/*.h", "runtime/include/*.h",
                "runtime/python/*.py"],
}


def files(part, root=ROOT):
    return sorted({p for pattern in PARTS[part] for p in glob.glob(os.path.join(root, pattern), recursive=True)})


def lines(path):
    with open(path) as f:
        return f.read().count("\n")


def python_functions(path):
    """(name, lines) of every function in a Python file."""
    with open(path) as f:
        tree = ast.parse(f.read())
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def c_functions(path):
    """(name, lines) of every top-level function definition in a C or C++
    file: a line opening a definition (a name and its parameters, then '{'
    at the end of it or of a continuation line) to its closing brace."""
    with open(path) as f:
        text = f.read().split("\n")
    out, i = [], 0
    while i < len(text):
        m = re.match(r"^(?!typedef|struct|enum|static const|union|#)[A-Za-z_][\w\s\*:<>,]*?\b(\w+)\(", text[i])
        if m and text[i].count("{") and text[i].count("{") == text[i].count("}"):  # a one-line definition
            out.append((m.group(1), 1))
        elif m:
            j = i
            while j < len(text) and not text[j].rstrip().endswith("{") and not text[j].rstrip().endswith(";"):
                j += 1
            if j < len(text) and text[j].rstrip().endswith("{"):
                depth, k = 0, i
                while k < len(text):
                    depth += text[k].count("{") - text[k].count("}")
                    if depth == 0 and k >= j:
                        break
                    k += 1
                out.append((m.group(1), k - i + 1))
                i = k
        i += 1
    return out


def main(root=ROOT):
    """Prints the counts; returns 1 where a limit is passed (each printed), else 0."""
    problems = []
    for part, budget in BUDGET.items():
        paths = files(part, root)
        total = sum(lines(p) for p in paths)
        print(f"{part:<9} {total:>6} lines in {len(paths)} files (budget {budget})")
        for p in sorted(paths, key=lines, reverse=True)[:3]:
            print(f"          {lines(p):>6}  {os.path.relpath(p, root)}")
        if total > budget:
            problems.append(f"{part} is {total} lines, over its budget of {budget}")
        for p in paths:
            rel = os.path.relpath(p, root)
            if part == "runtime" and lines(p) > FILE_LINES and not rel.startswith("runtime/python"):
                problems.append(f"{rel} is {lines(p)} lines (at most {FILE_LINES})")
            fns = python_functions(p) if p.endswith(".py") else c_functions(p) if p.endswith((".c", ".cc")) else []
            for name, n in fns:
                key = f"{rel}:{name}"
                if n > FUNCTION_LINES:
                    problems.append(f"{key} is {n} lines (at most {FUNCTION_LINES})")
    print(f"functions: at most {FUNCTION_LINES} lines each")
    for p in problems:
        print("OVER BUDGET: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
