"""compiler/bundle/multi.py: single-target bundles packed as one file's
sections, equal bytes stored once, the index best first, read back; the
runtime's side (which section a machine opens): tests/runtime/test_multi_target.py."""
import pytest

from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.bundle.multi import order, pack, sections


def test_equal_weights_are_stored_once(small_model, tmp_path):
    """aarch64 and sd855 kernels read one blocked layout (4 lanes): the
    second section stores no weight byte of its own."""
    one = compile_model(small_model, target="aarch64")
    both = compile_model(small_model, str(tmp_path / "arm.brew"), target="aarch64,sd855")
    weights = {s.offset: s.size for _, b, _ in sections(both) for s in b.segments if s.kind in (0, 1)}
    single = sum(s.size for s in sections(one)[0][1].segments if s.kind in (0, 1))
    assert sum(weights.values()) == single
    assert len(both) < 2 * len(one) - single // 2


def test_a_target_named_twice_is_a_compile_error(small_model):
    with pytest.raises(CompileError, match="each target is named once"):
        compile_model(small_model, target="host,aarch64,host")


def test_the_first_bundle_keeps_its_layout_and_the_index_puts_gpus_first(small_model):
    """Packed twice in another order, the same bytes shared; the index ranks
    GPU sections first, then CPU sections by their features, most first."""
    host, avx2 = compile_model(small_model, target="host"), compile_model(small_model, target="x86_64-avx2")
    both = pack([("host", host), ("x86_64-avx2", avx2)])
    got = sections(both)
    assert [n for n, _, _ in got] == order([(n, b) for n, b, _ in got])
    first = dict((n, b) for n, b, _ in got)["host"]
    alone = sections(host)[0][1]
    assert [(s.kind, s.size) for s in first.segments] == [(s.kind, s.size) for s in alone.segments]
    with pytest.raises(ValueError, match="named twice"):
        pack([("host", host), ("host", host)])
    with pytest.raises(ValueError, match="cannot be a section"):
        pack([("multi", both)])


def test_a_later_cpu_target_of_other_lanes_reads_the_weights_raw(small_model):
    """x86_64-avx2 blocks by 8 lanes, aarch64 by 4: the aarch64 section reads
    raw weights (driver._each_target) rather than store a layout of its own."""
    from coldbrew.schemas.generated import bundle_generated as fb

    got = dict((n, b) for n, b, _ in sections(compile_model(small_model, target="x86_64-avx2,aarch64")))
    forms = {n: {s.weightForm for s in b.plan.steps if any(b.tensors[a].kind == fb.TensorKind.weight
                                                            for a in b.layers[s.layer].args)} for n, b in got.items()}
    assert forms["aarch64"] == {fb.WeightForm.raw}, forms
    assert fb.WeightForm.cached in forms["x86_64-avx2"], forms
