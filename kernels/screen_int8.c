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
 * the rest. D % 64 == 0. The layer is stored in blocks of 4 rows, their 64-column chunks side by side
 * (spectui_screen_int8), so a thread reads its rows front to back and each input load serves 4 rows;
 * a block's 8 results are scaled in one vector of doubles (the same operations as one at a time).
 *
 * spectui_quantize_int8 makes the copy at load in one pass: s_v = max_i |W_vi| / 127, q = round(W / s_v)
 * clamped to [-127, 127], colsum_v, and the norms |W_v - s_v q_v| and |s_v q_v| summed in double (each
 * term exact: a float minus a float times a small integer spans well under 53 bits), rounded up.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define VB 4 /* layer rows a block: each input vector loaded serves VB of them */
/* The AVX2 loop asks for the codes this many bytes ahead of those it multiplies (past the end: a prefetch
 * never faults). The layer comes from memory at every verify step, and the hardware prefetcher alone
 * left time on the table: 49,152 x 576, cold, one row 1.90 -> 1.72 ms, two rows 2.08 -> 1.81; the head's
 * 8,192 draft rows 0.42 -> 0.39 and 0.48 -> 0.42 (2-core AVX2 EPYC, /work/exp/k53/pf/cold_screen.py;
 * 1,024 to 4,096 bytes did about as well; the same bits). */
#define PREFETCH_BYTES 2048

/* The 8 int32 lanes' sums of the 8 vectors a[0..7] -> out[0..7]: halve each to 256 bits, then
 * three rounds of pairwise horizontal adds (3 instructions a sum instead of a full reduction each). */
TARGET static inline void reduce8(const __m512i *a, int32_t *out) {
    __m256i h[8];
    for (int j = 0; j < 8; j++)
        h[j] = _mm256_add_epi32(_mm512_castsi512_si256(a[j]), _mm512_extracti64x4_epi64(a[j], 1));
    const __m256i p0 = _mm256_hadd_epi32(h[0], h[1]), p1 = _mm256_hadd_epi32(h[2], h[3]);
    const __m256i p2 = _mm256_hadd_epi32(h[4], h[5]), p3 = _mm256_hadd_epi32(h[6], h[7]);
    const __m256i q0 = _mm256_hadd_epi32(p0, p1), q1 = _mm256_hadd_epi32(p2, p3);
    /* q0 lanes: [a0 a1 a2 a3 | a0 a1 a2 a3] halves (low 128 bits, high 128 bits); likewise q1 for a4..7 */
    const __m256i lo = _mm256_permute2x128_si256(q0, q1, 0x20), hi = _mm256_permute2x128_si256(q0, q1, 0x31);
    _mm256_storeu_si256((__m256i *)out, _mm256_add_epi32(lo, hi));
}

/* acc += x (unsigned bytes) . w (signed bytes), in place: through the intrinsic, GCC -O2 copies every
 * accumulator twice a chunk (vpdpbusd overwrites its accumulator), which costs more than the dot products */
#define DPBUSD(acc, xv, wv) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(xv), "v"(wv))
/* One 64-column chunk of layer row b (its codes wv) against the R input rows' levels x0..x3 (R == 1:
 * x0, x1 alone), accumulated into a<layer row><input level>. */
#define DOT_ROW(b, wv)                  \
    do {                                \
        DPBUSD(a##b##0, x0, wv);        \
        DPBUSD(a##b##1, x1, wv);        \
        if (R == 2) {                   \
            DPBUSD(a##b##2, x2, wv);    \
            DPBUSD(a##b##3, x3, wv);    \
        }                               \
    } while (0)
#define BOTH(hi, lo) _mm512_add_epi32(_mm512_slli_epi32(hi, 7), lo)

/* Layer rows v0 .. v0 + 3 against input rows m0 (and m0 + 1 if R == 2) -> sums[2 b + r] of
 * 128 acc_hi + acc_lo (the codes + 128 as stored). R is a constant at each call site. */
TARGET static inline __attribute__((always_inline)) void block(const int8_t *w, const uint8_t *x, int64_t D,
                                                                int64_t v0, int64_t m0, const int R, int32_t *sums) {
    const __m512i z = _mm512_setzero_si512();
    __m512i a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
    __m512i a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    const uint8_t *xr = x + m0 * 2 * D;
    const int8_t *wr = w + v0 * D; /* the block's codes, chunk by chunk: [D / 64][4][64] */
    for (int64_t c = 0; c < D; c += 64) {
        const __m512i x0 = _mm512_loadu_si512(xr + c), x1 = _mm512_loadu_si512(xr + D + c);
        const __m512i x2 = R == 2 ? _mm512_loadu_si512(xr + 2 * D + c) : z;
        const __m512i x3 = R == 2 ? _mm512_loadu_si512(xr + 3 * D + c) : z;
        const __m512i w0 = _mm512_loadu_si512(wr + 4 * c), w1 = _mm512_loadu_si512(wr + 4 * c + 64);
        const __m512i w2 = _mm512_loadu_si512(wr + 4 * c + 128), w3 = _mm512_loadu_si512(wr + 4 * c + 192);
        DOT_ROW(0, w0);
        DOT_ROW(1, w1);
        DOT_ROW(2, w2);
        DOT_ROW(3, w3);
    }
    const __m512i both[8] = {BOTH(a00, a01), BOTH(a02, a03), BOTH(a10, a11), BOTH(a12, a13),
                             BOTH(a20, a21), BOTH(a22, a23), BOTH(a30, a31), BOTH(a32, a33)};
    reduce8(both, sums);
}

/* w: the codes in blocks of VB rows, [ceil(V / VB)][D / 64][VB][64] int8 (rows past V zero);
 * scale [V]; colsum [V]; x [M, 2, D] uint8 (hi, then lo codes + 128); t [M]; g [M, V] out. Blocks of VB
 * layer rows by two input rows share every load (16 dot products for 4 weight and 4 input loads a
 * 64-column chunk), and each thread reads its part of w front to back. Returns 0. */
TARGET int spectui_screen_int8(int64_t M, int64_t V, int64_t D, const int8_t *w, const float *scale,
                               const int32_t *colsum, const uint8_t *x, const float *t, float *g, int threads) {
    const int64_t blocks = (V + VB - 1) / VB;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t v0 = blk * VB, rows = V - v0 < VB ? V - v0 : VB;
        for (int64_t m0 = 0; m0 < M; m0 += 2) {
            const int R = M - m0 < 2 ? 1 : 2;
            int32_t sums[8];
            if (R == 2)
                block(w, x, D, v0, m0, 2, sums);
            else
                block(w, x, D, v0, m0, 1, sums);
            if (rows == VB && R == 2) { /* the 8 sums at once, lanes b * 2 + r: the same double arithmetic */
                const __m256i pair = _mm256_set_epi32(1, 0, 1, 0, 1, 0, 1, 0), dup = _mm256_set_epi32(3, 3, 2, 2, 1, 1, 0, 0);
                const __m512d tv = _mm512_cvtps_pd(_mm256_permutexvar_ps(pair, _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd((const double *)(t + m0))))));
                const __m512d sv = _mm512_cvtps_pd(_mm256_permutexvar_ps(dup, _mm256_castps128_ps256(_mm_loadu_ps(scale + v0))));
                const __m512d cv = _mm512_cvtepi32_pd(_mm256_permutexvar_epi32(dup, _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(colsum + v0)))));
                const __m512d A = _mm512_sub_pd(_mm512_cvtepi32_pd(_mm256_loadu_si256((const __m256i *)sums)),
                                                _mm512_mul_pd(_mm512_set1_pd(129.0 * 128.0), cv)); /* exact: |A| < 2^53 */
                const __m256 out = _mm512_cvtpd_ps(_mm512_mul_pd(sv, _mm512_mul_pd(tv, A))); /* lanes b * 2 + r */
                const __m256 rows01 = _mm256_permutexvar_ps(_mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0), out);
                _mm_storeu_ps(g + m0 * V + v0, _mm256_castps256_ps128(rows01));
                _mm_storeu_ps(g + (m0 + 1) * V + v0, _mm256_extractf128_ps(rows01, 1));
                continue;
            }
            for (int b = 0; b < rows; b++) {
                const double shift = 129.0 * 128.0 * (double)colsum[v0 + b];
                for (int r = 0; r < R; r++) {
                    const double A = (double)sums[b * 2 + r] - shift; /* exact: |A| < 2^53 */
                    g[(m0 + r) * V + v0 + b] = (float)((double)scale[v0 + b] * ((double)t[m0 + r] * A));
                }
            }
        }
    }
    return 0;
}

/* The same product with AVX2 alone (no VNNI): each input row's levels become one int16 code,
 * 128 p_hi + p_lo (|.| <= 16,383), and vpmaddwd multiplies 16 codes by 16 layer codes widened to
 * int16, adding pairs into int32 lanes (exact: a lane holds D / 8 products, under 2^31 for D <= 4,096).
 * The 8 lanes are summed in double (exact), so A, and g = s_v (t A) rounded once, are the VNNI
 * loop's to the bit. Blocks of VB layer rows by two input rows, as there. */
static inline double lanes_sum(__m256i a) {
    const __m256d s = _mm256_add_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(a)), _mm256_cvtepi32_pd(_mm256_extracti128_si256(a, 1)));
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
}

/* Layer row b's 16 codes at `p`, widened to int16 (w), into a0 += madd(w, u) (input row x0) and, in
 * ROW2, a1 += madd(w, v) (x1). Written in asm so that each widened row is used at once: through the
 * intrinsics GCC widened the four rows first and spilled an accumulator to the stack every 16 columns
 * (2 threads, 49,152 x 576 on the AVX2 EPYC: 8 rows 4.6 -> 3.3 ms, 4 rows 2.5 -> 2.0). */
#define ROW1(p, a0)                                                                                        \
    do {                                                                                                   \
        __m256i w_, t_;                                                                                    \
        __asm__("vpmovsxbw %[m], %[w]\n\tvpmaddwd %[u], %[w], %[t]\n\tvpaddd %[t], %[a], %[a]"              \
                : [w] "=&x"(w_), [t] "=&x"(t_), [a] "+x"(a0)                                               \
                : [m] "m"(*(const __m128i *)(p)), [u] "x"(u));                                             \
    } while (0)
#define ROW2(p, a0, a1)                                                                                    \
    do {                                                                                                   \
        __m256i w_, t_;                                                                                    \
        __asm__("vpmovsxbw %[m], %[w]\n\tvpmaddwd %[u], %[w], %[t]\n\tvpaddd %[t], %[a], %[a]\n\t"         \
                "vpmaddwd %[v], %[w], %[t]\n\tvpaddd %[t], %[b], %[b]"                                      \
                : [w] "=&x"(w_), [t] "=&x"(t_), [a] "+x"(a0), [b] "+x"(a1)                                 \
                : [m] "m"(*(const __m128i *)(p)), [u] "x"(u), [v] "x"(v));                                 \
    } while (0)

/* Layer rows v0 .. v0 + 3 (codes wr: [D / 64][VB][64]) against the int16 rows x0 and x1 (R == 2)
 * -> A[2 b + r]. R is a constant at each call site. */
static inline __attribute__((always_inline)) void block16(const int8_t *wr, const int16_t *x0, const int16_t *x1,
                                                          int64_t D, const int R, double *A) {
    const __m256i z = _mm256_setzero_si256();
    __m256i a00 = z, a01 = z, a10 = z, a11 = z, a20 = z, a21 = z, a30 = z, a31 = z;
    for (int64_t c = 0; c < D; c += 64) {
        const int8_t *wc = wr + VB * c; /* the chunk's 4 rows of 64 codes */
        for (int line = 0; line < VB * 64; line += 64) /* the codes PREFETCH_BYTES on: see PREFETCH_BYTES */
            _mm_prefetch((const char *)(wc + PREFETCH_BYTES + line), _MM_HINT_T0);
#pragma GCC unroll 4
        for (int piece = 0; piece < 64; piece += 16) {
            const __m256i u = _mm256_loadu_si256((const __m256i *)(x0 + c + piece));
            if (R == 2) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(x1 + c + piece));
                ROW2(wc + piece, a00, a01);
                ROW2(wc + 64 + piece, a10, a11);
                ROW2(wc + 128 + piece, a20, a21);
                ROW2(wc + 192 + piece, a30, a31);
            } else {
                ROW1(wc + piece, a00);
                ROW1(wc + 64 + piece, a10);
                ROW1(wc + 128 + piece, a20);
                ROW1(wc + 192 + piece, a30);
            }
        }
    }
    A[0] = lanes_sum(a00); A[2] = lanes_sum(a10); A[4] = lanes_sum(a20); A[6] = lanes_sum(a30);
    if (R == 2) { A[1] = lanes_sum(a01); A[3] = lanes_sum(a11); A[5] = lanes_sum(a21); A[7] = lanes_sum(a31); }
}

/* spectui_screen_int8's arguments and result, with AVX2 + FMA alone. Returns 0, or 1 if memory could
 * not be allocated. */
int spectui_screen_int8_avx2(int64_t M, int64_t V, int64_t D, const int8_t *w, const float *scale,
                             const int32_t *colsum, const uint8_t *x, const float *t, float *g, int threads) {
    (void)colsum; /* the codes here are signed: no offset to take back */
    int16_t *xs = (int16_t *)malloc(sizeof(int16_t) * M * D); /* [M, D]: 128 p_hi + p_lo */
    if (xs == NULL) return 1;
    for (int64_t m = 0; m < M; m++)
        for (int64_t i = 0; i < D; i++)
            xs[m * D + i] = (int16_t)(128 * ((int)x[(m * 2) * D + i] - 128) + ((int)x[(m * 2 + 1) * D + i] - 128));
    const int64_t blocks = (V + VB - 1) / VB;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
    for (int64_t blk = 0; blk < blocks; blk++) {
        const int64_t v0 = blk * VB, rows = V - v0 < VB ? V - v0 : VB;
        for (int64_t m0 = 0; m0 < M; m0 += 2) {
            const int R = M - m0 < 2 ? 1 : 2;
            double A[2 * VB];
            if (R == 2)
                block16(w + v0 * D, xs + m0 * D, xs + (m0 + 1) * D, D, 2, A);
            else
                block16(w + v0 * D, xs + m0 * D, xs + m0 * D, D, 1, A);
            for (int b = 0; b < rows; b++)
                for (int r = 0; r < R; r++)
                    g[(m0 + r) * V + v0 + b] = (float)((double)scale[v0 + b] * ((double)t[m0 + r] * A[2 * b + r]));
        }
    }
    free(xs);
    return 0;
}

/* x [M, D] fp32 -> codes [M, 2, D] (p_hi + 128, then p_lo + 128), t [M] and rho [M] = |delta_m| / |x_m|
 * (screen_int8.py's levels, operation for operation: t_hi = max|x| / 127 in float, at least 2^-100;
 * p_hi = round(x / t_hi) in float; r = x - t_hi p_hi in double (exact); p_lo = round(r / t) in double,
 * t = t_hi / 128; delta = r - t p_lo; ties to even, codes clamped to [-127, 127]). Returns 0. */
int spectui_int8_levels(int64_t M, int64_t D, const float *x, uint8_t *codes, float *t, double *rho, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads > 0 && M > 1 ? threads : 1)
    for (int64_t m = 0; m < M; m++) {
        const float *row = x + m * D;
        float amax = 0.0f;
        for (int64_t i = 0; i < D; i++) amax = fmaxf(amax, fabsf(row[i]));
        float t_hi = amax / 127.0f;
        t_hi = t_hi < 0x1p-100f ? 0x1p-100f : t_hi;
        const float step = t_hi / 128.0f; /* exact */
        double d2 = 0.0, x2 = 0.0;
        for (int64_t i = 0; i < D; i++) {
            float hi = nearbyintf(row[i] / t_hi);
            hi = hi > 127.0f ? 127.0f : hi < -127.0f ? -127.0f : hi;
            const double r = (double)row[i] - (double)t_hi * (double)hi;
            double lo = nearbyint(r / (double)step);
            lo = lo > 127.0 ? 127.0 : lo < -127.0 ? -127.0 : lo;
            const double delta = r - (double)step * lo;
            d2 += delta * delta;
            x2 += (double)row[i] * (double)row[i];
            codes[(m * 2) * D + i] = (uint8_t)(int)(hi + 128.0f);
            codes[(m * 2 + 1) * D + i] = (uint8_t)(int)(lo + 128.0);
        }
        t[m] = step;
        const double norm = sqrt(x2);
        rho[m] = sqrt(d2) / (norm > 1e-300 ? norm : 1e-300);
    }
    return 0;
}

/* W [V, D] fp32 -> codes (the layout above, zero-filled by the caller) int8, scale [V], colsum [V], err_norm [V] >= |W_v - s_v q_v|,
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
            codes[(v / VB) * VB * D + (i / 64) * VB * 64 + (v % VB) * 64 + i % 64] = (int8_t)q;
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
