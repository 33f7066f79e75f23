/* NF4/FP4 matmul on Intel CPUs with AMX (Sapphire Rapids and later): bf16 tiles, fp32 sums.
 *
 * nf4_cpu.c multiplies in fp32 with fused multiply-adds, one per weight and input row, so each row a tree
 * pass adds costs about as much as a one-token pass's arithmetic (on a Xeon with AMX: 1.1-1.5 ms a row of
 * SmolLM2-135M's 106 M weights). An AMX tile product (tdpbf16ps) multiplies 16 input rows by 16 x 32
 * weights in about the time an FMA loop takes for one row; what remains is decoding the 4-bit codes,
 * which is paid once whatever the number of rows.
 *
 * Arithmetic, the same for every row whatever M, N and the thread count (each output element is one
 * tile element, which a tile product computes from its own row of A and column of B only):
 *
 *     xb[m, k]   = bf16(x[m, k])                                round to nearest even (vcvtneps2bf16)
 *     cb[n, k]   = bf16(code[q(n, k)])                           the 4-bit code's values in bf16
 *     c[m, n, b] = sum over k in block b of xb[m, k] cb[n, k]     tdpbf16ps's own fp32 sum, a block of bs
 *     acc        = 0;  acc = fma(absmax[n, b], c[m, n, b], acc)   block by block, b = 0, 1, ...
 *     y[m, n]    = acc  (or y[m, n] + acc with `add`)
 *
 * The tile product's sum is not a chain of fp32 roundings in a fixed order (a vdpbf16ps chain over the
 * same pairs differs in the last bits; measured), so no other instruction reproduces its bits: every row
 * count, one row included, goes through the tiles. The weight is bitsandbytes' code value in bf16, its
 * block's scale applied in fp32 after the block's sum (bitsandbytes' own bf16 kernel rounds code x scale
 * to bf16 instead), the inputs bf16: not nf4_cpu.c's bits, which is why a model takes this kernel whole
 * (kernels/nf4_cpu.py `install`), so that transformers' generate and the engine compute with the same one.
 *
 * Weights are repacked once (spectui_nf4_amx_repack) from bitsandbytes' layout (element (n, k) in byte
 * (n K + k) / 2, high nibble first) into tiles of 16 output rows (a block nb) by 32 k (a tile kt): tile row
 * r's 32 bf16 words are (n = 16 nb + i / 2, k = 32 kt + 2 r + i % 2) for i = 0 .. 31, the pair layout
 * tdpbf16ps reads for B; 256 bytes of codes a tile (the repack's comment). Scales become [N / 16][K / bs][16].
 *
 * Built at first use by kernels/native.py (the flags there; the AMX functions carry their own target).
 * Linux lends a process AMX's tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM);
 * spectui_nf4_amx_ready asks and says whether tiles may be used.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "aligned.h"

#define TARGET_AMX __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_ROWS 16 /* input rows a tile */

typedef struct { /* ldtilecfg's 64 bytes, palette 1 */
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

/* tile registers: C 0-3 (sums of four output blocks), A 4 (input rows), B 5-7 (weights). The intrinsics paste
 * the number into the instruction: literals, not enums. */
#define A_TILE 4

/* 1 where the CPU has AMX-BF16 and AVX512-BF16 and the kernel lets this process use tiles, else 0. */
int spectui_nf4_amx_ready(void) {
    static int ready = -1;
    if (ready < 0) {
        __builtin_cpu_init();
        ready = __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("amx-tile") &&
                __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    }
    return ready;
}

/* out [N / 16][K / 32][256] from w [N K / 2] (the header's tile layout); scale [N / 16][K / bs][16] from
 * absmax [N][K / bs]. Needs N % 16 == 0, K % bs == 0, bs % 32 == 0.
 *
 * Tile row r's word i is (n = 16 nb + i / 2, k = 32 kt + 2 r + i % 2). A group c (0-3) of 64 bytes holds tile
 * rows 4c .. 4c + 3: its 16-bit word i has row 4c + q's word i in bits 4q .. 4q + 3. Row n's bitsandbytes
 * bytes u0 .. u3 at 16 kt + 4c hold k = 32 kt + 8c + 2q (high nibble of u_q) and the next k (low nibble), which
 * are words i = 2 (n - 16 nb) and i + 1 of row 4c + q. */
int spectui_nf4_amx_repack(int64_t N, int64_t K, const uint8_t *w, const float *absmax, int64_t bs, uint8_t *out,
                           float *scale, int threads) {
    const int64_t KT = K / 32, KB = K / bs;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t nb = 0; nb < N / 16; nb++) {
        for (int64_t kt = 0; kt < KT; kt++) {
            uint8_t *tile = out + (nb * KT + kt) * 256;
            for (int j = 0; j < 16; j++) {
                const uint8_t *row = w + (nb * 16 + j) * (K / 2) + kt * 16;
                for (int c = 0; c < 4; c++) {
                    const uint8_t *u = row + 4 * c;
                    uint8_t *even = tile + 64 * c + 4 * j, *odd = even + 2; /* words 2j and 2j + 1 */
                    even[0] = (uint8_t)((u[1] & 0xF0) | (u[0] >> 4)), even[1] = (uint8_t)((u[3] & 0xF0) | (u[2] >> 4));
                    odd[0] = (uint8_t)((u[1] << 4) | (u[0] & 15)), odd[1] = (uint8_t)((u[3] << 4) | (u[2] & 15));
                }
            }
        }
        for (int64_t b = 0; b < KB; b++)
            for (int j = 0; j < 16; j++) scale[(nb * KB + b) * 16 + j] = absmax[(nb * 16 + j) * KB + b];
    }
    return 0;
}

/* One B tile (32 k x 16 n as 16 rows of 16 pairs) from its 256 bytes into buf [16][32] bf16. vpermw reads the
 * low 5 bits of each index word; the table holds the code's 16 values twice (entries i and i + 16), so the
 * nibble in bits 0-3 selects its value whatever bit 4 holds: no mask, one shift a row. */
static TARGET_AMX inline void decode_tile(const uint8_t *tile, __m512i table, uint16_t *buf) {
    for (int c = 0; c < 4; c++) {
        const __m512i v = _mm512_loadu_si512((const void *)(tile + 64 * c)); /* [32] words: rows 4c .. 4c + 3 */
        uint16_t *rows = buf + 128 * c;
        _mm512_store_si512((__m512i *)rows, _mm512_permutexvar_epi16(v, table));
        _mm512_store_si512((__m512i *)(rows + 32), _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), table));
        _mm512_store_si512((__m512i *)(rows + 64), _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), table));
        _mm512_store_si512((__m512i *)(rows + 96), _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), table));
    }
}

/* xb [Mp, K] bf16 (rows M .. Mp - 1 zero) from x [M, ldx] fp32 */
static TARGET_AMX void round_rows(int64_t M, int64_t Mp, int64_t K, const float *x, int64_t ldx, uint16_t *xb) {
    for (int64_t m = 0; m < Mp; m++)
        for (int64_t k = 0; k < K; k += 16) {
            const __m256bh h = m < M ? _mm512_cvtneps_pbh(_mm512_loadu_ps(x + m * ldx + k)) : (__m256bh)_mm256_setzero_si256();
            _mm256_storeu_si256((__m256i *)(xb + m * K + k), (__m256i)h);
        }
}

/* C tiles 0 .. G - 1 += input rows m0 .. m0 + 15 (k-tile kt) x the G decoded B tiles at `tiles` [G][512] */
static TARGET_AMX inline void dot_group(int G, const uint16_t *xb, int64_t K, int64_t m0, int64_t kt,
                                        const uint16_t *tiles) {
    _tile_loadd(A_TILE, xb + m0 * K + kt * 32, K * 2);
    _tile_loadd(5, tiles, 64);
    _tile_dpbf16ps(0, A_TILE, 5);
    if (G > 1) { _tile_loadd(6, tiles + 512, 64); _tile_dpbf16ps(1, A_TILE, 6); }
    if (G > 2) { _tile_loadd(7, tiles + 1024, 64); _tile_dpbf16ps(2, A_TILE, 7); }
    if (G > 3) { _tile_loadd(5, tiles + 1536, 64); _tile_dpbf16ps(3, A_TILE, 5); }
}

/* The G tiles of blocks nb0 .. at k-tile kt into tiles [G][512], fetching those PREFETCH_BLOCKS blocks ahead
 * (the thread's own next groups: each thread takes one contiguous share of the blocks; a prefetch never faults). */
#define PREFETCH_BLOCKS 8
static TARGET_AMX inline void decode_group(int G, const uint8_t *wt, int64_t nb0, int64_t KT, int64_t kt, __m512i lut,
                                           uint16_t *tiles) {
    for (int j = 0; j < G; j++) {
        const uint8_t *tile = wt + ((nb0 + j) * KT + kt) * 256;
        _mm_prefetch((const char *)(tile + PREFETCH_BLOCKS * KT * 256), _MM_HINT_T0);
        _mm_prefetch((const char *)(tile + PREFETCH_BLOCKS * KT * 256 + 128), _MM_HINT_T0);
        decode_tile(tile, lut, tiles + 512 * j);
    }
}

/* Output blocks nb0 .. nb0 + G - 1 (G <= 4) for every input row. Per block b of bs k, for each tile of 16
 * input rows (fewer where M <= 16), the G C tiles sum the block's k-tiles (one A tile a k-tile, shared by
 * the G products), are stored to cbuf [4][16][16] and added in scaled to acc [4][Mp][16]. Up to 16 rows the
 * G tiles of a k-tile are decoded just before their products; with more, a block's tiles are decoded once
 * into bbuf [bs / 32][4][512] for every tile of rows. Four independent C tiles keep the tile unit busy
 * while the next tiles are decoded. */
static TARGET_AMX void group_rows(int64_t nb0, int G, int64_t M, int64_t Mp, int64_t K, int64_t bs, const uint16_t *xb,
                                  const uint8_t *wt, const float *scale, __m512i lut, uint16_t *bbuf, float *cbuf,
                                  float *acc, float *y, int64_t ldy, int add) {
    const int64_t KT = K / 32, KB = K / bs, per = bs / 32;
    for (int64_t i = 0; i < 4 * Mp; i++) _mm512_store_ps(acc + 16 * i, _mm512_setzero_ps());
    for (int64_t b = 0; b < KB; b++) {
        if (Mp > TILE_ROWS)
            for (int p = 0; p < per; p++) decode_group(G, wt, nb0, KT, b * per + p, lut, bbuf + 512 * 4 * p);
        for (int64_t m0 = 0; m0 < Mp; m0 += TILE_ROWS) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int p = 0; p < per; p++) {
                if (Mp <= TILE_ROWS) decode_group(G, wt, nb0, KT, b * per + p, lut, bbuf);
                dot_group(G, xb, K, m0, b * per + p, Mp <= TILE_ROWS ? bbuf : bbuf + 512 * 4 * p);
            }
            _tile_stored(0, cbuf, 64);
            _tile_stored(1, cbuf + 256, 64);
            _tile_stored(2, cbuf + 512, 64);
            _tile_stored(3, cbuf + 768, 64);
            const int64_t rows = Mp - m0 < TILE_ROWS ? Mp - m0 : TILE_ROWS;
            for (int j = 0; j < G; j++) {
                const __m512 s = _mm512_loadu_ps(scale + ((nb0 + j) * KB + b) * 16);
                for (int64_t i = 0; i < rows; i++) {
                    float *a = acc + 16 * (j * Mp + m0 + i);
                    _mm512_store_ps(a, _mm512_fmadd_ps(s, _mm512_load_ps(cbuf + 256 * j + 16 * i), _mm512_load_ps(a)));
                }
            }
        }
    }
    for (int j = 0; j < G; j++)
        for (int64_t m = 0; m < M; m++) {
            float *out = y + m * ldy + (nb0 + j) * 16;
            const __m512 v = _mm512_load_ps(acc + 16 * (j * Mp + m));
            _mm512_storeu_ps(out, add ? _mm512_add_ps(_mm512_loadu_ps(out), v) : v);
        }
}

/* Output blocks nb0 .. nb0 + G - 1 for one input row, whose block sums become the rows of the C tiles: A's
 * row r is xd's row b0 + r (xd [KBp][K]: row b holds the input's k of block b, zeros elsewhere), so over
 * the k-tiles of blocks b0 .. b0 + R - 1 C row r sums block b0 + r's products and adds exact zeros for the
 * others, which leaves its bits those of group_rows' c (tests/kernels/test_nf4_amx.py compares a row alone
 * with the same row among others). A C tile is then zeroed and stored once every R blocks, not every block;
 * the scales follow in the same order, block by block. */
static TARGET_AMX void group_one_row(int64_t nb0, int G, int64_t K, int64_t bs, int64_t R, const uint16_t *xd,
                                     const uint8_t *wt, const float *scale, __m512i lut, uint16_t *bbuf, float *cbuf,
                                     float *y, int add) {
    const int64_t KT = K / 32, KB = K / bs, per = bs / 32;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t b0 = 0; b0 < KB; b0 += R) {
        const int64_t b1 = b0 + R < KB ? b0 + R : KB;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t kt = b0 * per; kt < b1 * per; kt++) {
            decode_group(G, wt, nb0, KT, kt, lut, bbuf);
            dot_group(G, xd + b0 * K, K, 0, kt, bbuf);
        }
        _tile_stored(0, cbuf, 64);
        _tile_stored(1, cbuf + 256, 64);
        _tile_stored(2, cbuf + 512, 64);
        _tile_stored(3, cbuf + 768, 64);
        for (int j = 0; j < G; j++)
            for (int64_t b = b0; b < b1; b++)
                acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(scale + ((nb0 + j) * KB + b) * 16),
                                         _mm512_load_ps(cbuf + 256 * j + 16 * (b - b0)), acc[j]);
    }
    for (int j = 0; j < G; j++) {
        float *out = y + (nb0 + j) * 16;
        _mm512_storeu_ps(out, add ? _mm512_add_ps(_mm512_loadu_ps(out), acc[j]) : acc[j]);
    }
}

/* y [M, ldy] = x [M, ldx] @ W^T (or y += with `add`) for W [N, K] repacked by spectui_nf4_amx_repack (w, scale);
 * code [16] fp32. spectui_nf4_matmul's signature, so that callers hold either. Needs N % 16 == 0,
 * K % bs == 0, bs % 32 == 0 and spectui_nf4_amx_ready(). Returns 0, 1 if memory could not be allocated,
 * 2 without AMX. */
TARGET_AMX int spectui_nf4_amx_matmul(int64_t M, int64_t N, int64_t K, const float *x, int64_t ldx,
                                      const uint8_t *w, const float *scale, int64_t bs, const float *code, float *y,
                                      int64_t ldy, int threads, int add) {
    if (!spectui_nf4_amx_ready()) return 2;
    if (M <= 0) return 0;
    /* up to 16 rows: a tile of exactly M rows; more: tiles of 16, the last padded with zero rows (a row's
     * element does not depend on the tile's other rows or its row count: tests/kernels/test_nf4_amx.py) */
    const int64_t Mp = M <= TILE_ROWS ? M : (M + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
    /* one row: its blocks as the rows of A, R at a time (group_one_row); xb is then xd [KBp][K] */
    const int64_t KB = K / bs, R = M == 1 ? (KB < TILE_ROWS ? KB : TILE_ROWS) : 0, KBp = R ? (KB + R - 1) / R * R : 0;
    uint16_t *xb = (uint16_t *)alloc64(sizeof(uint16_t) * (R ? KBp : Mp) * K);
    if (xb == NULL) return 1;
    if (R) {
        memset(xb, 0, sizeof(uint16_t) * KBp * K);
        for (int64_t k = 0; k < K; k += 16) /* k's block b = k / bs: row b */
            _mm256_storeu_si256((__m256i *)(xb + (k / bs) * K + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + k)));
    } else {
        round_rows(M, Mp, K, x, ldx, xb);
    }
    uint16_t table[32];
    for (int i = 0; i < 16; i++) { /* bf16 of the code's values, round to nearest even */
        const __m256bh h = _mm512_cvtneps_pbh(_mm512_set1_ps(code[i]));
        uint16_t lanes[16];
        _mm256_storeu_si256((__m256i *)lanes, (__m256i)h);
        table[i] = table[i + 16] = lanes[0];
    }
    const int tasks = threads > 0 ? threads : 1;
    const int64_t per_thread = 256 * 4 * (bs / 32) + 256 * 4 + 16 * 4 * Mp; /* bbuf (bf16), cbuf, acc: in floats */
    float *scratch = (float *)alloc64(sizeof(float) * per_thread * tasks);
    if (scratch == NULL) {
        free(xb);
        return 1;
    }
    const int64_t blocks = N / 16;
#pragma omp parallel num_threads(tasks)
    {
        float *mine = scratch + per_thread * omp_get_thread_num();
        uint16_t *bbuf = (uint16_t *)mine;
        float *cbuf = mine + 256 * 4 * (bs / 32), *acc = cbuf + 256 * 4;
        TileConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.palette = 1;
        const uint8_t rows = (uint8_t)(R ? R : Mp < TILE_ROWS ? Mp : TILE_ROWS);
        for (int t = 0; t < 4; t++) cfg.rows[t] = rows, cfg.colsb[t] = 64; /* C: [rows, 16] fp32 */
        cfg.rows[A_TILE] = rows, cfg.colsb[A_TILE] = 64;                   /* A: [rows, 32] bf16 */
        for (int t = 5; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;   /* B: [16 pairs of k, 16 n] bf16 */
        _tile_loadconfig(&cfg);
        const __m512i lut = _mm512_loadu_si512(table);
        /* each thread its share of the blocks, contiguous (so PREFETCH_BLOCKS ahead is its own next), in groups of 4 */
        const int t = omp_get_thread_num(), n = omp_get_num_threads();
        const int64_t first = blocks * t / n, last = blocks * (t + 1) / n;
        for (int64_t nb = first; nb < last; nb += 4)
            if (R)
                group_one_row(nb, last - nb < 4 ? (int)(last - nb) : 4, K, bs, R, xb, w, scale, lut, bbuf, cbuf, y, add);
            else
                group_rows(nb, last - nb < 4 ? (int)(last - nb) : 4, M, Mp, K, bs, xb, w, scale, lut, bbuf, cbuf, acc, y, ldy, add);
        _tile_release();
    }
    free(scratch);
    free(xb);
    return 0;
}
