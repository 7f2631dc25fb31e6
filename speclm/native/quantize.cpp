// The activations of speclm's kernels: float rows quantised the way ggml quantises them for its own
// vec_dot (Q8_K for the k-quants, Q8_0/Q8_1 for the 32-value formats), into the block-major layouts
// quant_gemm.h declares. Every matmul pays this before any arithmetic, so the blocks are quantised with
// AVX2 where the CPU has it, the same float operations as the scalar code, bit for bit.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "quant_gemm.h"

#define SPECLM_AVX2 "avx2,fma,f16c"

namespace speclm {

// ggml's nearest_int: round half to even through the float mantissa (|v| < 2^22).
static inline int nearest_int(float v) {
    float f = v + 12582912.f;
    int i;
    std::memcpy(&i, &f, 4);
    return (i & 0x007fffff) - 0x00400000;
}


Activations Activations::in(void *mem, int ny, int64_t k) {
    Activations a;
    a.ny = ny;
    a.nb = (int)(k / QK);
    size_t blocks = (size_t)ny * a.nb;
    a.qs = (int8_t *)mem;
    a.bsums = (int16_t *)(a.qs + blocks * QK);
    a.d = (float *)(a.bsums + blocks * 16);
    return a;
}

// The largest of a register's eight floats, and the sum of its eight int32s.
__attribute__((target(SPECLM_AVX2))) static inline float hmax(__m256 m) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

__attribute__((target(SPECLM_AVX2))) static inline int hsum(__m256i t) {
    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    u = _mm_add_epi32(u, _mm_unpackhi_epi64(u, u));
    return _mm_cvtsi128_si32(_mm_add_epi32(u, _mm_shuffle_epi32(u, 1)));
}

// One block of quantize_rows with AVX2, the same float operations in the same order: |v| is maximal at
// the first index whose |v| equals the maximum, and _mm256_cvtps_epi32 rounds half to even (the default
// MXCSR) as nearest_int does for |v| <= 127.
__attribute__((target(SPECLM_AVX2))) static void quantize_block_avx2(const float *v, int8_t *q, int16_t *bs, float &d) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < QK; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
    const float amax = hmax(m);
    if (amax == 0) {
        std::memset(q, 0, QK);
        std::memset(bs, 0, 32);
        d = 0;
        return;
    }
    int first = 0;
    for (int i = 0; i < QK; i += 8) {
        const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)),
                                                         _mm256_set1_ps(amax), _CMP_EQ_OQ));
        if (hit) {
            first = i + __builtin_ctz(hit);
            break;
        }
    }
    const float iscale = -127.f / v[first];
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127), order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int g = 0; g < QK / 32; ++g) {
        __m256i n[4];
        for (int k = 0; k < 4; ++k)
            n[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(v + 32 * g + 8 * k))), top);
        for (int h2 = 0; h2 < 2; ++h2) {  // the two 16-value sums
            bs[2 * g + h2] = (int16_t)hsum(_mm256_add_epi32(n[2 * h2], n[2 * h2 + 1]));
        }
        const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
        _mm256_storeu_si256((__m256i *)(q + 32 * g), _mm256_permutevar8x32_epi32(b, order));
    }
    d = 1 / iscale;
}

// The same arithmetic as ggml's quantize_row_q8_K_ref, so the values match its vec_dot inputs.
void quantize_rows(const float *x, size_t x_stride, int j0, int j1, Activations &act) {
    static const bool avx2 = best_isa() != Isa::NONE;
    if (avx2) {
        for (int j = j0; j < j1; ++j)
            for (int b = 0; b < act.nb; ++b)
                quantize_block_avx2(x + (size_t)j * x_stride + (size_t)b * QK, act.qs + ((size_t)b * act.ny + j) * QK,
                                    act.bsums + ((size_t)b * act.ny + j) * 16, act.d[(size_t)b * act.ny + j]);
        return;
    }
    for (int j = j0; j < j1; ++j) {
        const float *row = x + (size_t)j * x_stride;
        for (int b = 0; b < act.nb; ++b) {
            const float *v = row + (size_t)b * QK;
            int8_t *q = act.qs + ((size_t)b * act.ny + j) * QK;
            int16_t *bs = act.bsums + ((size_t)b * act.ny + j) * 16;
            float max = 0, amax = 0;
            for (int i = 0; i < QK; ++i) {
                float ax = v[i] < 0 ? -v[i] : v[i];
                if (ax > amax) { amax = ax; max = v[i]; }
            }
            if (amax == 0) {
                std::memset(q, 0, QK);
                std::memset(bs, 0, 32);
                act.d[(size_t)b * act.ny + j] = 0;
                continue;
            }
            const float iscale = -127.f / max;
            for (int i = 0; i < QK; ++i) {
                int n = nearest_int(iscale * v[i]);
                q[i] = (int8_t)(n < 127 ? n : 127);
            }
            for (int g = 0; g < 16; ++g) {
                int sum = 0;
                for (int i = 0; i < 16; ++i) sum += q[g * 16 + i];
                bs[g] = (int16_t)sum;
            }
            act.d[(size_t)b * act.ny + j] = 1 / iscale;
        }
    }
}

Activations32 Activations32::in(void *mem, int ny, int64_t k) {
    Activations32 a;
    a.ny = ny;
    a.nb = (int)(k / QK32);
    size_t blocks = (size_t)ny * a.nb;
    a.qs = (int8_t *)mem;
    a.d = (float *)(a.qs + blocks * QK32);
    a.s = a.d + blocks;
    a.sums = (int16_t *)(a.s + blocks);
    return a;
}

// x rounded to f16 (to nearest even, as ggml's FP32_TO_FP16 on F16C), as a float.
__attribute__((target("f16c"))) static inline float to_half(float x) { return _cvtsh_ss(_cvtss_sh(x, 0)); }

// One block of quantize_rows32 with AVX2: the same float operations (a maximum is exact whatever the
// order; _mm256_cvtps_epi32 rounds half to even under the default MXCSR, as nearbyint does).
__attribute__((target(SPECLM_AVX2))) static void quantize_block32_avx2(const float *v, int8_t *q, float &d_out,
                                                                     float &s_out, int16_t &sum_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x[k] = _mm256_loadu_ps(v + 8 * k)));
    const float amax = hmax(m);
    const float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    __m256i n[4];
    for (int k = 0; k < 4; ++k)
        n[k] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x[k], vid)), hi), lo);
    const int sum = hsum(_mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3])));
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    d_out = to_half(d);
    s_out = to_half(d * (float)sum);
    sum_out = (int16_t)sum;
}

// ggml's x86 quantize_row_q8_0 / q8_1 in scalar float32: d = amax / 127 (stored as f16), id = 127 / amax,
// q = x * id rounded half to even (ggml's _mm256_round_ps; its reference code uses roundf), s = f16(d * Σq).
__attribute__((target("f16c"))) void quantize_rows32(const float *x, size_t x_stride, int j0, int j1,
                                                     Activations32 &act) {
    static const bool avx2 = best_isa() != Isa::NONE;
    if (avx2) {
        for (int j = j0; j < j1; ++j)
            for (int b = 0; b < act.nb; ++b) {
                const size_t at = (size_t)b * act.ny + j;
                quantize_block32_avx2(x + (size_t)j * x_stride + (size_t)b * QK32, act.qs + at * QK32, act.d[at],
                                      act.s[at], act.sums[at]);
            }
        return;
    }
    for (int j = j0; j < j1; ++j) {
        const float *row = x + (size_t)j * x_stride;
        for (int b = 0; b < act.nb; ++b) {
            const float *v = row + (size_t)b * QK32;
            const size_t at = (size_t)b * act.ny + j;
            int8_t *q = act.qs + at * QK32;
            float amax = 0;
            for (int i = 0; i < QK32; ++i) amax = std::fabs(v[i]) > amax ? std::fabs(v[i]) : amax;
            const float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.f;
            int sum = 0;
            for (int i = 0; i < QK32; ++i) {
                float r = std::nearbyint(v[i] * id);
                int n = (int)(r > 127.f ? 127.f : r < -127.f ? -127.f : r);
                q[i] = (int8_t)n;
                sum += n;
            }
            act.d[at] = to_half(d);
            act.s[at] = to_half(d * (float)sum);
            act.sums[at] = (int16_t)sum;
        }
    }
}

}  // namespace speclm
