// Multi-row matmul of ggml's 32-value block formats (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL, ggml's layout)
// with activations quantised per 32 values (Activations32).
//
// A 32-value block is one register of bytes, so a single row's block is too little work to amortise
// anything on; instead a tile of weight rows (8 on AVX2, 16 on AVX-512) is unpacked for block b and
// transposed so that register k holds values 4k..4k+3 of every row of the tile (one int32 lane per
// weight row). The dot with one activation row is then, per k, one multiply of that register by the
// row's four activation bytes broadcast: lane r accumulates row r's integer dot with no horizontal
// sums, and one float multiply-add per tile and activation row finishes the block. The tile is
// unpacked and transposed once per block for all activation rows of the forward.
//
// Offsets: weights are multiplied as unsigned bytes where possible and the offset is taken off with
// the activation block's sum of q (Σq): Q4_0 Σ(n·q) − 8Σq, Q5_0 Σ(n·q) − 16Σq; Q4_1 d·d_x·Σ(n·q) + m·s
// with s ≈ d_x·Σq as ggml's Q8_1 keeps it;
// on AVX-512 VNNI (vpdpbusd: u8 × s8 summed in int32, no saturation) also Q8_0 and IQ4_NL, shifted
// by +128: Σ((w+128)·q) − 128Σq. AVX2's vpmaddubsw sums pairs in int16 with saturation, so there
// Q8_0 and IQ4_NL stay signed and use the sign trick (|w| × sign(q, w); a pair is at most
// 2·128·127 = 32512), and the nibble formats sum up to 8 (Q4: 2·15·127 each) or 4 (Q5: 2·31·127)
// products in int16 before widening. Every integer sum is exact.
// Q4_1 and Q8_0 keep ggml's vec_dot float order as well (gemm32_ordered_*): their outputs are ggml's bit for bit.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "quant_gemm.h"

namespace speclm {
namespace {

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

// The f16 at p as a uint16.
inline uint16_t half_at(const uint8_t *p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return h;
}

// One block of up to `n` weight rows of a tile (rows past n: zero values, d = m = 0), unpacked into
// v[] (U8: as T::u8 does, else as T::avx2), with their d and m as f16.
template <typename T, int RT, bool U8>
__attribute__((target(SPECLM_AVX2))) inline void tile_rows(const uint8_t *w, size_t row_bytes, int n, int b,
                                                           __m256i v[RT], uint16_t d[RT], uint16_t m[RT]) {
    for (int r = 0; r < RT; ++r) {
        if (r < n) {
            const uint8_t *blk = w + r * row_bytes + (size_t)b * T::bytes;
            _mm_prefetch((const char *)blk + 1024, _MM_HINT_T0);
            v[r] = U8 ? T::u8(blk) : T::avx2(blk);
            d[r] = half_at(blk);
            m[r] = T::MIN ? half_at(blk + 2) : 0;
        } else {
            v[r] = _mm256_setzero_si256();
            d[r] = m[r] = 0;
        }
    }
}

// 8x8 transpose of int32s: out[k] lane r = v[r] lane k.
__attribute__((target(SPECLM_AVX2))) inline void transpose8(const __m256i v[8], __m256i out[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int k = 0; k < 4; ++k) {  // u[k]: rows 0..3's ints k and k + 4; u[k + 4]: rows 4..7's
        out[k] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x20);
        out[k + 4] = _mm256_permute2x128_si256(u[k], u[k + 4], 0x31);
    }
}

inline int32_t int_at(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// ---- AVX2: eight weight rows a tile -------------------------------------------------------------
template <typename T>
__attribute__((target(SPECLM_AVX2))) void gemm32_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                      const Activations32 &act, int j0, int j1, float *dst,
                                                      size_t dst_stride) {
    __m256 acc[ROW_TILE];
    const int n = j1 - j0;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t rt = r0; rt < r1; rt += 8) {
        const int rows = r1 - rt < 8 ? (int)(r1 - rt) : 8;
        for (int j = 0; j < n; ++j) acc[j] = _mm256_setzero_ps();
        const uint8_t *tile = w + rt * row_bytes;
        for (int b = 0; b < act.nb; ++b) {
            __m256i v[8], wt[8], a[8];
            uint16_t dh[8], mh[8];
            tile_rows<T, 8, false>(tile, row_bytes, rows, b, v, dh, mh);
            transpose8(v, wt);
            if (T::SIGNED)
                for (int k = 0; k < 8; ++k) a[k] = _mm256_abs_epi8(wt[k]);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));
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
// out[k] lane r = row r's ints k (rows 0..7 from lo[r], rows 8..15 from hi: z[i] = [v[i] | v[i + 8]]).
__attribute__((target(SPECLM_AVX512))) inline void transpose16x8(const __m256i v[16], __m512i out[8]) {
    __m512i z[8], t[8], u[8];
    for (int i = 0; i < 8; ++i) z[i] = _mm512_inserti64x4(_mm512_castsi256_si512(v[i]), v[i + 8], 1);
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    for (int h = 0; h < 2; ++h) {
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    // u[k] 128-bit lanes: rows 0..3 int k, rows 0..3 int k+4, rows 8..11 int k, rows 8..11 int k+4;
    // u[k + 4] the same for rows 4..7 and 12..15
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int k = 0; k < 4; ++k) {
        out[k] = _mm512_permutex2var_epi64(u[k], lo, u[k + 4]);
        out[k + 4] = _mm512_permutex2var_epi64(u[k], hi, u[k + 4]);
    }
}

template <typename T>
__attribute__((target(SPECLM_AVX512))) void gemm32_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                          const Activations32 &act, int j0, int j1, float *dst,
                                                          size_t dst_stride) {
    __m512 acc[ROW_TILE];
    const int n = j1 - j0;
    for (int64_t rt = r0; rt < r1; rt += 16) {
        const int rows = r1 - rt < 16 ? (int)(r1 - rt) : 16;
        for (int j = 0; j < n; ++j) acc[j] = _mm512_setzero_ps();
        const uint8_t *tile = w + rt * row_bytes;
        for (int b = 0; b < act.nb; ++b) {
            __m256i v[16];
            __m512i wt[8];
            uint16_t dh[16], mh[16];
            tile_rows<T, 16, true>(tile, row_bytes, rows, b, v, dh, mh);
            transpose16x8(v, wt);
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
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

template <typename T>
__attribute__((target(SPECLM_AVX2))) void gemm32_ordered_avx2(const uint8_t *w, size_t row_bytes, int64_t r0,
                                                              int64_t r1, const Activations32 &act, int j0, int j1,
                                                              float *dst, size_t dst_stride) {
    static thread_local OrderedAcc<__m256> acc[ROW_TILE];
    const int n = j1 - j0;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t rt = r0; rt < r1; rt += 8) {
        const int rows = r1 - rt < 8 ? (int)(r1 - rt) : 8;
        for (int j = 0; j < n; ++j) {
            for (int k = 0; k < 8; ++k) acc[j].k[k] = _mm256_setzero_ps();
            acc[j].summs = _mm256_setzero_ps();
        }
        const uint8_t *tile = w + rt * row_bytes;
        for (int b = 0; b < act.nb; ++b) {
            __m256i v[8], wt[8], a[8];
            uint16_t dh[8], mh[8];
            tile_rows<T, 8, false>(tile, row_bytes, rows, b, v, dh, mh);
            transpose8(v, wt);
            if (T::SIGNED)
                for (int k = 0; k < 8; ++k) a[k] = _mm256_abs_epi8(wt[k]);
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
            const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));
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

// The four bytes at p summed (a lane's share of an activation block's Σq, for the +128 shift).
inline int sum4(const int8_t *p) { return p[0] + p[1] + p[2] + p[3]; }

template <typename T>
__attribute__((target(SPECLM_AVX512))) void gemm32_ordered_avx512(const uint8_t *w, size_t row_bytes, int64_t r0,
                                                                  int64_t r1, const Activations32 &act, int j0,
                                                                  int j1, float *dst, size_t dst_stride) {
    static thread_local OrderedAcc<__m512> acc[ROW_TILE];
    const int n = j1 - j0;
    for (int64_t rt = r0; rt < r1; rt += 16) {
        const int rows = r1 - rt < 16 ? (int)(r1 - rt) : 16;
        for (int j = 0; j < n; ++j) {
            for (int k = 0; k < 8; ++k) acc[j].k[k] = _mm512_setzero_ps();
            acc[j].summs = _mm512_setzero_ps();
        }
        const uint8_t *tile = w + rt * row_bytes;
        for (int b = 0; b < act.nb; ++b) {
            __m256i v[16];
            __m512i wt[8];
            uint16_t dh[16], mh[16];
            tile_rows<T, 16, true>(tile, row_bytes, rows, b, v, dh, mh);
            transpose16x8(v, wt);
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
            const size_t at = (size_t)b * act.ny + j0;
            for (int j = 0; j < n; ++j) {
                const int8_t *q = act.qs + (at + j) * QK32;
                const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(act.d[at + j]));
                for (int k = 0; k < 8; ++k) {
                    __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wt[k], _mm512_set1_epi32(int_at(q + 4 * k)));
                    if (T::OFF512) p = _mm512_sub_epi32(p, _mm512_set1_epi32(T::OFF512 * sum4(q + 4 * k)));
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

}  // namespace

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
__attribute__((target("f16c"))) inline float to_half(float x) { return _cvtsh_ss(_cvtss_sh(x, 0)); }

// ggml's x86 quantize_row_q8_0 / q8_1 in scalar float32: d = amax / 127 (stored as f16), id = 127 / amax,
// q = x * id rounded half to even (ggml's _mm256_round_ps; its reference code uses roundf), s = f16(d * Σq).
// One block of quantize_rows32 with AVX2: the same float operations (a maximum is exact whatever the
// order; _mm256_cvtps_epi32 rounds half to even under the default MXCSR, as nearbyint does).
__attribute__((target(SPECLM_AVX2))) void quantize_block32_avx2(const float *v, int8_t *q, float &d_out, float &s_out,
                                                              int16_t &sum_out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], m = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x[k] = _mm256_loadu_ps(v + 8 * k)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
    __m256i n[4];
    for (int k = 0; k < 4; ++k)
        n[k] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(x[k], vid)), hi), lo);
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    u = _mm_add_epi32(u, _mm_unpackhi_epi64(u, u));
    const int sum = _mm_cvtsi128_si32(_mm_add_epi32(u, _mm_shuffle_epi32(u, 1)));
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
    _mm256_storeu_si256((__m256i *)q, _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    d_out = to_half(d);
    s_out = to_half(d * (float)sum);
    sum_out = (int16_t)sum;
}

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

size_t block_bytes32(WeightType type) {
    switch (type) {
        case WeightType::Q4_0: return Q40::bytes;
        case WeightType::Q4_1: return Q41::bytes;
        case WeightType::Q5_0: return Q50::bytes;
        case WeightType::Q8_0: return Q80::bytes;
        case WeightType::IQ4_NL: return IQ4NLB::bytes;
        default: return 0;
    }
}

void gemm32(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1, const Activations32 &act,
            float *dst, size_t dst_stride, Isa isa) {
    using Kernel = void (*)(const uint8_t *, size_t, int64_t, int64_t, const Activations32 &, int, int, float *, size_t);
    const bool wide = isa == Isa::AVX512_VNNI;
    Kernel kernel;
    switch (type) {
        case WeightType::Q4_0: kernel = wide ? gemm32_avx512<Q40> : gemm32_avx2<Q40>; break;
        case WeightType::Q4_1: kernel = wide ? gemm32_ordered_avx512<Q41> : gemm32_ordered_avx2<Q41>; break;
        case WeightType::Q5_0: kernel = wide ? gemm32_avx512<Q50> : gemm32_avx2<Q50>; break;
        case WeightType::Q8_0: kernel = wide ? gemm32_ordered_avx512<Q80> : gemm32_ordered_avx2<Q80>; break;
        case WeightType::IQ4_NL: kernel = wide ? gemm32_avx512<IQ4NLB> : gemm32_avx2<IQ4NLB>; break;
        default: return;
    }
    for (int j0 = 0; j0 < act.ny; j0 += ROW_TILE) {
        int j1 = act.ny < j0 + ROW_TILE ? act.ny : j0 + ROW_TILE;
        kernel(w, w_row_bytes, r0, r1, act, j0, j1, dst, dst_stride);
    }
}

}  // namespace speclm
