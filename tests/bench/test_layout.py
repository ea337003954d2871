"""bench/README.md is the index of bench/: every script under bench/ (the
maintained benchmarks at the top, bench/experiments/, anything added later;
not the shared modules in bench/harness/ nor __init__.py) has a row there
(its question, the command that runs it, its results file or "none"), and
every script and file the index names exists."""
import os
import re

from conftest import ROOT

SCRIPT = re.compile(r"(?<![\w/])bench/[\w./-]+?\.py\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def scripts(root):
    """The repo-relative paths of the scripts that need a row."""
    out = []
    bench = os.path.join(root, "bench")
    for folder, dirs, files in os.walk(bench):
        dirs[:] = sorted(d for d in dirs if d not in ("harness", "__pycache__"))
        for name in sorted(files):
            if name.endswith(".py") and name != "__init__.py":
                out.append(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/"))
    return out


def rows(text):
    """script path -> the cells of its table row (a row's first cell is the
    script's path in backticks)."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
        m = re.fullmatch(r"`(bench/[^`]+\.py)`", cells[0]) if cells else None
        if m:
            out[m.group(1)] = cells
    return out


def missing_rows(root, text):
    """Scripts without a complete row: 4 cells, a question, a command that
    runs the script, a results file or "none"."""
    have = rows(text)
    bad = []
    for s in scripts(root):
        cells = have.get(s)
        if not (cells and len(cells) == 4 and cells[1] and s in cells[2] and cells[3]):
            bad.append(s)
    return bad


def missing_files(root, text):
    """Scripts and link targets the index names that are not there."""
    named = {os.path.join(root, p) for p in SCRIPT.findall(text)}
    named |= {os.path.normpath(os.path.join(root, "bench", t)) for t in LINK.findall(text) if "://" not in t}
    return sorted(os.path.relpath(p, root) for p in named if not os.path.exists(p))


def readme():
    with open(os.path.join(ROOT, "bench", "README.md")) as f:
        return f.read()


def test_every_bench_script_has_a_row_in_the_index():
    assert scripts(ROOT), "no scripts found under bench/"
    assert missing_rows(ROOT, readme()) == []


def test_every_script_and_file_the_index_names_exists():
    text = readme()
    assert len(SCRIPT.findall(text)) >= len(scripts(ROOT))
    assert missing_files(ROOT, text) == []


def test_harness_modules_need_no_row_but_are_indexed_apart():
    harness = sorted(f for f in os.listdir(os.path.join(ROOT, "bench", "harness"))
                     if f.endswith(".py") and f != "__init__.py")
    assert harness and not any(s.startswith("bench/harness/") for s in scripts(ROOT))
    assert all(f"`bench/harness/{f}`" in readme() for f in harness)


def synthetic(tmp_path, files, text):
    for rel in files:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text('"""x"""\n')
    (tmp_path / "bench" / "README.md").write_text(text)
    return str(tmp_path)


def test_the_check_fails_on_a_missing_row(tmp_path):
    text = ("| script | question | command | results |\n| --- | --- | --- | --- |\n"
            "| `bench/a.py` | Why? | `python bench/a.py` | none |\n")
    root = synthetic(tmp_path, ["bench/a.py", "bench/experiments/b.py", "bench/harness/common.py",
                                "bench/harness/__init__.py"], text)
    assert missing_rows(root, text) == ["bench/experiments/b.py"]  # the harness needs no row
    # a row whose command runs another script, or with a cell missing, is no row
    assert missing_rows(root, text.replace("python bench/a.py", "python bench/c.py")) == [
        "bench/a.py", "bench/experiments/b.py"]
    assert "bench/a.py" in missing_rows(root, text.replace(" none |", ""))
    # the real index with one row removed fails the check
    real = readme()
    without = "\n".join(ln for ln in real.splitlines() if not ln.startswith("| `bench/peers.py`"))
    assert missing_rows(ROOT, without) == ["bench/peers.py"]


def test_the_check_fails_on_a_named_script_or_file_that_is_gone(tmp_path):
    text = ("| `bench/a.py` | Why? | `python bench/a.py` | [results/a.md](results/a.md) |\n"
            "see `bench/experiments/gone.py`\n")
    root = synthetic(tmp_path, ["bench/a.py"], text)
    assert missing_files(root, text) == ["bench/experiments/gone.py", "bench/results/a.md"]
