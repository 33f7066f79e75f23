/* NF4/FP4 matmul on CPUs with AVX2 + FMA, reading bitsandbytes' 4-bit weights as they are.
 *
 * Built at first use by kernels/nf4_cpu.py (cc -O2 -mavx2 -mfma -fopenmp -ffp-contract=off) and
 * called through ctypes. Layout (bitsandbytes' non-packed 4-bit format, checked by
 * tests/kernels/test_nf4_cpu.py):
 *
 *     w       [N * K / 2] uint8   element (n, k) = index i = n * K + k; byte i / 2, high nibble
 *                                 first (even i), low nibble second (odd i)
 *     absmax  [N * K / bs] fp32   one scale per block of bs consecutive elements (K % bs == 0,
 *                                 so a block never straddles two rows)
 *     code    [16] fp32           the 4-bit code (NF4 or FP4 table)
 *
 *     y[m, n] = sum_k x[m, k] * W[n, k],    W[n, k] = code[q(n, k)] * absmax[(n * K + k) / bs]
 *
 * W[n, k] is bitsandbytes' own dequantised weight to the bit (one fp32 product): each block's two
 * 8-entry halves of the code are multiplied by its scale once, and a weight is looked up in them.
 *
 * The sum is done in one fixed order for every (m, n): eight lanes, lane j accumulating, group by
 * group of 16 weights (g = 0, 1, ...), k = 16g + 2j (a byte's high nibble) and then 16g + 2j + 1
 * (its low nibble) with fused multiply-adds; then lanes (j, j + 4), then (j, j + 2), then (0, 1).
 * To read a group's bytes straight into lanes, x's rows are permuted once a call (`xp`, see
 * permute_rows) so that a group's 16 values sit as 8 even-k then 8 odd-k; in that order every loop
 * below is a plain run over k in steps of 8. Threads split the output rows n, never k, and the m
 * loop only repeats that order. So y[m, n] has the same bits whatever M, N (a stack of several
 * weights) and the thread count: a row computed in a tree pass equals the row computed alone, which
 * keeps tree verification token-identical to one-token decoding.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define ROWS 4 /* output rows per task: independent accumulator chains hide FMA latency */
#define M_BLOCK 48 /* input rows per pass over the weights (prefill): 48 x 1536 fp32 = 288 KiB, within L2 */

/* A block's code halves times its scale: lo[i] = code[i] * s, hi[i] = code[8 + i] * s (the products
 * bitsandbytes' dequantisation makes). */
typedef struct { __m256 lo, hi; } Luts;

static inline Luts block_luts(const float *code, float scale) {
    const __m256 s = _mm256_set1_ps(scale);
    Luts t = {_mm256_mul_ps(_mm256_loadu_ps(code), s), _mm256_mul_ps(_mm256_loadu_ps(code + 8), s)};
    return t;
}

/* A group's 16 weights from its 8 bytes: *even = the high nibbles' weights (k = 16g + 2j in lane j),
 * *odd = the low nibbles' (k = 16g + 2j + 1). A lane holds its byte b; the permutes read bits 0-2 of
 * their index (b >> 4 or b), the blend bit 31 (b << 24 brings bit 7 there, b << 28 bit 3). */
static inline void decode16(const uint8_t *bytes, Luts t, __m256 *even, __m256 *odd) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes));
    const __m256i high = _mm256_srli_epi32(b, 4);
    *even = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, high), _mm256_permutevar8x32_ps(t.hi, high),
                             _mm256_castsi256_ps(_mm256_slli_epi32(b, 24)));
    *odd = _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.lo, b), _mm256_permutevar8x32_ps(t.hi, b),
                            _mm256_castsi256_ps(_mm256_slli_epi32(b, 28)));
}

/* xp [M, K] = x's rows with each group of 16 reordered as its 8 even k, then its 8 odd k. */
static void permute_rows(int64_t M, int64_t K, const float *x, int64_t ldx, float *xp) {
    for (int64_t m = 0; m < M; m++) {
        const float *src = x + m * ldx;
        float *dst = xp + m * K;
        for (int64_t k = 0; k < K; k += 16)
            for (int j = 0; j < 8; j++) {
                dst[k + j] = src[k + 2 * j];
                dst[k + 8 + j] = src[k + 2 * j + 1];
            }
    }
}

/* Dequantise rows n0 .. n0 + ROWS - 1 into scratch [ROWS, K], in xp's order. */
static void dequant_rows(int64_t n0, int64_t K, const uint8_t *w, const float *absmax, int64_t bs,
                         const float *code, float *scratch) {
    for (int r = 0; r < ROWS; r++) {
        const int64_t n = n0 + r;
        const uint8_t *row = w + n * K / 2;
        const float *scales = absmax + n * (K / bs);
        float *out = scratch + r * K;
        for (int64_t k0 = 0; k0 < K; k0 += bs) {
            const Luts t = block_luts(code, scales[k0 / bs]);
            for (int64_t k = k0; k < k0 + bs; k += 16) {
                __m256 even, odd;
                decode16(row + k / 2, t, &even, &odd);
                _mm256_storeu_ps(out + k, even);
                _mm256_storeu_ps(out + k + 8, odd);
            }
        }
    }
}

/* y[m + i, n0 + r] for r < ROWS and three rows m, m + 1, m + 2 of xp, from dequantised scratch rows:
 * 12 accumulators, 4 weight vectors and 3 input vectors read per 12 fused multiply-adds. */
static void dot_rows_3(int64_t K, const float *x0, const float *x1, const float *x2, const float *scratch,
                       float *y0, float *y1, float *y2) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a23 = a00;
    for (int64_t k = 0; k < K; k += 8) {
        __m256 w0 = _mm256_loadu_ps(scratch + k), w1 = _mm256_loadu_ps(scratch + K + k);
        __m256 w2 = _mm256_loadu_ps(scratch + 2 * K + k), w3 = _mm256_loadu_ps(scratch + 3 * K + k);
        __m256 u = _mm256_loadu_ps(x0 + k);
        a00 = _mm256_fmadd_ps(u, w0, a00); a01 = _mm256_fmadd_ps(u, w1, a01);
        a02 = _mm256_fmadd_ps(u, w2, a02); a03 = _mm256_fmadd_ps(u, w3, a03);
        u = _mm256_loadu_ps(x1 + k);
        a10 = _mm256_fmadd_ps(u, w0, a10); a11 = _mm256_fmadd_ps(u, w1, a11);
        a12 = _mm256_fmadd_ps(u, w2, a12); a13 = _mm256_fmadd_ps(u, w3, a13);
        u = _mm256_loadu_ps(x2 + k);
        a20 = _mm256_fmadd_ps(u, w0, a20); a21 = _mm256_fmadd_ps(u, w1, a21);
        a22 = _mm256_fmadd_ps(u, w2, a22); a23 = _mm256_fmadd_ps(u, w3, a23);
    }
    y0[0] = hsum(a00); y0[1] = hsum(a01); y0[2] = hsum(a02); y0[3] = hsum(a03);
    y1[0] = hsum(a10); y1[1] = hsum(a11); y1[2] = hsum(a12); y1[3] = hsum(a13);
    y2[0] = hsum(a20); y2[1] = hsum(a21); y2[2] = hsum(a22); y2[3] = hsum(a23);
}

static void dot_rows_1(int64_t K, const float *x0, const float *scratch, float *y0) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < K; k += 8) {
        __m256 u = _mm256_loadu_ps(x0 + k);
        a0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(scratch + k), a0);
        a1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(scratch + K + k), a1);
        a2 = _mm256_fmadd_ps(u, _mm256_loadu_ps(scratch + 2 * K + k), a2);
        a3 = _mm256_fmadd_ps(u, _mm256_loadu_ps(scratch + 3 * K + k), a3);
    }
    y0[0] = hsum(a0); y0[1] = hsum(a1); y0[2] = hsum(a2); y0[3] = hsum(a3);
}

/* M = 1 without the scratch round trip: decode and multiply in one pass (same order, same bits). */
static void gemv_rows(int64_t n0, int64_t K, const float *x, const uint8_t *w, const float *absmax, int64_t bs,
                      const float *code, float *y) {
    const uint8_t *r0 = w + n0 * K / 2, *r1 = r0 + K / 2, *r2 = r1 + K / 2, *r3 = r2 + K / 2;
    const float *s0 = absmax + n0 * (K / bs), *s1 = s0 + K / bs, *s2 = s1 + K / bs, *s3 = s2 + K / bs;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k0 = 0; k0 < K; k0 += bs) {
        const int64_t b = k0 / bs;
        const Luts t0 = block_luts(code, s0[b]), t1 = block_luts(code, s1[b]);
        const Luts t2 = block_luts(code, s2[b]), t3 = block_luts(code, s3[b]);
        for (int64_t k = k0; k < k0 + bs; k += 16) {
            const __m256 u = _mm256_loadu_ps(x + k), v = _mm256_loadu_ps(x + k + 8);
            __m256 e, o;
            decode16(r0 + k / 2, t0, &e, &o); a0 = _mm256_fmadd_ps(v, o, _mm256_fmadd_ps(u, e, a0));
            decode16(r1 + k / 2, t1, &e, &o); a1 = _mm256_fmadd_ps(v, o, _mm256_fmadd_ps(u, e, a1));
            decode16(r2 + k / 2, t2, &e, &o); a2 = _mm256_fmadd_ps(v, o, _mm256_fmadd_ps(u, e, a2));
            decode16(r3 + k / 2, t3, &e, &o); a3 = _mm256_fmadd_ps(v, o, _mm256_fmadd_ps(u, e, a3));
        }
    }
    y[n0] = hsum(a0); y[n0 + 1] = hsum(a1); y[n0 + 2] = hsum(a2); y[n0 + 3] = hsum(a3);
}

/* Two weight rows n0, n0 + 1 for M = 2, 3 or 4 input rows: each decoded group serves every row.
 * FMA2(acc, i, even, odd) adds a group of row i (u: its even k, v: its odd k) into acc, in the
 * header's order. */
#define FMA2(acc, i, even, odd) acc = _mm256_fmadd_ps(v##i, odd, _mm256_fmadd_ps(u##i, even, acc))
#define LOAD(i, x) const __m256 u##i = _mm256_loadu_ps((x) + k), v##i = _mm256_loadu_ps((x) + k + 8)
#define TWO_ROWS_BEGIN                                                                                  \
    const uint8_t *r0 = w + n0 * K / 2, *r1 = r0 + K / 2;                                             \
    const float *s0 = absmax + n0 * (K / bs), *s1 = s0 + K / bs;                                       \
    for (int64_t k0 = 0; k0 < K; k0 += bs) {                                                           \
        const Luts t0 = block_luts(code, s0[k0 / bs]), t1 = block_luts(code, s1[k0 / bs]);             \
        for (int64_t k = k0; k < k0 + bs; k += 16) {                                                   \
            __m256 d, e, f, g;                                                                         \
            decode16(r0 + k / 2, t0, &d, &e);                                                          \
            decode16(r1 + k / 2, t1, &f, &g);
#define TWO_ROWS_END }}

static void gemv2_rows(int64_t n0, int64_t K, const float *x0, const float *x1, const uint8_t *w,
                       const float *absmax, int64_t bs, const float *code, float *y0, float *y1) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
    TWO_ROWS_BEGIN
        LOAD(0, x0); LOAD(1, x1);
        FMA2(a0, 0, d, e); FMA2(b0, 0, f, g); FMA2(a1, 1, d, e); FMA2(b1, 1, f, g);
    TWO_ROWS_END
    y0[n0] = hsum(a0); y0[n0 + 1] = hsum(b0); y1[n0] = hsum(a1); y1[n0 + 1] = hsum(b1);
}

static void gemv3_rows(int64_t n0, int64_t K, const float *x0, const float *x1, const float *x2, const uint8_t *w,
                       const float *absmax, int64_t bs, const float *code, float *y0, float *y1, float *y2) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, b0 = a0, b1 = a0, b2 = a0;
    TWO_ROWS_BEGIN
        LOAD(0, x0); LOAD(1, x1); LOAD(2, x2);
        FMA2(a0, 0, d, e); FMA2(b0, 0, f, g); FMA2(a1, 1, d, e); FMA2(b1, 1, f, g);
        FMA2(a2, 2, d, e); FMA2(b2, 2, f, g);
    TWO_ROWS_END
    y0[n0] = hsum(a0); y0[n0 + 1] = hsum(b0); y1[n0] = hsum(a1); y1[n0 + 1] = hsum(b1);
    y2[n0] = hsum(a2); y2[n0 + 1] = hsum(b2);
}

static void gemv4_rows(int64_t n0, int64_t K, const float *const xs[4], const uint8_t *w, const float *absmax,
                       int64_t bs, const float *code, float *const ys[4]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    TWO_ROWS_BEGIN
        LOAD(0, xs[0]); LOAD(1, xs[1]); LOAD(2, xs[2]); LOAD(3, xs[3]);
        FMA2(a0, 0, d, e); FMA2(b0, 0, f, g); FMA2(a1, 1, d, e); FMA2(b1, 1, f, g);
        FMA2(a2, 2, d, e); FMA2(b2, 2, f, g); FMA2(a3, 3, d, e); FMA2(b3, 3, f, g);
    TWO_ROWS_END
    ys[0][n0] = hsum(a0); ys[0][n0 + 1] = hsum(b0); ys[1][n0] = hsum(a1); ys[1][n0 + 1] = hsum(b1);
    ys[2][n0] = hsum(a2); ys[2][n0 + 1] = hsum(b2); ys[3][n0] = hsum(a3); ys[3][n0 + 1] = hsum(b3);
}

/* M = 5 to 8: one weight row at a time, each decoded group serving eight input rows (rows that are
 * not there read the last one again and write to `spare`). Same order per output. */
static void gemv8_row(int64_t n, int64_t K, const float *const xs[8], const uint8_t *w, const float *absmax,
                      int64_t bs, const float *code, float *const ys[8]) {
    const uint8_t *r = w + n * K / 2;
    const float *sc = absmax + n * (K / bs);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0; /* in registers */
    for (int64_t k0 = 0; k0 < K; k0 += bs) {
        const Luts t = block_luts(code, sc[k0 / bs]);
        for (int64_t k = k0; k < k0 + bs; k += 16) {
            __m256 e, o;
            decode16(r + k / 2, t, &e, &o);
            { LOAD(0, xs[0]); LOAD(1, xs[1]); LOAD(2, xs[2]); LOAD(3, xs[3]);
              FMA2(a0, 0, e, o); FMA2(a1, 1, e, o); FMA2(a2, 2, e, o); FMA2(a3, 3, e, o); }
            { LOAD(4, xs[4]); LOAD(5, xs[5]); LOAD(6, xs[6]); LOAD(7, xs[7]);
              FMA2(a4, 4, e, o); FMA2(a5, 5, e, o); FMA2(a6, 6, e, o); FMA2(a7, 7, e, o); }
        }
    }
    ys[0][n] = hsum(a0); ys[1][n] = hsum(a1); ys[2][n] = hsum(a2); ys[3][n] = hsum(a3);
    ys[4][n] = hsum(a4); ys[5][n] = hsum(a5); ys[6][n] = hsum(a6); ys[7][n] = hsum(a7);
}

/* xs[i], ys[i] for i < n: rows i of x and y, or, past row M - 1, x's last row again and `spare`. */
static void row_views(int n, int64_t M, const float *x, int64_t ldx, float *y, int64_t ldy, float *spare,
                      const float **xs, float **ys) {
    for (int i = 0; i < n; i++) {
        xs[i] = x + (i < M ? i : M - 1) * ldx;
        ys[i] = i < M ? y + i * ldy : spare;
    }
}

/* y [M, ldy] = x [M, ldx] @ W^T for W [N, K] in 4 bits, x's rows read through xp (the header's order). */
static int matmul(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const uint8_t *w,
                  const float *absmax, int64_t bs, const float *code, float *y, int64_t ldy, int threads) {
    if (M == 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t g = 0; g < N / ROWS; g++)
            gemv_rows(g * ROWS, K, x, w, absmax, bs, code, y);
        return 0;
    }
    if (M == 2) { /* two weight rows a pass, both input rows: 1.16x the 4-row path's speed here */
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t g = 0; g < N / 2; g++)
            gemv2_rows(g * 2, K, x, x + ldx, w, absmax, bs, code, y, y + ldy);
        return 0;
    }
    if (M == 3) { /* the same with three: 1.12x */
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t g = 0; g < N / 2; g++)
            gemv3_rows(g * 2, K, x, x + ldx, x + 2 * ldx, w, absmax, bs, code, y, y + ldy, y + 2 * ldy);
        return 0;
    }
    if (M <= 8) { /* 4 rows: the 4-row path; 5-8 rows: each decoded vector serves 8 rows */
        const int P = M <= 4 ? 4 : 8;
        float *spare = (float *)malloc(sizeof(float) * N); /* outputs of missing rows, M < P */
        if (spare == NULL) return 1;
        const float *xs[8];
        float *ys[8];
        row_views(P, M, x, ldx, y, ldy, spare, xs, ys);
        if (P == 4) {
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t g = 0; g < N / 2; g++)
                gemv4_rows(g * 2, K, xs, w, absmax, bs, code, ys);
        } else {
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t n = 0; n < N; n++)
                gemv8_row(n, K, xs, w, absmax, bs, code, ys);
        }
        free(spare);
        return 0;
    }
    float *scratch = (float *)malloc(sizeof(float) * ROWS * K * (threads > 0 ? threads : 1)); /* [threads, ROWS, K] */
    if (scratch == NULL) return 1;
#pragma omp parallel num_threads(threads)
    {
        float *mine = scratch + (int64_t)omp_get_thread_num() * ROWS * K;
        for (int64_t m0 = 0; m0 < M; m0 += M_BLOCK) { /* a block of x's rows stays in cache while every weight row passes */
            const int64_t m1 = m0 + M_BLOCK < M ? m0 + M_BLOCK : M;
#pragma omp for schedule(static)
            for (int64_t g = 0; g < N / ROWS; g++) {
                const int64_t n0 = g * ROWS;
                float t0[ROWS], t1[ROWS], t2[ROWS];
                dequant_rows(n0, K, w, absmax, bs, code, mine);
                int64_t m = m0;
                for (; m + 2 < m1; m += 3) {
                    dot_rows_3(K, x + m * ldx, x + (m + 1) * ldx, x + (m + 2) * ldx, mine, t0, t1, t2);
                    for (int r = 0; r < ROWS; r++) {
                        y[m * ldy + n0 + r] = t0[r];
                        y[(m + 1) * ldy + n0 + r] = t1[r];
                        y[(m + 2) * ldy + n0 + r] = t2[r];
                    }
                }
                for (; m < m1; m++) {
                    dot_rows_1(K, x + m * ldx, mine, t0);
                    for (int r = 0; r < ROWS; r++) y[m * ldy + n0 + r] = t0[r];
                }
            }
        }
    }
    free(scratch);
    return 0;
}

/* y [M, ldy] = x [M, ldx] @ W^T for W [N, K] in 4 bits, or with `add` y += x @ W^T (each element
 * y + p rounded once after the product's own rounding: torch's `y + linear(x)`). Needs N % 4 == 0,
 * K % 16 == 0, K % bs == 0, bs % 16 == 0 (the caller checks). Returns 0, or 1 if memory could not be
 * allocated. */
int spectui_nf4_matmul(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const uint8_t *w,
                       const float *absmax, int64_t bs, const float *code, float *y, int64_t ldy, int threads,
                       int add) {
    float *xp = (float *)malloc(sizeof(float) * M * (K + (add ? N : 0))); /* [M, K], then [M, N] products if add */
    if (xp == NULL) return 1;
    permute_rows(M, K, x, ldx, xp);
    float *products = add ? xp + M * K : y;
    const int failed = matmul(M, N, K, xp, K, w, absmax, bs, code, products, add ? N : ldy, threads);
    if (add && !failed)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) y[m * ldy + n] += products[m * N + n];
    free(xp);
    return failed;
}
