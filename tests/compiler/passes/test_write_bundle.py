"""compiler/passes/write_bundle.py: the bundle's bytes. A 64-byte preamble
(magic, schema version, the header's size and checksum, the file's size),
the FlatBuffer header (the graph's tensors, layers, steps and kernel
signatures, read back by bundle/reader.py), the CPU code (LZ4, on 64 bytes
after the header; plain code on a page), then the weights in the order the
plan first uses them, one segment per run of one form (the first on a page,
later ones on 64 bytes, each tensor on 64 bytes, each with its checksum),
continuous mode's warm weights after all of them."""
import os
import struct

import numpy as np
import pytest

from coldbrew.compiler import pipeline
from coldbrew.compiler.bundle.checksum import checksum64
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.ir.graph import signatures
from coldbrew.compiler.passes import codegen, write_bundle
from coldbrew.schemas.generated import bundle_generated as fb
from coldbrew.compiler.options import Choices, Options

DTYPES = write_bundle.DTYPES  # index = schema DType
HASH = "ab" * 32
WINOGRAD = {"conv2d": "conv2d.winograd_f2"}


def _unpack(kind, data, raw_size):
    """The shared object of a CPU code segment of either kind."""
    import lz4.block

    return bytes(data) if kind != fb.SegmentKind.cpu_code_lz4 else lz4.block.decompress(bytes(data), uncompressed_size=raw_size)


def _align(n, a):
    return -(-n // a) * a


@pytest.fixture(scope="module")
def host():
    from coldbrew.targets import resolve

    return resolve("host")


@pytest.fixture(scope="module")
def front(small_model):
    return pipeline.front_end(small_model)


@pytest.fixture(scope="module")
def mixed(front, host):
    """(graph, code, bundle): the conv's weights raw (Winograd, transformed on
    the first run), the dense layer's cached: weights of both forms."""
    graph = pipeline.lower(front, Choices(WINOGRAD, {"*": "cached", "c0": "raw"}, 2, 0))
    code = codegen.apply(graph, host)
    return graph, code, write_bundle.apply(graph, code, host, "coldbrew test", HASH)


def _tensor_bytes(data, b, t):
    start = b.segments[t.segment].offset + t.segmentOffset
    return data[start:start + t.nbytes]


def test_preamble_and_header_read_back_as_the_graph(mixed):
    graph, _, data = mixed
    magic, version, preamble, hdr_size, hdr_sum, file_size = struct.unpack_from("<8sIIQQQ", data, 0)
    assert magic == b"COLDBREW" and data.startswith(write_bundle.MAGIC)
    assert (version, preamble, file_size) == (4, 64, len(data))  # fixed shapes: version 4
    assert checksum64(data[64:64 + hdr_size]) == hdr_sum
    b, size, read_version = read_bytes(data)
    assert (size, read_version, b.schemaVersion) == (len(data), 4, 4)
    assert (b.producer, b.modelHash, b.modelName) == (b"coldbrew test", HASH.encode(), graph.name.encode())
    assert [(t.name.decode(), DTYPES[t.dtype], tuple(int(d) for d in t.shape), t.kind, t.nbytes) for t in b.tensors] == [
        (t.name, t.dtype, tuple(t.shape), write_bundle.KINDS[t.kind], t.nbytes) for t in graph.tensors]
    for t, ours in zip(b.tensors, graph.tensors):
        if ours.kind != "weight":
            assert t.arenaOffset == ours.arena_offset
    assert (list(b.inputs), list(b.outputs)) == (graph.inputs, graph.outputs)
    assert [(x.name.decode(), x.op.decode(), list(x.args)) for x in b.layers] == [
        (x.name, x.op, list(x.args)) for x in graph.layers]
    steps = [(s.layer, s.variant.decode(), s.kind.kernel.decode(), s.transform.decode(),
              list(s.transformArgs if s.transformArgs is not None else []), s.weightForm) for s in b.plan.steps]
    assert steps == [(k, x.variant, x.kernel, x.transform, list(x.transform_args), getattr(fb.WeightForm, x.weight_form))
                     for k, x in enumerate(graph.layers)]
    assert [s.weightForm for s in b.plan.steps if s.variant != b"generic"] == [fb.WeightForm.raw, fb.WeightForm.cached]
    assert (b.plan.arenaSize, b.plan.preparedSize, b.plan.threads) == (graph.arena_size, graph.prepared_size,
                                                                        graph.threads)
    # each kernel's calling contract, sorted by symbol
    assert [(k.symbol.decode(), [DTYPES[d] for d in k.argDtypes], [int(n) for n in k.argNbytes])
            for k in b.kernels] == [(s, [d for d, _ in a], [n for _, n in a]) for s, a in signatures(graph)]


def test_segments_and_weights_lie_where_the_layout_puts_them(mixed):
    graph, code, data = mixed
    b = read_bytes(data)[0]
    hdr_size = struct.unpack_from("<Q", data, 16)[0]
    head, *segments = b.segments
    # the code, compressed, follows the header on 64 bytes and decodes to the shared object
    assert head.kind == fb.SegmentKind.cpu_code_lz4 and head.offset == _align(64 + hdr_size, 64)
    assert _unpack(head.kind, data[head.offset:head.offset + head.size], head.rawSize) == code
    # one segment per run of one form, in the order the plan first needs the weights (a transform's before
    # its layer's own), then any no layer reads
    every = [i for i, t in enumerate(graph.tensors) if t.kind == "weight"]
    order = list(dict.fromkeys([i for x in graph.layers for i in list(x.transform_args) + list(x.args)
                                if graph.tensors[i].kind == "weight"] + every))
    assert order != sorted(order)  # first use is not the tensors' own order
    kinds = [fb.SegmentKind.weights_cached if graph.tensors[i].cached else fb.SegmentKind.weights_raw for i in order]
    runs = [k for j, k in enumerate(kinds) if j == 0 or kinds[j - 1] != k]
    assert len(runs) >= 3 and [s.kind for s in segments] == runs
    assert segments[0].offset == _align(head.offset + head.size, write_bundle.PAGE)
    for prev, s in zip(segments, segments[1:]):
        assert s.offset == _align(prev.offset + prev.size, 64)
    assert len(data) == _align(segments[-1].offset + segments[-1].size, 64)
    for s in b.segments:
        assert s.checksum == checksum64(data[s.offset:s.offset + s.size])
    # each weight on 64 bytes, holding its data, with its checksum, in need order
    places = []
    for i in order:
        t, ours = b.tensors[i], graph.tensors[i]
        assert t.segmentOffset % 64 == 0
        stored = _tensor_bytes(data, b, t)
        assert stored == np.ascontiguousarray(ours.data).astype(ours.dtype).tobytes()
        assert t.checksum == checksum64(stored)
        places.append(b.segments[t.segment].offset + t.segmentOffset)
    assert places == sorted(places) and len(places) == len(set(places))


def test_plain_code_is_stored_on_a_page(mixed, host):
    graph, _, _ = mixed
    plain = os.urandom(3000)  # does not compress
    assert write_bundle.pack_code(plain) == (fb.SegmentKind.cpu_code, plain, 0)
    data = write_bundle.apply(graph, plain, host, "coldbrew test", HASH)
    head = read_bytes(data)[0].segments[0]
    assert head.kind == fb.SegmentKind.cpu_code and head.offset % write_bundle.PAGE == 0 and head.rawSize == 0
    assert data[head.offset:head.offset + head.size] == plain
    kind, packed, raw_size = write_bundle.pack_code(b"\x90" * 3000)
    assert kind == fb.SegmentKind.cpu_code_lz4 and len(packed) < 3000 and raw_size == 3000
    assert _unpack(kind, packed, raw_size) == b"\x90" * 3000


def test_warm_weights_come_after_every_weight_the_plan_reads(front, host):
    from coldbrew.compiler.passes import add_warm_steps

    cold = pipeline.lower(front, Choices({"conv2d": "conv2d.im2col_gemm"}, "raw", 2, 0))
    warm = pipeline.lower(front, Choices(WINOGRAD, "cached", 2, 0))
    cold = add_warm_steps.apply(cold, warm, 2)
    data = write_bundle.apply(cold, b"\x90" * 1000, host, "coldbrew test", HASH)
    b = read_bytes(data)[0]
    place = lambda i: b.segments[b.tensors[i].segment].offset + b.tensors[i].segmentOffset  # noqa: E731
    read_by_plan = {i for layer in cold.layers for i in list(layer.args) + list(layer.transform_args)
                    if cold.tensors[i].kind == "weight"}
    warm_only = {i for layer in cold.layers if layer.warm for i in layer.warm["args"]
                 if cold.tensors[i].kind == "weight"} - read_by_plan
    assert warm_only and all(cold.tensors[i].name.endswith(".warm") for i in warm_only)
    assert min(place(i) for i in warm_only) >= max(place(i) + b.tensors[i].nbytes for i in read_by_plan)
    alt = next(s.kind.warm for s in b.plan.steps if s.kind.warm)
    assert alt.kernel.decode().startswith("warm_") and set(warm_only) <= set(alt.args)
    assert b.plan.warmThreads == 2


def test_run_stores_the_measured_accuracy_of_narrowed_layers(front, host):
    from coldbrew.compiler.pipeline import Compilation

    graph = pipeline.lower(front, Choices(None, "cached", 2, 0, {"*": "fp32", "c0": "fp16"}))
    assert {x.name: x.weight_precision for x in graph.layers if x.variant != "generic"} == {"c0": "fp16", "d0": "fp32"}
    accuracy = {"output_error": 0.02, "samples": 3, "inputs": "3 generated", "max_error": 0.05,
                "layers": {"c0": 0.01, "d0": 0.007}}
    c = write_bundle.run(Compilation(graph=graph, code=b"\x90" * 1000, options=Options(target=host), producer="coldbrew test",
                                     model_hash=HASH, accuracy=accuracy))
    b = read_bytes(c.data)[0]
    acc = b.accuracy
    assert (acc.outputError, acc.samples, acc.inputs, acc.maxError) == (pytest.approx(0.02), 3, b"3 generated",
                                                                        pytest.approx(0.05))
    errors = {b.layers[s.layer].name.decode(): s.outputError for s in b.plan.steps if s.variant != b"generic"}
    assert errors == {"c0": pytest.approx(0.01), "d0": 0.0}  # a layer kept fp32 has no error of its own
    plain = write_bundle.run(Compilation(graph=pipeline.lower(front, Choices(None, "cached", 2, 0)),
                                         code=b"\x90" * 1000, options=Options(target=host), model_hash=HASH))
    assert read_bytes(plain.data)[0].accuracy is None


def test_the_plan_records_the_core_class_of_every_thread_and_queue():
    """Execution thread k on the target's k-th fastest core, preparation
    queues on the cores after them (sd855: prime, big x 3, little x 4), an
    execution core's class where none is left; the bundle's plan holds them."""
    from coldbrew.compiler import compile_model
    from coldbrew.targets import resolve

    from conftest import small_cnn

    sd855 = resolve("sd855")
    assert [c.name for c in sd855.core_classes][:2] == ["prime", "big"]
    assert write_bundle.placed_classes(sd855, 2, 2) == (["prime", "big"], ["big", "big"])
    assert write_bundle.placed_classes(sd855, 4, 5) == (["prime", "big", "big", "big"], ["little"] * 4 + ["little"])
    host = resolve("host")
    assert write_bundle.placed_classes(host, len(host.core_ids), 1)[1] == [host.core_classes[-1].name]
    b = read_bytes(compile_model(small_cnn(), target="sd855", queues={"*": 1, "c0": 0}))[0]
    assert [c.decode() for c in b.plan.execClasses] == ["prime", "big"][:b.plan.threads]
    assert [c.decode() for c in b.plan.queueClasses] == ["big"]


def _tied_model(reads=("w", "w", "w", "v", "v"), n=96):
    """A chain of MatMuls (a ReLU after each but the last), each reading the
    weight named in `reads`: the weight tying of ALBERT-style encoders."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32) / n, "w")
    v = numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32) / n, "v")
    nodes, x = [], "x"
    for k, name in enumerate(reads[:-1]):
        nodes.append(helper.make_node("MatMul", [x, name], [f"m{k}"]))
        nodes.append(helper.make_node("Relu", [f"m{k}"], [f"r{k}"]))
        x = f"r{k}"
    nodes.append(helper.make_node("MatMul", [x, reads[-1]], ["y"]))
    graph = helper.make_graph(nodes, "tied", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, n])], [w, v])
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("weights", ["cached", "raw"])
def test_a_weight_several_layers_read_is_stored_once(weights, tmp_path):
    """Every layer reading one weight in one form points at the same bytes:
    the bundle's weight bytes are the model's two weights, once each."""
    import coldbrew
    from coldbrew.compiler import compile_model
    from conftest import assert_close, ort_run

    model, path = _tied_model(), str(tmp_path / "tied.brew")
    compile_model(model, path, weights=weights)
    b, _, _ = read_bytes(open(path, "rb").read())
    stored = sum(s.size for s in b.segments if s.kind in (fb.SegmentKind.weights_raw, fb.SegmentKind.weights_cached))
    users = [t for t in b.tensors if t.kind == fb.TensorKind.weight and t.nbytes == 96 * 96 * 4]
    assert len(users) == 5 and len({(t.segment, t.segmentOffset) for t in users}) == 2
    assert stored <= 2 * 96 * 96 * 4 + 64
    from coldbrew.compiler.tools.inspect import describe

    assert "shared     5 weight tensors are 2 stored once (110,592 bytes not repeated" in "\n".join(describe(path))
    x = np.random.default_rng(0).standard_normal((8, 96)).astype(np.float32)
    assert_close(coldbrew.load(path).run(None, {"x": x}), ort_run(model, {"x": x}))
