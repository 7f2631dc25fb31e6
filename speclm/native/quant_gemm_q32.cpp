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
// The kernels themselves are in quant_gemm_q32_kernels.h (shared with the interleaved layout,
// quant_gemm_q32x16.cpp); this file holds ggml's layout's tile source and
// the dispatch.
#include <cmath>
#include <cstring>

#include "quant_gemm_q32_kernels.h"

namespace speclm {
namespace {

using namespace q32;

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

// ggml's layout: row r's block b at w + r * row_bytes + b * T::bytes, unpacked and transposed per tile.
template <typename T> struct PlainTiles {
    const uint8_t *w;
    size_t row_bytes;

    __attribute__((target(SPECLM_AVX2))) void avx2(int64_t rt, int rows, int b, __m256i wt[8], __m256 &d,
                                                   __m256 &m) const {
        __m256i v[8];
        uint16_t dh[8], mh[8];
        tile_rows<T, 8, false>(w + rt * row_bytes, row_bytes, rows, b, v, dh, mh);
        transpose8(v, wt);
        d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)dh));
        m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)mh));
    }

    __attribute__((target(SPECLM_AVX512))) void avx512(int64_t rt, int rows, int b, __m512i wt[8], __m512 &d,
                                                       __m512 &m) const {
        __m256i v[16];
        uint16_t dh[16], mh[16];
        tile_rows<T, 16, true>(w + rt * row_bytes, row_bytes, rows, b, v, dh, mh);
        transpose16x8(v, wt);
        d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
        m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)mh));
    }
};

}  // namespace

size_t block_bytes32(WeightType type) {
    switch (type) {
        case WeightType::Q4_0:
        case WeightType::Q4_0_X16: return Q40::bytes;
        case WeightType::Q4_1:
        case WeightType::Q4_1_X16: return Q41::bytes;
        case WeightType::Q5_0:
        case WeightType::Q5_0_X16: return Q50::bytes;
        case WeightType::Q8_0:
        case WeightType::Q8_0_X16: return Q80::bytes;
        case WeightType::IQ4_NL:
        case WeightType::IQ4_NL_X16: return IQ4NLB::bytes;
        default: return 0;
    }
}

void gemm32(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1, const Activations32 &act,
            float *dst, size_t dst_stride, Isa isa) {
    if (is_x16(type))
        gemm32_x16(type, w, w_row_bytes, r0, r1, act, dst, dst_stride, isa);
    else
        q32::run_gemm32<PlainTiles>(q32_format(type), w, w_row_bytes, r0, r1, act, dst, dst_stride, isa);
}

}  // namespace speclm
