/* The output screen's decision (kernels/argmax_head.py ArgmaxScreen): from the screened logits g of a
 * C product to each row's greedy token, or -1 where the canonical product must decide.
 *
 * Row m of g [M, V] (screened logits, fp32) with the bound r_v = bound[v] * norm[m] + 2^-20 |g_v| + 1e-30
 * keeps the candidates
 *
 *     C_m = { v : g_v + r_v >= max_u (g_u - r_u) - slack[m] }
 *
 * in idx[m * cap ..] (ascending v) and their number in count[m]; a row with more than cap stops
 * counting at cap + 1, and a row of NaNs has none. Two passes over V a row, 8 v at a time with AVX2
 * (on AVX-512 CPUs too: the passes take a few hundredths of a ms a row), the fp32 operations of the
 * torch version op for op (separate products and sums: built with -ffp-contract=off); the maximum
 * is exact in any order, and max(low, best) keeps best where low is NaN, as `low > best ? low : best`
 * does.
 *
 * Then, for a row with 1 .. cap candidates, each candidate's fp32 logit and its error bound
 *
 *     h_v = w_v . x            (fp32, 8 lanes, any order)
 *     e_v = c * sum_i |w_vi x_i|    c = gamma_D (1 + 1e-3), the sum in fp32: |h_v - w_v . x| <= e_v
 *
 * and the rule of argmax_head.py: a = the first v with the largest h_v; the row is decided (token[m] = a,
 * logit[m] = h_a) if h_a - h_v > 2 (e_a + e_v) for every other candidate v (compared in double),
 * else token[m] = -1: a near-tie, or no candidate, or too many, which the caller computes the
 * canonical way. The fp32 sum's own rounding (at most gamma_D relative) is inside the 1e-3.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"

/* r_v = bound_v * norm + 2^-20 |g_v| + 1e-30, in that order, in fp32 */
static inline float radius(float g, float bound, float n) { return bound * n + 0x1p-20f * fabsf(g) + 1e-30f; }

/* from v0 on, one v at a time: the lowest bound's maximum, folded into best */
static float floor_tail(int64_t v0, int64_t V, const float *row, const float *bound, float n, float best) {
    for (int64_t v = v0; v < V; v++) {
        const float low = row[v] - radius(row[v], bound[v], n);
        best = low > best ? low : best;
    }
    return best;
}

static int64_t pick_tail(int64_t v0, int64_t V, const float *row, const float *bound, float n, float floor,
                         int64_t cap, int64_t *idx, int64_t c) {
    for (int64_t v = v0; v < V && c <= cap; v++)
        if (row[v] + radius(row[v], bound[v], n) >= floor) {
            if (c < cap) idx[c] = v;
            c++;
        }
    return c;
}

static inline float max8(__m256 v) {
    float lanes[8], best = -INFINITY;
    _mm256_storeu_ps(lanes, v);
    for (int j = 0; j < 8; j++) best = lanes[j] > best ? lanes[j] : best;
    return best;
}

static int64_t candidates(int64_t V, const float *row, const float *bound, float n, float slack, int64_t cap,
                               int64_t *idx) {
    const __m256 nv = _mm256_set1_ps(n), tiny = _mm256_set1_ps(0x1p-20f), eps = _mm256_set1_ps(1e-30f);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int64_t whole = V - V % 8;
#define R_OF(g, b) \
    _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(b, nv), _mm256_mul_ps(tiny, _mm256_andnot_ps(sign, g))), eps)
    __m256 bestv = _mm256_set1_ps(-INFINITY);
    for (int64_t v = 0; v < whole; v += 8) {
        const __m256 g = _mm256_loadu_ps(row + v);
        bestv = _mm256_max_ps(_mm256_sub_ps(g, R_OF(g, _mm256_loadu_ps(bound + v))), bestv);
    }
    const float floor = floor_tail(whole, V, row, bound, n, max8(bestv)) - slack;
    const __m256 floorv = _mm256_set1_ps(floor);
    int64_t c = 0;
    for (int64_t v = 0; v < whole && c <= cap; v += 8) {
        const __m256 g = _mm256_loadu_ps(row + v);
        const __m256 high = _mm256_add_ps(g, R_OF(g, _mm256_loadu_ps(bound + v)));
        int k = _mm256_movemask_ps(_mm256_cmp_ps(high, floorv, _CMP_GE_OQ));
        for (; k && c <= cap; k &= k - 1) {
            if (c < cap) idx[c] = v + __builtin_ctz(k);
            c++;
        }
    }
#undef R_OF
    return pick_tail(whole, V, row, bound, n, floor, cap, idx, c);
}

/* h = w . x and a = sum |w_i x_i|, both in fp32 over D (D % 8 == 0) */
static void dot_and_abs(int64_t D, const float *w, const float *x, float *h, float *a) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 hv = _mm256_setzero_ps(), av = hv;
    for (int64_t i = 0; i < D; i += 8) {
        const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i));
        hv = _mm256_add_ps(hv, p);
        av = _mm256_add_ps(av, _mm256_andnot_ps(sign, p));
    }
    *h = hsum(hv), *a = hsum(av);
}

/* the row's token from its n candidates idx (1 <= n <= cap <= 256), or -1 (a near-tie) */
static int64_t decide_row(int64_t D, const float *W, const float *x, const int64_t *idx, int64_t n, float c,
                          float *logit) {
    float h[256], e[256];
    int64_t best = 0;
    for (int64_t i = 0; i < n; i++) {
        float a;
        dot_and_abs(D, W + idx[i] * D, x, h + i, &a);
        e[i] = c * a;
        if (h[i] > h[best]) best = i; /* the first largest, as argmax */
    }
    for (int64_t i = 0; i < n; i++)
        if (i != best && !((double)h[best] - (double)h[i] > 2.0 * ((double)e[best] + (double)e[i]))) return -1;
    *logit = h[best];
    return idx[best];
}

/* g [M, V] fp32 screened logits; bound [V]; norm, slack [M]; W [V, D] fp32 (the output layer), x [M, D]
 * fp32 (rows ldx apart); c = gamma_D (1 + 1e-3). Out: idx [M, cap], count [M] (the candidates), token
 * [M] (-1: the canonical way), logit [M] (h of the token). cap <= 256, D % 8 == 0. Returns 0, or 1 if
 * cap is over 256. */
int spectui_screen_decide(int64_t M, int64_t V, int64_t D, const float *g, const float *bound, const float *norm,
                          const float *slack, int64_t cap, const float *W, const float *x, int64_t ldx, float c,
                          int64_t *idx, int64_t *count, int64_t *token, float *logit, int threads) {
    if (cap > 256) return 1;
#pragma omp parallel for schedule(static) num_threads(threads > 0 && M > 1 ? threads : 1)
    for (int64_t m = 0; m < M; m++) {
        int64_t *mine = idx + m * cap;
        const int64_t n = candidates(V, g + m * V, bound, norm[m], slack[m], cap, mine);
        count[m] = n;
        logit[m] = 0.0f;
        token[m] = n >= 1 && n <= cap ? decide_row(D, W, x + m * ldx, mine, n, c, logit + m) : -1;
    }
    return 0;
}
