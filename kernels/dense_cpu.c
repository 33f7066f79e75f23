/* Dense bf16-weight matmul for few rows: a drafter's layers, the output layer's argmax screen
 * (kernels/dense_cpu.py). Two paths: spectui_dense_bf16 (AVX2 + FMA, x in fp32; its int8-weight twin
 * spectui_dense_int8_x16 takes the feature head's layer) and, at the end of this file,
 * spectui_dot_bf16 (AVX512-BF16, x in bf16).
 *
 *     y[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n])      x fp32 [M, K], W bf16 [N, K], y fp32
 *
 * A bf16 weight widens to fp32 exactly (its 16 bits become the high half), so the products are
 * those of the fp32 matmul over the same weights; only the order of the K-term sum is this file's
 * (eight lanes, lane j taking k = j, j + 8, ..., then lanes folded pairwise). Drafters need speed,
 * not any particular rounding: nothing here is on the verifier's path.
 *
 * Why: on these CPUs MKL's small-M products against a [N, K] weight run far below memory speed
 * (one row of a 8,192 x 576 fp32 layer 1.5 ms, two rows 3.6 ms), and a drafter's forward is one to
 * four rows. Reading bf16 halves the bytes, and every weight vector serves up to four input rows.
 *
 * Threads split the output rows n; for many input rows (a drafter's catch-up over a prompt) the
 * rows go in blocks of M_BLOCK so that a block of x stays in cache while the weights stream by.
 *
 * A drafter's weights come from memory, not cache: the verifier's pass before each drafting step
 * streams 76 MB through the caches. The hardware prefetcher alone read them at 3-8 GB/s here (the
 * feature head's five products, cold, one row: 0.89 ms for its 8.4 MB), so each loop asks for the
 * weight rows PREFETCH_ROWS ahead of those it multiplies, a cache line at a time: 0.74 ms for one row,
 * 1.07 -> 0.83 ms for two or three (2-core AVX2 EPYC, /work/exp/k53/pf/cold_ab.py; the same bits).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define M_BLOCK 64
#define PREFETCH_ROWS 8 /* bf16 weight rows ahead of those being multiplied (4 to 16 did about as well); int8
                         * rows as many bytes ahead, twice the rows (the feature head's layer in a drafting
                         * step: 548 us a call, against 569 with 8 int8 rows ahead and 642 in bf16) */

/* Weights in bf16 or int8. An int8 layer (the feature head's on AVX2 CPUs, kernels/head_layer.py) is
 * kept as q [N, K] int8 with one scale a row, W[n, k] ~ scale[n] q[n, k] (scale = max_k |W[n, k]| / 127),
 * and its products are scale[n] * sum_k x[m, k] q[n, k]: half the bytes of bf16, where those bytes are
 * the cost (the weights come from memory every drafting step). The loops below take the format as a
 * constant `int8` (0: bf16) and are built once for each. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))

/* 8 weights of a row at element k, as fp32: a bf16's exact widening, or an int8 code */
ALWAYS_INLINE __m256 weights8(const char *row, int64_t k, const int int8) {
    if (int8) return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(row + k))));
    return widen8((const uint16_t *)row + k);
}

/* weight row n of W [N, K] (a prefetch past W's end never faults: rows past N are only prefetched) */
ALWAYS_INLINE const char *row_at(const void *w, int64_t n, int64_t K, const int int8) {
    return (const char *)w + n * K * (int8 ? 1 : 2);
}

/* At the first k of each cache line of a row's stream, the line PREFETCH_ROWS bf16 rows' bytes on. */
ALWAYS_INLINE void prefetch_ahead(const char *row, int64_t K, int64_t k, const int int8) {
    if ((k & (int8 ? 63 : 31)) == 0) _mm_prefetch(row + 2 * PREFETCH_ROWS * K + k * (int8 ? 1 : 2), _MM_HINT_T0);
}

/* a row's sum as stored: times the row's scale for int8, plus its bias */
ALWAYS_INLINE float finish(float sum, const float *scale, const float *bias, int64_t n) {
    return (scale ? sum * scale[n] : sum) + (bias ? bias[n] : 0.0f);
}

/* One input row against weight rows n0 .. n0 + 3. */
ALWAYS_INLINE void row_by_4(int64_t n0, int64_t K, const float *x, const void *w, float out[4], const int int8) {
    const char *w0 = row_at(w, n0, K, int8), *w1 = row_at(w, n0 + 1, K, int8);
    const char *w2 = row_at(w, n0 + 2, K, int8), *w3 = row_at(w, n0 + 3, K, int8);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < K; k += 8) {
        prefetch_ahead(w0, K, k, int8), prefetch_ahead(w1, K, k, int8);
        prefetch_ahead(w2, K, k, int8), prefetch_ahead(w3, K, k, int8);
        __m256 u = _mm256_loadu_ps(x + k);
        a0 = _mm256_fmadd_ps(u, weights8(w0, k, int8), a0);
        a1 = _mm256_fmadd_ps(u, weights8(w1, k, int8), a1);
        a2 = _mm256_fmadd_ps(u, weights8(w2, k, int8), a2);
        a3 = _mm256_fmadd_ps(u, weights8(w3, k, int8), a3);
    }
    out[0] = hsum(a0); out[1] = hsum(a1); out[2] = hsum(a2); out[3] = hsum(a3);
}

/* Two input rows (xs) against weight rows n0 .. n0 + 3: each widened vector serves both, and each row's
 * lanes sum over k in row_by_4's order (the same bits). Through rows4_by_2, whose missing rows repeat the
 * last, two rows multiplied every weight four times: the feature head's five products for two rows (half
 * its calls in a drafting step) took 1.9x one row's time from memory, 1.3x with this (684 -> 463 us; 2-core
 * AVX2 EPYC, /work/exp/k57/abdot.py). Three rows this way keep 12 accumulators, spill, and ran slower
 * than through rows4_by_2. */
ALWAYS_INLINE void rows2_by_4(int64_t n0, int64_t K, const float *const xs[2], const void *w, float out[2][4],
                              const int int8) {
    const char *w0 = row_at(w, n0, K, int8), *w1 = row_at(w, n0 + 1, K, int8);
    const char *w2 = row_at(w, n0 + 2, K, int8), *w3 = row_at(w, n0 + 3, K, int8);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 0; k < K; k += 8) {
        prefetch_ahead(w0, K, k, int8), prefetch_ahead(w1, K, k, int8);
        prefetch_ahead(w2, K, k, int8), prefetch_ahead(w3, K, k, int8);
        const __m256 d0 = weights8(w0, k, int8), d1 = weights8(w1, k, int8);
        const __m256 d2 = weights8(w2, k, int8), d3 = weights8(w3, k, int8);
        const __m256 u = _mm256_loadu_ps(xs[0] + k), v = _mm256_loadu_ps(xs[1] + k);
        a0 = _mm256_fmadd_ps(u, d0, a0), a1 = _mm256_fmadd_ps(u, d1, a1);
        a2 = _mm256_fmadd_ps(u, d2, a2), a3 = _mm256_fmadd_ps(u, d3, a3);
        b0 = _mm256_fmadd_ps(v, d0, b0), b1 = _mm256_fmadd_ps(v, d1, b1);
        b2 = _mm256_fmadd_ps(v, d2, b2), b3 = _mm256_fmadd_ps(v, d3, b3);
    }
    out[0][0] = hsum(a0); out[0][1] = hsum(a1); out[0][2] = hsum(a2); out[0][3] = hsum(a3);
    out[1][0] = hsum(b0); out[1][1] = hsum(b1); out[1][2] = hsum(b2); out[1][3] = hsum(b3);
}

/* Four input rows (xs) against weight rows n0, n0 + 1: each widened vector serves all four rows. */
ALWAYS_INLINE void rows4_by_2(int64_t n0, int64_t K, const float *const xs[4], const void *w, float out[4][2],
                              const int int8) {
    const char *w0 = row_at(w, n0, K, int8), *w1 = row_at(w, n0 + 1, K, int8);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 0; k < K; k += 8) {
        prefetch_ahead(w0, K, k, int8), prefetch_ahead(w1, K, k, int8);
        __m256 d = weights8(w0, k, int8), e = weights8(w1, k, int8), u;
        u = _mm256_loadu_ps(xs[0] + k); a0 = _mm256_fmadd_ps(u, d, a0); b0 = _mm256_fmadd_ps(u, e, b0);
        u = _mm256_loadu_ps(xs[1] + k); a1 = _mm256_fmadd_ps(u, d, a1); b1 = _mm256_fmadd_ps(u, e, b1);
        u = _mm256_loadu_ps(xs[2] + k); a2 = _mm256_fmadd_ps(u, d, a2); b2 = _mm256_fmadd_ps(u, e, b2);
        u = _mm256_loadu_ps(xs[3] + k); a3 = _mm256_fmadd_ps(u, d, a3); b3 = _mm256_fmadd_ps(u, e, b3);
    }
    out[0][0] = hsum(a0); out[1][0] = hsum(a1); out[2][0] = hsum(a2); out[3][0] = hsum(a3);
    out[0][1] = hsum(b0); out[1][1] = hsum(b1); out[2][1] = hsum(b2); out[3][1] = hsum(b3);
}

ALWAYS_INLINE float dot1(int64_t K, const float *x, const void *w, int64_t n, const int int8) {
    const char *row = row_at(w, n, K, int8);
    __m256 a = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), weights8(row, k, int8), a);
    return hsum(a);
}

/* y [M, ldy] = x [M, ldx] @ W^T (+ bias), W [N, K] (K % 8 == 0) in bf16, or int8 with its row scales. */
ALWAYS_INLINE void dense(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const void *w,
                         const float *scale, const float *bias, float *y, int64_t ldy, int threads, const int int8) {
    const int nthreads = threads > 0 ? threads : 1;
    if (M == 1) {
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t g = 0; g < N / 4; g++) {
            float out[4];
            row_by_4(g * 4, K, x, w, out, int8);
            for (int r = 0; r < 4; r++) y[g * 4 + r] = finish(out[r], scale, bias, g * 4 + r);
        }
        for (int64_t n = N / 4 * 4; n < N; n++) y[n] = finish(dot1(K, x, w, n, int8), scale, bias, n);
        return;
    }
    if (M == 2) {
        const float *xs[2] = {x, x + ldx};
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t g = 0; g < N / 4; g++) {
            float out[2][4];
            rows2_by_4(g * 4, K, xs, w, out, int8);
            for (int64_t m = 0; m < 2; m++)
                for (int r = 0; r < 4; r++) y[m * ldy + g * 4 + r] = finish(out[m][r], scale, bias, g * 4 + r);
        }
        for (int64_t n = N / 4 * 4; n < N; n++)
            for (int64_t m = 0; m < 2; m++) y[m * ldy + n] = finish(dot1(K, x + m * ldx, w, n, int8), scale, bias, n);
        return;
    }
    for (int64_t m0 = 0; m0 < M; m0 += M_BLOCK) {
        const int64_t m1 = m0 + M_BLOCK < M ? m0 + M_BLOCK : M;
#pragma omp parallel for schedule(static) num_threads(nthreads)
        for (int64_t g = 0; g < N / 2; g++) {
            const int64_t n0 = g * 2;
            for (int64_t m = m0; m < m1; m += 4) {
                const int rows = m1 - m < 4 ? (int)(m1 - m) : 4;
                const float *xs[4];
                for (int i = 0; i < 4; i++) xs[i] = x + (m + (i < rows ? i : rows - 1)) * ldx; /* missing rows repeat the last */
                float out[4][2];
                rows4_by_2(n0, K, xs, w, out, int8);
                for (int i = 0; i < rows; i++) {
                    y[(m + i) * ldy + n0] = finish(out[i][0], scale, bias, n0);
                    y[(m + i) * ldy + n0 + 1] = finish(out[i][1], scale, bias, n0 + 1);
                }
            }
        }
        if (N % 2)
            for (int64_t m = m0; m < m1; m++)
                y[m * ldy + N - 1] = finish(dot1(K, x + m * ldx, w, N - 1, int8), scale, bias, N - 1);
    }
}

/* y [M, ldy] = x [M, ldx] @ W^T + bias (bias may be NULL); W [N, K] bf16 as uint16, K % 8 == 0. */
int spectui_dense_bf16(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const uint16_t *w,
                       const float *bias, float *y, int64_t ldy, int threads) {
    dense(M, N, K, x, ldx, w, NULL, bias, y, ldy, threads, 0);
    return 0;
}

/* The same for an int8 layer, x in bf16 [M, ldx] (kernels/head_layer.c's rows on AVX2 CPUs, where its
 * products read bf16 inputs as spectui_dot_bf16's do): x widened to fp32 (exact, widen8); `layer` is one
 * block: the N row scales (fp32), then q [N, K] int8. Returns 0, or 1 if memory could not be allocated. */
int spectui_dense_int8_x16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx, const void *layer,
                           const float *bias, float *y, int64_t ldy, int threads) {
    float *wide = (float *)malloc(sizeof(float) * M * K); /* [M, K] */
    if (wide == NULL) return 1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < K; k += 8) _mm256_storeu_ps(wide + m * K + k, widen8(x + m * ldx + k));
    const float *scale = (const float *)layer;
    dense(M, N, K, wide, K, scale + N, scale, bias, y, ldy, threads, 1);
    free(wide);
    return 0;
}

/* ---------------------------------------------------------------- a drafter's top tokens: spectui_softmax_top
 *
 * For each row g [V] of a drafter's logits (its output layer's product above or screen_int8.c's), the k
 * largest entries and their softmax probabilities, in one pass for the top-k and one for the sum:
 *
 *     idx    the columns of the k largest g, largest first (ties: the lower column first)
 *     prob   exp(g_idx - m) / sum_j exp(g_j - m),   m = max_j g_j
 *
 * what torch.topk(torch.softmax(g), k) gives, without its dozen dispatched ops a drafting level
 * (drafts need no exact probabilities: they rank tokens and pick an acceptance bin). exp is
 * Cephes' single-precision polynomial (relative error about 1e-7) on g - m <= 0, clamped at -87. */

/* exp(x) for 8 lanes of x <= 0 */
static inline __m256 exp8_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); /* x / ln 2 */
    __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));    /* x - n ln 2, in two parts */
    r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(p, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n)); /* p 2^n */
}

#define TOP_MAX 16

/* g [M, V] fp32 (V % 8 == 0), k <= TOP_MAX and <= V -> idx [M, k] int64, prob [M, k] fp32. Returns 0, or 1 for a k
 * out of range. */
int spectui_softmax_top(int64_t M, int64_t V, const float *g, int64_t k, int64_t *idx, float *prob) {
    if (k < 1 || k > TOP_MAX || k > V || V % 8) return 1;
    for (int64_t m = 0; m < M; m++) {
        const float *row = g + m * V;
        float best[TOP_MAX];
        int64_t at[TOP_MAX];
        for (int i = 0; i < k; i++) best[i] = -INFINITY, at[i] = i;
        for (int64_t j0 = 0; j0 < V; j0 += 8) {
            int above = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + j0), _mm256_set1_ps(best[k - 1]), _CMP_GT_OQ));
            while (above) { /* insert each lane above the k-th best so far, in column order */
                const int lane = __builtin_ctz(above);
                above &= above - 1;
                const float v = row[j0 + lane];
                if (!(v > best[k - 1])) continue; /* an earlier lane of these 8 raised the bar */
                int i = (int)k - 1;
                for (; i > 0 && v > best[i - 1]; i--) best[i] = best[i - 1], at[i] = at[i - 1];
                best[i] = v, at[i] = j0 + lane;
            }
        }
        const float top = best[0];
        __m256 sum = _mm256_setzero_ps();
        for (int64_t j0 = 0; j0 < V; j0 += 8)
            sum = _mm256_add_ps(sum, exp8_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(row + j0), _mm256_set1_ps(top))));
        const float total = hsum(sum);
        for (int64_t i0 = 0; i0 < k; i0 += 8) {
            float part[8], es[8];
            for (int i = 0; i < 8; i++) part[i] = i0 + i < k ? best[i0 + i] - top : 0.0f;
            _mm256_storeu_ps(es, exp8_nonpositive(_mm256_loadu_ps(part)));
            for (int i = 0; i < 8 && i0 + i < k; i++) {
                idx[m * k + i0 + i] = at[i0 + i];
                prob[m * k + i0 + i] = es[i] / total;
            }
        }
    }
    return 0;
}

/* ---------------------------------------------------------------- AVX512-BF16: spectui_dot_bf16
 *
 *     y[m, n] = sum_k x[m, k] * W[n, k]  (+ bias[n])      x bf16 [M, K], W bf16 [N, K], y fp32
 *
 * vdpbf16ps multiplies pairs of bf16 exactly (8-bit significands: the product fits in fp32) and adds
 * them into fp32 lanes, each addition rounded (denormals flushed: an absolute error below 2^-126 an
 * operation). So every y is an fp32 sum of exact products: |y - x.w| <= gamma_K sum_k |x_k w_k|.
 *
 * Why: torch's bf16 product on these CPUs goes through oneDNN, whose AMX tiles make 16 rows cost what
 * one costs (2.1-2.4 ms for 1 to 16 rows of a 49,152 x 576 layer), reading W at about half memory
 * speed. For one to three rows this loop streams W once (1.05 ms for one row there, 1.35 for two; a
 * 8,192-row layer 0.23 / 0.32 ms against torch's 0.38-0.5); kernels/dense_cpu.py sends more rows to torch.
 * Without AMX (an AMD EPYC) torch's product of the 49,152-row layer costs 4.8-5.9 ms for any rows and
 * this loop 2.2-2.5 for 2 to 4, 4.3 for 8: the output screen (kernels/argmax_head.py) takes it up to 8.
 *
 * Tiles of NB = 4 weight rows by up to MB = 4 input rows keep 16 accumulators in registers; a tile's
 * weights (4 x K bf16) stay in L1 while the input rows pass. Threads split the weight rows.
 */
#define DOT_NB 4
#define DOT_MB 4
#define DOT_PREFETCH 4096 /* bytes ahead of each weight row's stream: the next tile's rows */
#define DOT_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* mb input rows (a constant after inlining: the accumulators stay in registers) by DOT_NB weight rows
 * w + j * ldw (ldw = 0 repeats one row: the last, partial tile); nb of the DOT_NB results are stored. */
DOT_TARGET __attribute__((always_inline)) static inline void dot_tile(
        const int mb, int64_t K, const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw,
        float *y, int64_t ldy, const float *bias, int nb) {
    __m512 acc[DOT_MB][DOT_NB];
    for (int i = 0; i < DOT_MB; i++)
        for (int j = 0; j < DOT_NB; j++) acc[i][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 32) {
        const __mmask32 mask = K - k >= 32 ? (__mmask32)0xFFFFFFFFu : (__mmask32)((1u << (K - k)) - 1);
        __m512i wv[DOT_NB];
        for (int j = 0; j < DOT_NB; j++) {
            _mm_prefetch((const char *)(w + j * ldw + k) + DOT_PREFETCH, _MM_HINT_T0); /* never faults */
            wv[j] = _mm512_maskz_loadu_epi16(mask, w + j * ldw + k);
        }
        for (int i = 0; i < mb; i++) {
            const __m512i xv = _mm512_maskz_loadu_epi16(mask, x + i * ldx + k);
            for (int j = 0; j < DOT_NB; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
        }
    }
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < nb; j++) y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]) + (bias ? bias[j] : 0.0f);
}

/* y [M, ldy] = x [M, ldx] @ W^T + bias (bias may be NULL); x and W bf16 as uint16, W [N, K] contiguous. */
DOT_TARGET int spectui_dot_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx, const uint16_t *w,
                                const float *bias, float *y, int64_t ldy, int threads) {
    const int nthreads = threads > 0 ? threads : 1;
    const int64_t tiles = (N + DOT_NB - 1) / DOT_NB;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t n0 = t * DOT_NB;
        const int nb = N - n0 < DOT_NB ? (int)(N - n0) : DOT_NB;
        for (int64_t m0 = 0; m0 < M; m0 += DOT_MB) {
            const int mb = M - m0 < DOT_MB ? (int)(M - m0) : DOT_MB;
            const uint16_t *xt = x + m0 * ldx;
            for (int j = 0; j < nb; j += nb < DOT_NB ? 1 : DOT_NB) { /* a partial tile: one row at a time */
                const uint16_t *wt = w + (n0 + j) * K;
                const int64_t ldw = nb < DOT_NB ? 0 : K;
                const int store = nb < DOT_NB ? 1 : DOT_NB;
                float *yt = y + m0 * ldy + n0 + j;
                const float *bt = bias ? bias + n0 + j : 0;
                switch (mb) {
                case 1: dot_tile(1, K, xt, ldx, wt, ldw, yt, ldy, bt, store); break;
                case 2: dot_tile(2, K, xt, ldx, wt, ldw, yt, ldy, bt, store); break;
                case 3: dot_tile(3, K, xt, ldx, wt, ldw, yt, ldy, bt, store); break;
                default: dot_tile(4, K, xt, ldx, wt, ldw, yt, ldy, bt, store); break;
                }
            }
        }
    }
    return 0;
}
