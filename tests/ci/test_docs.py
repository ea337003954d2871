"""Every repository path and link anchor the docs name exists: the Markdown
files of docs/, bench/README.md, schemas/README.md, runtime/README.md and
the root README.md. A path is a link's target (relative to its file) or a
word in code (inline or fenced) that starts with one of the repository's
top-level folders (relative to the root); an anchor is a link's `#...`
into a Markdown file, matched against its headings' GitHub slugs."""
import glob
import os
import re

from conftest import ROOT

TOP = ("compiler", "runtime", "bench", "tests", "docs", "schemas", "targets", "examples", ".ci")
FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1", re.M | re.S)
CODE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
PATH = re.compile(r"(?<![\w./$~-])(?:%s)/[\w./*-]*" % "|".join(re.escape(t) for t in TOP))
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ...


def doc_files(root=ROOT):
    names = sorted(glob.glob(os.path.join(root, "docs", "**", "*.md"), recursive=True))
    for rel in ("bench/README.md", "schemas/README.md", "runtime/README.md", "README.md"):
        if os.path.exists(os.path.join(root, rel)):
            names.append(os.path.join(root, rel))
    return names


def slug(heading):
    """GitHub's anchor for a heading: its text (code, links, emphasis
    taken as their words) lowercased, every character but letters, digits,
    '_', '-' and spaces dropped, spaces made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md_path):
    """The anchors of a Markdown file's headings (a repeated slug gets -1, -2, ...)."""
    text = FENCE.sub("", open(md_path, encoding="utf-8").read())
    seen, out = {}, set()
    for heading in HEADING.findall(text):
        s = slug(heading)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    out.update(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text))
    return out


def _exists(path):
    return glob.glob(path) if "*" in path else os.path.exists(path)


def problems(md_path, root=ROOT):
    """What `md_path` names that does not exist, one line each."""
    text = open(md_path, encoding="utf-8").read()
    here = os.path.dirname(md_path)
    rel = os.path.relpath(md_path, root)
    out = []
    code = [m.group(0) for m in FENCE.finditer(text)]
    prose = FENCE.sub("", text)
    code += [m.group(2) for m in CODE.finditer(prose)]
    prose = CODE.sub("", prose)
    for snippet in code:
        for name in PATH.findall(snippet):
            name = name.rstrip(".")
            if not _exists(os.path.join(root, name)):
                out.append(f"{rel}: path {name}")
    for target in LINK.findall(prose):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(here, path)) if path else md_path
        if not os.path.exists(full):
            out.append(f"{rel}: link {target}")
        elif anchor and full.endswith(".md") and anchor not in anchors(full):
            out.append(f"{rel}: anchor {target}")
    return out


def test_every_path_and_anchor_the_docs_name_exists():
    files = doc_files()
    assert os.path.join(ROOT, "docs", "pipeline.md") in files and os.path.join(ROOT, "README.md") in files
    missing = [p for f in files for p in problems(f)]
    assert not missing, "the docs name what does not exist:\n" + "\n".join(missing)


def test_the_check_catches_a_missing_path_and_anchor(tmp_path):
    (tmp_path / "compiler" / "passes").mkdir(parents=True)
    (tmp_path / "compiler" / "passes" / "codegen.py").write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## The cold path: `--plan cold`\n\n## Same\n\n## Same\n")
    doc = tmp_path / "docs" / "a.md"
    doc.write_text("# A page\n\n## Heading, with punctuation!\n\n"
                   "`compiler/passes/codegen.py` and `python compiler/passes/gone.py --x`; `compiler/passes/`.\n\n"
                   "```\nbash compiler/nope/run.sh\n```\n\n"
                   "[here](#heading-with-punctuation) [there](other.md#the-cold-path---plan-cold) "
                   "[again](other.md#same-1) [web](https://example.com/compiler/x.py)\n"
                   "[lost](#no-such-heading) [far](other.md#missing) [gone](../compiler/gone.md)\n")
    assert sorted(problems(str(doc), str(tmp_path))) == sorted([
        "docs/a.md: path compiler/passes/gone.py", "docs/a.md: path compiler/nope/run.sh",
        "docs/a.md: anchor #no-such-heading", "docs/a.md: anchor other.md#missing",
        "docs/a.md: link ../compiler/gone.md"])
