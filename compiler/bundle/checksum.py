"""cb_checksum64 (schemas/README.md), the same function as the runtime's."""
import numpy as np


def checksum64(data):
    buf = np.frombuffer(data, dtype=np.uint8)
    pad = (-len(buf)) % 8
    if pad:
        buf = np.concatenate([buf, np.zeros(pad, np.uint8)])
    words = buf.view("<u8")
    weights = np.arange(len(words), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    with np.errstate(over="ignore"):
        return int(np.sum(words * weights, dtype=np.uint64))
