"""Export a cold-run trace (runtime `sess.trace()` or simulator events) as
Chrome trace-event JSON (Perfetto, chrome://tracing), as a PNG timeline, or as
a summary of totals.

An event is a dict: step, layer, variant, phase (read | transform | execute |
load), cpu, start_ns, end_ns, and an optional `process` ("measured" by
default; e.g. "predicted" for simulator output). Each process is a separate
timeline, drawn from its own first event, so measured and predicted runs can
be laid side by side.
"""
import json
import struct
import zlib

import numpy as np

PHASES = ("read", "transform", "execute", "load")
COLORS = {"read": (66, 133, 244), "transform": (245, 140, 0), "execute": (52, 168, 83),
          "load": (142, 68, 173)}
OTHER = (128, 128, 128)
_KEYS = ("step", "layer", "variant", "phase", "cpu", "start_ns", "end_ns")

# 5x7 bitmap font: per glyph, 7 rows as 2 hex digits (bit 4 = leftmost pixel).
# Letters are drawn lower-case whatever their case; other characters are blank.
_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz.:-_()/%+,="
_GLYPHS = """
0e11131519110e 040c040404040e 0e11010204081f 1f020402011 10e 02060a121f0202 1f101e0101110e 060810 1e11110e
1f010204080808 0e11110e11110e 0e11110f01020c 00000e010f110f 101016191111 1e 00000e1010110e 01010d1311110f
00000e111f100e 0609081c080808 000f11110f010e 10101619111111 04000c0404040e 02000602021 20c 10101214181412
0c04040404040e 00001a15151111 00001619111111 00000e1111110e 00001e111e1010 00000d130f0101 00001619101010
00000e100e011e 08081c08080906 0000111111130d 0000111111 0a04 0000111115150a 0000110a040a11 00001111 0f010e
00001f0204081f 0000000000 0c0c 000c0c000c0c00 0000001f000000 0000000000001f 0204080808 0402 0804020202 0408
00010204081000 1819020408 1303 0004041f040400 00000000 0c0408 00001f001f0000
"""
_FONT = {ch: np.array([[int(g[2 * r:2 * r + 2], 16) >> (4 - c) & 1 for c in range(5)] for r in range(7)], bool)
         for ch, g in zip(_CHARS, "".join(_GLYPHS.split()).__iter__().__class__(
             [("".join(_GLYPHS.split()))[i:i + 14] for i in range(0, 14 * len(_CHARS), 14)]))}
