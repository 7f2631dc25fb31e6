// Multi-row k-quant matmul: unpack a weight block once, then dot it with every activation row.
//
// A weight block (256 values) is unpacked into registers in one shape whatever its type: its
// values as unsigned bytes in activation order, an int16 scale for each pair of products, and
// the factor of the activations' 16-value sums that carries the block's offset (Q4_K: its mins,
// Q6_K: -32 times its scales). The dot with one activation row is then, per 32 values,
// maddubs (u8 x s8 -> pairs summed into int16) and madd with the scales (-> int32), exact
// integer arithmetic, and two float multiply-adds per block. ggml's kernels re-unpack the
// weights for each row (vec_dot) or each 4-row pass; here the unpacking is paid once per block
// for all rows of the forward, which is what makes 2..64 rows cheap (docs/kernels.md).
#include "quant_gemm.h"

#include <cpuid.h>
#include <immintrin.h>

#include <cstring>

namespace speclm {
namespace {

// ---- AVX2 ------------------------------------------------------------------------------------
// A block, unpacked: eight registers of 32 values (unsigned, in activation order), the int16 scale of
// each of maddubs' pair sums for those 32 values (in memory: the 16 registers AVX2 has run out), the
// factor of each 16-value activation sum, and the block's two float scales.
#define SPECLM_AVX2 "avx2,fma,f16c"

struct alignas(64) Scales2 {
    __m256i s[8];
};

// d and the second f16 of a block (Q4_K: dmin), as floats.
__attribute__((target(SPECLM_AVX2))) inline __m128 two_halves(const uint8_t *p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)v));
}

// Q4_K's twelve scale bytes as 16 bytes: the eight 6-bit scales, then the eight 6-bit mins.
inline __m128i q4_k_scales_mins(const uint8_t *sc) {
    uint32_t u[4];
    std::memcpy(u, sc, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    u[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    const uint32_t mins_lo = u[1] & m6;
    u[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    u[2] = mins_lo;
    u[0] &= m6;
    return _mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]);  // scales 0..3, 4..7, mins 0..3, 4..7
}

struct Q4K {
    static constexpr size_t bytes = 144;
    // Q4_K block: d, dmin (f16), scales[12], qs[128]: values 64c..64c+31 in the low nibbles of
    // qs[32c..32c+31], 64c+32.. in the high ones; value = d * scale[v / 32] * q - dmin * min[v / 32].
    __attribute__((target(SPECLM_AVX2))) static inline void avx2(const uint8_t *blk, __m256i w[8], Scales2 &s,
                                                                 __m256i &bm, float &d, float &cb) {
        const __m256i low = _mm256_set1_epi8(0x0F);
        for (int c = 0; c < 4; ++c) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c));
            w[2 * c] = _mm256_and_si256(q, low);
            w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
        }
        __m256i all = _mm256_cvtepu8_epi16(q4_k_scales_mins(blk + 4));  // 8 scales, 8 mins, int16
        __m256i scales = _mm256_permute2x128_si256(all, all, 0x00), mins = _mm256_permute2x128_si256(all, all, 0x11);
        for (int k = 0; k < 8; ++k)
            s.s[k] = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((2 * k) | ((2 * k + 1) << 8))));
        const __m256i pairs = _mm256_setr_epi8(0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7,
                                               8, 9, 8, 9, 10, 11, 10, 11, 12, 13, 12, 13, 14, 15, 14, 15);
        bm = _mm256_shuffle_epi8(mins, pairs);  // lane 0: mins 0..3 doubled, lane 1: mins 4..7 doubled
        const __m128 dd = two_halves(blk);
        d = _mm_cvtss_f32(dd);
        cb = -_mm_cvtss_f32(_mm_movehdup_ps(dd));
    }
};

struct Q6K {
    static constexpr size_t bytes = 210;
    // Q6_K block: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8, one per 16 values), d (f16).
    // Values 128n + 32g + l (g = 0..3, l = 0..31) take the low (g = 0, 1) or high (g = 2, 3) nibble of
    // ql[64n + 32(g & 1) + l] and bits 2g..2g+1 of qh[32n + l]; value = d * scale[v / 16] * (q - 32).
    __attribute__((target(SPECLM_AVX2))) static inline void avx2(const uint8_t *blk, __m256i w[8], Scales2 &s,
                                                                 __m256i &bm, float &d, float &cb) {
        const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03);
        for (int n = 0; n < 2; ++n) {
            const uint8_t *ql = blk + 64 * n, *qh = blk + 128 + 32 * n;
            __m256i a = _mm256_loadu_si256((const __m256i *)ql), b = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            w[4 * n + 0] = _mm256_or_si256(_mm256_and_si256(a, low4), _mm256_slli_epi16(_mm256_and_si256(h, low2), 4));
            w[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(b, low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), low2), 4));
            w[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), low2), 4));
            w[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b, 4), low4),
                                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), low2), 4));
        }
        __m128i sc8 = _mm_loadu_si128((const __m128i *)(blk + 192));
        bm = _mm256_cvtepi8_epi16(sc8);
        for (int k = 0; k < 8; ++k)  // lanes: scale 2k for the first 16 values, 2k + 1 for the next 16
            s.s[k] = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                sc8, _mm_setr_epi8(2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k, 2 * k + 1, 2 * k + 1,
                                   2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1, 2 * k + 1)));
        d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(blk[208] | (blk[209] << 8))));
        cb = -32.0f * d;
    }
};

__attribute__((target(SPECLM_AVX2))) inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// One block's contribution to a row's float accumulator: dy * (d * isum + cb * bias).
__attribute__((target(SPECLM_AVX2))) inline __m256 block_term(__m256i isum, __m256i bias, __m256 vd, __m256 vcb,
                                                              const float *dy, __m256 acc) {
    __m256 t = _mm256_fmadd_ps(vcb, _mm256_cvtepi32_ps(bias), _mm256_mul_ps(vd, _mm256_cvtepi32_ps(isum)));
    return _mm256_fmadd_ps(_mm256_broadcast_ss(dy), t, acc);
}

constexpr int ROW_TILE = 64;  // activation rows whose accumulators live on the stack at once
constexpr int PREFETCH = 2048;  // bytes of weights requested ahead of the block being unpacked

// Ask for the weights PREFETCH bytes ahead: a block's unpacking and its rows' dots are a long chain of
// work, so the out-of-order window alone runs only two or three blocks ahead of the loads, and weights
// streamed from memory (all but the smallest matrices) would wait on each cache miss in turn.
inline void prefetch_ahead(const uint8_t *block) {
    const char *p = (const char *)block + PREFETCH;
    _mm_prefetch(p, _MM_HINT_T0);
    _mm_prefetch(p + 64, _MM_HINT_T0);
    _mm_prefetch(p + 128, _MM_HINT_T0);
    _mm_prefetch(p + 192, _MM_HINT_T0);
}

// One unpacked weight block dotted with activation rows j0..j0+n-1 of block b, into acc[0..n).
__attribute__((target(SPECLM_AVX2))) inline void dot_rows_avx2(const __m256i wv[8], const Scales2 &s, __m256i bm,
                                                              float d, float cb, const Activations &act, int b,
                                                              int j0, int n, __m256 *acc) {
    const __m256 vd = _mm256_set1_ps(d), vcb = _mm256_set1_ps(cb);
    const __m256i *y = (const __m256i *)act.row_qs(b, j0);
    const __m256i *bs = (const __m256i *)act.row_bsums(b, j0);
    const float *dy = &act.d[(size_t)b * act.ny + j0];
    for (int j = 0; j < n; ++j, y += 8) {
        __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[0], _mm256_loadu_si256(y + 0)), s.s[0]);
        __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[1], _mm256_loadu_si256(y + 1)), s.s[1]);
        __m256i p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[2], _mm256_loadu_si256(y + 2)), s.s[2]);
        __m256i p3 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[3], _mm256_loadu_si256(y + 3)), s.s[3]);
        __m256i p4 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[4], _mm256_loadu_si256(y + 4)), s.s[4]);
        __m256i p5 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[5], _mm256_loadu_si256(y + 5)), s.s[5]);
        __m256i p6 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[6], _mm256_loadu_si256(y + 6)), s.s[6]);
        __m256i p7 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[7], _mm256_loadu_si256(y + 7)), s.s[7]);
        __m256i isum = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)),
                                        _mm256_add_epi32(_mm256_add_epi32(p4, p5), _mm256_add_epi32(p6, p7)));
        __m256i bias = _mm256_madd_epi16(_mm256_loadu_si256(bs + j), bm);
        acc[j] = block_term(isum, bias, vd, vcb, dy + j, acc[j]);
    }
}

template <typename T>
__attribute__((target(SPECLM_AVX2))) void gemm_avx2(const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1,
                                                    const Activations &act, int j0, int j1, float *dst,
                                                    size_t dst_stride) {
    Scales2 s;
    __m256 acc[ROW_TILE];
    const int n = j1 - j0;
    for (int64_t r = r0; r < r1; ++r) {
        for (int j = 0; j < n; ++j) acc[j] = _mm256_setzero_ps();
        const uint8_t *row = w + r * w_row_bytes;
        for (int b = 0; b < act.nb; ++b) {
            __m256i wv[8], bm;
            float d, cb;
            prefetch_ahead(row + b * T::bytes);
            T::avx2(row + b * T::bytes, wv, s, bm, d, cb);
            dot_rows_avx2(wv, s, bm, d, cb, act, b, j0, n, acc);
        }
        for (int j = 0; j < n; ++j) dst[(size_t)(j0 + j) * dst_stride + r] = hsum(acc[j]);
    }
}

// ---- AVX-512 VNNI: 64 values a register, the scale multiply-add fused (vpdpwssd), 32 registers ------
#define SPECLM_AVX512 "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"

struct Block512 {
    __m512i w[4];  // values 64c..64c+63
    __m512i s[4];  // the int16 scale of each pair sum of w[c]
    __m256i bm;
    __m256 vd, vcb;
};

__attribute__((target(SPECLM_AVX512))) inline void unpack512(const uint8_t *blk, Q4K, Block512 &u) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);  // [0 | 4]
    for (int c = 0; c < 4; ++c) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * c));
        u.w[c] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(q), shift), low);
    }
    __m256i all = _mm256_cvtepu8_epi16(q4_k_scales_mins(blk + 4));  // 8 scales, 8 mins
    __m512i all512 = _mm512_castsi256_si512(all);
    for (int c = 0; c < 4; ++c) {  // [scale 2c x16 | scale 2c+1 x16]
        __m512i idx = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 1)), 1);
        u.s[c] = _mm512_permutexvar_epi16(idx, all512);
    }
    const __m256i pairs = _mm256_setr_epi16(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
    u.bm = _mm256_permutexvar_epi16(pairs, all);
    const __m128 dd = two_halves(blk);
    u.vd = _mm256_set1_ps(_mm_cvtss_f32(dd));
    u.vcb = _mm256_set1_ps(-_mm_cvtss_f32(_mm_movehdup_ps(dd)));
}

__attribute__((target(SPECLM_AVX512))) inline void unpack512(const uint8_t *blk, Q6K, Block512 &u) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), low2 = _mm512_set1_epi8(0x03);
    const __m512i sh_even = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);            // [0 | 2]
    const __m512i sh_odd = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);               // [4 | 6]
    for (int n = 0; n < 2; ++n) {
        __m512i ql = _mm512_loadu_si512(blk + 64 * n);  // [ql 64n..64n+31 | 64n+32..64n+63]
        __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n)));
        __m512i hi_even = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_even), low2), 4);
        __m512i hi_odd = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_odd), low2), 4);
        u.w[2 * n] = _mm512_or_si512(_mm512_and_si512(ql, low4), hi_even);
        u.w[2 * n + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi_odd);
    }
    __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(blk + 192)));
    u.bm = sc;
    __m512i sc512 = _mm512_castsi256_si512(sc);
    for (int c = 0; c < 4; ++c) {  // values 64c.. take scales 4c, 4c+1, 4c+2, 4c+3, 16 values each
        __m512i idx = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_setr_m128i(_mm_set1_epi16((short)(4 * c)), _mm_set1_epi16((short)(4 * c + 1)))),
            _mm256_setr_m128i(_mm_set1_epi16((short)(4 * c + 2)), _mm_set1_epi16((short)(4 * c + 3))), 1);
        u.s[c] = _mm512_permutexvar_epi16(idx, sc512);
    }
    float d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(blk[208] | (blk[209] << 8))));
    u.vd = _mm256_set1_ps(d);
    u.vcb = _mm256_set1_ps(-32.0f * d);
}

__attribute__((target(SPECLM_AVX512))) inline __m256 row_block512(const Block512 &u, const int8_t *y,
                                                                  const int16_t *bsums, const float *dy, __m256 acc) {
    __m512i a = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(u.w[0], _mm512_loadu_si512(y)), u.s[0]);
    __m512i c = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_maddubs_epi16(u.w[1], _mm512_loadu_si512(y + 64)), u.s[1]);
    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(u.w[2], _mm512_loadu_si512(y + 128)), u.s[2]);
    c = _mm512_dpwssd_epi32(c, _mm512_maddubs_epi16(u.w[3], _mm512_loadu_si512(y + 192)), u.s[3]);
    a = _mm512_add_epi32(a, c);
    __m256i isum = _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1));
    __m256i bias = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bsums), u.bm);
    __m256 t = _mm256_fmadd_ps(u.vcb, _mm256_cvtepi32_ps(bias), _mm256_mul_ps(u.vd, _mm256_cvtepi32_ps(isum)));
    return _mm256_fmadd_ps(_mm256_broadcast_ss(dy), t, acc);
}

// Two weight rows a pass: each activation row's loads serve both.
template <typename T>
__attribute__((target(SPECLM_AVX512))) void gemm_avx512(const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1,
                                                        const Activations &act, int j0, int j1, float *dst,
                                                        size_t dst_stride) {
    __m256 acc[2][ROW_TILE];
    const int n = j1 - j0;
    int64_t r = r0;
    for (; r + 1 < r1; r += 2) {
        for (int j = 0; j < n; ++j) acc[0][j] = acc[1][j] = _mm256_setzero_ps();
        const uint8_t *row0 = w + r * w_row_bytes, *row1 = row0 + w_row_bytes;
        for (int b = 0; b < act.nb; ++b) {
            Block512 u0, u1;
            prefetch_ahead(row0 + b * T::bytes);
            prefetch_ahead(row1 + b * T::bytes);
            unpack512(row0 + b * T::bytes, T{}, u0);
            unpack512(row1 + b * T::bytes, T{}, u1);
            const int8_t *y = act.row_qs(b, j0);
            const int16_t *bs = act.row_bsums(b, j0);
            const float *dy = &act.d[(size_t)b * act.ny + j0];
            for (int j = 0; j < n; ++j) {
                acc[0][j] = row_block512(u0, y + QK * j, bs + 16 * j, dy + j, acc[0][j]);
                acc[1][j] = row_block512(u1, y + QK * j, bs + 16 * j, dy + j, acc[1][j]);
            }
        }
        for (int j = 0; j < n; ++j) {
            dst[(size_t)(j0 + j) * dst_stride + r] = hsum(acc[0][j]);
            dst[(size_t)(j0 + j) * dst_stride + r + 1] = hsum(acc[1][j]);
        }
    }
    for (; r < r1; ++r) {
        for (int j = 0; j < n; ++j) acc[0][j] = _mm256_setzero_ps();
        const uint8_t *row = w + r * w_row_bytes;
        for (int b = 0; b < act.nb; ++b) {
            Block512 u;
            prefetch_ahead(row + b * T::bytes);
            unpack512(row + b * T::bytes, T{}, u);
            const int8_t *y = act.row_qs(b, j0);
            const int16_t *bs = act.row_bsums(b, j0);
            const float *dy = &act.d[(size_t)b * act.ny + j0];
            for (int j = 0; j < n; ++j) acc[0][j] = row_block512(u, y + QK * j, bs + 16 * j, dy + j, acc[0][j]);
        }
        for (int j = 0; j < n; ++j) dst[(size_t)(j0 + j) * dst_stride + r] = hsum(acc[0][j]);
    }
}

}  // namespace

size_t weight_block_bytes(WeightType type) {
    if (is_q32(type)) return block_bytes32(type);
    return type == WeightType::Q6_K || type == WeightType::Q6_K_X16 ? Q6K::bytes : Q4K::bytes;
}

void gemm(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1, const Activations &act,
          float *dst, size_t dst_stride, Isa isa) {
    if (is_k16(type)) return gemm_k16(type, w, w_row_bytes, r0, r1, act, dst, dst_stride, isa);
    using Kernel = void (*)(const uint8_t *, size_t, int64_t, int64_t, const Activations &, int, int, float *, size_t);
    const bool wide = isa == Isa::AVX512_VNNI;
    Kernel kernel = type == WeightType::Q4_K ? (wide ? gemm_avx512<Q4K> : gemm_avx2<Q4K>)
                                             : (wide ? gemm_avx512<Q6K> : gemm_avx2<Q6K>);
    for (int j0 = 0; j0 < act.ny; j0 += ROW_TILE) {
        int j1 = act.ny < j0 + ROW_TILE ? act.ny : j0 + ROW_TILE;
        kernel(w, w_row_bytes, r0, r1, act, j0, j1, dst, dst_stride);
    }
}

Isa best_isa() {
    __builtin_cpu_init();
    unsigned a, b, c, d;
    bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c))
        return Isa::NONE;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return Isa::AVX512_VNNI;
    return Isa::AVX2;
}

}  // namespace speclm
