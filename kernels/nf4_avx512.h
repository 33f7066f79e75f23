/* kernels/nf4_cpu.c's AVX-512 path, included by it after its AVX2 loops (it uses their macros, CHUNKS and
 * hsum, and gemv_rows for a last four rows): a header so that nf4_cpu.c stays one build and one library
 * (kernels/native.py's build key covers this folder's headers). */
#pragma once
/* AVX-512 (F, BW, DQ, VL) without changing a bit. A zmm holds two weight rows side by side, row a in
 * lanes 0-7 and row b in lanes 8-15, so each half runs exactly nf4_cpu.c's 8-lane order for its row; the
 * input's 8 values are broadcast to both halves. A group's code values come from one lane permute of
 * the code itself (vpermps: 16 fp32 entries, a nibble an index) instead of the four byte planes' shuffles
 * and unpacks: per 16 weights of two rows, one byte widening, a shift, an and and two permutes. Each
 * product W = code[q] * s is the same one fp32 multiply, and each fused multiply-add the same, so y has
 * the AVX2 path's bits (tests/kernels/test_nf4_cpu.py compares them). Chosen at run time where the CPU
 * has these extensions (Intel Skylake-SP and later, AMD Zen 4); `spectui_nf4_set_avx512(0)` turns it off. */
#define T512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
#define INLINE512 static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512dq,avx512vl")))

static int use_avx512 = -1; /* -1: not yet asked; then 0 or 1 */

int spectui_nf4_set_avx512(int on) { /* -> whether the AVX-512 path now runs (on where the CPU has it) */
    use_avx512 = on && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    return use_avx512;
}

/* One group of two rows: bytes [a's 8 bytes, b's 8 bytes] -> even (high nibbles: k = 2j in lane j of each
 * half) and odd (low nibbles), times s ([s_a x 8, s_b x 8]). */
INLINE512 void decode_pair(__m128i bytes, __m512 code, __m512 s, __m512 *even, __m512 *odd) {
    const __m512i z = _mm512_cvtepu8_epi32(bytes); /* [16] one byte a lane */
    *even = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(z, 4), code), s);
    *odd = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(z, _mm512_set1_epi32(15)), code), s);
}

/* A chunk (32 weights) of rows a, b at k: group 0's even/odd (e0, o0) and group 1's (e1, o1). */
#define DECODE_PAIR(ra_, rb_, s_)                                                                      \
    __m512 e0, o0, e1, o1;                                                                             \
    {                                                                                                  \
        const __m128i ba = _mm_loadu_si128((const __m128i *)((ra_) + k / 2));                          \
        const __m128i bb = _mm_loadu_si128((const __m128i *)((rb_) + k / 2));                          \
        decode_pair(_mm_unpacklo_epi64(ba, bb), code, s_, &e0, &o0);                                   \
        decode_pair(_mm_unpackhi_epi64(ba, bb), code, s_, &e1, &o1);                                   \
    }
/* xp's 8 values at x + k + off in both halves */
#define BCAST(x, off) _mm512_broadcast_f32x8(_mm256_loadu_ps((x) + k + (off)))
/* The same 8 values from a doubled row (`double_rows`: each 8 of xp written twice, 16 floats a 64-byte line), by
 * a plain load the multiply-add can take as its operand instead of a broadcast, which needs a shuffle */
#define DOUBLED(x, off) _mm512_load_ps((x) + 2 * (k + (off)))
/* the chunk's two groups of input row x into acc, in the header's order (as CHUNK2) */
#define CHUNK2_512(acc, x)                                                                                    \
    acc = _mm512_fmadd_ps(BCAST(x, 8), o0, _mm512_fmadd_ps(BCAST(x, 0), e0, acc));                           \
    acc = _mm512_fmadd_ps(BCAST(x, 24), o1, _mm512_fmadd_ps(BCAST(x, 16), e1, acc))
/* CHUNK2_512 from a doubled input row (gemv_two_pairs_512) */
#define CHUNK2_ROWS(acc, x)                                                                          \
    acc = _mm512_fmadd_ps(DOUBLED(x, 8), o0, _mm512_fmadd_ps(DOUBLED(x, 0), e0, acc));              \
    acc = _mm512_fmadd_ps(DOUBLED(x, 24), o1, _mm512_fmadd_ps(DOUBLED(x, 16), e1, acc))
/* CHUNK2_ROWS of input rows 0 .. rows - 1 into accumulators acc0 .. acc7 (gemv_two_pairs_512, once a pair) */
#define EVERY_ROW(acc)                                                                                 \
    do {                                                                                               \
        CHUNK2_ROWS(acc##0, xs[0]); CHUNK2_ROWS(acc##1, xs[1]);                                        \
        if (rows > 2) { CHUNK2_ROWS(acc##2, xs[2]); }                                                  \
        if (rows > 3) { CHUNK2_ROWS(acc##3, xs[3]); }                                                  \
        if (rows > 4) { CHUNK2_ROWS(acc##4, xs[4]); }                                                  \
        if (rows > 5) { CHUNK2_ROWS(acc##5, xs[5]); }                                                  \
        if (rows > 6) { CHUNK2_ROWS(acc##6, xs[6]); }                                                  \
        if (rows > 7) { CHUNK2_ROWS(acc##7, xs[7]); }                                                  \
    } while (0)
#define SCALES(sa_, sb_) _mm512_insertf32x8(_mm512_set1_ps(sa_), _mm256_set1_ps(sb_), 1)
/* a pair's sums: row a's from lanes 0-7, row b's from lanes 8-15, each in hsum's order */
#define STORE_PAIR(acc, ya_, yb_)                                         \
    {                                                                     \
        ya_ = hsum(_mm512_castps512_ps256(acc));                          \
        yb_ = hsum(_mm512_extractf32x8_ps(acc, 1));                       \
    }

/* M = 1: weight rows n0 .. n0 + 7 as four pairs, four independent chains. */
static T512 void gemv_rows_512(int64_t n0, int64_t K, const float *x, const uint8_t *w, const float *absmax,
                               int64_t bs, const float *code16, float *y) {
    const __m512 code = _mm512_loadu_ps(code16);
    const uint8_t *r[8];
    const float *sc[8];
    for (int i = 0; i < 8; i++) {
        r[i] = w + (n0 + i) * K / 2;
        sc[i] = absmax + (n0 + i) * (K / bs);
    }
    const char *next = (const char *)(w + (n0 + 8) * K / 2); /* the next task's 8 rows: 4 K bytes, 128 an iteration */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    CHUNKS(b) {
        PREFETCH_NEXT(next + 4 * k); PREFETCH_NEXT(next + 4 * k + 64);
        { DECODE_PAIR(r[0], r[1], SCALES(sc[0][b], sc[1][b])); CHUNK2_512(a0, x); }
        { DECODE_PAIR(r[2], r[3], SCALES(sc[2][b], sc[3][b])); CHUNK2_512(a1, x); }
        { DECODE_PAIR(r[4], r[5], SCALES(sc[4][b], sc[5][b])); CHUNK2_512(a2, x); }
        { DECODE_PAIR(r[6], r[7], SCALES(sc[6][b], sc[7][b])); CHUNK2_512(a3, x); }
    }
    STORE_PAIR(a0, y[n0], y[n0 + 1]);
    STORE_PAIR(a1, y[n0 + 2], y[n0 + 3]);
    STORE_PAIR(a2, y[n0 + 4], y[n0 + 5]);
    STORE_PAIR(a3, y[n0 + 6], y[n0 + 7]);
}

/* Two to eight input rows are read doubled: [M, DOUBLED_LD(K)], each 8 values of xp twice in a row, so that an
 * input load is a plain 64-byte load the multiply-add takes as its operand, where a broadcast needs a shuffle (the
 * values and their order unchanged: the same bits). Over the 30 layers' products (two threads, a 2-core AMD EPYC
 * Zen 4) 4-10 % faster for 2 to 7 rows. The pad keeps rows 2K floats apart (a multiple of 4 KB for K = 1,536) off the
 * same L1 sets (with it 3 to 7 rows ran 4-9 % faster again). */
#define DOUBLED_LD(K) (2 * (K) + 16) /* floats from one doubled row to the next: 64 bytes of pad */
static float *double_rows(int64_t M, int64_t K, const float *x, int64_t ldx) {
    float *d = (float *)alloc64(sizeof(float) * M * DOUBLED_LD(K));
    if (d == NULL) return NULL;
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k += 8) {
            float *to = d + i * DOUBLED_LD(K) + 2 * k;
            memcpy(to, x + i * ldx + k, 32);
            memcpy(to + 8, x + i * ldx + k, 32);
        }
    return d;
}

/* M = rows = 2 to 8: weight rows n0 .. n0 + 3 as two pairs, each decoded chunk serving every input row (2 x rows
 * accumulators: 16 at most of the 32 registers). Over the 30 layers' products, 5-8 rows ran 9-15 % faster this way
 * than with one pair a task (8 accumulators; a 2-core AMD EPYC Zen 4), 2-4 rows as before. */
INLINE512 void gemv_two_pairs_512(int rows, int64_t n0, int64_t K, const float *const xs[8], const uint8_t *w,
                                  const float *absmax, int64_t bs, const float *code16, float *const ys[8]) {
    const __m512 code = _mm512_loadu_ps(code16);
    const uint8_t *r0 = w + n0 * K / 2, *r1 = r0 + K / 2, *r2 = r1 + K / 2, *r3 = r2 + K / 2;
    const float *s0 = absmax + n0 * (K / bs), *s1 = s0 + K / bs, *s2 = s1 + K / bs, *s3 = s2 + K / bs;
    const char *next = (const char *)(w + (n0 + 4) * K / 2); /* the next task's 4 rows: 64 bytes an iteration */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
    CHUNKS(blk) {
        PREFETCH_NEXT(next + 2 * k);
        {
            DECODE_PAIR(r0, r1, SCALES(s0[blk], s1[blk]));
            EVERY_ROW(a);
        }
        {
            DECODE_PAIR(r2, r3, SCALES(s2[blk], s3[blk]));
            EVERY_ROW(b);
        }
    }
    const __m512 a[8] = {a0, a1, a2, a3, a4, a5, a6, a7}, b[8] = {b0, b1, b2, b3, b4, b5, b6, b7};
    for (int i = 0; i < rows; i++) {
        STORE_PAIR(a[i], ys[i][n0], ys[i][n0 + 1]);
        STORE_PAIR(b[i], ys[i][n0 + 2], ys[i][n0 + 3]);
    }
}

#define FOR_ROWS_512(name, inner, rows)                                                                        \
    static T512 void name(int64_t n, int64_t K, const float *const xs[8], const uint8_t *w, const float *absmax,  \
                          int64_t bs, const float *code16, float *const ys[8]) {                                 \
        inner(rows, n, K, xs, w, absmax, bs, code16, ys);                                                        \
    }
FOR_ROWS_512(gemv2_512, gemv_two_pairs_512, 2)
FOR_ROWS_512(gemv3_512, gemv_two_pairs_512, 3)
FOR_ROWS_512(gemv4_512, gemv_two_pairs_512, 4)
FOR_ROWS_512(gemv5_512, gemv_two_pairs_512, 5)
FOR_ROWS_512(gemv6_512, gemv_two_pairs_512, 6)
FOR_ROWS_512(gemv7_512, gemv_two_pairs_512, 7)
FOR_ROWS_512(gemv8_512, gemv_two_pairs_512, 8)

typedef void (*gemv512_fn)(int64_t, int64_t, const float *const *, const uint8_t *, const float *, int64_t,
                           const float *, float *const *);

/* M > 8 (prefill) on the AVX-512 path: weight rows n0 .. n0 + 3 dequantised once into scratch as two
 * pairs, each pair's rows interleaved 8 values at a time ([2][K / 8][16]: one zmm load gives rows a and b
 * at the same k), then every input row's products with them, six input rows a pass (prefill_task_512). */
static T512 void dequant_pairs_512(int64_t n0, int64_t K, const uint8_t *w, const float *absmax, int64_t bs,
                                   const float *code16, float *scratch) {
    const __m512 code = _mm512_loadu_ps(code16);
    for (int pair = 0; pair < 2; pair++) {
        const int64_t na = n0 + 2 * pair;
        const uint8_t *ra = w + na * K / 2, *rb = ra + K / 2;
        const float *sa = absmax + na * (K / bs), *sb = sa + K / bs;
        float *out = scratch + pair * 2 * K;
        CHUNKS(blk) {
            DECODE_PAIR(ra, rb, SCALES(sa[blk], sb[blk]));
            _mm512_storeu_ps(out + 2 * k, e0); /* k .. k + 7 (xp's order) of both rows */
            _mm512_storeu_ps(out + 2 * k + 16, o0);
            _mm512_storeu_ps(out + 2 * k + 32, e1);
            _mm512_storeu_ps(out + 2 * k + 48, o1);
        }
    }
}

/* y[m + i, n0 .. n0 + 3] for `rows` (1 to 6) input rows from the dequantised pairs, each sum over k in steps of 8
 * in xp's order (dot_rows_3's): a row's bits do not depend on the rows beside it. The rows past a multiple of six
 * go through one call too (dot2_512 ... dot5_512); taken one at a time, on two accumulator chains, 9 to 11 input
 * rows took longer than 12 (18.7, 20.6, 22.4 against 19.7 ms over the 30 layers' products on a Zen 4 EPYC). Accumulators
 * named one by one: as an array in a loop over the rows, gcc kept them in memory. */
#define DOT_ROW(i) \
    if (rows > (i)) { const __m512 u = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + (i) * ldx + k)); \
      a##i = _mm512_fmadd_ps(u, w01, a##i); b##i = _mm512_fmadd_ps(u, w23, b##i); }
#define DOT_STORE(i)                                                           \
    if (rows > (i)) {                                                          \
        STORE_PAIR(a##i, y[(i) * ldy + n0], y[(i) * ldy + n0 + 1]);            \
        STORE_PAIR(b##i, y[(i) * ldy + n0 + 2], y[(i) * ldy + n0 + 3]);        \
    }

INLINE512 void dot_rows_512(int rows, int64_t K, const float *x, int64_t ldx, const float *scratch, float *y,
                            int64_t ldy, int64_t n0) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0;
    for (int64_t k = 0; k < K; k += 8) {
        const __m512 w01 = _mm512_loadu_ps(scratch + 2 * k), w23 = _mm512_loadu_ps(scratch + 2 * K + 2 * k);
        DOT_ROW(0) DOT_ROW(1) DOT_ROW(2) DOT_ROW(3) DOT_ROW(4) DOT_ROW(5)
    }
    DOT_STORE(0); DOT_STORE(1); DOT_STORE(2); DOT_STORE(3); DOT_STORE(4); DOT_STORE(5);
}

#define DOT_512(name, rows)                                                                                  \
    static T512 __attribute__((noinline)) void name(int64_t K, const float *x, int64_t ldx, const float *scratch, \
                                                    float *y, int64_t ldy, int64_t n0) {                       \
        dot_rows_512(rows, K, x, ldx, scratch, y, ldy, n0);                                                    \
    }
DOT_512(dot1_512, 1)
DOT_512(dot2_512, 2)
DOT_512(dot3_512, 3)
DOT_512(dot4_512, 4)
DOT_512(dot5_512, 5)
DOT_512(dot6_512, 6)

typedef void (*dot512_fn)(int64_t, const float *, int64_t, const float *, float *, int64_t, int64_t);

/* A prefill task on the AVX-512 path: weight rows n0 .. n0 + 3 into `mine` (dequant_pairs_512), then their
 * products with input rows m0 .. m1 - 1 (nf4_cpu.c's prefill loop: the same blocks, scratch and threads). */
static void prefill_task_512(int64_t n0, int64_t m0, int64_t m1, int64_t K, const float *x, int64_t ldx,
                             const uint8_t *w, const float *absmax, int64_t bs, const float *code, float *mine,
                             float *y, int64_t ldy) {
    dequant_pairs_512(n0, K, w, absmax, bs, code, mine);
    int64_t m = m0;
    static const dot512_fn last[6] = {0, dot1_512, dot2_512, dot3_512, dot4_512, dot5_512}; /* by the rows left */
    for (; m + 5 < m1; m += 6) dot6_512(K, x + m * ldx, ldx, mine, y + m * ldy, ldy, n0);
    if (m < m1) last[m1 - m](K, x + m * ldx, ldx, mine, y + m * ldy, ldy, n0);
}

/* M = 1 to 8 on the AVX-512 path (the caller checks use_avx512) -> 0, or 1 if memory could not be allocated. */
static int matmul_512(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const uint8_t *w,
                       const float *absmax, int64_t bs, const float *code, const Planes *p, float *y, int64_t ldy,
                       int threads) {
    if (M == 1) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t g = 0; g < N / 8; g++)
            gemv_rows_512(g * 8, K, x, w, absmax, bs, code, y);
        if (N % 8) gemv_rows(N - 4, K, x, w, absmax, bs, p, y); /* N % 4 == 0: the last four rows, the same bits */
        return 0;
    }
    const float *xs[8];
    float *ys[8];
    float *doubled = double_rows(M, K, x, ldx);
    if (doubled == NULL) return 1;
    for (int i = 0; i < M; i++) {
        xs[i] = doubled + i * DOUBLED_LD(K);
        ys[i] = y + i * ldy;
    }
    static const gemv512_fn by_rows[9] = {0, 0, gemv2_512, gemv3_512, gemv4_512, gemv5_512, gemv6_512, gemv7_512, gemv8_512};
    const gemv512_fn fn = by_rows[M];
    const int64_t step = 4; /* weight rows a task */
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < N / step; g++)
        fn(g * step, K, xs, w, absmax, bs, code, ys);
    free(doubled);
    return 0;
}
