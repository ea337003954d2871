"""runtime/src is laid out in layers, a folder each, lowest first (LAYERS):
a source includes headers of its own folder or of folders below it, and
names no function defined in a folder above it, so lower layers never call
up; and the files of one folder call one way, never in a loop (a lower file
holds what two of them share). The check reads every file's `#include "..."`
lines and, comments and strings left out, the functions it names; an upward
include or call, or a loop of calls, planted in a copy of the tree must fail
it."""
import os
import re
import shutil
import sys

from conftest import ROOT

SRC = os.path.join(ROOT, "runtime", "src")
LAYERS = ["base", "bundle", "cpu", "vulkan", "exec"]  # lowest first: each may use the ones before it
OUTSIDE = {"coldbrew.h", "coldbrew_testing.h",  # runtime/include: the API, under every layer
           "bundle_generated.h"}  # schemas/generated: the verifier's (bundle/model.cc)
SOURCE_EXT = (".c", ".cc", ".h")


def _sources(src):
    """(path relative to `src`, text) of every source under it."""
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            if f.endswith(SOURCE_EXT):
                path = os.path.join(dirpath, f)
                with open(path) as fh:
                    yield os.path.relpath(path, src), fh.read()


def _code(text):
    """The text without comments and string literals (line breaks kept)."""
    pattern = r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"'
    return re.sub(pattern, lambda m: "\n" * m.group(0).count("\n") if m.group(0)[0] == "/" else '""', text,
                  flags=re.S)


def _layer(rel):
    """The layer of a file (its folder), or None for a file outside them."""
    parts = rel.split(os.sep)
    return parts[0] if len(parts) == 2 and parts[0] in LAYERS else None


def _included_layer(src, rel, name):
    """The layer of the header `rel` includes as "name"; None for the headers
    outside runtime/src; "?" for one it cannot place."""
    if os.path.exists(os.path.join(src, os.path.dirname(rel), name)):  # beside the includer: its own folder
        return _layer(os.path.normpath(os.path.join(os.path.dirname(rel), name)))
    if name in OUTSIDE:
        return None
    if os.path.exists(os.path.join(src, name)):
        return _layer(os.path.normpath(name)) or "?"
    return "?"


def _defined(code):
    """Functions a source defines for other files (not static; `code`: _code's, so
    C++'s extern "C" reads extern "")."""
    return set(re.findall(r'^(?!static\b)(?:extern ""\s*)?(?:[A-Za-z_][\w*]*[ *]+)+(cb_\w+)\([^;{}]*\)\s*\{', code,
                          flags=re.M))


def _reach(calls):
    """Per file, the files its calls lead to, directly or through others."""
    reach = {a: set(bs) for a, bs in calls.items()}
    for _ in calls:
        for a in reach:
            reach[a] |= set().union(*(reach.get(b, set()) for b in reach[a]))
    return reach


def violations(src=SRC):
    """What breaks the layering under `src`, one line each (empty: none)."""
    files = {rel: text for rel, text in _sources(src)}
    out, owner, calls = [], {}, {}
    for rel, text in files.items():
        if _layer(rel) is None:
            out.append(f"{rel}: not in a layer folder ({', '.join(LAYERS)})")
        for fn in _defined(_code(text)):
            owner[fn] = rel
    for rel, text in files.items():
        mine = _layer(rel)
        if mine is None:
            continue
        for n, line in enumerate(text.split("\n"), 1):
            m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
            if not m:
                continue
            theirs = _included_layer(src, rel, m.group(1))
            if theirs == "?":
                out.append(f"{rel}:{n} includes {m.group(1)}, which is in no layer")
            elif theirs and LAYERS.index(theirs) > LAYERS.index(mine):
                out.append(f"{rel}:{n} includes {m.group(1)}: {theirs}/ is above {mine}/")
        code = _code(text)
        for fn in sorted(set(re.findall(r"\b(cb_\w+)\s*\(", code))):
            theirs = _layer(owner.get(fn, ""))
            if theirs and LAYERS.index(theirs) > LAYERS.index(mine):
                out.append(f"{rel} calls {fn}, defined in {theirs}/ above {mine}/")
            elif theirs == mine and owner[fn] != rel:  # a file calling itself is no loop
                calls.setdefault(rel, {}).setdefault(owner[fn], []).append(fn)
    reach = _reach(calls)
    for a, callees in calls.items():
        for b, fns in callees.items():
            if a in reach.get(b, ()):
                out.append(f"{a} calls {b} ({', '.join(fns)}), whose calls lead back to {a}")
    return sorted(out)


def test_runtime_sources_include_and_call_only_their_layer_and_below():
    assert violations() == []
    assert sorted(os.listdir(SRC)) == sorted(LAYERS)


def test_each_layer_has_its_test_file():
    here = os.path.dirname(os.path.abspath(__file__))
    assert [f"test_{layer}.py" for layer in LAYERS if not os.path.exists(os.path.join(here, f"test_{layer}.py"))] == []


def test_the_build_compiles_every_source_of_every_layer():
    sys.path.insert(0, os.path.join(ROOT, "runtime"))
    import build

    built = sorted(build.C_SOURCES + build.CXX_SOURCES)
    assert built == sorted(rel for rel, _ in _sources(SRC) if not rel.endswith(".h"))
    assert {_layer(s) for s in built} == set(LAYERS)


def _copy(tmp_path):
    dst = tmp_path / "src"
    shutil.copytree(SRC, dst)
    assert violations(str(dst)) == []
    return dst


def _append(path, text):
    with open(path, "a") as f:
        f.write(text)


def test_an_upward_include_fails_the_check(tmp_path):
    src = _copy(tmp_path)
    _append(src / "bundle" / "stream.c", '#include "exec/session.h"\n')
    _append(src / "base" / "alloc.c", '#include "../cpu/cpu.h"\n')
    found = violations(str(src))
    assert len(found) == 2, found
    assert found[0].startswith("base/alloc.c:") and "../cpu/cpu.h: cpu/ is above base/" in found[0]
    assert found[1].startswith("bundle/stream.c:") and "exec/session.h: exec/ is above bundle/" in found[1]


def test_an_upward_call_through_a_prototype_of_its_own_fails_the_check(tmp_path):
    src = _copy(tmp_path)
    _append(src / "bundle" / "stream.c",
            "int cb_backend_threads(void);  /* cb_session_run( in a comment is no call */\n"
            "int cb_stream_pool(void) { return cb_backend_threads(); }\n")
    assert violations(str(src)) == ["bundle/stream.c calls cb_backend_threads, defined in cpu/ above bundle/"]


def test_a_source_outside_the_layer_folders_fails_the_check(tmp_path):
    src = _copy(tmp_path)
    (src / "internal.h").write_text("/* shared by everything */\n")
    (src / "exec" / "extra").mkdir()
    (src / "exec" / "extra" / "x.c").write_text('#include "exec/session.h"\n')
    found = violations(str(src))
    assert sorted(found) == ["exec/extra/x.c: not in a layer folder (base, bundle, cpu, vulkan, exec)",
                             "internal.h: not in a layer folder (base, bundle, cpu, vulkan, exec)"]


def test_a_loop_of_calls_between_files_of_a_folder_fails_the_check(tmp_path):
    src = _copy(tmp_path)  # exec/: session.c -> warmer.c -> step.c, now -> session.c; run.c only calls in
    _append(src / "exec" / "step.c", "void cb_step_drop(cb_session* s) { cb_session_release(s); }\n")
    _append(src / "vulkan" / "vulkan_weights.c", "cb_status cb_vk_reopen(cb_gpu** g) { return cb_gpu_open(g); }\n")
    back = "whose calls lead back to"
    assert violations(str(src)) == [
        f"exec/session.c calls exec/warmer.c (cb_warmer_stop), {back} exec/session.c",
        f"exec/step.c calls exec/session.c (cb_session_release), {back} exec/step.c",
        f"exec/warmer.c calls exec/step.c (cb_read_tensors, cb_trace_end, cb_trace_step), {back} exec/warmer.c",
        f"vulkan/vulkan.c calls vulkan/vulkan_weights.c (cb_vk_layout_weights), {back} vulkan/vulkan.c",
        f"vulkan/vulkan_weights.c calls vulkan/vulkan.c (cb_gpu_open), {back} vulkan/vulkan_weights.c"]
