"""One bundle for several targets (compiler/bundle/multi.py; the runtime's
bundle/open.c pick_section, exec/load.c): the same file opened on this
machine's best x86 section and forced to its AVX2 one, under qemu as a
Cortex-A53 (the generic aarch64 section) and a Cortex-A76 (sd855's), on
lavapipe (the Vulkan section, asked for: unasked, a CPU implementation of
Vulkan is passed over for the CPU sections), each matching onnxruntime;
a list this CPU runs none of refused naming each target; equal weight
bytes stored once; `coldbrew inspect` listing the sections."""
import ctypes
import struct

import numpy as np
import pytest
import qemu
from click.testing import CliRunner
from conftest import assert_close, ort_run

import coldbrew
from coldbrew.compiler import compile_model
from coldbrew.compiler.tools.cli import main
from coldbrew.runtime import testing_function as runtime_hook

TARGETS = "host,x86_64-avx2,aarch64,sd855,vulkan"


@pytest.fixture(scope="module")
def multi(small_model, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("multi") / "small-multi.brew")
    compile_model(small_model, path, target=TARGETS)
    return path


def _feeds(model, seed=5):
    x = model.graph.input[0]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    return {x.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def test_the_host_opens_its_own_section_unasked_and_the_avx2_one_when_asked(multi, small_model):
    feeds = _feeds(small_model)
    ref = ort_run(small_model, feeds)
    sess = coldbrew.load(multi, trace=True)
    assert sess.target == "host"  # not vulkan: lavapipe, the only Vulkan device here, is a CPU implementation
    assert_close(sess.run(None, feeds), ref)
    assert [e["variant"] for e in sess.trace() if e["phase"] == "verify"] == ["host"]
    forced = coldbrew.load(multi, target="x86_64-avx2")
    assert forced.target == "x86_64-avx2"
    assert_close(forced.run(None, feeds), ref)


def test_lavapipe_runs_the_vulkan_section_asked_for(multi, small_model):
    feeds = _feeds(small_model)
    sess = coldbrew.load(multi, target="vulkan")
    assert sess.target == "vulkan"
    assert_close(sess.run(None, feeds), ort_run(small_model, feeds))
    assert coldbrew.load(multi, cpu_only=True).target == "host"


def test_a_gpu_node_whose_vulkan_is_a_cpu_implementation_falls_back_to_the_cpu_sections(multi, small_model):
    """With a GPU's device node there, the open tries the Vulkan section
    first; lavapipe, a CPU implementation, is not taken unasked (CB_ERR_GPU),
    and the bundle is opened again for its CPU sections."""
    node = runtime_hook("cb_debug_gpu_node", None, ctypes.c_int)
    node(1)
    try:
        sess = coldbrew.load(multi)
    finally:
        node(-1)
    assert sess.target == "host"
    feeds = _feeds(small_model)
    assert_close(sess.run(None, feeds), ort_run(small_model, feeds))


def test_lavapipe_lays_out_a_padded_cpu_form_back_to_the_weights_part(tmp_path):
    """A CPU section that pads a weight's channels (padded_cnn: 6 of 8)
    shares those bytes with the Vulkan section, which uploads the weight's
    part (bundle/index.cc parse_relayout, vulkan_weights.c unlay)."""
    from conftest import padded_cnn

    model = padded_cnn()
    path = str(tmp_path / "padded.brew")
    compile_model(model, path, target="x86_64-avx2,vulkan")
    feeds = _feeds(model)
    sess = coldbrew.load(path, target="vulkan")
    assert sess.target == "vulkan"
    assert_close(sess.run(None, feeds), ort_run(model, feeds))


@pytest.mark.parametrize("cpu,section", [("cortex-a53", "aarch64"), ("cortex-a76", "sd855")])
def test_qemu_opens_the_section_its_cpu_runs(qemu_runner, multi, small_model, cpu, section, tmp_path):
    seen = {}
    pairs = qemu.run_and_compare(qemu_runner, small_model, multi, str(tmp_path), cpu=cpu, seen=seen)
    assert seen["target"] == section
    for ours, ref in pairs:
        assert_close(ours, ref)


def test_a_list_this_cpu_runs_none_of_is_refused_naming_each(small_model, tmp_path):
    with open("/proc/cpuinfo") as f:
        avx512 = "avx512f" in f.read()
    names = ["aarch64", "sd855"] + ([] if avx512 else ["x86_64-avx512"])
    path = str(tmp_path / "foreign.brew")
    compile_model(small_model, path, target=",".join(names))
    with pytest.raises(coldbrew.BundleError, match="no target of this bundle runs here") as e:
        coldbrew.load(path)
    for name in names:
        assert f"{name} (" in str(e.value)
    assert "this machine is x86_64" in str(e.value)
    if "x86_64-avx512" in names:
        assert "needs 'avx512f'" in str(e.value)
    with pytest.raises(coldbrew.BundleError, match="no target of this bundle runs here: .*not the one asked for"):
        coldbrew.load(path, target="nonesuch")


def test_inspect_lists_the_sections_and_their_shared_bytes(multi):
    out = CliRunner().invoke(main, ["inspect", "--verify", multi])
    assert out.exit_code == 0, out.output
    for name in TARGETS.split(","):
        assert f"section    {name} (schema v" in out.output
    assert "schema v9: 5 targets, best first" in out.output
    rows = {line.split()[0]: line.split() for line in out.output.splitlines() if line.startswith("  ")}
    assert not rows["host"][2].endswith("*") and rows["x86_64-avx2"][2].endswith("*")  # compressed headers
    assert "weight bytes stored once for several targets" in out.output
    assert "verify     ok" in out.output


def test_a_damaged_section_header_is_refused(multi, tmp_path):
    data = bytearray(open(multi, "rb").read())
    host = next(s for s in _index(data).sections if s.name == b"host")
    data[host.headerOffset + host.headerSize // 2] ^= 0x40
    with pytest.raises(coldbrew.BundleError, match="section 'host': header checksum mismatch"):
        coldbrew.load(bytes(data))
    assert coldbrew.load(bytes(data), target="x86_64-avx2").target == "x86_64-avx2"  # its own header is whole
    with pytest.raises(coldbrew.BundleError, match="section 'host': header checksum mismatch"):
        coldbrew.check_bundle(bytes(data))  # a tool's check: every section


def _index(data):
    from coldbrew.compiler.bundle.reader import read_bytes

    return read_bytes(bytes(data))[0]


def test_a_compressed_section_header_that_does_not_decode_is_refused(multi):
    """An index whose checksums hold but whose compressed header decodes to
    another size than it says: CORRUPT, naming the section; the other
    sections still open."""
    import flatbuffers

    from coldbrew.compiler.bundle.checksum import checksum64
    from coldbrew.schemas.generated import bundle_generated as fb

    data = bytearray(open(multi, "rb").read())
    index = _index(data)
    avx2 = next(s for s in index.sections if s.name == b"x86_64-avx2")
    assert avx2.headerRawSize
    avx2.headerRawSize += 8
    builder = flatbuffers.Builder(4096)
    builder.ForceDefaults(True)
    builder.Finish(index.Pack(builder), file_identifier=b"CBRW")
    header = bytes(builder.Output())
    hdr_off, hdr_size = struct.unpack_from("<IQ", data, 12)
    assert len(header) == hdr_size
    data[hdr_off:hdr_off + hdr_size] = header
    struct.pack_into("<Q", data, 24, checksum64(header))
    with pytest.raises(coldbrew.BundleError, match="section 'x86_64-avx2': its compressed header does not decode"):
        coldbrew.load(bytes(data), target="x86_64-avx2")
    assert coldbrew.load(bytes(data)).target == "host"
    with pytest.raises(coldbrew.BundleError, match="does not decode"):
        coldbrew.check_bundle(bytes(data))
