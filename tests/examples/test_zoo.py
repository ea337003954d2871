"""Every zoo model compiles and its bundle matches onnxruntime."""
import os
import sys

import numpy as np
import pytest

import coldbrew
from coldbrew.compiler.measure.protocol import evict
from conftest import ROOT, assert_close, cpu_targets, ort_run

sys.path.insert(0, os.path.join(ROOT, "examples"))
import zoo  # noqa: E402

NAMES = list(zoo.MODELS)


def test_zoo_has_the_paper_models():
    for name in ("resnet18", "resnet50", "mobilenet", "mobilenet_v2", "squeezenet", "shufflenet_v2",
                 "googlenet", "alexnet", "efficientnet_b0", "crnn"):
        assert name in NAMES


def test_zoo_is_deterministic():
    assert zoo.build("squeezenet").SerializeToString() == zoo.build("squeezenet").SerializeToString()


# host code, and on x86 also AVX2 code (x86-64-v3 runs on every AVX2 and
# AVX-512 machine), whichever CPU runs the tests
TARGETS = cpu_targets()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_matches_onnxruntime(name, target, tmp_path):
    from coldbrew.compiler import compile_model

    model = zoo.build(name)
    path = tmp_path / f"{name}.brew"
    compile_model(model, str(path), target=target)
    evict(path)  # opened cold: the open reads its front past the page cache, the streamer the rest
    sess = coldbrew.load(str(path))
    rng = np.random.default_rng(11)
    feeds = {i.name: rng.standard_normal(i.shape).astype(i.dtype) for i in sess.get_inputs()}
    ours = sess.run(None, feeds)
    ref = ort_run(model, feeds)
    assert_close(ours, ref)
    # a code segment that runs past the open's first read (128 KiB) is read
    # once the header is parsed, with the first weights: its last byte is still
    # checked (tests/runtime/test_bundle.py makes such a front on purpose)
    code = code_segment(path)
    if code.offset + code.size > FIRST_REQUEST:
        data = bytearray(path.read_bytes())
        data[code.offset + code.size - 1] ^= 0x01
        path.write_bytes(bytes(data))
        evict(path)
        with pytest.raises(coldbrew.BundleError) as e:
            coldbrew.load(str(path))
        assert e.value.status == "CORRUPT"


FIRST_REQUEST = 128 << 10  # runtime/src/bundle/bundle.h: CB_STREAM_FIRST


def code_segment(path):
    from coldbrew.compiler.bundle.reader import read_header
    from coldbrew.schemas.generated import bundle_generated as fb

    return next(s for s in read_header(str(path)).segments if s.kind == fb.SegmentKind.cpu_code_lz4)


# Forced variants on whole models: squeezenet has 1x1, 3x3 stride-1 and a
# strided first conv; mobilenet has depthwise and pointwise convs.
FORCED = [(m, v) for m in ("squeezenet", "mobilenet")
          for v in ("direct", "packed_direct", "im2col_gemm", "gemm_1x1", "im2col_gemm_kvec", "gemm_1x1_kvec",
                    "winograd_f2", "winograd_f4",
                    "winograd_f6", "depthwise_direct", "blocked", "depthwise_blocked")]


@pytest.mark.parametrize("name,variant", FORCED, ids=[f"{m}-{v}" for m, v in FORCED])
def test_zoo_model_with_forced_variant(name, variant):
    from coldbrew.compiler import compile_model

    model = zoo.build(name)
    data = compile_model(model, variants={"*": variant}, weights="raw" if "winograd" in variant else "cached")
    from coldbrew.compiler.bundle.reader import read_bytes

    used = {s.variant.decode() if isinstance(s.variant, bytes) else s.variant for s in read_bytes(data)[0].plan.steps}
    # mobilenet (v1) has no 3x3 stride-1 dense conv, squeezenet no depthwise one
    applies = not ((name == "squeezenet" and variant.startswith("depthwise"))
                   or (name == "mobilenet" and variant.startswith("winograd")))
    assert (f"conv2d.{variant}" in used) == applies, used
    sess = coldbrew.load(data)
    feeds = {i.name: np.random.default_rng(5).standard_normal(i.shape).astype(i.dtype) for i in sess.get_inputs()}
    tol = 5e-3 if variant == "winograd_f6" else 1e-3
    assert_close(sess.run(None, feeds)[0], ort_run(model, feeds)[0], rel=tol)
