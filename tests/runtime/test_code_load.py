"""The CPU code made callable by the runtime's own loader (runtime/src/cpu/
elf.c): a bundle's kernel object decoded into one anonymous mapping and
relocated, no memfd and no dlopen; the system loader's way kept for what
it declines (COLDBREW_CODE_LOADER=system takes it always)."""
import ctypes
import json
import os
import subprocess
import sys

import lz4.block
import numpy as np

from coldbrew.compiler.bundle.reader import cpu_step, read, text
from coldbrew.runtime import testing_function as runtime_hook

PROBE = """
import json, sys
import numpy as np
import coldbrew
sess = coldbrew.load(sys.argv[1])
x = np.random.default_rng(3).standard_normal(sess.get_inputs()[0].shape).astype(np.float32)
out = sess.run(None, {sess.get_inputs()[0].name: x})[0]
maps = open("/proc/self/maps").read()
print(json.dumps({"memfd": "coldbrew-kernels" in maps, "out": out.ravel().tolist()}))
"""


def _probe(path, **env):
    run = subprocess.run([sys.executable, "-c", PROBE, path], capture_output=True, text=True, check=True,
                         env=dict(os.environ, **env))
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_runtime_loads_the_code_itself_and_the_system_loader_gives_the_same(small_bundle):
    own, system = _probe(small_bundle), _probe(small_bundle, COLDBREW_CODE_LOADER="system")
    assert not own["memfd"] and system["memfd"]  # no memfd mapped: the runtime's loader took the object
    assert own["out"] == system["out"]


def _object(path):
    """(the bundle's kernel object, plain; a kernel symbol in it)."""
    b = read(path)[0]
    seg = next(s for s in b.segments if s.kind in (2, 4))
    with open(path, "rb") as f:
        f.seek(seg.offset)
        body = f.read(seg.size)
    image = lz4.block.decompress(body, uncompressed_size=seg.rawSize) if seg.kind == 4 else body
    kernel = next(text(cpu_step(st).kernel) for st in b.plan.steps if cpu_step(st))
    return bytearray(image), "__tvm_ffi_" + kernel


def _load(image, symbol):
    fn = runtime_hook("cb_debug_code_object", ctypes.c_int, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p)
    return fn(bytes(image), len(image), symbol.encode())


def test_the_loader_takes_the_compilers_object_and_declines_what_it_does_not_know(small_bundle):
    """Declined (0: the open then takes the system loader's way), never a
    crash: not an ELF, cut short, thread-local storage, a relocation kind
    it does not apply, a symbol that is not there."""
    image, symbol = _object(small_bundle)
    assert _load(image, symbol) == 1
    assert _load(image, "__tvm_ffi_no_such_kernel") == 0
    assert _load(bytes(len(image)), symbol) == 0
    assert _load(np.random.default_rng(0).integers(0, 256, len(image), np.uint8).tobytes(), symbol) == 0
    for cut in (16, 64, 200, len(image) // 3):
        assert _load(image[:cut], symbol) == 0, cut
    phoff, phnum = int.from_bytes(image[32:40], "little"), int.from_bytes(image[56:58], "little")
    tls = bytearray(image)
    tls[phoff + 56 * (phnum - 1):phoff + 56 * (phnum - 1) + 4] = (7).to_bytes(4, "little")  # PT_TLS
    assert _load(tls, symbol) == 0
    odd = bytearray(image)
    at = _dynamic(image, 7)  # DT_RELA: in the first segment, where a file offset is its address
    assert at is not None
    odd[at + 8:at + 12] = (250).to_bytes(4, "little")  # the first relocation's kind: none the loader applies
    assert _load(odd, symbol) == 0


def _dynamic(image, tag):
    """The value of the object's dynamic entry `tag`, or None."""
    import struct

    phoff, phnum = struct.unpack_from("<Q", image, 32)[0], struct.unpack_from("<H", image, 56)[0]
    for k in range(phnum):
        kind, _, offset = struct.unpack_from("<IIQ", image, phoff + 56 * k)
        if kind == 2:  # PT_DYNAMIC: its file offset
            for at in range(offset, len(image) - 15, 16):
                t, v = struct.unpack_from("<qQ", image, at)
                if t == 0:
                    return None
                if t == tag:
                    return v
    return None
