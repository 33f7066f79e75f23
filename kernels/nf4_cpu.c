/* NF4/FP4 matmul on CPUs with AVX2 + FMA (and, with the same bits, AVX-512: below), reading bitsandbytes'
 * 4-bit weights as they are.
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
 * W[n, k] is bitsandbytes' own dequantised weight to the bit (one fp32 product): a weight's code
 * value is looked up (decode32, below) and multiplied by its block's scale.
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

#include "aligned.h"
#include "bf16.h"

#define ROWS 4 /* output rows per task: independent accumulator chains hide FMA latency */
/* The next task's weight bytes at p into cache while this task computes (a prefetch past w's end never
 * faults). A task's rows are runs of 288-768 bytes, too short for the hardware's stream prefetcher: with
 * it a one-row product of the 30 layers' 60 MB from memory took 10-33 % less in seven interleaved runs
 * (12.45 -> 9.73 ms in one; two threads, a 2-core AMD EPYC), two rows 4-8 % less. */
#define PREFETCH_NEXT(p) _mm_prefetch((p), _MM_HINT_T0)
#define M_BLOCK 48 /* input rows per pass over the weights (prefill): 48 x 1536 fp32 = 288 KiB, within L2 */

/* Decoding by byte shuffles. The code's 16 fp32 values go into four byte planes (plane k: byte k of
 * each value, the same in both 128-bit lanes); a chunk of 32 weights (16 bytes) is looked up in each
 * plane with vpshufb, and unpacking the four planes' bytes back together gives the code values,
 * which times the block's scale are W. (The lookup this replaces, two lane-crossing vpermps and a
 * blend per 8 weights, was most of a one-row product on AMD Zen 3, where vpermps is slow; with this
 * one the one-row product runs 1.16-1.29x faster, with the same bits: docs/performance.md.) */
typedef struct { __m256i p0, p1, p2, p3; } Planes;

static Planes code_planes(const float *code) {
    uint8_t b[4][32];
    for (int i = 0; i < 16; i++) {
        uint32_t u;
        memcpy(&u, code + i, 4);
        for (int k = 0; k < 4; k++) b[k][i] = b[k][16 + i] = (uint8_t)(u >> (8 * k));
    }
    Planes p = {_mm256_loadu_si256((const __m256i *)b[0]), _mm256_loadu_si256((const __m256i *)b[1]),
                _mm256_loadu_si256((const __m256i *)b[2]), _mm256_loadu_si256((const __m256i *)b[3])};
    return p;
}

/* A chunk's 32 weights from its 16 bytes, times the scale s: e0, o0 = group 0's even k (the high
 * nibbles of bytes 0-7, k = 2j in lane j) and odd k (their low nibbles), e1, o1 the same for group 1
 * (bytes 8-15). The index vector's lane 0 holds bytes 0-3's high nibbles, their low nibbles, bytes
 * 8-11's high, their low; lane 1 the same for bytes 4-7 and 12-15. The unpacks put positions
 * 4j .. 4j + 3 of both lanes into output j (bytes 0, 1 of a value from planes 0, 1, bytes 2, 3 from
 * planes 2, 3), so output 0 is bytes 0-7's high nibbles in order, output 1 their low ones, and so on. */
static inline void decode32(const uint8_t *bytes, const Planes *p, __m256 s, __m256 *e0, __m256 *o0, __m256 *e1,
                            __m256 *o1) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 8, 9, 10, 11, 8, 9, 10, 11,
                                          4, 5, 6, 7, 4, 5, 6, 7, 12, 13, 14, 15, 12, 13, 14, 15);
    const __m256i shift = _mm256_setr_epi32(4, 0, 4, 0, 4, 0, 4, 0); /* high nibble, low nibble */
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)bytes));
    const __m256i nibbles = _mm256_srlv_epi32(_mm256_shuffle_epi8(b, pick), shift);
    const __m256i idx = _mm256_and_si256(nibbles, _mm256_set1_epi8(0x0F));
    const __m256i q0 = _mm256_shuffle_epi8(p->p0, idx), q1 = _mm256_shuffle_epi8(p->p1, idx);
    const __m256i q2 = _mm256_shuffle_epi8(p->p2, idx), q3 = _mm256_shuffle_epi8(p->p3, idx);
    const __m256i lo01 = _mm256_unpacklo_epi8(q0, q1), lo23 = _mm256_unpacklo_epi8(q2, q3); /* positions 0-7 */
    const __m256i hi01 = _mm256_unpackhi_epi8(q0, q1), hi23 = _mm256_unpackhi_epi8(q2, q3); /* positions 8-15 */
    *e0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(lo01, lo23)), s);
    *o0 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(lo01, lo23)), s);
    *e1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(hi01, hi23)), s);
    *o1 = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(hi01, hi23)), s);
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
                         const Planes *p, float *scratch) {
    for (int r = 0; r < ROWS; r++) {
        const int64_t n = n0 + r;
        const uint8_t *row = w + n * K / 2;
        const float *scales = absmax + n * (K / bs);
        float *out = scratch + r * K;
        for (int64_t k0 = 0; k0 < K; k0 += bs) {
            const __m256 s = _mm256_set1_ps(scales[k0 / bs]);
            for (int64_t k = k0; k < k0 + bs; k += 32) {
                __m256 e0, o0, e1, o1;
                decode32(row + k / 2, p, s, &e0, &o0, &e1, &o1);
                _mm256_storeu_ps(out + k, e0);
                _mm256_storeu_ps(out + k + 8, o0);
                _mm256_storeu_ps(out + k + 16, e1);
                _mm256_storeu_ps(out + k + 24, o1);
            }
        }
    }
}

/* y[m + i, n0 + r] for r < ROWS and three rows m, m + 1, m + 2 of xp, from dequantised scratch rows:
 * 12 accumulators, 4 weight vectors and 3 input vectors read per 12 fused multiply-adds. Kept out of
 * line, as dot_rows_1 is: inlined beside decode32, gcc read the weight vectors again for every input
 * row (64 rows 163 -> 201 ms over the 30 layers). */
static __attribute__((noinline)) void dot_rows_3(int64_t K, const float *x0, const float *x1, const float *x2,
                                                 const float *scratch, float *y0, float *y1, float *y2) {
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

static __attribute__((noinline)) void dot_rows_1(int64_t K, const float *x0, const float *scratch, float *y0) {
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

/* FMA2(acc, x, even, odd): a group of input row x (xp's order: its 8 even k at x + k, its 8 odd k at
 * x + k + 8) into acc, in the header's order; CHUNK2 the chunk's two groups, one after the other. */
#define FMA2(acc, x, even, odd) \
    acc = _mm256_fmadd_ps(_mm256_loadu_ps((x) + k + 8), odd, _mm256_fmadd_ps(_mm256_loadu_ps((x) + k), even, acc))
#define CHUNK2(acc, x)                 \
    {                                  \
        FMA2(acc, x, e0, o0);          \
        FMA2(acc, (x) + 16, e1, o1);   \
    }
/* A weight row's chunk at k: e0, o0, e1, o1 (decode32) from row r_ and its block's scale s_ (__m256). */
#define DECODE(r_, s_) \
    __m256 e0, o0, e1, o1; \
    decode32((r_) + k / 2, p, s_, &e0, &o0, &e1, &o1)
/* for (k ...) over a row's chunks, block by block: `block` (0, 1, ...) numbers k's block. */
#define CHUNKS(block)                                          \
    for (int64_t k0 = 0, block = 0; k0 < K; k0 += bs, block++) \
        for (int64_t k = k0; k < k0 + bs; k += 32)

/* M = 1 without the scratch round trip: decode and multiply in one pass (same order, same bits),
 * four weight rows at a time for four independent chains of fused multiply-adds. */
static void gemv_rows(int64_t n0, int64_t K, const float *x, const uint8_t *w, const float *absmax, int64_t bs,
                      const Planes *p, float *y) {
    const uint8_t *r0 = w + n0 * K / 2, *r1 = r0 + K / 2, *r2 = r1 + K / 2, *r3 = r2 + K / 2;
    const float *s0 = absmax + n0 * (K / bs), *s1 = s0 + K / bs, *s2 = s1 + K / bs, *s3 = s2 + K / bs;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    CHUNKS(b) {
        PREFETCH_NEXT((const char *)(r0 + 2 * K) + 2 * k); /* the next task's 4 rows (2K bytes): a line a chunk */
        { DECODE(r0, _mm256_set1_ps(s0[b])); CHUNK2(a0, x); }
        { DECODE(r1, _mm256_set1_ps(s1[b])); CHUNK2(a1, x); }
        { DECODE(r2, _mm256_set1_ps(s2[b])); CHUNK2(a2, x); }
        { DECODE(r3, _mm256_set1_ps(s3[b])); CHUNK2(a3, x); }
    }
    y[n0] = hsum(a0); y[n0 + 1] = hsum(a1); y[n0 + 2] = hsum(a2); y[n0 + 3] = hsum(a3);
}

/* Two weight rows n0, n0 + 1 for M = rows = 2, 3 or 4 input rows (xs): each decoded chunk serves
 * every input row (a_i: input row i, weight row n0; b_i: weight row n0 + 1). Inlined into gemv2_rows,
 * gemv3_rows, gemv4_rows (FOR_ROWS). */
#define INLINE static inline __attribute__((always_inline))
INLINE void gemv_two_rows(int rows, int64_t n0, int64_t K, const float *const xs[8], const uint8_t *w,
                          const float *absmax, int64_t bs, const Planes *p, float *const ys[8]) {
    const uint8_t *r0 = w + n0 * K / 2, *r1 = r0 + K / 2;
    const float *s0 = absmax + n0 * (K / bs), *s1 = s0 + K / bs;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    CHUNKS(blk) {
        PREFETCH_NEXT((const char *)(r0 + K) + k); /* the next task's 2 rows (K bytes): half a line a chunk */
        {
            DECODE(r0, _mm256_set1_ps(s0[blk]));
            CHUNK2(a0, xs[0]); CHUNK2(a1, xs[1]);
            if (rows > 2) CHUNK2(a2, xs[2]);
            if (rows > 3) CHUNK2(a3, xs[3]);
        }
        {
            DECODE(r1, _mm256_set1_ps(s1[blk]));
            CHUNK2(b0, xs[0]); CHUNK2(b1, xs[1]);
            if (rows > 2) CHUNK2(b2, xs[2]);
            if (rows > 3) CHUNK2(b3, xs[3]);
        }
    }
    const __m256 a[4] = {a0, a1, a2, a3}, b[4] = {b0, b1, b2, b3};
    for (int i = 0; i < rows; i++) {
        ys[i][n0] = hsum(a[i]);
        ys[i][n0 + 1] = hsum(b[i]);
    }
}

/* name(...): `inner` for a constant number of input rows (a function of its own, so that the compiler
 * keeps the accumulators in registers and drops the rows that are not there). */
#define FOR_ROWS(name, inner, rows)                                                                        \
    static void name(int64_t n, int64_t K, const float *const xs[8], const uint8_t *w, const float *absmax,  \
                     int64_t bs, const Planes *p, float *const ys[8]) {                                    \
        inner(rows, n, K, xs, w, absmax, bs, p, ys);                                                         \
    }
FOR_ROWS(gemv2_rows, gemv_two_rows, 2)
FOR_ROWS(gemv3_rows, gemv_two_rows, 3)
FOR_ROWS(gemv4_rows, gemv_two_rows, 4)

/* M = rows = 5 to 8: one weight row at a time, each decoded chunk serving every input row; inlined
 * into gemv5_row ... gemv8_row, so a tree of 5 rows does 5 rows' work, not 8 (5 rows: 28 -> 20 ms
 * over the 30 layers). Same order per output. */
INLINE void gemv_one_row(int rows, int64_t n, int64_t K, const float *const xs[8], const uint8_t *w,
                         const float *absmax, int64_t bs, const Planes *p, float *const ys[8]) {
    const uint8_t *r = w + n * K / 2;
    const float *sc = absmax + n * (K / bs);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    CHUNKS(b) {
        DECODE(r, _mm256_set1_ps(sc[b]));
        CHUNK2(a0, xs[0]); CHUNK2(a1, xs[1]); CHUNK2(a2, xs[2]); CHUNK2(a3, xs[3]); CHUNK2(a4, xs[4]);
        if (rows > 5) CHUNK2(a5, xs[5]);
        if (rows > 6) CHUNK2(a6, xs[6]);
        if (rows > 7) CHUNK2(a7, xs[7]);
    }
    const __m256 a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
    for (int i = 0; i < rows; i++) ys[i][n] = hsum(a[i]);
}

FOR_ROWS(gemv5_row, gemv_one_row, 5)
FOR_ROWS(gemv6_row, gemv_one_row, 6)
FOR_ROWS(gemv7_row, gemv_one_row, 7)
FOR_ROWS(gemv8_row, gemv_one_row, 8)

#include "nf4_avx512.h" /* the AVX-512 path: matmul_512, prefill_task_512, use_avx512 */

/* y [M, ldy] = x [M, ldx] @ W^T for W [N, K] in 4 bits, x's rows read through xp (the header's order). */
static int matmul(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const uint8_t *w,
                  const float *absmax, int64_t bs, const float *code, float *y, int64_t ldy, int threads) {
    const Planes planes = code_planes(code), *p = &planes;
    if (use_avx512 < 0) spectui_nf4_set_avx512(1);
    if (use_avx512 && M <= 8) {
        return matmul_512(M, N, K, x, ldx, w, absmax, bs, code, p, y, ldy, threads);
    }
    if (M == 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t g = 0; g < N / ROWS; g++)
            gemv_rows(g * ROWS, K, x, w, absmax, bs, p, y);
        return 0;
    }
    if (M <= 8) { /* 2-4 rows: two weight rows a pass; 5-8 rows: one; each decoded chunk serving every row */
        const float *xs[8];
        float *ys[8];
        for (int i = 0; i < M; i++) {
            xs[i] = x + i * ldx;
            ys[i] = y + i * ldy;
        }
        if (M <= 4) {
            void (*two)(int64_t, int64_t, const float *const *, const uint8_t *, const float *, int64_t, const Planes *,
                        float *const *) = M == 2 ? gemv2_rows : M == 3 ? gemv3_rows : gemv4_rows;
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t g = 0; g < N / 2; g++)
                two(g * 2, K, xs, w, absmax, bs, p, ys);
        } else {
            void (*one)(int64_t, int64_t, const float *const *, const uint8_t *, const float *, int64_t, const Planes *,
                        float *const *) = M == 5 ? gemv5_row : M == 6 ? gemv6_row : M == 7 ? gemv7_row : gemv8_row;
#pragma omp parallel for schedule(static) num_threads(threads)
            for (int64_t n = 0; n < N; n++)
                one(n, K, xs, w, absmax, bs, p, ys);
        }
        return 0;
    }
    float *scratch = (float *)alloc64(sizeof(float) * ROWS * K * (threads > 0 ? threads : 1)); /* [threads, ROWS, K] (or [threads, 2, K / 8, 16]) */
    if (scratch == NULL) return 1;
#pragma omp parallel num_threads(threads)
    {
        float *mine = scratch + (int64_t)omp_get_thread_num() * ROWS * K;
        for (int64_t m0 = 0; m0 < M; m0 += M_BLOCK) { /* a block of x's rows stays in cache while every weight row passes */
            const int64_t m1 = m0 + M_BLOCK < M ? m0 + M_BLOCK : M;
#pragma omp for schedule(static)
            for (int64_t g = 0; g < N / ROWS; g++) {
                const int64_t n0 = g * ROWS;
                if (use_avx512) { /* scratch as two interleaved pairs, six input rows a pass (nf4_avx512.h) */
                    prefill_task_512(n0, m0, m1, K, x, ldx, w, absmax, bs, code, mine, y, ldy);
                    continue;
                }
                float t0[ROWS], t1[ROWS], t2[ROWS];
                dequant_rows(n0, K, w, absmax, bs, p, mine);
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
 * K % bs == 0, bs % 32 == 0 (the caller checks). Returns 0, or 1 if memory could not be
 * allocated. */
int spectui_nf4_matmul(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const uint8_t *w,
                       const float *absmax, int64_t bs, const float *code, float *y, int64_t ldy, int threads,
                       int add) {
    float *xp = (float *)alloc64(sizeof(float) * M * (K + (add ? N : 0))); /* [M, K], then [M, N] products if add */
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
