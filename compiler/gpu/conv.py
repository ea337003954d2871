"""GPU convolution variants: shape-generic compute shaders.

A GPU bundle's first launch pays for every distinct pipeline the driver
compiles (tens of milliseconds each on a desktop GPU), so the convolutions
(most layers of a CNN) do not get one shader per shape: each variant is one
GLSL shader that reads the layer's shapes from push constants, and serves
every convolution it applies to. The epilogue fused into it is the same for
all: + bias[k], + an optional residual tensor, then clamp(lo, hi) (ReLU is
lo = 0, ReLU6 lo = 0 and hi = 6, none ±inf).

Variants:
- `gpu.conv_gemm`: implicit GEMM (groups == 1): output channels x output
  pixels in 64 x 64 workgroup tiles, 16 x 16 invocations each computing
  4 x 4, the reduction (input channels x kernel window) staged through
  shared memory 16 at a time; the input window is gathered on the fly
  (pointwise convolutions read the input directly). Weights are read in
  their ONNX layout (OIHW: a row-major [K][C*R*S] matrix), so no transform.
- `gpu.conv_winograd`: F(2x2, 3x3) for 3x3 stride-1 convolutions: 2.25x
  fewer multiplications. A workgroup computes 32 output channels x 8 tiles;
  each invocation one (channel, tile) pair's 16 transform-domain sums, the
  input tiles transformed in shared memory 4 channels at a time. Its weights
  are U = G g G^T in a [C][16][K] layout: either computed here and stored
  in the bundle (weight form `cached`, 16/9 of the bytes) or computed at
  load by the runtime's CPU threads from the raw OIHW weights (`raw`:
  runtime transform `gpu.winograd_f23`, runtime/src/vulkan/vulkan.c).
- `gpu.conv_direct`: one output element per invocation (grouped and
  depthwise convolutions, where a GEMM has no reduction to share), and the
  GEMM's **cold variant**: a driver makes its pipeline 3-5x sooner (on an
  H200: 20 ms against 77-150 ms, the slowest of a CNN's pipelines, on the
  first-ever launch's critical path), so each GEMM layer also carries
  conv_direct launches that a run made before the GEMM's pipeline exists
  uses instead of waiting (`GpuStep.first_run`, docs/gpu.md).

Bindings (set 0): 0 input, 1 weights, 2 bias, 3 residual (the output itself
when there is none: never read then), 4 output.
"""
import math
import struct
from dataclasses import dataclass

import numpy as np

PUSH_FIELDS = ("n", "c", "h", "w", "k", "oh", "ow", "kh", "kw", "sh", "sw", "ph", "pw", "dh", "dw", "groups",
               "residual")
GEMM_TILE = 64       # output channels and output pixels per workgroup
DIRECT_GROUP = 256   # invocations per workgroup of conv_direct
MAX_GRID = 65535     # every Vulkan device's minimum maxComputeWorkGroupCount


@dataclass(frozen=True)
class Epilogue:
    """A layer's epilogue (above: whether it adds a residual, its clamp); the
    convolution itself is a float32 NCHW ConvSpec (compiler/kernels/contract.py)."""
    residual: bool = False
    lo: float = -math.inf
    hi: float = math.inf


def push(spec, epilogue=Epilogue()):
    """The push-constant words: PUSH_FIELDS as int32, then lo and hi as float32."""
    v = dict(n=spec.n, c=spec.c, h=spec.h, w=spec.w, k=spec.k, oh=spec.out_h, ow=spec.out_w, kh=spec.r, kw=spec.s,
             sh=spec.stride[0], sw=spec.stride[1], ph=spec.pad[0], pw=spec.pad[1], dh=spec.dilation[0],
             dw=spec.dilation[1], groups=spec.groups, residual=int(epilogue.residual))
    words = [v[f] & 0xFFFFFFFF for f in PUSH_FIELDS]
    return words + [struct.unpack("<I", struct.pack("<f", x))[0] for x in (epilogue.lo, epilogue.hi)]


class _Variant:
    name = ""
    transform = ""  # the runtime's CPU weight transform, "" = the weights are read as they are
    first_run = ""  # the cold variant a first run uses while this one's pipeline is made, "" = none

    def applies(self, spec):
        raise NotImplementedError

    def grid(self, spec):
        raise NotImplementedError

    def source(self):
        return _PRELUDE + self.body


def _fold(groups):
    """1-D workgroup count -> (x, y, 1) within the grid limit."""
    x = min(groups, MAX_GRID)
    return [x, -(-groups // x), 1]


def _tiles_by_y(tiles, y):
    """(tiles, y) workgroups -> (x, y, z) within the grid limit: the shader's
    tile is x + z * MAX_GRID (tiles past the end compute nothing)."""
    x = min(tiles, MAX_GRID)
    return [x, y, -(-tiles // x)]


class ConvGemm(_Variant):
    name = "gpu.conv_gemm"
    local_size = (16, 16, 1)
    first_run = "gpu.conv_direct"  # the same OIHW weights; its pipeline is made 3-5x sooner

    def applies(self, spec):
        return spec.groups == 1

    def grid(self, spec):
        cols = spec.n * spec.out_h * spec.out_w
        return _tiles_by_y(-(-cols // GEMM_TILE), -(-spec.k // GEMM_TILE))

    body = """
layout(local_size_x = 16, local_size_y = 16) in;
shared float As[16][64];
shared float Bs[16][64];

void main() {
  int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y), t = ty * 16 + tx;
  int m0 = int(gl_WorkGroupID.y) * 64, n0 = int(gl_WorkGroupID.z * 65535u + gl_WorkGroupID.x) * 64;
  int ohw = p.oh * p.ow, hw = p.h * p.w, cols = p.n * ohw, khw = p.kh * p.kw, R = p.c * khw;
  bool pointwise = khw == 1 && p.sh == 1 && p.sw == 1 && p.ph == 0 && p.pw == 0;
  // the output pixel whose input column this invocation gathers (fixed per invocation)
  int col = n0 + (t & 63);
  bool col_ok = col < cols;
  int img = col / ohw, pix = col - img * ohw;
  int oy = pix / p.ow, ox = pix - oy * p.ow;
  int iy0 = oy * p.sh - p.ph, ix0 = ox * p.sw - p.pw, xbase = img * p.c * hw;
  float acc[4][4];
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 4; j++) acc[i][j] = 0.0;
  for (int r0 = 0; r0 < R; r0 += 16) {
    int ra = r0 + (t & 15);
    for (int q = 0; q < 4; q++) {
      int mm = (t >> 4) + 16 * q, m = m0 + mm;
      As[t & 15][mm] = (m < p.k && ra < R) ? W[m * R + ra] : 0.0;
    }
    for (int q = 0; q < 4; q++) {
      int kk = (t >> 6) + 4 * q, r = r0 + kk;
      float v = 0.0;
      if (col_ok && r < R) {
        if (pointwise) {
          v = X[xbase + r * hw + pix];
        } else {
          int ci = r / khw, rr = r - ci * khw, ky = rr / p.kw, kx = rr - ky * p.kw;
          int iy = iy0 + ky * p.dh, ix = ix0 + kx * p.dw;
          if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w) v = X[xbase + (ci * p.h + iy) * p.w + ix];
        }
      }
      Bs[kk][t & 63] = v;
    }
    barrier();
    for (int kk = 0; kk < 16; kk++) {
      float a[4], b[4];
      for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
      for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
    }
    barrier();
  }
  for (int i = 0; i < 4; i++) {
    int m = m0 + ty + 16 * i;
    if (m >= p.k) continue;
    for (int j = 0; j < 4; j++) {
      int c2 = n0 + tx + 16 * j;
      if (c2 >= cols) continue;
      int img2 = c2 / ohw;
      store((img2 * p.k + m) * ohw + (c2 - img2 * ohw), m, acc[i][j]);
    }
  }
}
"""


WINOGRAD_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float32)
WINOGRAD_MIN_CHANNELS = 16  # below this the transforms cost more than they save


def winograd_weights(w):
    """OIHW [K, C, 3, 3] -> U = G g G^T as [C][16][K] (what gpu.winograd_f23 computes at load)."""
    u = np.einsum("ij,kcjl,ml->kcim", WINOGRAD_G, w.astype(np.float32), WINOGRAD_G)  # [K, C, 4, 4]
    return np.ascontiguousarray(u.reshape(w.shape[0], w.shape[1], 16).transpose(1, 2, 0))


class ConvWinograd(_Variant):
    name = "gpu.conv_winograd"
    local_size = (256, 1, 1)
    transform = "gpu.winograd_f23"  # the runtime's CPU transform of the raw weights

    def applies(self, spec):
        return (spec.groups == 1 and (spec.r, spec.s) == (3, 3) and spec.stride == (1, 1)
                and spec.dilation == (1, 1) and min(spec.c, spec.k) >= WINOGRAD_MIN_CHANNELS)

    def grid(self, spec):
        tiles = spec.n * ((spec.out_h + 1) // 2) * ((spec.out_w + 1) // 2)
        return _tiles_by_y(-(-tiles // 8), -(-spec.k // 32))

    def transformed_shape(self, spec):
        return (spec.c, 16, spec.k)

    body = """
layout(local_size_x = 256) in;
shared float Vs[4][16][8];
shared float Us[4][16][32];

void main() {
  int t = int(gl_LocalInvocationID.x), kk = t >> 3, tt = t & 7;
  int k0 = int(gl_WorkGroupID.y) * 32, tile0 = int(gl_WorkGroupID.z * 65535u + gl_WorkGroupID.x) * 8;
  int tw = (p.ow + 1) / 2, th = (p.oh + 1) / 2, per_img = tw * th, tiles = p.n * per_img;
  float acc[16];
  for (int e = 0; e < 16; e++) acc[e] = 0.0;
  for (int c0 = 0; c0 < p.c; c0 += 4) {
    if (t < 32) {  // one input tile of one channel: V = B^T d B
      int ci = t >> 3, tj = t & 7, tile = tile0 + tj, c = c0 + ci;
      float d[4][4];
      bool ok = tile < tiles && c < p.c;
      int img = ok ? tile / per_img : 0, r = tile - img * per_img;
      int iy0 = (r / tw) * 2 - p.ph, ix0 = (r - (r / tw) * tw) * 2 - p.pw;
      int base = (img * p.c + c) * p.h * p.w;
      for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
          int iy = iy0 + i, ix = ix0 + j;
          d[i][j] = (ok && iy >= 0 && iy < p.h && ix >= 0 && ix < p.w) ? X[base + iy * p.w + ix] : 0.0;
        }
      float q[4][4];
      for (int j = 0; j < 4; j++) {
        q[0][j] = d[0][j] - d[2][j]; q[1][j] = d[1][j] + d[2][j];
        q[2][j] = d[2][j] - d[1][j]; q[3][j] = d[1][j] - d[3][j];
      }
      for (int i = 0; i < 4; i++) {
        Vs[ci][i * 4 + 0][tj] = q[i][0] - q[i][2]; Vs[ci][i * 4 + 1][tj] = q[i][1] + q[i][2];
        Vs[ci][i * 4 + 2][tj] = q[i][2] - q[i][1]; Vs[ci][i * 4 + 3][tj] = q[i][1] - q[i][3];
      }
    }
    for (int q = 0; q < 8; q++) {  // U[c][e][k] for 4 channels x 16 x 32 output channels
      int idx = t + 256 * q, kq = idx & 31, e = (idx >> 5) & 15, ci = idx >> 9, c = c0 + ci, k = k0 + kq;
      Us[ci][e][kq] = (c < p.c && k < p.k) ? W[(c * 16 + e) * p.k + k] : 0.0;
    }
    barrier();
    for (int ci = 0; ci < 4; ci++)
      for (int e = 0; e < 16; e++) acc[e] += Us[ci][e][kk] * Vs[ci][e][tt];
    barrier();
  }
  int k = k0 + kk, tile = tile0 + tt;
  if (k >= p.k || tile >= tiles) return;
  // Y = A^T M A
  float s0[4], s1[4];
  for (int j = 0; j < 4; j++) {
    s0[j] = acc[j] + acc[4 + j] + acc[8 + j];
    s1[j] = acc[4 + j] - acc[8 + j] - acc[12 + j];
  }
  float y[2][2];
  y[0][0] = s0[0] + s0[1] + s0[2]; y[0][1] = s0[1] - s0[2] - s0[3];
  y[1][0] = s1[0] + s1[1] + s1[2]; y[1][1] = s1[1] - s1[2] - s1[3];
  int img = tile / per_img, r = tile - img * per_img, oy = (r / tw) * 2, ox = (r - (r / tw) * tw) * 2;
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 2; j++)
      if (oy + i < p.oh && ox + j < p.ow) store(((img * p.k + k) * p.oh + oy + i) * p.ow + ox + j, k, y[i][j]);
}
"""


class ConvDirect(_Variant):
    name = "gpu.conv_direct"
    local_size = (DIRECT_GROUP, 1, 1)

    def applies(self, spec):
        return True

    def grid(self, spec):
        total = spec.n * spec.k * spec.out_h * spec.out_w
        return _fold(-(-total // DIRECT_GROUP))

    body = """
layout(local_size_x = 256) in;

void main() {
  int ohw = p.oh * p.ow;
  int idx = int((gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 256u + gl_LocalInvocationID.x);
  if (idx >= p.n * p.k * ohw) return;
  int ox = idx % p.ow, oy = (idx / p.ow) % p.oh, m = (idx / ohw) % p.k, img = idx / (ohw * p.k);
  int cg = p.c / p.groups, kg = p.k / p.groups, c0 = (m / kg) * cg;
  float acc = 0.0;
  for (int ci = 0; ci < cg; ci++) {
    int xb = ((img * p.c + c0 + ci) * p.h) * p.w, wb = (m * cg + ci) * p.kh * p.kw;
    for (int ky = 0; ky < p.kh; ky++) {
      int iy = oy * p.sh - p.ph + ky * p.dh;
      if (iy < 0 || iy >= p.h) continue;
      for (int kx = 0; kx < p.kw; kx++) {
        int ix = ox * p.sw - p.pw + kx * p.dw;
        if (ix >= 0 && ix < p.w) acc += X[xb + iy * p.w + ix] * W[wb + ky * p.kw + kx];
      }
    }
  }
  store(idx, m, acc);
}
"""


_PRELUDE = """#version 450
layout(std430, set = 0, binding = 0) readonly buffer B0 { float X[]; };
layout(std430, set = 0, binding = 1) readonly buffer B1 { float W[]; };
layout(std430, set = 0, binding = 2) readonly buffer B2 { float BIAS[]; };
layout(std430, set = 0, binding = 3) readonly buffer B3 { float RES[]; };
layout(std430, set = 0, binding = 4) writeonly buffer B4 { float Y[]; };
layout(push_constant) uniform Push {
  int n, c, h, w, k, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, groups, residual;
  float lo, hi;
} p;

// the epilogue every variant shares: bias, residual, clamp
void store(int o, int m, float v) {
  v += BIAS[m];
  if (p.residual != 0) v += RES[o];
  Y[o] = clamp(v, p.lo, p.hi);
}
"""

BINDINGS = 5
VARIANTS = [ConvWinograd(), ConvGemm(), ConvDirect()]


def get(name):
    return next(v for v in VARIANTS if v.name == name)


def applicable(spec):
    return [v.name for v in VARIANTS if v.applies(spec)]


# Without a choice a convolution gets the GEMM, else the direct variant:
# Winograd adds a pipeline (one more shader to compile on the first-ever
# launch, which costs most where a device has fewer CPU cores than
# pipelines), so it is chosen, not default. On the H200 (16 cores) it ran
# 1.3-1.5x faster warm (squeezenet 0.76-0.80 vs 1.06-1.11 ms, resnet50
# 5.35 vs 7.91 ms) and its first-ever launch was within the run-to-run
# noise of the GEMM's (docs/gpu.md).
DEFAULT = ("gpu.conv_gemm", "gpu.conv_direct")


def choose(spec, choice=None):
    """The variant a convolution gets: `choice` (a variant name) where it
    applies, else the first of DEFAULT that applies."""
    names = applicable(spec)
    if choice and choice != "auto" and full_name(choice) in names:
        return get(full_name(choice))
    return get(next(n for n in DEFAULT if n in names))


def full_name(choice):
    """"winograd", "conv_winograd" or "gpu.conv_winograd" -> "gpu.conv_winograd"."""
    return "gpu.conv_" + choice.removeprefix("gpu.").removeprefix("conv_")
