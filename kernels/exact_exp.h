/* exact_attention.c's exponential, 8 float32 lanes at a time (included once, by exact_attention.c;
 * native.py's build key covers this file). Needs immintrin.h and ALWAYS_INLINE from its includer.
 *
 * Each lane is a function of its own argument alone, so a score's e has the same bits whichever
 * kernel computes it and whatever shares its vector. For x <= 0 (the kernels' s - m):
 *     n = nearest integer to x / ln 2,  r = x - n ln 2       (ln 2 in two parts, fused multiply-adds)
 *     e^r = 1 + r + r^2 p(r)                                  (Cephes' expf polynomial, |r| <= ln 2 / 2)
 *     e^x = e^r 2^n                                           (n added to the exponent's bits)
 * 0 below -87 (where 2^n would leave the normal range; e^-87 is 1.6e-38 of the row's largest term) and
 * in the lanes not in `live`. About 1 ulp from the true value over [-87, 0]. */
#pragma once

ALWAYS_INLINE __m256 exp8(__m256 x, __m256 live) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    live = _mm256_and_ps(live, _mm256_cmp_ps(x, lo, _CMP_GE_OQ)); /* NaN and x < -87: 0 */
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    const __m256i e2n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e2n)), live);
}
