/* The glue between a LLaMA layer's kernels on CPU, with the bits of transformers' torch ops.
 *
 * kernels/glue_cpu.py calls these from engine/lean_model.py. Each replaces several small torch ops
 * (a few us each at decode sizes) by one call, and computes every element with the same IEEE
 * operations in the same order: no fused multiply-add (built with -ffp-contract=off, see native.py),
 * no reassociation.
 *
 * spectui_rms_scale: the tail of LlamaRMSNorm, given sumsq[r] = sum(h[r]^2) from torch (its sum
 * order is torch's own), then the bf16 rounding of the 4-bit kernel's input:
 *     out[r, i] = bf16( w[i] * (h[r, i] * (1 / sqrt(sumsq[r] / n + eps))) )
 * torch: mean on CPU is the sum divided by n, `var + eps` (eps as float), rsqrt = 1 / sqrt (all
 * correctly rounded), two products, then .to(bfloat16): round to nearest even, NaN to 0x7FC0.
 * With bf16_out 0, the same without the rounding, for an fp32 model whose 4-bit layers read fp32
 * rows (kernels/nf4_cpu.c): out[r, i] = w[i] * (h[r, i] * (1 / sqrt(sumsq[r] / n + eps))).
 *
 * spectui_rope_store: apply_rotary_pos_emb on the q and k heads of one q|k|v row block, then the
 * cache writes:
 *     y[d] = x[d] cos[d] + r[d] sin[d],  r = (-x[D/2:], x[:D/2])     (each product rounded, then the sum)
 * q heads go to q [Hq, T, D]; k heads, rotated, and v heads, copied, to the cache at
 * k + h * ld + t * D and v + h * ld + t * D.
 *
 * spectui_silu_mul_bf16: LlamaMLP's act(gate) * up and the bf16 rounding of the down projection's
 * input, from the gate|up rows: out[t, i] = bf16( (g / (1 + exp(-g))) * u ), g = gate_up[t, i],
 * u = gate_up[t, I + i]. torch's float silu on AVX512 CPUs is that formula over 16 lanes with
 * Sleef_expf16_u10 for exp; libtorch exports that function, and the caller passes its address
 * (glue_cpu.py checks the bits against torch's silu at load, else keeps torch's ops).
 *
 * spectui_silu_mul_f32: the same in fp32 for torch's AVX2 kernels: 8 lanes, Sleef_expf8_u10, no
 * rounding after the product (silu's quotient is rounded, then the product with up).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* torch's float sum over a contiguous row of x*x on CPU (aten cascade_sum as it runs here: 8-lane
 * vectors, 4 interleaved accumulators over rows of 4 vectors, carried up a level every 16 rows,
 * then the accumulators, the scalar tail and the 8 lanes added in order). glue_cpu.py checks it
 * against torch at load for the sizes it is used at, else keeps torch's pow + sum. */
static float sum_of_squares(const float *x, int64_t n) {
    enum { LANES = 8, ILP = 4, LEVELS = 4, STEP = 16 };
    const int64_t nvec = n / LANES, size = nvec / ILP;
    float acc[LEVELS][ILP][LANES] = {{{0.0f}}};
    int64_t i = 0;
    for (; i + STEP <= size; i += STEP) {
        for (int64_t j = 0; j < STEP; j++)
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < LANES; l++) {
                    const float v = x[((i + j) * ILP + k) * LANES + l];
                    acc[0][k][l] += v * v;
                }
        for (int level = 1; level < LEVELS; level++) {
            for (int k = 0; k < ILP; k++)
                for (int l = 0; l < LANES; l++) {
                    acc[level][k][l] += acc[level - 1][k][l];
                    acc[level - 1][k][l] = 0.0f;
                }
            if (i & ((int64_t)(STEP - 1) << (level * 4))) break;
        }
    }
    for (; i < size; i++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < LANES; l++) {
                const float v = x[(i * ILP + k) * LANES + l];
                acc[0][k][l] += v * v;
            }
    for (int level = 1; level < LEVELS; level++)
        for (int k = 0; k < ILP; k++)
            for (int l = 0; l < LANES; l++) acc[0][k][l] += acc[level][k][l];
    for (int64_t vec = size * ILP; vec < nvec; vec++) /* vectors past the last row of 4 */
        for (int l = 0; l < LANES; l++) {
            const float v = x[vec * LANES + l];
            acc[0][0][l] += v * v;
        }
    for (int k = 1; k < ILP; k++)
        for (int l = 0; l < LANES; l++) acc[0][0][l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t e = nvec * LANES; e < n; e++) total += x[e] * x[e];
    for (int l = 0; l < LANES; l++) total += acc[0][0][l];
    return 0.0f + total;
}

/* h [rows, n] fp32, w [n] fp32 -> out [rows, n]: bf16 (as uint16) when bf16_out, else fp32; sumsq
 * [rows] fp32 from torch, or NULL: computed here (sum_of_squares). */
int spectui_rms_scale(int64_t rows, int64_t n, const float *h, const float *sumsq, float eps, const float *w,
                      void *out, int bf16_out) {
    for (int64_t r = 0; r < rows; r++) {
        const float var = (sumsq ? sumsq[r] : sum_of_squares(h + r * n, n)) / (float)n;
        const float s = 1.0f / sqrtf(var + eps);
        const float *hr = h + r * n;
        if (bf16_out) {
            uint16_t *o = (uint16_t *)out + r * n;
#pragma omp simd
            for (int64_t i = 0; i < n; i++) o[i] = to_bf16(w[i] * (hr[i] * s));
        } else {
            float *o = (float *)out + r * n;
#pragma omp simd
            for (int64_t i = 0; i < n; i++) o[i] = w[i] * (hr[i] * s);
        }
    }
    return 0;
}

/* qkv [T, ldqkv] fp32 holding (Hq + 2 Hkv) heads of D; cos, sin [T, D] fp32; q out [Hq, T, D];
 * k, v: the cache's rows for these T positions, head h at k + h * ld. */
int spectui_rope_store(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, const float *qkv, int64_t ldqkv,
                       const float *cos, const float *sin, float *q, float *k, float *v, int64_t ld) {
    const int64_t half = D / 2;
    for (int64_t t = 0; t < T; t++) {
        const float *row = qkv + t * ldqkv, *c = cos + t * D, *s = sin + t * D;
        for (int64_t head = 0; head < Hq + Hkv; head++) {
            const float *x = row + head * D;
            float *y = head < Hq ? q + (head * T + t) * D : k + (head - Hq) * ld + t * D;
#pragma omp simd
            for (int64_t d = 0; d < half; d++) {
                const float a = x[d] * c[d], b = (-x[d + half]) * s[d];
                y[d] = a + b;
            }
#pragma omp simd
            for (int64_t d = half; d < D; d++) {
                const float a = x[d] * c[d], b = x[d - half] * s[d];
                y[d] = a + b;
            }
        }
        for (int64_t head = 0; head < Hkv; head++)
            memcpy(v + head * ld + t * D, row + (Hq + Hkv + head) * D, (size_t)D * sizeof(float));
    }
    return 0;
}

typedef __m512 (*exp16_fn)(__m512);

/* gate_up [T, ld] fp32 (gate in columns 0..I-1, up in I..2I-1), I % 16 == 0 -> out [T, I] bf16. */
__attribute__((target("avx512f,avx512bw"))) int spectui_silu_mul_bf16(int64_t T, int64_t I, const float *gate_up,
                                                                        int64_t ld, uint16_t *out, void *exp16) {
    const exp16_fn expf16 = (exp16_fn)exp16;
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u), bias = _mm512_set1_epi32(0x7FFF),
                  lsb = _mm512_set1_epi32(1), nan16 = _mm512_set1_epi32(0x7FC0);
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * ld, *u = g + I;
        for (int64_t i = 0; i < I; i += 16) {
            const __m512 x = _mm512_loadu_ps(g + i);
            const __m512 minus = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), sign));
            const __m512 y = _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, expf16(minus))), _mm512_loadu_ps(u + i));
            const __m512i bits = _mm512_castps_si512(y); /* bf16: round to nearest even, as to_bf16 */
            __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(bits, bias),
                                                           _mm512_and_si512(_mm512_srli_epi32(bits, 16), lsb)), 16);
            r = _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), r, nan16);
            _mm256_storeu_si256((__m256i *)(out + t * I + i), _mm512_cvtepi32_epi16(r));
        }
    }
    return 0;
}

typedef __m256 (*exp8_fn)(__m256);

/* gate_up [T, ld] fp32 (gate in columns 0..I-1, up in I..2I-1), I % 8 == 0 -> out [T, I] fp32. */
__attribute__((target("avx2,fma"))) int spectui_silu_mul_f32(int64_t T, int64_t I, const float *gate_up, int64_t ld,
                                                            float *out, void *exp8) {
    const exp8_fn expf8 = (exp8_fn)exp8;
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t t = 0; t < T; t++) {
        const float *g = gate_up + t * ld, *u = g + I;
        for (int64_t i = 0; i < I; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, expf8(_mm256_xor_ps(x, sign))));
            _mm256_storeu_ps(out + t * I + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
        }
    }
    return 0;
}
