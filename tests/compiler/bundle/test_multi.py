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


def _weight_bytes(data):
    """Bytes of the distinct weight segments of a bundle (every section's)."""
    return sum({s.offset: s.size for _, b, _ in sections(data) for s in b.segments if s.kind in (0, 1)}.values())


def test_a_later_cpu_target_of_other_lanes_shares_the_first_ones_blocked_weights(small_model):
    """x86_64-avx2 blocks by 8 lanes, aarch64 by 4: the aarch64 section is
    scheduled on 8-lane blocks (driver._sharing, Target.blocks_of) and reads
    the x86 section's cached weights; no weight byte is its own."""
    from coldbrew.schemas.generated import bundle_generated as fb

    data = compile_model(small_model, target="x86_64-avx2,aarch64")
    got = dict((n, b) for n, b, _ in sections(data))
    forms = {n: {s.weightForm for s in b.plan.steps if any(b.tensors[a].kind == fb.TensorKind.weight
                                                            for a in b.layers[s.layer].args)} for n, b in got.items()}
    assert forms["aarch64"] == forms["x86_64-avx2"] and fb.WeightForm.cached in forms["aarch64"], forms
    assert _weight_bytes(data) == _weight_bytes(compile_model(small_model, target="x86_64-avx2"))


@pytest.mark.parametrize("padded", [False, True])
def test_a_gpu_section_reads_the_cpu_sections_rearranged_weights(small_model, padded):
    """The Vulkan section's convolution weights are the x86 section's blocked
    bytes with their Relayout (schema 8; the runtime lays them out back as it
    uploads: tests/runtime/test_multi_target.py runs it on lavapipe); where
    the x86 form pads a weight's channels, its part (padded_cnn)."""
    from conftest import padded_cnn

    from coldbrew.compiler.ir.relayout import Relayout, unlay

    import numpy as np

    small_model = padded_cnn() if padded else small_model
    data = compile_model(small_model, target="x86_64-avx2,vulkan")
    got = {n: (b, v) for n, b, v in sections(data)}
    gpu, version = got["vulkan"]
    relaid = [t for t in gpu.tensors if t.relayout is not None and list(t.relayout.stored) != list(t.shape)]
    assert relaid and version == 8 and got["x86_64-avx2"][1] < 8
    alone = compile_model(small_model, target="vulkan")
    single = {t.name: t for t in sections(alone)[0][1].tensors}
    for t in relaid:  # laid out back, each is the raw weight a Vulkan-only bundle stores
        r, seg = t.relayout, gpu.segments[t.segment]
        desc = Relayout(*(tuple(int(d) for d in v) for v in (r.raw, r.stored, r.axes, r.mults)))
        stored = np.frombuffer(data, np.float32, int(np.prod(desc.stored)), seg.offset + t.segmentOffset)
        own = single[t.name]
        oseg = sections(alone)[0][1].segments[own.segment]
        raw = np.frombuffer(alone, np.float32, own.nbytes // 4, oseg.offset + own.segmentOffset)
        back = unlay(stored.reshape(desc.stored), desc)[tuple(slice(0, int(d)) for d in t.shape)]
        assert np.array_equal(back.reshape(-1), raw), t.name  # (a padded CPU form: the tensor's part)
        assert t.nbytes == own.nbytes
    cropped = [t for t in relaid if list(t.relayout.raw) != list(t.shape)]
    assert len(cropped) == (2 if padded else 0), [(list(t.relayout.raw), list(t.shape)) for t in relaid]
    own_bytes = sum((t.nbytes + 63) // 64 * 64 for t in gpu.tensors if t.kind == 3 and t not in relaid)
    assert _weight_bytes(data) <= _weight_bytes(compile_model(small_model, target="x86_64-avx2")) + own_bytes


def test_the_later_sections_headers_are_stored_compressed(small_model):
    """The first section's header is stored as it is (it reads as a single
    bundle's); a later one's is an LZ4 block, smaller, read back whole."""
    from coldbrew.compiler.bundle.reader import read_bytes

    data = compile_model(small_model, target="host,x86_64-avx2")
    index, _, version = read_bytes(data)
    stored = {s.name.decode(): s for s in index.sections}
    assert version == 9 and stored["host"].headerRawSize == 0
    avx2 = stored["x86_64-avx2"]
    assert 0 < avx2.headerSize < avx2.headerRawSize
    got = dict((n, b) for n, b, _ in sections(data))["x86_64-avx2"]
    alone = sections(compile_model(small_model, target="x86_64-avx2"))[0][1]
    assert [t.name for t in got.tensors] == [t.name for t in alone.tensors]
    assert len(got.plan.steps) == len(alone.plan.steps)
