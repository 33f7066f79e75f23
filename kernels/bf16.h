/* bf16 <-> fp32 and an 8-lane sum, shared by the C kernels that read bf16 (dense_cpu.c, glue_cpu.c,
 * head_layer.c) and nf4_cpu.c's sums. Needs immintrin.h, stdint.h and string.h from its includer;
 * native.py's build key covers this file. */
#pragma once

/* 8 bf16 -> fp32 (exact: the bf16 bits are the high half of the float's) */
static inline __m256 widen8(const uint16_t *p) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* fp32 -> bf16, round to nearest even as torch's .to(bfloat16); every NaN becomes torch's 0x7FC0 */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t rounded = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    return f != f ? (uint16_t)0x7FC0 : rounded; /* a select: the loops that call it vectorize */
}

/* the 8 lanes' sum, in this order: j + (j + 4), then j + (j + 2), then 0 + 1 */
static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
