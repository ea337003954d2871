"""Signed bundles: `coldbrew keygen`, `coldbrew compile --sign KEY`,
`coldbrew.load(path, public_key=...)`. With a key the runtime refuses an
unsigned bundle, one signed by another key, and one altered in any byte
(every byte of a signed bundle is tried), before it parses the header or
loads code; without a key, signed and unsigned bundles open alike."""
import struct

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import assert_close, ort_run

import coldbrew
from coldbrew.compiler.bundle.checksum import checksum64
from coldbrew.compiler.tools.cli import main
from coldbrew.compiler.bundle.reader import read_bytes
from coldbrew.schemas.generated import bundle_generated as fb

# statuses a refused open may give: the preamble's own checks come first
# (magic, version, declared size, the signature block's place), then the signature
REFUSED = ("SIGNATURE", "BAD_MAGIC", "VERSION", "CORRUPT")


@pytest.fixture(scope="module")
def signed(tmp_path_factory, small_model):
    import onnx

    d = tmp_path_factory.mktemp("signed")
    onnx.save(small_model, str(d / "small.onnx"))
    runner = CliRunner()
    for key in ("key", "other"):
        r = runner.invoke(main, ["keygen", str(d / key)])
        assert r.exit_code == 0, r.output
    for name, extra in (("signed", ["--sign", str(d / "key")]), ("unsigned", [])):
        r = runner.invoke(main, ["compile", str(d / "small.onnx"), "-o", str(d / f"{name}.brew"), "--no-tune", *extra])
        assert r.exit_code == 0, r.output
    return d


@pytest.fixture(scope="module")
def feeds():
    return {"x": np.random.default_rng(5).standard_normal((1, 3, 16, 16)).astype(np.float32)}


def test_a_signed_bundle_runs_with_its_key_and_without_one(signed, small_model, feeds):
    ref = ort_run(small_model, feeds)
    for key in (str(signed / "key.pub"), open(signed / "key.pub").read().strip(), None):
        sess = coldbrew.load(str(signed / "signed.brew"), public_key=key)
        assert_close(sess.run(None, feeds)[0], ref[0])
        sess.close()
    data = (signed / "signed.brew").read_bytes()
    sess = coldbrew.load(data, public_key=bytes.fromhex(open(signed / "key.pub").read()))  # from memory too
    assert_close(sess.run(None, feeds)[0], ref[0])


def test_unsigned_and_other_keys_are_refused(signed):
    with pytest.raises(coldbrew.BundleError, match=r"\[SIGNATURE\] bundle is not signed"):
        coldbrew.load(str(signed / "unsigned.brew"), public_key=str(signed / "key.pub"))
    with pytest.raises(coldbrew.BundleError, match=r"\[SIGNATURE\] bundle is signed by another key"):
        coldbrew.load(str(signed / "signed.brew"), public_key=str(signed / "other.pub"))
    coldbrew.load(str(signed / "unsigned.brew")).close()  # no key required: unsigned bundles open
    with pytest.raises(ValueError, match="public_key must be"):
        coldbrew.load(str(signed / "signed.brew"), public_key="not a key")


def test_altering_any_byte_is_refused(signed):
    data = bytearray((signed / "signed.brew").read_bytes())
    key = open(signed / "key.pub").read().strip()
    statuses = {}
    for i in range(len(data)):
        data[i] ^= 1 << (i % 8)
        try:
            coldbrew.load(bytes(data), public_key=key).close()
            opened = True
        except coldbrew.BundleError as e:
            opened = False
            statuses[e.status] = statuses.get(e.status, 0) + 1
        data[i] ^= 1 << (i % 8)
        assert not opened, f"byte {i} altered, yet the bundle opened"
    assert set(statuses) <= set(REFUSED), statuses
    assert statuses["SIGNATURE"] >= len(data) - 64, statuses  # all but the preamble's own fields


def _refresh_checksums(data):
    """Every checksum made right again, as a careful attacker would."""
    hdr_off, hdr_size = struct.unpack_from("<IQ", data, 12)
    b = fb.Bundle.GetRootAs(bytes(data[hdr_off:hdr_off + hdr_size]), 0)
    for k in range(b.SegmentsLength()):
        s = b.Segments(k)
        slot = s._tab.Offset(12)  # Segment.checksum
        c = checksum64(bytes(data[s.Offset():s.Offset() + s.Size()]))
        struct.pack_into("<Q", data, hdr_off + s._tab.Pos + slot, c)
    struct.pack_into("<Q", data, 24, checksum64(bytes(data[hdr_off:hdr_off + hdr_size])))
    return data


def test_altered_code_with_checksums_made_right_is_refused_before_it_loads(signed):
    data = bytearray((signed / "signed.brew").read_bytes())
    b, _, _ = read_bytes(bytes(data))
    code = next(s for s in b.segments if s.kind in (fb.SegmentKind.cpu_code, fb.SegmentKind.cpu_code_lz4))
    data[code.offset + code.size // 2] ^= 0xFF
    data = _refresh_checksums(data)
    with pytest.raises(coldbrew.BundleError, match=r"\[SIGNATURE\] bundle signature does not verify"):
        coldbrew.load(bytes(data), public_key=str(signed / "key.pub"))


def test_inspect_names_the_signer(signed):
    runner = CliRunner()
    pub = open(signed / "key.pub").read().strip()
    r = runner.invoke(main, ["inspect", str(signed / "signed.brew"), "--verify", "--public-key", str(signed / "key.pub")])
    assert r.exit_code == 0, r.output
    assert f"signature  Ed25519 by {pub}: valid for every byte" in r.output
    r = runner.invoke(main, ["inspect", str(signed / "unsigned.brew"), "--verify", "--public-key", pub])
    assert r.exit_code != 0 and "bundle is not signed" in r.output
    r = runner.invoke(main, ["compile", str(signed / "small.onnx"), "-o", str(signed / "x.brew"), "--no-tune",
                             "--sign", str(signed / "missing")])
    assert r.exit_code != 0 and "coldbrew keygen" in r.output
