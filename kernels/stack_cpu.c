/* A LLaMA decoder stack for one sequence on CPU, in one call: engine/lean_model.py's glue path with
 * its Python loop moved here.
 *
 * LeanModel.run, on an fp32 verifier whose 4-bit layers all run kernels/nf4_cpu.c, makes about ten
 * calls a layer (norm, q|k|v, rotary + cache writes, attention, o + residual, norm, gate|up,
 * silu * up, down + residual), each a ctypes call of a few microseconds around a few microseconds
 * of Python: about 3 ms of a 23 ms one-token step on a 2-core AVX2 machine. Here the same functions,
 * from the same builds, are called through the addresses stack_cpu.py passes (Ops), with the same
 * arguments, in the same order, layer after layer. Nothing is computed here but the transpose of
 * the attention's output for o ([Hq, T, D] -> [T, Hq * D], a copy), so the bits are the loop's
 * (tests/kernels/test_stack_cpu.py compares the logits bit for bit). Per layer, T rows h [T, H]:
 *
 *     x = rms(h) * w_in                              rms_scale (its own sum of squares)
 *     qkv = x W_qkv^T                                nf4 matmul            [T, (Hq + 2 Hkv) D]
 *     q = rot(q); cache[start..] <- rot(k), v        rope_store            q [Hq, T, D]
 *     a = attention(q, cache[..start+T], mask)       exact attention       [Hq, T, D] -> [T, Hq D]
 *     h += a W_o^T                                   nf4 matmul, add
 *     x = rms(h) * w_post
 *     gu = x W_gate|up^T                             nf4 matmul            [T, 2I]
 *     h += (silu(gate) * up) W_down^T                silu_mul_f32, nf4 matmul, add
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "aligned.h"

typedef int (*matmul_fn)(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx, const uint8_t *w,
                         const float *absmax, int64_t bs, const float *code, float *y, int64_t ldy, int threads,
                         int add);
typedef int (*rms_fn)(int64_t rows, int64_t n, const float *h, const float *sumsq, float eps, const float *w,
                      void *out, int bf16_out);
typedef int (*rope_fn)(int64_t T, int64_t Hq, int64_t Hkv, int64_t D, const float *qkv, int64_t ldqkv,
                       const float *cos, const float *sin, float *q, float *k, float *v, int64_t ld);
typedef int (*silu_fn)(int64_t T, int64_t I, const float *gate_up, int64_t ld, float *out, void *exp8);
typedef int (*attention_fn)(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D, const float *q,
                            const float *k, const float *v, int64_t kv_sb, int64_t kv_sh, int64_t kv_sj,
                            const uint8_t *mask, int64_t mask_sb, int64_t mask_st, double scale, float *out,
                            int threads);
typedef int (*grouped_fn)(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t S, int64_t D, const float *q,
                          const float *k, const float *v, int64_t kv_sb, int64_t kv_sh, int64_t kv_sj,
                          const uint8_t *mask, int64_t mask_sb, int64_t mask_st, double scale, float *out,
                          int threads, int64_t tokens_per_block);

typedef struct { /* the functions, from their own libraries */
    matmul_fn matmul;
    rms_fn rms;
    rope_fn rope;
    silu_fn silu;
    void *exp8; /* torch's Sleef_expf8_u10, for silu */
    attention_fn rows;
    grouped_fn grouped;
} Ops;

typedef struct { /* one 4-bit projection (or stack of them): y [T, N] = x [T, K] W^T */
    int64_t N, K, bs;
    const uint8_t *w;
    const float *absmax, *code;
} Proj;

typedef struct { /* one decoder layer's weights */
    const float *norm_in, *norm_post;
    float eps_in, eps_post;
    double scale; /* the attention's */
    Proj qkv, o, gate_up, down;
} Layer;

typedef struct { /* the shapes and this call's state */
    int64_t T, H, Hq, Hkv, D, I;
    int64_t start;           /* cached positions before these T */
    float *kv;               /* the cache [L, 2, 1, Hkv, capacity, D] float32 */
    int64_t capacity;
    const float *cos, *sin;  /* [T, D] */
    const uint8_t *mask;     /* [T, start + T] (1 = may attend), or NULL: causal */
    int threads;
    int64_t block;           /* tokens a task of the grouped attention, 0: its per-row kernel */
} Call;

static int project(const Ops *ops, const Proj *p, int64_t T, const float *x, float *y, int64_t ldy, int threads,
                   int add) {
    return ops->matmul(T, p->N, p->K, x, p->K, p->w, p->absmax, p->bs, p->code, y, ldy, threads, add);
}

static int attend(const Ops *ops, const Call *c, const Layer *layer, const float *keys, const float *q, float *out) {
    const int64_t S = c->start + c->T, sh = c->capacity * c->D;
    const float *values = keys + c->Hkv * sh;
    if (c->block)
        return ops->grouped(1, c->Hq, c->Hkv, c->T, S, c->D, q, keys, values, c->Hkv * sh, sh, c->D, c->mask, 0, S,
                            layer->scale, out, c->threads, c->block);
    return ops->rows(1, c->Hq, c->Hkv, c->T, S, c->D, q, keys, values, c->Hkv * sh, sh, c->D, c->mask, 0, S,
                     layer->scale, out, c->threads);
}

/* h [T, H] fp32, updated in place through L layers; the cache gets these T positions' keys and
 * values at start .. start + T - 1. Returns 0, 1 if memory could not be allocated, 2 if a kernel failed. */
int spectui_stack_forward(int64_t L, const Layer *layers, const Ops *ops, const Call *c, float *h) {
    const int64_t T = c->T, H = c->H, HD = c->Hq * c->D, sh = c->capacity * c->D;
    const int64_t Nqkv = (c->Hq + 2 * c->Hkv) * c->D;
    float *x = alloc64(sizeof(float) * T * (H + Nqkv + 3 * HD + 3 * c->I)); /* one block for every buffer */
    if (x == NULL) return 1;
    float *qkv = x + T * H, *q = qkv + T * Nqkv, *att = q + T * HD, *rows = att + T * HD, *gu = rows + T * HD,
          *act = gu + 2 * T * c->I;
    int failed = 0;
    for (int64_t l = 0; l < L && !failed; l++) {
        const Layer *layer = layers + l;
        float *keys = c->kv + l * 2 * c->Hkv * sh, *values = keys + c->Hkv * sh;
        failed |= ops->rms(T, H, h, NULL, layer->eps_in, layer->norm_in, x, 0);
        failed |= project(ops, &layer->qkv, T, x, qkv, Nqkv, c->threads, 0);
        failed |= ops->rope(T, c->Hq, c->Hkv, c->D, qkv, Nqkv, c->cos, c->sin, q, keys + c->start * c->D,
                            values + c->start * c->D, sh);
        failed |= attend(ops, c, layer, keys, q, att); /* [Hq, T, D] */
        const float *a = att;
        if (T > 1) { /* [Hq, T, D] -> [T, Hq, D]: o reads a token's heads as one row */
            for (int64_t t = 0; t < T; t++)
                for (int64_t head = 0; head < c->Hq; head++)
                    memcpy(rows + t * HD + head * c->D, att + (head * T + t) * c->D, sizeof(float) * c->D);
            a = rows;
        }
        failed |= project(ops, &layer->o, T, a, h, H, c->threads, 1);
        failed |= ops->rms(T, H, h, NULL, layer->eps_post, layer->norm_post, x, 0);
        failed |= project(ops, &layer->gate_up, T, x, gu, 2 * c->I, c->threads, 0);
        failed |= ops->silu(T, c->I, gu, 2 * c->I, act, ops->exp8);
        failed |= project(ops, &layer->down, T, act, h, H, c->threads, 1);
    }
    free(x);
    return failed ? 2 : 0;
}
