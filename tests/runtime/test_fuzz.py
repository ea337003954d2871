"""The runtime's libFuzzer targets (tests/fuzz/fuzz.py), ASan + UBSan: each
runs for a bounded time over the committed corpus with no crash, the
structure-aware ones reach the session and the run, and every crash found
so far (tests/fuzz/regressions/) is replayed. The million-execution runs
are `python tests/fuzz/fuzz.py`."""
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))
import fuzz  # noqa: E402

SECONDS = 15


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("fuzz"))
    return {name: fuzz.build_target(name, out) for name in fuzz.TARGETS}


@pytest.mark.parametrize("name", fuzz.TARGETS)
def test_fuzz_target_runs_clean_over_the_corpus(targets, name, tmp_path):
    res = fuzz.fuzz(targets[name], seconds=SECONDS, work=str(tmp_path))
    print(fuzz.summary(res))
    assert not res["crashes"] and res["exit"] == 0, fuzz.summary(res) + "\n" + fuzz.crash_report(res["log"])
    assert res["executions"] > 1000, fuzz.summary(res)
    cov = res["coverage"]
    if name == "decode":  # the code segment's decoder alone, from the seeds' compressed code
        assert cov["cb_lz4_decode"][0] > 0
        return
    assert cov["parse"][0] > 0 and cov["cb_bundle_from_memory"][0] > 0  # bundle/open.c: the open from memory
    if name == "run_structured":  # mutations with their checksums made right reach the session and the run
        for f in ("cb_session_create", "cb_session_run", "cb_read_tensors"):
            assert cov[f][0] > 0, (f, cov.get(f))


def test_the_structured_mutator_leaves_a_header_it_cannot_read_in_place_to_byte_mutations(targets, tmp_path):
    """A mutation can move the header to an offset that is not 8-byte
    aligned (the runtime refuses it); the mutator must not read it in place
    (a misaligned FlatBuffer under UBSan), only mutate its bytes."""
    with open(os.path.join(fuzz.CORPUS, "cached.brew"), "rb") as f:
        data = bytearray(f.read())
    off = int.from_bytes(data[12:16], "little")
    data[off:off] = b"\0" * 3  # the header three bytes on, its offset updated
    data[12:16] = (off + 3).to_bytes(4, "little")
    seed = tmp_path / "misaligned_header.brew"
    seed.write_bytes(bytes(data))
    res = fuzz.fuzz(targets["run_structured"], runs=300, work=str(tmp_path / "work"), seeds=[str(seed)])
    assert not res["crashes"] and res["exit"] == 0, fuzz.summary(res) + "\n" + fuzz.crash_report(res["log"])
    assert res["executions"] >= 300, fuzz.summary(res)


def test_regressions_replay_clean(targets):
    files = sorted(os.path.join(fuzz.REGRESSIONS, f) for f in os.listdir(fuzz.REGRESSIONS))
    assert files
    for name in ("open", "run"):
        r = fuzz.replay(targets[name], files)
        assert r.returncode == 0, r.stderr[-3000:]


def test_corpus_seeds_open_and_run(targets):
    seeds = sorted(os.path.join(fuzz.CORPUS, f) for f in os.listdir(fuzz.CORPUS))
    assert len(seeds) >= 4
    r = fuzz.replay(targets["run"], seeds)
    assert r.returncode == 0, r.stderr[-3000:]
