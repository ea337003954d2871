"""cpu/ (runtime/src/cpu): a CPU bundle's code decoded, loaded and its
kernels found (code.c); the runtime's own fp16 widening (widen.c); the
thread pool's parallel loops split by core speed (backend.c): a plan for
cores of different speeds carries each execution thread's share of a
loop's tasks; the runtime runs thread k's shares[k] consecutive tasks. Any
split gives the same outputs (equal to onnxruntime's); bad shares are clear
errors."""
import ctypes
import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_close, ort_run
from hostile import expect, read, repack

import coldbrew
from coldbrew.compiler import compile_graph
from coldbrew.compiler.bundle.checksum import checksum64
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.compiler.passes import write_bundle
from coldbrew.compiler.tools.cli import main
from coldbrew.runtime import _lib
from coldbrew.schemas.generated import bundle_generated as fb
from coldbrew.targets import CoreClass, resolve


def test_missing_kernel_is_load_error(small_bundle, tmp_path):
    def rename(b):  # in the plan and in the kernel list alike: the code lacks it
        k = next(k for k in b.kernels if k.symbol == b.plan.steps[0].kind.kernel)
        b.plan.steps[0].kind.kernel = k.symbol = b"no_such_kernel"
        b.kernels.sort(key=lambda k: k.symbol)
    expect(repack(read(small_bundle), rename), "LOAD", tmp_path, "no_such_kernel")


def test_compressed_code_that_does_not_decode(small_bundle, tmp_path):
    """The CPU code is one LZ4 block: with its checksums made right, a
    damaged block or a wrong decoded size is CORRUPT before anything loads."""
    data = read(small_bundle)
    b = fb.BundleT.InitFromObj(fb.Bundle.GetRootAs(bytes(data[64:]), 0))
    (code,) = [s for s in b.segments if s.kind == fb.SegmentKind.cpu_code_lz4]
    zeroed = bytearray(data)
    zeroed[code.offset:code.offset + code.size] = bytes(code.size)  # token 0, then offset 0: no block

    def zero_checksum(b):
        seg = next(s for s in b.segments if s.kind == fb.SegmentKind.cpu_code_lz4)
        seg.checksum = checksum64(bytes(code.size))
    expect(repack(zeroed, zero_checksum), "CORRUPT", tmp_path, "does not decode")

    for wrong, match in ((code.rawSize + 1, "does not decode"), (code.rawSize - 1, "does not decode"),
                         (0, "decoded"), (1 << 40, "decoded")):
        def size(b, wrong=wrong):
            next(s for s in b.segments if s.kind == fb.SegmentKind.cpu_code_lz4).rawSize = wrong
        expect(repack(data, size), "CORRUPT", tmp_path, match)


def test_widen_f16_turns_every_half_into_its_float():
    """cb_widen_f16 (widen.c: the transform cb.widen_f16; F16C or NEON where
    the CPU has them) gives every one of the 65536 fp16 values the fp32 value
    numpy gives it, bit for bit (a NaN stays a NaN), at lengths that leave a
    tail past the vector width, and writes nothing past its n values."""
    widen = _lib.cb_widen_f16
    widen.argtypes, widen.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64], None
    halves = np.random.default_rng(0).permutation(1 << 16).astype(np.uint16)
    for n in (1 << 16, 1, 7, 9, 1003):
        src = halves[:n].copy()
        out = np.full(n + 4, 7.0, np.float32)
        widen(src.ctypes.data, out.ctypes.data, n)
        got, want = out[:n], src.view(np.float16).astype(np.float32)
        nan = np.isnan(want)
        assert np.array_equal(np.isnan(got), nan), n
        assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), n
        assert (out[n:] == 7.0).all(), n


def test_widen_i8_multiplies_each_value_by_its_entrys_scale():
    """cb_widen_i8 (the transform cb.widen_i8) over [outer][n][inner]: every
    value times the scale of its entry of the middle axis, as numpy rounds
    it, and nothing written past the tensor."""
    widen = _lib.cb_widen_i8
    widen.argtypes, widen.restype = [ctypes.c_void_p] * 3 + [ctypes.c_uint64] * 3, None
    rng = np.random.default_rng(1)
    for outer, n, inner in ((1, 1, 1000), (3, 5, 7), (2, 64, 1), (1, 9, 33)):
        q = rng.integers(-128, 128, (outer, n, inner)).astype(np.int8)
        scale = rng.uniform(1e-4, 1.0, n).astype(np.float32)
        out = np.full(q.size + 4, 7.0, np.float32)
        widen(q.ctypes.data, scale.ctypes.data, out.ctypes.data, outer, n, inner)
        want = q.astype(np.float32) * scale.reshape(1, n, 1)
        assert np.array_equal(out[:q.size], want.reshape(-1)), (outer, n, inner)
        assert (out[q.size:] == 7.0).all()


@pytest.fixture(scope="module")
def feeds():
    return {"x": np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def _asymmetric_host(speed):
    """The host's ISA with its cores in two classes, the second at `speed`."""
    host = resolve("host")
    one = host.core_classes[0]
    ids = host.core_ids
    return dataclasses.replace(host, name="host-asym", core_classes=(
        CoreClass("fast", ids[:1], 1.0, None, one.scale), CoreClass("slow", ids[1:] or ids[:1], speed, None, one.scale)))


@pytest.mark.parametrize("shares", [[1, 1], [2, 1], [1, 3], [7, 1], [255, 1]])
def test_any_split_gives_the_same_outputs(small_bundle, small_model, feeds, shares):
    even = coldbrew.load(small_bundle, threads=2).run(None, feeds)
    split = coldbrew.load(small_bundle, threads=2, exec_shares=shares).run(None, feeds)
    for a, b, ref in zip(even, split, ort_run(small_model, feeds)):
        np.testing.assert_array_equal(a, b)  # each element is computed by one task, whichever thread runs it
        assert_close(b, ref)


def test_bad_shares_are_clear_errors(small_bundle):
    with pytest.raises(coldbrew.BundleError, match=r"INVALID_ARGUMENT.*exec_shares has 3 entries for 2 execution"):
        coldbrew.load(small_bundle, threads=2, exec_shares=[1, 2, 3])
    with pytest.raises(ValueError, match="whole numbers 1..255"):
        coldbrew.load(small_bundle, threads=2, exec_shares=[1, 0])


def test_plan_for_cores_of_different_speeds_carries_shares(tmp_path, small_model, feeds):
    path = tmp_path / "asym.brew"
    data, _ = compile_graph(small_model, str(path), target=_asymmetric_host(0.5), threads=2)
    bundle, _, _ = read_bytes(data)
    assert list(bundle.plan.execShares) == [2, 1]
    got = coldbrew.load(str(path)).run(None, feeds)
    assert_close(got, ort_run(small_model, feeds))
    out = CliRunner().invoke(main, ["inspect", str(path)])
    assert out.exit_code == 0 and "threads 2, loops split 2:1 by core speed" in out.output


def test_symmetric_cores_split_evenly(small_bundle):
    bundle, _, _ = read_bytes(open(small_bundle, "rb").read())
    assert bundle.plan.execShares is None or len(bundle.plan.execShares) == 0
    out = CliRunner().invoke(main, ["inspect", small_bundle])
    assert "loops split evenly" in out.output


@pytest.mark.parametrize("shares,message", [([1, 2, 3], "plan exec_shares has 3 entries for 2 execution threads"),
                                            ([0, 1], "plan exec_shares gives thread 0 no share")])
def test_bundle_with_bad_shares_is_refused(tmp_path, small_model, monkeypatch, shares, message):
    """The compiler's own check of what it writes refuses the bundle; written
    past that check, the runtime refuses it at open."""
    from coldbrew.compiler import InternalError

    monkeypatch.setattr(write_bundle, "_shares", lambda target, threads: shares if threads == 2 else [])
    path = tmp_path / "bad.brew"
    with pytest.raises(InternalError, match=f"runtime's verifier: BundleError: .CORRUPT. {message}"):
        compile_graph(small_model, str(path), threads=2)
    monkeypatch.setattr(write_bundle, "verify", lambda data: None)
    compile_graph(small_model, str(path), threads=2)
    with pytest.raises(coldbrew.BundleError, match=f"CORRUPT.*{message}"):
        coldbrew.load(str(path))
