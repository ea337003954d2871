"""Signed bundles: Ed25519 keys, signing a written bundle, reading its signer.

A signed bundle ends in a 104-byte block (schemas/README.md): magic
`CBSIGNv1`, the signer's 32-byte public key, and the Ed25519 signature of
`coldbrew signed bundle v1\\0` followed by the BLAKE2b-256 hash of every byte
before the block. Preamble byte 40 holds the block's offset, and the
declared file size counts it, so the preamble itself is signed. The runtime
checks it with libsodium (runtime/src/bundle/signature.c) when an app gives a
public key. Signing uses PyNaCl (libsodium); the hash is hashlib's BLAKE2b.

Key files (`coldbrew keygen KEY`): KEY holds the secret seed, KEY.pub the
public key, each as one line of hex.
"""
import hashlib
import os
import struct

from ..errors import CompileError

MAGIC = b"CBSIGNv1"
CONTEXT = b"coldbrew signed bundle v1\0"
BLOCK_SIZE = 8 + 32 + 64
SIG_OFFSET_AT, SIZE_AT = 40, 32  # preamble fields: signature block offset, declared file size
SECRET_TAG = "coldbrew-ed25519-secret"


def keygen(path):
    """Write a new key pair: `path` (secret, mode 0600) and `path`.pub; the public key's hex."""
    from nacl.signing import SigningKey

    key = SigningKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{SECRET_TAG} {bytes(key).hex()}\n")
    public = bytes(key.verify_key).hex()
    with open(path + ".pub", "w") as f:
        f.write(public + "\n")
    return public


def read_secret(path):
    """The signing key in the secret key file `path`."""
    from nacl.signing import SigningKey

    try:
        with open(path) as f:
            tag, seed = f.read().split()
        if tag != SECRET_TAG:
            raise ValueError
        return SigningKey(bytes.fromhex(seed))
    except FileNotFoundError:
        raise CompileError(f"signing key '{path}' not found (make one with: coldbrew keygen {path})") from None
    except ValueError:
        raise CompileError(f"'{path}' is not a coldbrew secret key (coldbrew keygen writes one)") from None


def digest(data, upto):
    return hashlib.blake2b(data[:upto], digest_size=32).digest()


def sign(data, secret_path):
    """The bundle `data` with a signature block by the key in `secret_path`."""
    key = read_secret(secret_path)
    if struct.unpack_from("<Q", data, SIG_OFFSET_AT)[0]:
        raise CompileError("the bundle is already signed")
    out = bytearray(data)
    at = len(out)
    struct.pack_into("<Q", out, SIG_OFFSET_AT, at)
    struct.pack_into("<Q", out, SIZE_AT, at + BLOCK_SIZE)
    signature = key.sign(CONTEXT + digest(memoryview(out), at)).signature
    out += MAGIC + bytes(key.verify_key) + signature
    return bytes(out)


def signer(data):
    """The signer's public key (hex) and whether the signature verifies, or None when unsigned."""
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    at = struct.unpack_from("<Q", data, SIG_OFFSET_AT)[0]
    if not at or at + BLOCK_SIZE != len(data) or data[at:at + 8] != MAGIC:
        return None
    pub, sig = bytes(data[at + 8:at + 40]), bytes(data[at + 40:at + BLOCK_SIZE])
    try:
        VerifyKey(pub).verify(CONTEXT + digest(memoryview(data), at), sig)
        ok = True
    except BadSignatureError:
        ok = False
    return pub.hex(), ok
