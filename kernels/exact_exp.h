/* exact_attention.c's exponential: glibc's exp, bit for bit, 4 lanes at a time (included once, by
 * exact_attention.c; native.py's build key covers this file). Needs immintrin.h, math.h, stdint.h,
 * string.h and ALWAYS_INLINE from its includer. */
#pragma once

/* The C library's exp, 4 lanes at a time: glibc's algorithm (2^(k/128) from a table, a degree-5 polynomial)
 * with the fused operations of its FMA build; 1 + x for |x| < 2^-54 as glibc; the library itself for
 * |x| >= 512, infinities and NaN. Used only once spectui_exact_attention_init has found it equal to exp
 * bit for bit on a million arguments; otherwise every e comes from the library's exp. */
static uint64_t exp_tab[256]; /* 2^(k/128) = H (1 + T): T's bits, then H's bits - (k << 45) */
static int exp_vector;

ALWAYS_INLINE __m256d exp4_main(__m256d x) {
    const __m256d shift = _mm256_set1_pd(0x1.8p52);
    const __m256d z = _mm256_fmadd_pd(x, _mm256_set1_pd(0x1.71547652b82fep0 * 128), shift); /* x N / ln 2 + shift */
    const __m256i ki = _mm256_castpd_si256(z), idx = _mm256_slli_epi64(_mm256_and_si256(ki, _mm256_set1_epi64x(127)), 1);
    const __m256d kd = _mm256_sub_pd(z, shift);
    __m256d r = _mm256_fmadd_pd(kd, _mm256_set1_pd(-0x1.62e42fefa0000p-8), x);
    r = _mm256_fmadd_pd(kd, _mm256_set1_pd(-0x1.cf79abc9e3b3ap-47), r);
    const __m256d tail = _mm256_i64gather_pd((const double *)exp_tab, idx, 8);
    const __m256d scale = _mm256_castsi256_pd(_mm256_add_epi64(
        _mm256_i64gather_epi64((const long long *)exp_tab + 1, idx, 8), _mm256_slli_epi64(ki, 45)));
    const __m256d r2 = _mm256_mul_pd(r, r);
    const __m256d p23 = _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.555555555543cp-3), _mm256_set1_pd(0x1.ffffffffffdbdp-2));
    const __m256d p45 = _mm256_fmadd_pd(r, _mm256_set1_pd(0x1.1111167a4d017p-7), _mm256_set1_pd(0x1.55555cf172b91p-5));
    const __m256d tmp = _mm256_fmadd_pd(_mm256_mul_pd(r2, r2), p45, _mm256_fmadd_pd(p23, r2, _mm256_add_pd(r, tail)));
    return _mm256_fmadd_pd(scale, tmp, scale);
}

static inline __m256d exp4(__m256d x, __m256d live) { /* exp(x) in the lanes of live (all ones), 0 in the others */
    const __m256i top = _mm256_and_si256(_mm256_srli_epi64(_mm256_castpd_si256(x), 52), _mm256_set1_epi64x(0x7ff));
    const __m256d tiny = _mm256_castsi256_pd(_mm256_cmpgt_epi64(_mm256_set1_epi64x(0x3c9), top));
    const __m256d big = _mm256_castsi256_pd(_mm256_cmpgt_epi64(top, _mm256_set1_epi64x(0x407)));
    const int rare = _mm256_movemask_pd(_mm256_and_pd(big, live));
    __m256d y = _mm256_blendv_pd(exp4_main(x), _mm256_add_pd(x, _mm256_set1_pd(1.0)), tiny);
    if (rare) {
        double xs[4], ys[4];
        _mm256_storeu_pd(xs, x), _mm256_storeu_pd(ys, y);
        for (int i = 0; i < 4; i++)
            if (rare >> i & 1) ys[i] = exp(xs[i]);
        y = _mm256_loadu_pd(ys);
    }
    return _mm256_and_pd(y, live);
}

/* tab: exp_tab's values (exact_attention.py computes them). Returns 1 if exp4 is exp here (then it is used). */
int spectui_exact_attention_init(const uint64_t *tab) {
    memcpy(exp_tab, tab, sizeof exp_tab);
    uint64_t state = 0x9e3779b97f4a7c15ull;
    int same = 1;
    for (int64_t n = 0; n < (1 << 18) && same; n++) { /* x = s - m <= 0: in [-760, 0], [-40, 0], [-1, 0], tiny */
        double xs[4], ys[4];
        for (int i = 0; i < 4; i++) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            const double u = (double)(state >> 11) * 0x1p-53;
            xs[i] = n % 4 == 0 ? -760 * u : n % 4 == 1 ? -40 * u : n % 4 == 2 ? -u : (u - 0.5) * 0x1p-50;
        }
        _mm256_storeu_pd(ys, exp4(_mm256_loadu_pd(xs), _mm256_castsi256_pd(_mm256_set1_epi64x(-1))));
        for (int i = 0; i < 4; i++) same &= memcmp(&(double){exp(xs[i])}, ys + i, sizeof(double)) == 0;
    }
    return exp_vector = same;
}
