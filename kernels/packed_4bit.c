/* bitsandbytes' fused 4-bit CPU product, the same bits for any number of rows, each weight decoded
 * once for up to eight of them (kernels/packed_4bit.py).
 *
 * On CPUs with AVX512-BF16, bitsandbytes 0.50 computes a Linear4bit from its packed CPU layout:
 *
 *     w       blocks of 32 output rows n; block b holds K/2 groups of 32 bytes, group j holding
 *             the two weights k = 2j, 2j + 1 of each of the block's 32 rows: low nibbles for
 *             rows 0-15, high nibbles for rows 16-31
 *     absmax  [K / bs, N] bf16 (scales by block of bs along k, then by row)
 *     x       [M, K] bf16, y [M, N] bf16
 *
 * and for every output y[m, n], one fp32 lane does, over the groups of bs weights along k:
 *
 *     acc = 0;  for each pair (k, k + 1) of the group:  acc = vdpbf16ps(acc, x pair, w pair)
 *     master = fma(acc, scale[group, n], master)
 *     y = bf16(master)                               (round to nearest even)
 *
 * where vdpbf16ps adds the two exact bf16 products into the lane, each addition rounded, denormals
 * flushed, and w pair = code[q] in bf16. Its kernel runs the rows in tiles of at most four, so a
 * tree pass of 5 to 8 rows decodes and multiplies every weight twice (a 960 x 576 layer: 30 us for
 * one row, 37 for four, 63 for eight on a 2-core AMD EPYC). Here the lane does the same operations in
 * the same order, so every y has bitsandbytes' bits (tests/kernels/test_packed_4bit.py checks them
 * against its function). What differs is the tiling: a tile is NB blocks (2 NB vectors of 16 output
 * rows) by R input rows, each decoded weight vector serving every row, with 2 NB R accumulator
 * chains in registers (vdpbf16ps has a latency of several cycles, and a lane's additions must stay
 * in order, so independent chains come from more rows and more blocks, never from splitting k):
 * one row takes 4 blocks at a time, two rows 4, three or four rows 2, five to eight rows 1.
 * Threads split the tiles along n; more than 8 input rows go 8 at a time.
 *
 * The caller (LeanModel) wants fp32: y is stored as those bf16 values widened (exact), or added to an
 * fp32 y in place, as torch's `h + y.float()` would (the residual add).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

#define MAX_ROWS 8 /* input rows a tile */
#define MAX_NB 4 /* blocks of 32 output rows a tile */
#define GROUP_BYTES 32 /* bytes a pair of k in a block: 32 output rows x 2 weights x 4 bits */
#define OUT_STORE 0 /* output modes of spectui_packed_4bit: y = the result, y += the result */
#define OUT_ADD 1
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* y[r, b * 32 + j] for r < R, b < NB, j < 32, from the NB blocks at w (K / 2 groups each) and their
 * scales at `scales` (row stride N); x rows ldx elements apart, y rows ldy apart; lut: code[q] as
 * bf16 in lanes 0-15. R and NB are constants after inlining: the accumulators stay in registers. */
TARGET __attribute__((always_inline)) static inline void tile(
        const int R, const int NB, int64_t K, int64_t bs, const uint16_t *x, int64_t ldx, const uint8_t *w,
        const uint16_t *scales, int64_t N, __m512i lut, float *y, int64_t ldy, int mode) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const int64_t block_bytes = 32 * (K / 2);
    __m512 master[MAX_ROWS][2 * MAX_NB]; /* updated once a group: they may live in memory */
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < 2 * NB; c++) master[r][c] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += bs) { /* one group of bs weights along k */
        __m512 acc[MAX_ROWS][2 * MAX_NB];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int c = 0; c < 2 * NB; c++) acc[r][c] = _mm512_setzero_ps();
        for (int64_t p = k / 2; p < (k + bs) / 2; p++) { /* pairs (2p, 2p + 1), in order */
            __m512bh wv[2 * MAX_NB];
#pragma GCC unroll 4
            for (int b = 0; b < NB; b++) { /* the block's low nibbles: rows 0-15; high: rows 16-31 */
                const uint8_t *g = w + b * block_bytes + p * GROUP_BYTES;
                _mm_prefetch((const char *)g + 512, _MM_HINT_T0); /* never faults */
                const __m256i bytes = _mm256_loadu_si256((const __m256i *)g);
                const __m256i lo = _mm256_and_si256(bytes, low4), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
                wv[2 * b] = (__m512bh)_mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(lo), lut);
                wv[2 * b + 1] = (__m512bh)_mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(hi), lut);
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                uint32_t pair;
                __builtin_memcpy(&pair, x + r * ldx + 2 * p, 4);
                const __m512bh a = (__m512bh)_mm512_set1_epi32((int)pair);
#pragma GCC unroll 8
                for (int c = 0; c < 2 * NB; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], a, wv[c]);
            }
        }
#pragma GCC unroll 8
        for (int c = 0; c < 2 * NB; c++) { /* 16 scales: block c / 2's rows of half c % 2 */
            const __m256i s16 = _mm256_loadu_si256((const __m256i *)(scales + (k / bs) * N + c * 16));
            const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(s16), 16)); /* exact */
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) master[r][c] = _mm512_fmadd_ps(acc[r][c], s, master[r][c]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 8
        for (int c = 0; c < 2 * NB; c++) { /* bf16(master) widened (exact), stored or added */
            const __m256i b = (__m256i)_mm512_cvtneps_pbh(master[r][c]);
            const __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
            float *yr = y + r * ldy + c * 16;
            _mm512_storeu_ps(yr, mode == OUT_ADD ? _mm512_add_ps(_mm512_loadu_ps(yr), v) : v);
        }
}

#define TILE(R, NB) tile(R, NB, K, bs, xt, ldx, wb, sb, N, lut, yt, ldy, mode)
#define ROWS_CASES(NB)                                                                                          \
    switch (R) {                                                                                                \
    case 1: TILE(1, NB); break; case 2: TILE(2, NB); break; case 3: TILE(3, NB); break;                         \
    case 4: TILE(4, NB); break; case 5: TILE(5, NB); break; case 6: TILE(6, NB); break;                         \
    case 7: TILE(7, NB); break; default: TILE(8, NB); break;                                                    \
    }

/* Blocks b0 .. b0 + nb - 1 for rows m0 .. m0 + R - 1: tiles of 4, 2 or 1 blocks (the constants tile takes). */
TARGET static void blocks_for_rows(int64_t b0, int nb, int64_t m0, int R, int64_t N, int64_t K, int64_t bs,
                                   const uint16_t *x, int64_t ldx, const uint8_t *w, const uint16_t *absmax,
                                   __m512i lut, float *y, int64_t ldy, int mode) {
    const uint16_t *xt = x + m0 * ldx;
    for (int done = 0; done < nb;) {
        const int take = nb - done >= 4 ? 4 : nb - done >= 2 ? 2 : 1;
        const int64_t b = b0 + done;
        const uint8_t *wb = w + b * 32 * (K / 2);
        const uint16_t *sb = absmax + b * 32;
        float *yt = y + m0 * ldy + b * 32;
        if (take == 4) { ROWS_CASES(4) }
        else if (take == 2) { ROWS_CASES(2) }
        else { ROWS_CASES(1) }
        done += take;
    }
}

/* y [M, ldy] fp32 = (or +=, mode OUT_ADD) x [M, ldx] @ W^T rounded to bf16, x bf16 (as uint16), W in
 * the packed layout above with N % 32 == 0, K % bs == 0, bs even; lut16: code[q] as bf16,
 * q = 0..15. Returns 0. */
TARGET int spectui_packed_4bit(int64_t M, int64_t N, int64_t K, const uint16_t *x, int64_t ldx, const uint8_t *w,
                               const uint16_t *absmax, int64_t bs, const uint16_t *lut16, float *y, int64_t ldy,
                               int threads, int mode) {
    uint16_t table[32] = {0};
    for (int i = 0; i < 16; i++) table[i] = lut16[i];
    const __m512i lut = _mm512_loadu_si512(table);
    const int64_t blocks = N / 32;
    const int rows = M < MAX_ROWS ? (int)M : MAX_ROWS;
    const int per_tile = rows <= 2 ? 4 : rows <= 4 ? 2 : 1; /* blocks a tile: 8 to 16 accumulator chains */
    const int64_t tiles = (blocks + per_tile - 1) / per_tile;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : 1)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t b0 = t * per_tile;
        const int nb = blocks - b0 < per_tile ? (int)(blocks - b0) : per_tile; /* the last tile may be short */
        for (int64_t m0 = 0; m0 < M; m0 += MAX_ROWS)
            blocks_for_rows(b0, nb, m0, M - m0 < MAX_ROWS ? (int)(M - m0) : MAX_ROWS, N, K, bs, x, ldx, w, absmax,
                            lut, y, ldy, mode);
    }
    return 0;
}
