/* The runtime's own weight transforms: fp16 weights widened to fp32
 * (transform "cb.widen_f16", compiler/passes/plan_weights.py), and int8
 * weights times their scales ("cb.widen_i8": a quantized model's weights
 * in layers without a variant). A step whose
 * weights are stored fp16 in the layout its kernel reads needs no code of
 * its own in the bundle: the runtime widens them once into the prepared
 * area, on whichever thread prepares the step. x86-64 uses F16C
 * (vcvtph2ps, 8 values per instruction) where the CPU has it, aarch64 NEON
 * (fcvtl); the portable path converts bit by bit. */
#include <stdint.h>
#include <string.h>

#include "cpu/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

/* One IEEE half -> float, exactly (subnormals, infinities and NaNs too). */
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13); /* inf, NaN */
  } else if (exp) {
    bits = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (!man) {
    bits = sign; /* signed zero */
  } else { /* subnormal: normalize */
    int e = -1;
    do {
      man <<= 1;
      e++;
    } while (!(man & 0x400u));
    bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static void widen_portable(const uint16_t* in, float* out, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) out[i] = half_to_float(in[i]);
}

#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) static void widen_f16c(const uint16_t* in, float* out, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(in + i))));
  widen_portable(in + i, out + i, n - i);
}
#endif

void cb_widen_f16(const uint16_t* in, float* out, uint64_t n) {
#if defined(__x86_64__)
  static _Atomic int f16c = -2; /* -2: not asked yet */
  if (f16c == -2) f16c = cb_host_has("f16c") == 1 && cb_host_has("avx") == 1;
  if (f16c) {
    widen_f16c(in, out, n);
    return;
  }
#elif defined(__aarch64__)
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(out + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(in + i))));
  in += i, out += i, n -= i;
#endif
  widen_portable(in, out, n);
}

/* out[o][a][i] = in[o][a][i] * scale[a] over [outer][n][inner]: int8
 * weights widened with one scale per entry of one axis (n = 1: one scale
 * for the tensor). Exact: an int8 value times a float rounds once, as the
 * model's own DequantizeLinear does. The inner loop vectorizes. */
void cb_widen_i8(const int8_t* in, const float* scale, float* out, uint64_t outer, uint64_t n, uint64_t inner) {
  for (uint64_t o = 0; o < outer; o++)
    for (uint64_t a = 0; a < n; a++) {
      const float s = scale[a];
      const int8_t* q = in + (o * n + a) * inner;
      float* w = out + (o * n + a) * inner;
      for (uint64_t i = 0; i < inner; i++) w[i] = (float)q[i] * s;
    }
}
