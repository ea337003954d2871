"""compiler/bundle/sign.py: key files, a signature over every byte, and the
signer read back; altered bytes, a second signature and a bad key file are
named."""
import pytest

from coldbrew.compiler import CompileError, compile_model
from coldbrew.compiler.bundle import sign as sb


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("keys") / "KEY")
    return path, sb.keygen(path)


def test_a_signed_bundle_names_its_signer_and_verifies(small_model, keys):
    path, public = keys
    data = compile_model(small_model)
    assert sb.signer(data) is None
    signed = sb.sign(data, path)
    assert len(signed) == len(data) + sb.BLOCK_SIZE and signed[64:len(data)] == data[64:]
    assert sb.signer(signed) == (public, True)
    with open(path + ".pub") as f:
        assert f.read().strip() == public


def test_any_altered_byte_breaks_the_signature(small_model, keys):
    path, public = keys
    signed = bytearray(sb.sign(compile_model(small_model), path))
    for at in (0, 100, len(signed) - sb.BLOCK_SIZE - 1):
        altered = bytearray(signed)
        altered[at] ^= 1
        assert sb.signer(bytes(altered)) == (public, False)
    assert sb.signer(bytes(signed)) == (public, True)


def test_signing_twice_and_bad_keys_are_refused(small_model, keys, tmp_path):
    path, _ = keys
    signed = sb.sign(compile_model(small_model), path)
    with pytest.raises(CompileError, match="already signed"):
        sb.sign(signed, path)
    with pytest.raises(CompileError, match="not found \\(make one with: coldbrew keygen"):
        sb.read_secret(str(tmp_path / "missing"))
    (tmp_path / "bad").write_text("not a key\n")
    with pytest.raises(CompileError, match="is not a coldbrew secret key"):
        sb.read_secret(str(tmp_path / "bad"))
