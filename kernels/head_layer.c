/* The feature head's decoder layer for a few rows, in one call: kernels/head_layer.py's fast path.
 *
 * engine/feature_head.py's FeatureHead.forward for T rows (a drafting level: 1 to 8 of them),
 *
 *     u   = W_fc [e(x_t) ; prev_t] + b_fc                          [T, H + P] -> [T, H]
 *     a   = Attention(RoPE(W_q n(u)), RoPE(W_k n(u)), W_v n(u))    over the cached slots and these rows
 *     h   = u + W_o a
 *     out = h + W_down (silu(W_gate n'(h)) * W_up n'(h))           n, n': RMSNorm with their weights
 *
 * costs about 25 torch ops a call in eager mode, a few microseconds of dispatch each: 1.2 ms for two
 * rows, where its five products (bf16 weights, 3.5 M of them) take 0.3. Here the products go through
 * dense_cpu.c's spectui_dense_int8_x16 (its address is passed in: each C file is its own library) and the
 * rest is plain loops over T rows.
 *
 * Drafts need no exact arithmetic (the verifier decides every token), so this computes in fp32 what
 * the torch path computes in bf16: inputs of a product are rounded to bf16 (the dot reads bf16), its
 * sums and everything between products stay fp32. The key/value cache is the drafter's own, bf16
 * [Hkv, cap, D] per tensor (fp32 with kv_fp32: a drafter in fp32, on AVX2 CPUs); this call writes the
 * rows' keys and values at slots used .. used + T - 1. The products read int8 weights, a scale a row,
 * widened to fp32 (kernels/head_layer.py says why); the weights are passed as the product reads them,
 * that int8 block (any product of dot_fn's signature serves: dense_cpu.c's spectui_dot_bf16 reads bf16
 * [N, K]).
 * Row t sees slot j when mask[t * (used + T) + j] != 0, or, without a mask, when j <= used + t (causal).
 * prev_t is f_{t-1} (P = H), or f_{t-1} ; e(x_{t-1}) for a head that reads the previous token (P = 2H).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

#define MAX_D 256 /* head_dim: a multiple of 16 up to this */

typedef int (*dot_fn)(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx, const void *w,
                      const float *bias, float *y, int64_t ldy, int threads);

/* out[t] = bf16(w * x[t] / sqrt(mean(x[t]^2) + eps)), x [T, n] fp32 */
static void rms_bf16(int64_t T, int64_t n, const float *x, const float *w, float eps, uint16_t *out) {
    for (int64_t t = 0; t < T; t++) {
        const float *r = x + t * n;
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) ss += (double)r[i] * r[i];
        const float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
        for (int64_t i = 0; i < n; i++) out[t * n + i] = to_bf16(w[i] * (r[i] * scale));
    }
}

/* 8 keys' or values' elements from the cache, bf16 or fp32 */
static inline __m256 cached8(const void *cache, int64_t i, int fp32) {
    return fp32 ? _mm256_loadu_ps((const float *)cache + i) : widen8((const uint16_t *)cache + i);
}

/* LLaMA's rotary on one head vector x [D]: pairs (i, i + D/2) turned by position * inv_freq[i] */
static void rotate(float *x, int64_t D, const float *cosv, const float *sinv) {
    const int64_t half = D / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cosv[i] - b * sinv[i];
        x[i + half] = b * cosv[i] + a * sinv[i];
    }
}

int spectui_head_layer(int64_t T, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I, int64_t P,
                       const int64_t *tokens, const uint16_t *embed, const uint16_t *prev, const int64_t *positions,
                       const float *inv_freq, const void *fc_w, const float *fc_b, const float *norm_in,
                       const void *qkv_w, const void *o_w, const float *norm_post, const void *gu_w,
                       const void *down_w, float eps, void *kcache, void *vcache, int64_t cap,
                       int64_t used, const uint8_t *mask, uint16_t *out, void *dot_address, int threads,
                       int kv_fp32) {
    const dot_fn dot = (dot_fn)dot_address;
    const int64_t S = used + T, QKV = (Hq + 2 * Hkv) * D, G = Hq / Hkv;
    const int nthreads = threads > 0 ? threads : 1;
    /* scratch, fp32 unless named _b (bf16) */
    const int64_t K = H + P;                                  /* fc's input width */
    uint16_t *in_b = malloc(sizeof(uint16_t) * T * K);        /* [T, H + P]: e(x_t) ; prev (f_{t-1}, e(x_{t-1})) */
    float *u = malloc(sizeof(float) * T * H);                 /* [T, H] */
    uint16_t *x_b = malloc(sizeof(uint16_t) * T * (I > H ? I : H)); /* a product's input */
    float *qkv = malloc(sizeof(float) * T * QKV);             /* [T, (Hq + 2 Hkv) D] */
    uint16_t *att_b = malloc(sizeof(uint16_t) * T * Hq * D);  /* [T, Hq D] */
    float *y = malloc(sizeof(float) * T * 2 * I);             /* a product's output */
    float *scores = malloc(sizeof(float) * S * nthreads);     /* [threads, S] */
    float *rot = malloc(sizeof(float) * T * D);               /* [T, D]: cos then sin halves */
    int status = 0;
    if (!in_b || !u || !x_b || !qkv || !att_b || !y || !scores || !rot) {
        status = 1;
        goto done;
    }
    for (int64_t t = 0; t < T; t++) {
        memcpy(in_b + t * K, embed + tokens[t] * H, sizeof(uint16_t) * H);
        memcpy(in_b + t * K + H, prev + t * P, sizeof(uint16_t) * P);
        for (int64_t i = 0; i < D / 2; i++) {
            const float angle = (float)positions[t] * inv_freq[i];
            rot[t * D + i] = cosf(angle);
            rot[t * D + D / 2 + i] = sinf(angle);
        }
    }
    dot(T, H, K, in_b, K, fc_w, fc_b, u, H, nthreads);                     /* u = W_fc [e ; prev] + b */
    rms_bf16(T, H, u, norm_in, eps, x_b);
    dot(T, QKV, H, x_b, H, qkv_w, NULL, qkv, QKV, nthreads);              /* q | k | v */
    for (int64_t t = 0; t < T; t++) {
        const float *cosv = rot + t * D, *sinv = cosv + D / 2;
        for (int64_t h = 0; h < Hq + Hkv; h++) rotate(qkv + t * QKV + h * D, D, cosv, sinv);
        for (int64_t g = 0; g < Hkv; g++) {
            const float *k = qkv + t * QKV + (Hq + g) * D, *v = k + Hkv * D;
            const int64_t at = (g * cap + used + t) * D;
            if (kv_fp32) {
                memcpy((float *)kcache + at, k, sizeof(float) * D);
                memcpy((float *)vcache + at, v, sizeof(float) * D);
            } else {
                uint16_t *kc = (uint16_t *)kcache + at, *vc = (uint16_t *)vcache + at;
                for (int64_t d = 0; d < D; d++) kc[d] = to_bf16(k[d]), vc[d] = to_bf16(v[d]);
            }
        }
    }
    /* attention: softmax(q . k_j / sqrt(D)) over the visible slots j, weighted sum of v_j */
    const float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t r = 0; r < T * Hq; r++) {
        const int64_t t = r / Hq, h = r % Hq, g = h / G;
        const float *q = qkv + t * QKV + h * D;
        float *s = scores + (int64_t)omp_get_thread_num() * S;
        float m = -INFINITY;
        for (int64_t j = 0; j < S; j++) {
            const int visible = mask ? mask[t * S + j] != 0 : j <= used + t;
            if (!visible) {
                s[j] = -INFINITY;
                continue;
            }
            const int64_t k = (g * cap + j) * D;
            __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 16) {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), cached8(kcache, k + d, kv_fp32), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), cached8(kcache, k + d + 8, kv_fp32), a1);
            }
            s[j] = hsum(_mm256_add_ps(a0, a1)) * scale;
            if (s[j] > m) m = s[j];
        }
        __m256 acc[MAX_D / 8];
        for (int64_t d = 0; d < D; d += 8) acc[d / 8] = _mm256_setzero_ps();
        float denom = 0.0f;
        for (int64_t j = 0; j < S; j++) {
            if (s[j] == -INFINITY) continue;
            const float e = expf(s[j] - m);
            denom += e;
            const __m256 ev = _mm256_set1_ps(e);
            const int64_t v = (g * cap + j) * D;
            for (int64_t d = 0; d < D; d += 8)
                acc[d / 8] = _mm256_fmadd_ps(ev, cached8(vcache, v + d, kv_fp32), acc[d / 8]);
        }
        float o[MAX_D];
        for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, acc[d / 8]);
        for (int64_t d = 0; d < D; d++) att_b[t * Hq * D + h * D + d] = to_bf16(denom > 0 ? o[d] / denom : 0.0f);
    }
    dot(T, H, Hq * D, att_b, Hq * D, o_w, NULL, y, H, nthreads);           /* h = u + W_o a (in u) */
    for (int64_t i = 0; i < T * H; i++) u[i] += y[i];
    rms_bf16(T, H, u, norm_post, eps, x_b);
    dot(T, 2 * I, H, x_b, H, gu_w, NULL, y, 2 * I, nthreads);             /* gate | up */
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < I; i++) {
            const float gate = y[t * 2 * I + i], up = y[t * 2 * I + I + i];
            x_b[t * I + i] = to_bf16(gate / (1.0f + expf(-gate)) * up);
        }
    dot(T, H, I, x_b, I, down_w, NULL, y, H, nthreads);                    /* out = h + W_down (...) */
    for (int64_t i = 0; i < T * H; i++) out[i] = to_bf16(u[i] + y[i]);
done:
    free(in_b), free(u), free(x_b), free(qkv), free(att_b), free(y), free(scores), free(rot);
    return status;
}
