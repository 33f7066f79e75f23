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
#include <string.h>

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

/* ---- Several rows at once: each row's arithmetic as above, each key and value loaded once per task. ----
 *
 * A task is (batch b, kv head g, a block of tokens); its R rows are the G query heads of kv head g at
 * those tokens, token-major (row r: token t0 + r / G, head g * G + r % G). Tiles of 4 rows share every
 * load; keys go in chunks of 64 (cache-sized), the keys then the values prefetched a chunk ahead.
 *   scores    3 keys at a time: 12 dot products in 4 lanes over d (the lanes and fma order above),
 *             reduced 4 rows at once in hsum4's order, times scale; a key the row may not see
 *             scores -inf; each row's running max (_mm256_max_pd(s, m) is `if (s > m) m = s`)
 *   exps      e = exp(s - m) for the keys the row may see, 0 for the others
 *   weighted  2 vectors of d at a time: acc += e * v_j (fma) and denom += e, in ascending j
 *   finish    acc / denom, rounded once to float32; a row that may see nothing gives zeros
 * A key a row may not see adds exact zeros where the per-row kernel skips it: the same sums (for
 * finite cache values). So every row gets the bits spectui_exact_attention gives it. */
typedef struct {
    int64_t B, Hq, Hkv, T, S, D, G, Tb, RP, nblocks, ntasks; /* Tb tokens a task, RP rows padded to 4 */
    const float *q;
    const void *k, *v;
    int kv_double;
    int64_t kv_sb, kv_sh, kv_sj, mask_sb, mask_st;
    const uint8_t *mask, *none; /* none: S zeros, the mask row of a padding row */
    double scale;
    float *out;
} Call;

typedef struct { int64_t b, g, t0, R, J, base; } Task; /* it needs keys j < J (its last row's limit) */

#define CHUNK 64
#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

static Task task_of(const Call *c, int64_t i) { /* the last blocks first: a causal one sees the most keys */
    Task w;
    const int64_t block = c->nblocks - 1 - i / (c->B * c->Hkv), bg = i % (c->B * c->Hkv);
    w.b = bg / c->Hkv, w.g = bg % c->Hkv, w.t0 = block * c->Tb;
    w.R = MIN(c->T - w.t0, c->Tb) * c->G;
    w.J = c->mask ? c->S : c->S - c->T + w.t0 + w.R / c->G;
    w.base = w.b * c->kv_sb + w.g * c->kv_sh;
    return w;
}

static inline int64_t row_offset(const Call *c, const Task *w, int64_t r) { /* of row r in q and out */
    return ((w->b * c->Hq + w->g * c->G + r % c->G) * c->T + w->t0 + r / c->G) * c->D;
}

typedef struct {           /* the 4 rows of a tile: which keys each may see */
    __m256d lim;           /* causal: keys j <= lim (-1: a padding row) */
    const uint8_t *row[4]; /* a mask: key j where row[i][j] != 0 */
} Tile;

static Tile tile_of(const Call *c, const Task *w, int64_t rt) {
    Tile u;
    double lim[4];
    for (int i = 0; i < 4; i++) {
        const int64_t r = rt + i, t = w->t0 + r / c->G;
        lim[i] = r < w->R ? (double)(c->S - c->T + t) : -1.0;
        u.row[i] = r < w->R && c->mask ? c->mask + w->b * c->mask_sb + t * c->mask_st : c->none;
    }
    u.lim = _mm256_loadu_pd(lim);
    return u;
}

ALWAYS_INLINE __m256d visible(const Call *c, const Tile *u, int64_t j) { /* all ones in the lanes that see key j */
    if (!c->mask) return _mm256_cmp_pd(_mm256_set1_pd((double)j), u->lim, _CMP_LE_OQ);
    return _mm256_castsi256_pd(_mm256_set_epi64x(-(int64_t)(u->row[3][j] != 0), -(int64_t)(u->row[2][j] != 0),
                                                 -(int64_t)(u->row[1][j] != 0), -(int64_t)(u->row[0][j] != 0)));
}

static int64_t seen_by_all(const Call *c, const Task *w, const Tile *u, int64_t rt, int64_t j0, int64_t j1) {
    if (!c->mask) { /* the first key in [j0, j1) that some row of the tile may not see, or j1 */
        double lim[4];
        _mm256_storeu_pd(lim, u->lim); /* rows go up in tokens: the first row's limit is the least */
        return lim[0] + 1 < j0 ? j0 : MIN((int64_t)lim[0] + 1, j1);
    }
    const int n = (int)MIN(w->R - rt, 4);
    int64_t j = j0;
    for (uint64_t zero = 0; j + 8 <= j1; j += 8) { /* 8 keys at a time: has a row a zero byte? */
        for (int i = 0; i < n; i++) {
            uint64_t x;
            memcpy(&x, u->row[i] + j, 8);
            zero |= (x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull;
        }
        if (zero) break;
    }
    for (; j < j1; j++)
        for (int i = 0; i < n; i++)
            if (!u->row[i][j]) return j;
    return j1;
}

/* row p of the task's stream (its keys, then its values), to the cache ahead of its use */
ALWAYS_INLINE void prefetch_row(const Call *c, const Task *w, int64_t p) {
    const int64_t size = c->kv_double ? 8 : 4;
    if (p >= 2 * w->J) return;
    const char *row = (const char *)(p < w->J ? c->k : c->v) + (w->base + (p % w->J) * c->kv_sj) * size;
    for (int64_t b = 0; b < c->D * size; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
}

/* lane r of the result: hsum4 of the r-th argument, in hsum4's order ((x0 + x2) + (x1 + x3)) */
static inline __m256d hsum4x4(__m256d a, __m256d b, __m256d c, __m256d d) {
    const __m256d ab = _mm256_add_pd(_mm256_permute2f128_pd(a, b, 0x20), _mm256_permute2f128_pd(a, b, 0x31));
    const __m256d cd = _mm256_add_pd(_mm256_permute2f128_pd(c, d, 0x20), _mm256_permute2f128_pd(c, d, 0x31));
    return _mm256_permute4x64_pd(_mm256_hadd_pd(ab, cd), 0xD8); /* hadd gives a, c, b, d */
}

/* the 4 rows' scores for key j (-inf where a row may not see it) to s[j * RP + rt], their max to m */
ALWAYS_INLINE void put_scores(const Call *c, const Tile *u, int64_t all, double *s, int64_t j, __m256d sc, __m256d *m) {
    if (j >= all) sc = _mm256_blendv_pd(_mm256_set1_pd(-INFINITY), sc, visible(c, u, j));
    _mm256_storeu_pd(s + j * c->RP, sc);
    *m = _mm256_max_pd(sc, *m);
}

ALWAYS_INLINE void scores_kernel(const Call *c, const Task *w, const double *qd, double *s, double *m, int64_t j0,
                                 int64_t j1, const int dbl) {
    const int64_t D = c->D, sj = c->kv_sj;
    const __m256d scale = _mm256_set1_pd(c->scale);
    for (int64_t rt = 0; rt < w->R; rt += 4) {
        const double *q0 = qd + rt * D, *q1 = q0 + D, *q2 = q1 + D, *q3 = q2 + D;
        const Tile u = tile_of(c, w, rt);
        const int64_t all = seen_by_all(c, w, &u, rt, j0, j1);
        double *st = s + rt;
        __m256d mx = _mm256_loadu_pd(m + rt);
        for (int64_t j = j0; j < j1; j += 3) { /* the last keys: a key repeated, its scores put once */
            const int64_t k0 = w->base + j * sj, k1 = k0 + (j + 1 < j1) * sj;
            const int64_t k2 = k0 + (j + 2 < j1 ? 2 : j + 1 < j1) * sj;
            for (int64_t p = j + CHUNK; rt == 0 && p < j + CHUNK + 3; p++) prefetch_row(c, w, p);
            __m256d a00 = _mm256_setzero_pd(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
            __m256d a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
            for (int64_t d = 0; d < D; d += 4) {
                const __m256d x0 = load4(c->k, k0 + d, dbl), x1 = load4(c->k, k1 + d, dbl), x2 = load4(c->k, k2 + d, dbl);
                __m256d y = _mm256_loadu_pd(q0 + d);
                a00 = _mm256_fmadd_pd(y, x0, a00), a01 = _mm256_fmadd_pd(y, x1, a01), a02 = _mm256_fmadd_pd(y, x2, a02);
                y = _mm256_loadu_pd(q1 + d);
                a10 = _mm256_fmadd_pd(y, x0, a10), a11 = _mm256_fmadd_pd(y, x1, a11), a12 = _mm256_fmadd_pd(y, x2, a12);
                y = _mm256_loadu_pd(q2 + d);
                a20 = _mm256_fmadd_pd(y, x0, a20), a21 = _mm256_fmadd_pd(y, x1, a21), a22 = _mm256_fmadd_pd(y, x2, a22);
                y = _mm256_loadu_pd(q3 + d);
                a30 = _mm256_fmadd_pd(y, x0, a30), a31 = _mm256_fmadd_pd(y, x1, a31), a32 = _mm256_fmadd_pd(y, x2, a32);
            }
            put_scores(c, &u, all, st, j, _mm256_mul_pd(hsum4x4(a00, a10, a20, a30), scale), &mx);
            if (j + 1 < j1) put_scores(c, &u, all, st, j + 1, _mm256_mul_pd(hsum4x4(a01, a11, a21, a31), scale), &mx);
            if (j + 2 < j1) put_scores(c, &u, all, st, j + 2, _mm256_mul_pd(hsum4x4(a02, a12, a22, a32), scale), &mx);
        }
        _mm256_storeu_pd(m + rt, mx);
    }
}

/* s[j * RP + r] for j in [j0, j1), every row; m [RP]: each row's running max, updated */
static void scores(const Call *c, const Task *w, const double *qd, double *s, double *m, int64_t j0, int64_t j1) {
    c->kv_double ? scores_kernel(c, w, qd, s, m, j0, j1, 1) : scores_kernel(c, w, qd, s, m, j0, j1, 0);
}

#include "exact_exp.h"

/* scores -> e = exp(s - m) where the row may see the key, else 0, for j in [j0, j1) */
static void exps(const Call *c, const Task *w, double *s, const double *m, int64_t j0, int64_t j1) {
    const int64_t RP = c->RP;
    for (int64_t rt = 0; rt < w->R; rt += 4) {
        const Tile u = tile_of(c, w, rt);
        const __m256d mx = _mm256_loadu_pd(m + rt), every = _mm256_castsi256_pd(_mm256_set1_epi64x(-1));
        const int64_t all = seen_by_all(c, w, &u, rt, j0, j1);
        for (int64_t j = j0; j < j1; j++) {
            double *x = s + j * RP + rt;
            if (exp_vector) {
                _mm256_storeu_pd(x, exp4(_mm256_sub_pd(_mm256_loadu_pd(x), mx), j < all ? every : visible(c, &u, j)));
                continue;
            }
            const int live = _mm256_movemask_pd(visible(c, &u, j));
            for (int i = 0; i < 4; i++) x[i] = live >> i & 1 ? exp(x[i] - m[rt + i]) : 0.0;
        }
    }
}

/* acc [RP, D] += e * v over j in [j0, j1) for the tile's 4 rows, d in [4 dv, 4 dv + 4 nv) (nv 1 or 2);
 * dv == 0 also adds e to den [RP] */
ALWAYS_INLINE void weighted_kernel(const Call *c, const Task *w, const double *e, double *acc, double *den,
                                   int64_t rt, int64_t dv, int64_t nv, int64_t j0, int64_t j1, const int dbl) {
    const int64_t RP = c->RP, D = c->D, sj = c->kv_sj, d0 = 4 * dv, d1 = nv > 1 ? d0 + 4 : d0;
    double *A0 = acc + rt * D, *A1 = A0 + D, *A2 = A1 + D, *A3 = A2 + D;
    __m256d a00 = _mm256_loadu_pd(A0 + d0), a01 = _mm256_loadu_pd(A0 + d1), a10 = _mm256_loadu_pd(A1 + d0);
    __m256d a11 = _mm256_loadu_pd(A1 + d1), a20 = _mm256_loadu_pd(A2 + d0), a21 = _mm256_loadu_pd(A2 + d1);
    __m256d a30 = _mm256_loadu_pd(A3 + d0), a31 = _mm256_loadu_pd(A3 + d1), dn = _mm256_loadu_pd(den + rt);
    for (int64_t j = j0; j < j1; j++) {
        const double *ej = e + j * RP + rt;
        const int64_t row = w->base + j * sj;
        const __m256d x0 = load4(c->v, row + d0, dbl), x1 = load4(c->v, row + d1, dbl);
        if (rt == 0 && dv == 0) prefetch_row(c, w, w->J + j + CHUNK);
        dn = _mm256_add_pd(dn, _mm256_loadu_pd(ej));
        __m256d y = _mm256_broadcast_sd(ej);
        a00 = _mm256_fmadd_pd(y, x0, a00), a01 = _mm256_fmadd_pd(y, x1, a01);
        y = _mm256_broadcast_sd(ej + 1);
        a10 = _mm256_fmadd_pd(y, x0, a10), a11 = _mm256_fmadd_pd(y, x1, a11);
        y = _mm256_broadcast_sd(ej + 2);
        a20 = _mm256_fmadd_pd(y, x0, a20), a21 = _mm256_fmadd_pd(y, x1, a21);
        y = _mm256_broadcast_sd(ej + 3);
        a30 = _mm256_fmadd_pd(y, x0, a30), a31 = _mm256_fmadd_pd(y, x1, a31);
    }
    _mm256_storeu_pd(A0 + d0, a00), _mm256_storeu_pd(A1 + d0, a10);
    _mm256_storeu_pd(A2 + d0, a20), _mm256_storeu_pd(A3 + d0, a30);
    if (nv > 1) _mm256_storeu_pd(A0 + d1, a01), _mm256_storeu_pd(A1 + d1, a11), _mm256_storeu_pd(A2 + d1, a21);
    if (nv > 1) _mm256_storeu_pd(A3 + d1, a31);
    if (dv == 0) _mm256_storeu_pd(den + rt, dn);
}

static void weighted(const Call *c, const Task *w, const double *e, double *acc, double *den, int64_t rt, int64_t dv,
                     int64_t j0, int64_t j1) {
    const int64_t nv = c->D / 4 - dv < 2 ? 1 : 2;
    if (c->kv_double) weighted_kernel(c, w, e, acc, den, rt, dv, nv, j0, j1, 1);
    else weighted_kernel(c, w, e, acc, den, rt, dv, nv, j0, j1, 0);
}

/* out of the tile's rows: acc / den rounded once to float32, zeros for a row that may see nothing */
static void finish(const Call *c, const Task *w, const double *acc, const double *den, int64_t rt) {
    const Tile u = tile_of(c, w, rt);
    for (int i = 0; i < 4 && rt + i < w->R; i++) {
        float *o = c->out + row_offset(c, w, rt + i);
        const double *a = acc + (rt + i) * c->D;
        int seen = !c->mask;
        for (int64_t j = 0; j < w->J && !seen; j++) seen = u.row[i][j] != 0;
        const __m256d inv = _mm256_set1_pd(den[rt + i]);
        for (int64_t d = 0; d < c->D; d += 4)
            _mm_storeu_ps(o + d, seen ? _mm256_cvtpd_ps(_mm256_div_pd(_mm256_loadu_pd(a + d), inv)) : _mm_setzero_ps());
    }
}

static void start(const Call *c, const Task *w, double *qd, double *m, double *acc, double *den) {
    for (int64_t r = 0; r < c->RP; r++) { /* qd [RP, D]: the queries in float64, padding rows 0 */
        const float *qr = r < w->R ? c->q + row_offset(c, w, r) : NULL;
        for (int64_t d = 0; d < c->D; d++) qd[r * c->D + d] = qr ? (double)qr[d] : 0.0;
        m[r] = -INFINITY, den[r] = 0.0;
    }
    memset(acc, 0, sizeof(double) * c->RP * c->D);
    for (int64_t p = 0; p < CHUNK; p++) prefetch_row(c, w, p);
}

/* q [B, Hq, T, D], k, v, mask, out as spectui_exact_attention's; tokens_per_block: tokens of a task (a
 * thread takes whole tasks, the costliest first). Returns 0, or 1 if scratch could not be allocated. */
int spectui_exact_attention_grouped(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D,
                                    const float *q, const void *k, const void *v, int kv_double, int64_t kv_sb,
                                    int64_t kv_sh, int64_t kv_sj, const uint8_t *mask, int64_t mask_sb,
                                    int64_t mask_st, double scale, float *out, int threads, int64_t tokens_per_block) {
    Call c = {B, Hq, Hkv, T, S, D, Hq / Hkv, tokens_per_block < 1 ? 1 : MIN(tokens_per_block, T), 0, 0, 0, q, k, v,
              kv_double, kv_sb, kv_sh, kv_sj, mask_sb, mask_st, mask, NULL, scale, out};
    c.RP = (c.Tb * c.G + 3) / 4 * 4, c.nblocks = (T + c.Tb - 1) / c.Tb, c.ntasks = B * Hkv * c.nblocks;
    const int nthreads = threads > 0 ? threads : 1;
    const int64_t RP = c.RP, per_thread = RP * (2 * D + S + 2); /* queries, accumulators, scores, max, denominators */
    double *scratch = malloc(sizeof(double) * per_thread * nthreads);
    uint8_t *none = mask ? calloc(S, 1) : NULL;
    c.none = none;
    if (!scratch || (mask && !none)) {
        free(scratch), free(none);
        return 1;
    }
#pragma omp parallel num_threads(nthreads)
    {
        double *qd = scratch + omp_get_thread_num() * per_thread, *acc = qd + RP * D, *s = acc + RP * D;
        double *m = s + RP * S, *den = m + RP;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < c.ntasks; i++) {
            const Task w = task_of(&c, i);
            start(&c, &w, qd, m, acc, den);
            for (int64_t j0 = 0; j0 < w.J; j0 += CHUNK) scores(&c, &w, qd, s, m, j0, MIN(j0 + CHUNK, w.J));
            for (int64_t j0 = 0; j0 < w.J; j0 += CHUNK) {
                const int64_t j1 = MIN(j0 + CHUNK, w.J);
                exps(&c, &w, s, m, j0, j1);
                for (int64_t dv = 0; dv < D / 4; dv += 2) /* a slice of the chunk's values, for every tile */
                    for (int64_t rt = 0; rt < w.R; rt += 4) weighted(&c, &w, s, acc, den, rt, dv, j0, j1);
            }
            for (int64_t rt = 0; rt < w.R; rt += 4) finish(&c, &w, acc, den, rt);
        }
    }
    free(scratch), free(none);
    return 0;
}
