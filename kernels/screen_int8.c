/* The output screen's product from an int8 copy of the output layer (kernels/screen_int8.py).
 *
 * Row v of the layer is kept as codes q_v (int8, |q| <= 127) and one fp32 scale s_v; an input row
 * x_m comes as two int8 levels, x ~ t (128 p_hi + p_lo) (screen_int8.py: t_hi = 128 t, |p_lo| <= 65),
 * each code stored plus 128 (unsigned, as vpdpbusd reads its first operand). Per lane the two
 * accumulators combine as 128 acc_hi + acc_lo (below 2^31 for D <= 4,096), one reduction a row:
 *
 *     sum_i q_vi (128 (p_hi + 128) + (p_lo + 128)) = A + 129 * 128 colsum_v,   A = sum_i q_vi (128 p_hi + p_lo)
 *     g[m, v] = s_v t A                                     (in double, rounded once to float)
 *
 * which is exactly (s_v q_v) . (t (128 p_hi + p_lo)) up to that last rounding; screen_int8.py bounds
 * the rest. The layer is read once for up to four input rows (eight accumulators); D % 64 == 0.
 *
 * spectui_quantize_int8 makes the copy at load in one pass: s_v = max_i |W_vi| / 127, q = round(W / s_v)
 * clamped to [-127, 127], colsum_v, and the norms |W_v - s_v q_v| and |s_v q_v| summed in double (each
 * term exact: a float minus a float times a small integer spans well under 53 bits), rounded up.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define ROWS 4 /* input rows sharing each loaded weight vector */

/* w [V, D] int8; scale [V]; colsum [V]; x [M, 2, D] uint8 (hi, then lo codes + 128); t [M];
 * g [M, V] out. Returns 0. */
TARGET int spectui_screen_int8(int64_t M, int64_t V, int64_t D, const int8_t *w, const float *scale,
                               const int32_t *colsum, const uint8_t *x, const float *t, float *g, int threads) {
    const int64_t chunks = D / 64;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
    for (int64_t v = 0; v < V; v++) {
        const int8_t *row = w + v * D;
        for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
            const int R = M - m0 < ROWS ? (int)(M - m0) : ROWS;
            __m512i acc[2 * ROWS];
            for (int j = 0; j < 2 * ROWS; j++) acc[j] = _mm512_setzero_si512();
            for (int64_t c = 0; c < chunks; c++) {
                const __m512i wv = _mm512_loadu_si512(row + c * 64);
                for (int j = 0; j < 2 * R; j++) /* row m0 + j / 2, level j % 2 */
                    acc[j] = _mm512_dpbusd_epi32(acc[j], _mm512_loadu_si512(x + ((m0 + j / 2) * 2 + j % 2) * D + c * 64), wv);
            }
            const int64_t shift = 129 * 128 * (int64_t)colsum[v];
            for (int r = 0; r < R; r++) {
                const __m512i both = _mm512_add_epi32(_mm512_slli_epi32(acc[2 * r], 7), acc[2 * r + 1]);
                const int64_t A = (int64_t)_mm512_reduce_add_epi32(both) - shift;
                g[(m0 + r) * V + v] = (float)((double)scale[v] * ((double)t[m0 + r] * (double)A));
            }
        }
    }
    return 0;
}

/* W [V, D] fp32 -> codes [V, D] int8, scale [V], colsum [V], err_norm [V] >= |W_v - s_v q_v|,
 * q_norm [V] >= |s_v q_v|. Returns 0. */
int spectui_quantize_int8(int64_t V, int64_t D, const float *W, int8_t *codes, float *scale, int32_t *colsum,
                          float *err_norm, float *q_norm, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
    for (int64_t v = 0; v < V; v++) {
        const float *w = W + v * D;
        float amax = 0.0f;
        for (int64_t i = 0; i < D; i++) amax = fmaxf(amax, fabsf(w[i]));
        float s = amax / 127.0f;
        if (!(s > 1e-30f)) s = 1e-30f;
        double e2 = 0.0, q2 = 0.0;
        int32_t sum = 0;
        for (int64_t i = 0; i < D; i++) {
            float q = nearbyintf(w[i] / s);
            q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
            codes[v * D + i] = (int8_t)q;
            sum += (int32_t)q;
            const double wq = (double)s * (double)q, e = (double)w[i] - wq;
            e2 += e * e;
            q2 += wq * wq;
        }
        scale[v] = s;
        colsum[v] = sum;
        err_norm[v] = (float)(sqrt(e2) * (1.0 + 1e-6)); /* room for the double sums and this rounding */
        q_norm[v] = (float)(sqrt(q2) * (1.0 + 1e-6));
    }
    return 0;
}
