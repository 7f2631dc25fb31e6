// The 32-value formats' tile kernels, shared by ggml's layout (quant_gemm_q32.cpp) and speclm's
// interleaved one (quant_gemm_q32x16.cpp): each kernel takes its weights from a tile source, so both
// layouts run the same integer and float operations in the same order and give the same floats.
//
// A tile source `S` (one per layout and format) answers, for block b of the weight rows from rt:
//   S::avx2(rt, rows, b, wt, d, m):   8 rows;  wt[k] lane r = row r's values 4k..4k+3 as T::avx2 forms them
//   S::avx512(rt, rows, b, wt, d, m): 16 rows; the same as T::u8 forms them
// with d and m the rows' scales and mins as floats (rows past `rows`: zero values, d = m = 0).
// quant_gemm_q32.cpp's header comment explains the sums.
#pragma once

#include <immintrin.h>

#include <cstring>

#include "quant_gemm.h"

namespace speclm {
namespace q32 {

#define SPECLM_AVX2 "avx2,fma,f16c"
#define SPECLM_AVX512 "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"

constexpr int ROW_TILE = 64;  // activation rows whose accumulators live on the stack at once
constexpr int8_t IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Sixteen quant bytes as 32 values: value i in the low nibble of byte i, value i + 16 in its high one.
__attribute__((target(SPECLM_AVX2))) inline __m256i nibbles(const uint8_t *qs) {
    const __m128i q = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low), _mm_and_si128(q, low));
}

// 0x10 in byte i where bit i of the little-endian uint32 at qh is set (Q5_0's fifth bits).
__attribute__((target(SPECLM_AVX2))) inline __m256i fifth_bits(const uint8_t *qh) {
    uint32_t h;
    std::memcpy(&h, qh, 4);
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sel), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(0x10));
}

__attribute__((target(SPECLM_AVX2))) inline __m256i table16(const int8_t t[16], int add) {
    __m128i v = _mm_add_epi8(_mm_loadu_si128((const __m128i *)t), _mm_set1_epi8((char)add));
    return _mm256_broadcastsi128_si256(v);
}

// Each format: its block bytes; `avx2` its 32 values as AVX2 multiplies them (unsigned for the
// offset formats, signed for SIGNED ones), `u8` as VNNI does (always unsigned: value + OFF512);
// OFF: the offset AVX2 takes off with Σq; GROUP: how many vpmaddubsw results AVX2 may add in int16.
// Every block starts with d (f16); Q4_1's min m (f16) follows it.
struct Q40 {  // d, qs[16]: value = d * (n - 8)
    static constexpr size_t bytes = 18;
    static constexpr int OFF = 8, OFF512 = 8, GROUP = 8;
    static constexpr bool SIGNED = false, MIN = false;
    __attribute__((target(SPECLM_AVX2))) static inline __m256i avx2(const uint8_t *b) { return nibbles(b + 2); }
    __attribute__((target(SPECLM_AVX2))) static inline __m256i u8(const uint8_t *b) { return nibbles(b + 2); }
};

struct Q41 {  // d, m, qs[16]: value = d * n + m
    static constexpr size_t bytes = 20;
    static constexpr int OFF = 0, OFF512 = 0, GROUP = 8;
    static constexpr bool SIGNED = false, MIN = true;
    __attribute__((target(SPECLM_AVX2))) static inline __m256i avx2(const uint8_t *b) { return nibbles(b + 4); }
    __attribute__((target(SPECLM_AVX2))) static inline __m256i u8(const uint8_t *b) { return nibbles(b + 4); }
};

struct Q50 {  // d, qh[4], qs[16]: value = d * ((n | bit << 4) - 16), value i's fifth bit is bit i of qh
    static constexpr size_t bytes = 22;
    static constexpr int OFF = 16, OFF512 = 16, GROUP = 4;
    static constexpr bool SIGNED = false, MIN = false;
    __attribute__((target(SPECLM_AVX2))) static inline __m256i avx2(const uint8_t *b) {
        return _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2));
    }
    __attribute__((target(SPECLM_AVX2))) static inline __m256i u8(const uint8_t *b) { return avx2(b); }
};

struct Q80 {  // d, qs[32] int8: value = d * q
    static constexpr size_t bytes = 34;
    static constexpr int OFF = 0, OFF512 = 128, GROUP = 1;
    static constexpr bool SIGNED = true, MIN = false;
    __attribute__((target(SPECLM_AVX2))) static inline __m256i avx2(const uint8_t *b) {
        return _mm256_loadu_si256((const __m256i *)(b + 2));
    }
    __attribute__((target(SPECLM_AVX2))) static inline __m256i u8(const uint8_t *b) {
        return _mm256_xor_si256(avx2(b), _mm256_set1_epi8((char)0x80));
    }
};

struct IQ4NLB {  // d, qs[16]: value = d * IQ4NL[n]
    static constexpr size_t bytes = 18;
    static constexpr int OFF = 0, OFF512 = 128, GROUP = 1;
    static constexpr bool SIGNED = true, MIN = false;
    __attribute__((target(SPECLM_AVX2))) static inline __m256i avx2(const uint8_t *b) {
        return _mm256_shuffle_epi8(table16(IQ4NL, 0), nibbles(b + 2));
    }
    __attribute__((target(SPECLM_AVX2))) static inline __m256i u8(const uint8_t *b) {
        return _mm256_shuffle_epi8(table16(IQ4NL, 128), nibbles(b + 2));
    }
};

inline int32_t int_at(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// ---- AVX2: eight weight rows a tile -------------------------------------------------------------
template <typename T, typename S>
__attribute__((target(SPECLM_AVX2))) void gemm32_avx2(const S &src, int64_t r0, int64_t r1, const Activations32 &act,
                                                      int j0, int j1, float *dst, size_t dst_stride) {
    __m256 acc[ROW_TILE];
    const int n = j1 - j0;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t rt = r0; rt < r1; rt += 8) {
        const int rows = r1 - rt < 8 ? (int)(r1 - rt) : 8;
        for (int j = 0; j < n; ++j) acc[j] = _mm256_setzero_ps();
        for (int b = 0; b < act.nb; ++b) {
            __m256i wt[8], a[8];
            __m256 d, m;
            src.avx2(rt, rows, b, wt, d, m);
            if (T::SIGNED)
                for (int k = 0; k < 8; ++k) a[k] = _mm256_abs_epi8(wt[k]);
            const size_t at = (size_t)b * act.ny + j0;
            for (int j = 0; j < n; ++j) {
                const int8_t *q = act.qs + (at + j) * QK32;
                __m256i s32 = _mm256_setzero_si256(), s16 = _mm256_setzero_si256();
                for (int k = 0; k < 8; ++k) {
                    const __m256i y = _mm256_set1_epi32(int_at(q + 4 * k));
                    const __m256i p = T::SIGNED ? _mm256_maddubs_epi16(a[k], _mm256_sign_epi8(y, wt[k]))
                                                : _mm256_maddubs_epi16(wt[k], y);
                    s16 = _mm256_add_epi16(s16, p);
                    if ((k + 1) % T::GROUP == 0) {
                        s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, ones));
                        s16 = _mm256_setzero_si256();
                    }
                }
                const int sum = act.sums[at + j];
                if (T::OFF) s32 = _mm256_sub_epi32(s32, _mm256_set1_epi32(T::OFF * sum));
                const float dy = act.d[at + j];
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(d, _mm256_set1_ps(dy)), acc[j]);
                if (T::MIN) acc[j] = _mm256_fmadd_ps(m, _mm256_set1_ps(act.s[at + j]), acc[j]);
            }
        }
        for (int j = 0; j < n; ++j) {
            float *out = dst + (size_t)(j0 + j) * dst_stride + rt;
            if (rows == 8) {
                _mm256_storeu_ps(out, acc[j]);
            } else {
                alignas(32) float lanes[8];
                _mm256_store_ps(lanes, acc[j]);
                for (int r = 0; r < rows; ++r) out[r] = lanes[r];
            }
        }
    }
}

// ---- AVX-512 VNNI: sixteen weight rows a tile ---------------------------------------------------
template <typename T, typename S>
__attribute__((target(SPECLM_AVX512))) void gemm32_avx512(const S &src, int64_t r0, int64_t r1,
                                                          const Activations32 &act, int j0, int j1, float *dst,
                                                          size_t dst_stride) {
    __m512 acc[ROW_TILE];
    const int n = j1 - j0;
    for (int64_t rt = r0; rt < r1; rt += 16) {
        const int rows = r1 - rt < 16 ? (int)(r1 - rt) : 16;
        for (int j = 0; j < n; ++j) acc[j] = _mm512_setzero_ps();
        for (int b = 0; b < act.nb; ++b) {
            __m512i wt[8];
            __m512 d, m;
            src.avx512(rt, rows, b, wt, d, m);
            const size_t at = (size_t)b * act.ny + j0;
            for (int j = 0; j < n; ++j) {
                const int8_t *q = act.qs + (at + j) * QK32;
                __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
                for (int k = 0; k < 8; k += 2) {
                    s0 = _mm512_dpbusd_epi32(s0, wt[k], _mm512_set1_epi32(int_at(q + 4 * k)));
                    s1 = _mm512_dpbusd_epi32(s1, wt[k + 1], _mm512_set1_epi32(int_at(q + 4 * k + 4)));
                }
                __m512i s = _mm512_add_epi32(s0, s1);
                const int sum = act.sums[at + j];
                if (T::OFF512) s = _mm512_sub_epi32(s, _mm512_set1_epi32(T::OFF512 * sum));
                const float dy = act.d[at + j];
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(dy)), acc[j]);
                if (T::MIN) acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(act.s[at + j]), acc[j]);
            }
        }
        for (int j = 0; j < n; ++j) {
            float *out = dst + (size_t)(j0 + j) * dst_stride + rt;
            _mm512_mask_storeu_ps(out, (__mmask16)((1u << rows) - 1), acc[j]);
        }
    }
}

// ---- Q4_1 and Q8_0 in ggml's vec_dot order ---------------------------------------------------------
// ggml's plain kernels run Q4_1 through vec_dot (no multi-row path) and Q8_0 through vec_dot or, tiled,
// llamafile's tinyBLAS, which sums the same way: eight float partial sums per output, lane k summing
// over blocks d_w·d_x·(the int dot of values 4k..4k+3), added as ((0+4)+(2+6))+((1+5)+(3+7)), then (Q4_1)
// Σ m·s, a float running over blocks. In the transposed tile register k's lanes hold exactly lane k's
// int dots, so keeping eight accumulators per output gives ggml's floats bit for bit. Q4_1: SmolLM2
// amplifies any rounding difference past the probe's tolerance (docs/kernels.md#the-32-value-block-formats);
// Q8_0: a one-row forward runs ggml's code on it, so a row's logits do not then depend on the block
// verifying it (SmolLM2's tied head, the draft's embeddings and head). It costs eight float multiply-adds
// per block and row where the other formats take one.
template <typename V> struct OrderedAcc {
    V k[8], summs;
};

template <typename T>
__attribute__((target(SPECLM_AVX2))) inline __m256 ordered_finish(const OrderedAcc<__m256> &a) {
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a.k[0], a.k[4]), _mm256_add_ps(a.k[2], a.k[6])),
                                     _mm256_add_ps(_mm256_add_ps(a.k[1], a.k[5]), _mm256_add_ps(a.k[3], a.k[7])));
    return T::MIN ? _mm256_add_ps(sum, a.summs) : sum;
}

template <typename T, typename S>
__attribute__((target(SPECLM_AVX2))) void gemm32_ordered_avx2(const S &src, int64_t r0, int64_t r1,
                                                              const Activations32 &act, int j0, int j1, float *dst,
                                                              size_t dst_stride) {
    static thread_local OrderedAcc<__m256> acc[ROW_TILE];
    const int n = j1 - j0;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t rt = r0; rt < r1; rt += 8) {
        const int rows = r1 - rt < 8 ? (int)(r1 - rt) : 8;
        for (int j = 0; j < n; ++j) {
            for (int k = 0; k < 8; ++k) acc[j].k[k] = _mm256_setzero_ps();
            acc[j].summs = _mm256_setzero_ps();
        }
        for (int b = 0; b < act.nb; ++b) {
            __m256i wt[8], a[8];
            __m256 d, m;
            src.avx2(rt, rows, b, wt, d, m);
            if (T::SIGNED)
                for (int k = 0; k < 8; ++k) a[k] = _mm256_abs_epi8(wt[k]);
            const size_t at = (size_t)b * act.ny + j0;
            for (int j = 0; j < n; ++j) {
                const int8_t *q = act.qs + (at + j) * QK32;
                const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(act.d[at + j]));
                for (int k = 0; k < 8; ++k) {
                    const __m256i y = _mm256_set1_epi32(int_at(q + 4 * k));
                    const __m256i p16 = T::SIGNED ? _mm256_maddubs_epi16(a[k], _mm256_sign_epi8(y, wt[k]))
                                                  : _mm256_maddubs_epi16(wt[k], y);
                    const __m256i p = _mm256_madd_epi16(p16, ones);
                    acc[j].k[k] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(p), acc[j].k[k]);
                }
                if (T::MIN) acc[j].summs = _mm256_fmadd_ps(m, _mm256_set1_ps(act.s[at + j]), acc[j].summs);
            }
        }
        for (int j = 0; j < n; ++j) {
            alignas(32) float lanes[8];
            _mm256_store_ps(lanes, ordered_finish<T>(acc[j]));
            float *out = dst + (size_t)(j0 + j) * dst_stride + rt;
            for (int r = 0; r < rows; ++r) out[r] = lanes[r];
        }
    }
}

template <typename T>
__attribute__((target(SPECLM_AVX512))) inline __m512 ordered_finish(const OrderedAcc<__m512> &a) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a.k[0], a.k[4]), _mm512_add_ps(a.k[2], a.k[6])),
                                     _mm512_add_ps(_mm512_add_ps(a.k[1], a.k[5]), _mm512_add_ps(a.k[3], a.k[7])));
    return T::MIN ? _mm512_add_ps(sum, a.summs) : sum;
}

// -OFF · (q[4k] + .. + q[4k+3]) for k = 0..7: each lane's share of the +OFF shift, as vpdpbusd's start.
__attribute__((target(SPECLM_AVX2))) inline void shares(const int8_t *q, int off, int32_t out[8]) {
    const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)q));
    const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
    _mm256_storeu_si256((__m256i *)out, _mm256_mullo_epi32(s32, _mm256_set1_epi32(-off)));
}

template <typename T, typename S>
__attribute__((target(SPECLM_AVX512))) void gemm32_ordered_avx512(const S &src, int64_t r0, int64_t r1,
                                                                  const Activations32 &act, int j0, int j1,
                                                                  float *dst, size_t dst_stride) {
    static thread_local OrderedAcc<__m512> acc[ROW_TILE];
    const int n = j1 - j0;
    for (int64_t rt = r0; rt < r1; rt += 16) {
        const int rows = r1 - rt < 16 ? (int)(r1 - rt) : 16;
        for (int j = 0; j < n; ++j) {
            for (int k = 0; k < 8; ++k) acc[j].k[k] = _mm512_setzero_ps();
            acc[j].summs = _mm512_setzero_ps();
        }
        for (int b = 0; b < act.nb; ++b) {
            __m512i wt[8];
            __m512 d, m;
            src.avx512(rt, rows, b, wt, d, m);
            const size_t at = (size_t)b * act.ny + j0;
            for (int j = 0; j < n; ++j) {
                const int8_t *q = act.qs + (at + j) * QK32;
                const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(act.d[at + j]));
                int32_t start[8] = {};
                if (T::OFF512) shares(q, T::OFF512, start);
                for (int k = 0; k < 8; ++k) {
                    const __m512i p = _mm512_dpbusd_epi32(_mm512_set1_epi32(start[k]), wt[k],
                                                          _mm512_set1_epi32(int_at(q + 4 * k)));
                    acc[j].k[k] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(p), acc[j].k[k]);
                }
                if (T::MIN) acc[j].summs = _mm512_fmadd_ps(m, _mm512_set1_ps(act.s[at + j]), acc[j].summs);
            }
        }
        for (int j = 0; j < n; ++j)
            _mm512_mask_storeu_ps(dst + (size_t)(j0 + j) * dst_stride + rt, (__mmask16)((1u << rows) - 1),
                                  ordered_finish<T>(acc[j]));
    }
}

// gemm32's dispatch for one layout: `Tiles<T>` is its tile source for format T, made from (w, row_bytes).
// Q4_1 and Q8_0 run in ggml's order, the others in the one-multiply-add order. False: not a 32-value type.
template <template <typename> class Tiles>
bool run_gemm32(int format, const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, const Activations32 &act,
                float *dst, size_t dst_stride, Isa isa) {
    const bool wide = isa == Isa::AVX512_VNNI;
    auto go = [&](auto kernel, auto tiles) {
        for (int j0 = 0; j0 < act.ny; j0 += ROW_TILE) {
            int j1 = act.ny < j0 + ROW_TILE ? act.ny : j0 + ROW_TILE;
            kernel(tiles, r0, r1, act, j0, j1, dst, dst_stride);
        }
        return true;
    };
    switch (format) {  // the order of WeightType's Q4_0 .. IQ4_NL
        case 0: return go(wide ? gemm32_avx512<Q40, Tiles<Q40>> : gemm32_avx2<Q40, Tiles<Q40>>, Tiles<Q40>{w, row_bytes});
        case 1: return go(wide ? gemm32_ordered_avx512<Q41, Tiles<Q41>> : gemm32_ordered_avx2<Q41, Tiles<Q41>>,
                          Tiles<Q41>{w, row_bytes});
        case 2: return go(wide ? gemm32_avx512<Q50, Tiles<Q50>> : gemm32_avx2<Q50, Tiles<Q50>>, Tiles<Q50>{w, row_bytes});
        case 3: return go(wide ? gemm32_ordered_avx512<Q80, Tiles<Q80>> : gemm32_ordered_avx2<Q80, Tiles<Q80>>,
                          Tiles<Q80>{w, row_bytes});
        case 4: return go(wide ? gemm32_avx512<IQ4NLB, Tiles<IQ4NLB>> : gemm32_avx2<IQ4NLB, Tiles<IQ4NLB>>,
                          Tiles<IQ4NLB>{w, row_bytes});
        default: return false;
    }
}

}  // namespace q32
}  // namespace speclm
