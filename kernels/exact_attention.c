/* Layout-invariant attention on CPU, in float32 with a fixed order: kernels/exact_attention.py's fast path.
 *
 * For one query row (batch b, query head h, row t) and the keys j it may see, in cache order:
 *
 *     s_j = (q . k_j) * scale                 the dot in 8 lanes over d (lane i takes d = i, i + 8, ...,
 *                                             fused multiply-adds in ascending d), then the lanes summed
 *                                             ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7))
 *     m   = max_j s_j
 *     e_j = exp8(s_j - m)                     exact_exp.h's exponential (lane by lane, so whatever else
 *                                             shares its vector)
 *     out = (sum_j e_j v_j) / (sum_j e_j)     both sums over j in ascending cache order (the weighted
 *                                             values with fused multiply-adds, each d alone)
 *
 * Keys the row may not see are skipped by the per-row kernel; the grouped kernel adds exact zeros for
 * them (e = 0: x + 0 and fma(0, v, x) are x for finite v), which leaves every sum as it was. So a row's
 * output is a function of its own query and the sequence of keys it sees, nothing else: the same bits in
 * a tree pass (prefix, then its ancestors among other nodes) as in a one-token pass over the committed
 * cache (prefix, then the same ancestors, contiguous), whatever the batch, the other rows, the kernel or
 * the thread count. Keys and values are float32 (exact_attention.py sends float64 caches to torch). Built
 * with -ffp-contract=off: only the fused operations written here.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define MIN(a, b) ((a) < (b) ? (a) : (b))

#include "exact_exp.h"

/* the 8 lanes of v summed in the fixed order ((0 + 1) + (2 + 3)) + ((4 + 5) + (6 + 7)) */
static inline float hsum8(__m256 v) {
    float x[8];
    _mm256_storeu_ps(x, v);
    return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
}

/* lane i of the result: hsum8 of the i-th argument (the same additions, 8 sums at once) */
static inline __m256 hsum8x8(__m256 a, __m256 b, __m256 c, __m256 d, __m256 e, __m256 f, __m256 g, __m256 h) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d)); /* a_lo b_lo c_lo d_lo | a_hi ... */
    const __m256 efgh = _mm256_hadd_ps(_mm256_hadd_ps(e, f), _mm256_hadd_ps(g, h));
    return _mm256_add_ps(_mm256_permute2f128_ps(abcd, efgh, 0x20), _mm256_permute2f128_ps(abcd, efgh, 0x31));
}

/* q [B, Hq, T, D] float32 contiguous; k, v: float32 element (b, g, j, d) at b * kv_sb + g * kv_sh + j * kv_sj + d;
 * mask: NULL (causal: row t sees j <= S - T + t) or uint8 with element (b, t, j) at b * mask_sb + t * mask_st + j
 * (nonzero = may see); out [B, Hq, T, D] float32. D % 8 == 0, D <= 256. One task per query row. Returns 0, or 1
 * if scratch could not be allocated. */
int spectui_exact_attention(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D, const float *q,
                            const float *K, const float *V, int64_t kv_sb, int64_t kv_sh, int64_t kv_sj,
                            const uint8_t *mask, int64_t mask_sb, int64_t mask_st, double scale, float *out,
                            int threads) {
    const int64_t G = Hq / Hkv, rows = B * Hq * T;
    const int nthreads = threads > 0 ? threads : 1;
    const float sc = (float)scale;
    float *scratch = (float *)malloc(sizeof(float) * (S + 8) * nthreads);   /* [threads, S + 8]: scores */
    int32_t *seen = (int32_t *)malloc(sizeof(int32_t) * (S + 8) * nthreads); /* [threads, S + 8]: visible keys */
    if (scratch == NULL || seen == NULL) {
        free(scratch);
        free(seen);
        return 1;
    }
#pragma omp parallel num_threads(nthreads)
    {
        float *s = scratch + (int64_t)omp_get_thread_num() * (S + 8);
        int32_t *js = seen + (int64_t)omp_get_thread_num() * (S + 8);
        __m256 acc[32];
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const int64_t t = r % T, h = (r / T) % Hq, b = r / (T * Hq), g = h / G;
            const float *qr = q + r * D;
            const int64_t base = b * kv_sb + g * kv_sh;
            int64_t n = 0;
            float m = -INFINITY;
            for (int64_t j = 0; j < S; j++) {
                const int visible = mask ? mask[b * mask_sb + t * mask_st + j] != 0 : j <= S - T + t;
                if (!visible) continue;
                __m256 a = _mm256_setzero_ps();
                for (int64_t d = 0; d < D; d += 8)
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), _mm256_loadu_ps(K + base + j * kv_sj + d), a);
                const float score = hsum8(a) * sc;
                s[n] = score;
                js[n++] = (int32_t)j;
                if (score > m) m = score;
            }
            float *o = out + r * D;
            if (n == 0) { /* a row that may see nothing (left padding) attends to nothing */
                for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                continue;
            }
            const __m256 mv = _mm256_set1_ps(m), every = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
            for (int64_t i = n; i < (n + 7) / 8 * 8; i++) s[i] = m; /* padding lanes, never read */
            for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(s + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv), every));
            for (int64_t d = 0; d < D; d += 8) acc[d / 8] = _mm256_setzero_ps();
            float denom = 0.0f;
            for (int64_t i = 0; i < n; i++) {
                const float e = s[i];
                denom += e;
                const __m256 ev = _mm256_set1_ps(e);
                const float *row = V + base + (int64_t)js[i] * kv_sj;
                for (int64_t d = 0; d < D; d += 8) acc[d / 8] = _mm256_fmadd_ps(ev, _mm256_loadu_ps(row + d), acc[d / 8]);
            }
            const __m256 den = _mm256_set1_ps(denom);
            for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(acc[d / 8], den));
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
 *   scores    2 keys at a time: 8 dot products in 8 lanes over d (the lanes and fma order above),
 *             summed 8 at once in hsum8's order, times scale; a key the row may not see scores -inf;
 *             each row's running max (_mm_max_ps(s, m) is `if (s > m) m = s`)
 *   exps      e = exp8(s - m) for the keys the row may see, 0 for the others
 *   weighted  2 vectors of d at a time: acc += e * v_j (fma) and denom += e, in ascending j
 *   finish    acc / denom; a row that may see nothing gives zeros
 * So every row gets the bits spectui_exact_attention gives it. */
typedef struct {
    int64_t B, Hq, Hkv, T, S, D, G, Tb, RP, nblocks, ntasks; /* Tb tokens a task, RP rows padded to 4 */
    const float *q, *k, *v;
    int64_t kv_sb, kv_sh, kv_sj, mask_sb, mask_st;
    const uint8_t *mask, *none; /* none: S zeros, the mask row of a padding row */
    float scale;
    float *out;
} Call;

typedef struct { int64_t b, g, t0, R, J, base; } Task; /* it needs keys j < J (its last row's limit) */

#define CHUNK 64

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
    __m128i lim;           /* causal: keys j <= lim (-1: a padding row) */
    int64_t lim0;          /* the first row's limit, the least */
    const uint8_t *row[4]; /* a mask: key j where row[i][j] != 0 */
} Tile;

static Tile tile_of(const Call *c, const Task *w, int64_t rt) {
    Tile u;
    int32_t lim[4];
    for (int i = 0; i < 4; i++) {
        const int64_t r = rt + i, t = w->t0 + r / c->G;
        lim[i] = r < w->R ? (int32_t)(c->S - c->T + t) : -1;
        u.row[i] = r < w->R && c->mask ? c->mask + w->b * c->mask_sb + t * c->mask_st : c->none;
    }
    u.lim = _mm_loadu_si128((const __m128i *)lim);
    u.lim0 = lim[0];
    return u;
}

ALWAYS_INLINE __m128 visible(const Call *c, const Tile *u, int64_t j) { /* all ones in the lanes that see key j */
    if (!c->mask) return _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_add_epi32(u->lim, _mm_set1_epi32(1)), _mm_set1_epi32((int32_t)j)));
    return _mm_castsi128_ps(_mm_set_epi32(-(int32_t)(u->row[3][j] != 0), -(int32_t)(u->row[2][j] != 0),
                                          -(int32_t)(u->row[1][j] != 0), -(int32_t)(u->row[0][j] != 0)));
}

static int64_t seen_by_all(const Call *c, const Task *w, const Tile *u, int64_t rt, int64_t j0, int64_t j1) {
    if (!c->mask) /* the first key in [j0, j1) that some row of the tile may not see, or j1 */
        return u->lim0 + 1 < j0 ? j0 : MIN(u->lim0 + 1, j1);
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
    if (p >= 2 * w->J) return;
    const char *row = (const char *)((p < w->J ? c->k : c->v) + w->base + (p % w->J) * c->kv_sj);
    for (int64_t b = 0; b < c->D * 4; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
}

/* the 4 rows' scores for key j (-inf where a row may not see it) to s[j * RP + rt], their max to m */
ALWAYS_INLINE void put_scores(const Call *c, const Tile *u, int64_t all, float *s, int64_t j, __m128 sc, __m128 *m) {
    if (j >= all) sc = _mm_blendv_ps(_mm_set1_ps(-INFINITY), sc, visible(c, u, j));
    _mm_storeu_ps(s + j * c->RP, sc);
    *m = _mm_max_ps(sc, *m);
}

static void scores(const Call *c, const Task *w, const float *qs, float *s, float *m, int64_t j0, int64_t j1) {
    const int64_t D = c->D, sj = c->kv_sj;
    const __m256 scale = _mm256_set1_ps(c->scale);
    for (int64_t rt = 0; rt < w->R; rt += 4) {
        const float *q0 = qs + rt * D, *q1 = q0 + D, *q2 = q1 + D, *q3 = q2 + D;
        const Tile u = tile_of(c, w, rt);
        const int64_t all = seen_by_all(c, w, &u, rt, j0, j1);
        float *st = s + rt;
        __m128 mx = _mm_loadu_ps(m + rt);
        for (int64_t j = j0; j < j1; j += 2) { /* the last key alone: its twin is itself, put once */
            const float *k0 = c->k + w->base + j * sj, *k1 = k0 + (j + 1 < j1) * sj;
            for (int64_t p = j + CHUNK; rt == 0 && p < j + CHUNK + 2; p++) prefetch_row(c, w, p);
            __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00;
            __m256 a20 = a00, a21 = a00, a30 = a00, a31 = a00;
            for (int64_t d = 0; d < D; d += 8) {
                const __m256 x0 = _mm256_loadu_ps(k0 + d), x1 = _mm256_loadu_ps(k1 + d);
                __m256 y = _mm256_loadu_ps(q0 + d);
                a00 = _mm256_fmadd_ps(y, x0, a00), a01 = _mm256_fmadd_ps(y, x1, a01);
                y = _mm256_loadu_ps(q1 + d);
                a10 = _mm256_fmadd_ps(y, x0, a10), a11 = _mm256_fmadd_ps(y, x1, a11);
                y = _mm256_loadu_ps(q2 + d);
                a20 = _mm256_fmadd_ps(y, x0, a20), a21 = _mm256_fmadd_ps(y, x1, a21);
                y = _mm256_loadu_ps(q3 + d);
                a30 = _mm256_fmadd_ps(y, x0, a30), a31 = _mm256_fmadd_ps(y, x1, a31);
            }
            const __m256 both = _mm256_mul_ps(hsum8x8(a00, a10, a20, a30, a01, a11, a21, a31), scale);
            put_scores(c, &u, all, st, j, _mm256_castps256_ps128(both), &mx);
            if (j + 1 < j1) put_scores(c, &u, all, st, j + 1, _mm256_extractf128_ps(both, 1), &mx);
        }
        _mm_storeu_ps(m + rt, mx);
    }
}

/* scores -> e = exp8(s - m) where the row may see the key, else 0, for j in [j0, j1) */
static void exps(const Call *c, const Task *w, float *s, const float *m, int64_t j0, int64_t j1) {
    const int64_t RP = c->RP;
    const __m128 every = _mm_castsi128_ps(_mm_set1_epi32(-1));
    for (int64_t rt = 0; rt < w->R; rt += 4) {
        const Tile u = tile_of(c, w, rt);
        const __m128 m4 = _mm_loadu_ps(m + rt);
        const __m256 mx = _mm256_set_m128(m4, m4);
        const int64_t all = seen_by_all(c, w, &u, rt, j0, j1);
        int64_t j = j0;
        for (; j + 1 < j1; j += 2) {
            float *x0 = s + j * RP + rt, *x1 = x0 + RP;
            const __m256 live = _mm256_set_m128(j + 1 < all ? every : visible(c, &u, j + 1), j < all ? every : visible(c, &u, j));
            const __m256 e = exp8(_mm256_sub_ps(_mm256_set_m128(_mm_loadu_ps(x1), _mm_loadu_ps(x0)), mx), live);
            _mm_storeu_ps(x0, _mm256_castps256_ps128(e)), _mm_storeu_ps(x1, _mm256_extractf128_ps(e, 1));
        }
        if (j < j1) {
            float *x0 = s + j * RP + rt;
            const __m128 l = j < all ? every : visible(c, &u, j);
            const __m256 e = exp8(_mm256_sub_ps(_mm256_set_m128(m4, _mm_loadu_ps(x0)), mx), _mm256_set_m128(l, l));
            _mm_storeu_ps(x0, _mm256_castps256_ps128(e));
        }
    }
}

/* acc [RP, D] += e * v over j in [j0, j1) for the tile's 4 rows, d in [8 dv, 8 dv + 8 nv) (nv 1 or 2);
 * dv == 0 also adds e to den [RP] */
static void weighted(const Call *c, const Task *w, const float *e, float *acc, float *den, int64_t rt, int64_t dv,
                     int64_t j0, int64_t j1) {
    const int64_t RP = c->RP, D = c->D, sj = c->kv_sj, d0 = 8 * dv, d1 = c->D / 8 - dv < 2 ? d0 : d0 + 8;
    const int nv = d1 != d0 ? 2 : 1;
    float *A0 = acc + rt * D, *A1 = A0 + D, *A2 = A1 + D, *A3 = A2 + D;
    __m256 a00 = _mm256_loadu_ps(A0 + d0), a01 = _mm256_loadu_ps(A0 + d1), a10 = _mm256_loadu_ps(A1 + d0);
    __m256 a11 = _mm256_loadu_ps(A1 + d1), a20 = _mm256_loadu_ps(A2 + d0), a21 = _mm256_loadu_ps(A2 + d1);
    __m256 a30 = _mm256_loadu_ps(A3 + d0), a31 = _mm256_loadu_ps(A3 + d1);
    __m128 dn = _mm_loadu_ps(den + rt);
    for (int64_t j = j0; j < j1; j++) {
        const float *ej = e + j * RP + rt, *row = c->v + w->base + j * sj;
        const __m256 x0 = _mm256_loadu_ps(row + d0), x1 = _mm256_loadu_ps(row + d1);
        if (rt == 0 && dv == 0) prefetch_row(c, w, w->J + j + CHUNK);
        dn = _mm_add_ps(dn, _mm_loadu_ps(ej));
        __m256 y = _mm256_broadcast_ss(ej);
        a00 = _mm256_fmadd_ps(y, x0, a00), a01 = _mm256_fmadd_ps(y, x1, a01);
        y = _mm256_broadcast_ss(ej + 1);
        a10 = _mm256_fmadd_ps(y, x0, a10), a11 = _mm256_fmadd_ps(y, x1, a11);
        y = _mm256_broadcast_ss(ej + 2);
        a20 = _mm256_fmadd_ps(y, x0, a20), a21 = _mm256_fmadd_ps(y, x1, a21);
        y = _mm256_broadcast_ss(ej + 3);
        a30 = _mm256_fmadd_ps(y, x0, a30), a31 = _mm256_fmadd_ps(y, x1, a31);
    }
    _mm256_storeu_ps(A0 + d0, a00), _mm256_storeu_ps(A1 + d0, a10);
    _mm256_storeu_ps(A2 + d0, a20), _mm256_storeu_ps(A3 + d0, a30);
    if (nv > 1) _mm256_storeu_ps(A0 + d1, a01), _mm256_storeu_ps(A1 + d1, a11), _mm256_storeu_ps(A2 + d1, a21);
    if (nv > 1) _mm256_storeu_ps(A3 + d1, a31);
    if (dv == 0) _mm_storeu_ps(den + rt, dn);
}

/* out of the tile's rows: acc / den, zeros for a row that may see nothing */
static void finish(const Call *c, const Task *w, const float *acc, const float *den, int64_t rt) {
    const Tile u = tile_of(c, w, rt);
    for (int i = 0; i < 4 && rt + i < w->R; i++) {
        float *o = c->out + row_offset(c, w, rt + i);
        const float *a = acc + (rt + i) * c->D;
        int seen = !c->mask;
        for (int64_t j = 0; j < w->J && !seen; j++) seen = u.row[i][j] != 0;
        const __m256 inv = _mm256_set1_ps(den[rt + i]);
        for (int64_t d = 0; d < c->D; d += 8)
            _mm256_storeu_ps(o + d, seen ? _mm256_div_ps(_mm256_loadu_ps(a + d), inv) : _mm256_setzero_ps());
    }
}

static void start(const Call *c, const Task *w, float *qs, float *m, float *acc, float *den) {
    for (int64_t r = 0; r < c->RP; r++) { /* qs [RP, D]: the queries, padding rows 0 */
        const float *qr = r < w->R ? c->q + row_offset(c, w, r) : NULL;
        for (int64_t d = 0; d < c->D; d++) qs[r * c->D + d] = qr ? qr[d] : 0.0f;
        m[r] = -INFINITY, den[r] = 0.0f;
    }
    memset(acc, 0, sizeof(float) * c->RP * c->D);
    for (int64_t p = 0; p < CHUNK; p++) prefetch_row(c, w, p);
}

/* q [B, Hq, T, D], k, v, mask, out as spectui_exact_attention's; tokens_per_block: tokens of a task (a
 * thread takes whole tasks, the costliest first). Returns 0, or 1 if scratch could not be allocated. */
int spectui_exact_attention_grouped(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D,
                                    const float *q, const float *k, const float *v, int64_t kv_sb, int64_t kv_sh,
                                    int64_t kv_sj, const uint8_t *mask, int64_t mask_sb, int64_t mask_st, double scale,
                                    float *out, int threads, int64_t tokens_per_block) {
    Call c = {B, Hq, Hkv, T, S, D, Hq / Hkv, tokens_per_block < 1 ? 1 : MIN(tokens_per_block, T), 0, 0, 0, q,
              k, v, kv_sb, kv_sh, kv_sj, mask_sb, mask_st, mask, NULL, (float)scale, out};
    c.RP = (c.Tb * c.G + 3) / 4 * 4, c.nblocks = (T + c.Tb - 1) / c.Tb, c.ntasks = B * Hkv * c.nblocks;
    const int nthreads = threads > 0 ? threads : 1;
    const int64_t RP = c.RP, per_thread = RP * (2 * D + S + 2); /* queries, accumulators, scores, max, denominators */
    float *scratch = malloc(sizeof(float) * per_thread * nthreads);
    uint8_t *none = mask ? calloc(S, 1) : NULL;
    c.none = none;
    if (!scratch || (mask && !none)) {
        free(scratch), free(none);
        return 1;
    }
#pragma omp parallel num_threads(nthreads)
    {
        float *qs = scratch + omp_get_thread_num() * per_thread, *acc = qs + RP * D, *s = acc + RP * D;
        float *m = s + RP * S, *den = m + RP;
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < c.ntasks; i++) {
            const Task w = task_of(&c, i);
            start(&c, &w, qs, m, acc, den);
            for (int64_t j0 = 0; j0 < w.J; j0 += CHUNK) scores(&c, &w, qs, s, m, j0, MIN(j0 + CHUNK, w.J));
            for (int64_t j0 = 0; j0 < w.J; j0 += CHUNK) {
                const int64_t j1 = MIN(j0 + CHUNK, w.J);
                exps(&c, &w, s, m, j0, j1);
                for (int64_t dv = 0; dv < D / 8; dv += 2) /* a slice of the chunk's values, for every tile */
                    for (int64_t rt = 0; rt < w.R; rt += 4) weighted(&c, &w, s, acc, den, rt, dv, j0, j1);
            }
            for (int64_t rt = 0; rt < w.R; rt += 4) finish(&c, &w, acc, den, rt);
        }
    }
    free(scratch), free(none);
    return 0;
}
