/* Layout-invariant attention on CPU, in float64: kernels/exact_attention.py's fast path.
 *
 * For one query row (batch b, query head h, row t) and the keys j it may see, in cache order:
 *
 *     s_j = scale * (q . k_j)                 q, k_j widened to float64; the dot in 4 lanes over d
 *                                             (lane i takes d = i, i + 4, ...), then lanes
 *                                             (0 + 2, 1 + 3), then (0 + 1)
 *     m   = max_j s_j
 *     e_j = exp(s_j - m)                      (the C library's exp, in double)
 *     out = (sum_j e_j v_j) / (sum_j e_j)     both sums over j in cache order (the weighted values
 *                                             with fused multiply-adds), rounded once to float32
 *
 * Keys the row may not see are skipped, not added as zeros. So a row's output is a function of
 * its own query and the sequence of keys it sees, nothing else: the same bits in a tree pass
 * (prefix, then its ancestors among other nodes) as in a one-token pass over the committed cache
 * (prefix, then the same ancestors, contiguous), whatever the batch, the other rows or the thread
 * count. Keys and values may be stored as float32 or float64 (widening float32 is exact, so both
 * give the same bits). Built with -ffp-contract=off: only the fused operations written here.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

static inline __m256d load4(const void *base, int64_t i, int is_double) {
    if (is_double) return _mm256_loadu_pd((const double *)base + i);
    return _mm256_cvtps_pd(_mm_loadu_ps((const float *)base + i));
}

static inline double hsum4(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1)); /* (0 + 2, 1 + 3) */
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));                       /* 0 + 1 */
}

/* q [B, Hq, T, D] float32 contiguous; k, v: element (b, g, j, d) at b * kv_sb + g * kv_sh + j * kv_sj + d
 * (float32 or float64 by kv_double); mask: NULL (causal: row t sees j <= S - T + t) or uint8 with
 * element (b, t, j) at b * mask_sb + t * mask_st + j (nonzero = may see); out [B, Hq, T, D] float32.
 * D % 4 == 0, D <= 256. One task per query row. Returns 0, or 1 if scratch could not be allocated. */
int spectui_exact_attention(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D, const float *q,
                            const void *k, const void *v, int kv_double, int64_t kv_sb, int64_t kv_sh, int64_t kv_sj,
                            const uint8_t *mask, int64_t mask_sb, int64_t mask_st, double scale, float *out,
                            int threads) {
    const int64_t G = Hq / Hkv, rows = B * Hq * T;
    const int nthreads = threads > 0 ? threads : 1;
    double *scratch = (double *)malloc(sizeof(double) * (S + 1) * nthreads); /* [threads, S]: scores */
    int32_t *seen = (int32_t *)malloc(sizeof(int32_t) * (S + 1) * nthreads); /* [threads, S]: visible keys */
    if (scratch == NULL || seen == NULL) {
        free(scratch);
        free(seen);
        return 1;
    }
#pragma omp parallel num_threads(nthreads)
    {
        double *s = scratch + (int64_t)omp_get_thread_num() * (S + 1);
        int32_t *js = seen + (int64_t)omp_get_thread_num() * (S + 1);
        double qd[256];
        __m256d acc[64];
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t t = r % T, h = (r / T) % Hq, b = r / (T * Hq), g = h / G;
            const float *qr = q + r * D;
            for (int64_t d = 0; d < D; d++) qd[d] = (double)qr[d];
            const int64_t base = b * kv_sb + g * kv_sh;
            int64_t n = 0;
            double m = -INFINITY;
            for (int64_t j = 0; j < S; j++) {
                const int visible = mask ? mask[b * mask_sb + t * mask_st + j] != 0 : j <= S - T + t;
                if (!visible) continue;
                __m256d a = _mm256_setzero_pd();
                for (int64_t d = 0; d < D; d += 4)
                    a = _mm256_fmadd_pd(_mm256_loadu_pd(qd + d), load4(k, base + j * kv_sj + d, kv_double), a);
                const double score = hsum4(a) * scale;
                s[n] = score;
                js[n++] = (int32_t)j;
                if (score > m) m = score;
            }
            float *o = out + r * D;
            if (n == 0) { /* a row that may see nothing (left padding) attends to nothing */
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                continue;
            }
            for (int64_t d = 0; d < D; d += 4) acc[d / 4] = _mm256_setzero_pd();
            double denom = 0.0;
            for (int64_t i = 0; i < n; i++) {
                const double e = exp(s[i] - m);
                denom += e;
                const __m256d ev = _mm256_set1_pd(e);
                const int64_t row = base + (int64_t)js[i] * kv_sj;
                for (int64_t d = 0; d < D; d += 4) acc[d / 4] = _mm256_fmadd_pd(ev, load4(v, row + d, kv_double), acc[d / 4]);
            }
            const __m256d inv = _mm256_set1_pd(denom);
            for (int64_t d = 0; d < D; d += 4)
                _mm_storeu_ps(o + d, _mm256_cvtpd_ps(_mm256_div_pd(acc[d / 4], inv)));
        }
    }
    free(scratch);
    free(seen);
    return 0;
}
