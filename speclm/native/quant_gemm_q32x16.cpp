// The 32-value formats (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL) in speclm's interleaved layout ("X16"): the
// tile kernels of quant_gemm_q32_kernels.h read the weights already transposed, where on ggml's layout
// they unpack and transpose every tile of every forward.
//
// Rows come in groups of sixteen. Group g's block b is one "superblock" of 16 · (the format's block
// bytes), at w + g·16·row_bytes + b·16·block_bytes (so a group's blocks follow each other):
//   bytes 0..31     the sixteen rows' d (f16), row r at 2r
//   Q4_1: 32..63    their m (f16)
//   Q5_0: 32..95    eight 64-bit masks M_k: bit 4r+j is the fifth bit of row r's value 4k+j
//   then the values, in 64-byte chunks whose bytes 4r..4r+3 belong to row r:
//     Q8_0: chunk k holds row r's values 4k..4k+3 (int8)
//     the nibble formats: chunk i holds row r's quant bytes 4i..4i+3 as the block stores them (low
//     nibble value 4i+j, high nibble value 16+4i+j), so one AND gives register k = i and one shift
//     and AND register k = i + 4.
// A chunk is one AVX-512 register (register k lane r, as the kernels want it) and its halves are the
// AVX2 tiles of rows 0..7 and 8..15. The layout has exactly ggml's size.
#include <cstring>
#include <type_traits>

#include "quant_gemm_q32_kernels.h"

namespace speclm {
namespace {

using namespace q32;

constexpr int GROUP_ROWS = 16;

// Where a format's fields are, in its ggml block (qs: the quant bytes, qn of them) and in the superblock.
struct Fields {
    size_t bytes;
    int qs, qn, values;  // values: where the chunks start in the superblock
    bool min, qh;
};

template <typename T> constexpr Fields fields() {
    if (std::is_same<T, Q41>::value) return {T::bytes, 4, 16, 64, true, false};
    if (std::is_same<T, Q50>::value) return {T::bytes, 6, 16, 96, false, true};
    if (std::is_same<T, Q80>::value) return {T::bytes, 2, 32, 32, false, false};
    return {T::bytes, 2, 16, 32, false, false};  // Q4_0, IQ4_NL
}

Fields fields_of(WeightType type) {
    switch (type) {
        case WeightType::Q4_0: case WeightType::Q4_0_X16: return fields<Q40>();
        case WeightType::Q4_1: case WeightType::Q4_1_X16: return fields<Q41>();
        case WeightType::Q5_0: case WeightType::Q5_0_X16: return fields<Q50>();
        case WeightType::Q8_0: case WeightType::Q8_0_X16: return fields<Q80>();
        case WeightType::IQ4_NL: case WeightType::IQ4_NL_X16: return fields<IQ4NLB>();
        default: return {0, 0, 0, 0, false, false};
    }
}

// Row r's (0..15) ggml block `blk` into superblock `sb`, or (back) the other way.
void place(const Fields &f, uint8_t *sb, int r, uint8_t *blk, bool back) {
    auto move = [back](uint8_t *x16, uint8_t *ggml, size_t n) { x16_move(back, x16, ggml, n); };
    move(sb + 2 * r, blk, 2);
    if (f.min) move(sb + 32 + 2 * r, blk + 2, 2);
    for (int c = 0; c < f.qn / 4; ++c) move(sb + f.values + 64 * c + 4 * r, blk + f.qs + 4 * c, 4);
    if (!f.qh) return;
    uint32_t qh = 0;
    if (!back) std::memcpy(&qh, blk + 2, 4);
    for (int k = 0; k < 8; ++k) {
        uint8_t *mask = sb + 32 + 8 * k + r / 2;  // bits 4r..4r+3 of M_k: a nibble of byte r/2
        const int shift = 4 * (r % 2);
        if (back) qh |= (uint32_t)((*mask >> shift) & 0xF) << (4 * k);
        else *mask = (uint8_t)((*mask & ~(0xF << shift)) | (((qh >> (4 * k)) & 0xF) << shift));
    }
    if (back) std::memcpy(blk + 2, &qh, 4);
}

// The superblock of the tile whose rows start at rt, block b.
inline const uint8_t *superblock(const uint8_t *w, size_t row_bytes, size_t block_bytes, int64_t rt, int b) {
    return w + (rt / GROUP_ROWS) * GROUP_ROWS * row_bytes + (size_t)b * GROUP_ROWS * block_bytes;
}

// The X16 layout's tile source (quant_gemm_q32_kernels.h): tiles are whole (rows = 8 or 16 always).
template <typename T> struct X16Tiles {
    static constexpr Fields F = fields<T>();
    const uint8_t *w;
    size_t row_bytes;

    __attribute__((target(SPECLM_AVX2))) void avx2(int64_t rt, int, int b, __m256i wt[8], __m256 &d,
                                                   __m256 &m) const {
        const uint8_t *sb = superblock(w, row_bytes, T::bytes, rt, b);
        const int h = (int)(rt % GROUP_ROWS) / 8;  // which half of the group's rows
        d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 16 * h)));
        m = F.min ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + 32 + 16 * h))) : _mm256_setzero_ps();
        const uint8_t *v = sb + F.values + 32 * h;
        if (std::is_same<T, Q80>::value) {
            for (int k = 0; k < 8; ++k) wt[k] = _mm256_loadu_si256((const __m256i *)(v + 64 * k));
            return;
        }
        const __m256i low = _mm256_set1_epi8(0x0F);
        for (int i = 0; i < 4; ++i) {
            const __m256i c = _mm256_loadu_si256((const __m256i *)(v + 64 * i));
            wt[i] = _mm256_and_si256(c, low);
            wt[i + 4] = _mm256_and_si256(_mm256_srli_epi16(c, 4), low);
        }
        if (F.qh)
            for (int k = 0; k < 8; ++k) wt[k] = _mm256_or_si256(wt[k], fifth_bits(sb + 32 + 8 * k + 4 * h));
        if (std::is_same<T, IQ4NLB>::value)
            for (int k = 0; k < 8; ++k) wt[k] = _mm256_shuffle_epi8(table16(IQ4NL, 0), wt[k]);
    }

    __attribute__((target(SPECLM_AVX512))) void avx512(int64_t rt, int, int b, __m512i wt[8], __m512 &d,
                                                       __m512 &m) const {
        const uint8_t *sb = superblock(w, row_bytes, T::bytes, rt, b);
        d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)sb));
        m = F.min ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + 32))) : _mm512_setzero_ps();
        const uint8_t *v = sb + F.values;
        if (std::is_same<T, Q80>::value) {
            for (int k = 0; k < 8; ++k)
                wt[k] = _mm512_xor_si512(_mm512_loadu_si512(v + 64 * k), _mm512_set1_epi8((char)0x80));
            return;
        }
        const __m512i low = _mm512_set1_epi8(0x0F);
        for (int i = 0; i < 4; ++i) {
            const __m512i c = _mm512_loadu_si512(v + 64 * i);
            wt[i] = _mm512_and_si512(c, low);
            wt[i + 4] = _mm512_and_si512(_mm512_srli_epi16(c, 4), low);
        }
        if (F.qh)
            for (int k = 0; k < 8; ++k) {
                uint64_t bits;
                std::memcpy(&bits, sb + 32 + 8 * k, 8);
                wt[k] = _mm512_or_si512(wt[k], _mm512_maskz_set1_epi8(bits, 0x10));
            }
        if (std::is_same<T, IQ4NLB>::value) {
            const __m512i table = _mm512_broadcast_i32x4(_mm256_castsi256_si128(table16(IQ4NL, 128)));
            for (int k = 0; k < 8; ++k) wt[k] = _mm512_shuffle_epi8(table, wt[k]);
        }
    }
};

}  // namespace

bool repack_x16(WeightType type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst) {
    if (type == WeightType::Q4_K || type == WeightType::Q6_K) return repack_k16(type, src, rows, k, dst);
    const Fields f = fields_of(type);
    if (f.bytes == 0 || is_x16(type) || rows % GROUP_ROWS != 0 || k % QK32 != 0 || k <= 0) return false;
    const int64_t nb = k / QK32;
    const size_t row_bytes = f.bytes * nb;
    std::memset(dst, 0, row_bytes * rows);
    for (int64_t g = 0; g < rows / GROUP_ROWS; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *sb = dst + g * GROUP_ROWS * row_bytes + b * GROUP_ROWS * f.bytes;
            for (int r = 0; r < GROUP_ROWS; ++r)
                place(f, sb, r, const_cast<uint8_t *>(src + (g * GROUP_ROWS + r) * row_bytes + b * f.bytes), false);
        }
    return true;
}

void unpack_x16_row(WeightType type, const uint8_t *x16, int64_t k, int64_t row, uint8_t *out) {
    if (type == WeightType::Q4_K || type == WeightType::Q6_K) return unpack_k16_row(type, x16, k, row, out);
    const Fields f = fields_of(type);
    const int64_t nb = k / QK32;
    for (int64_t b = 0; b < nb; ++b) {
        uint8_t *sb = const_cast<uint8_t *>(superblock(x16, f.bytes * nb, f.bytes, row, (int)b));
        place(f, sb, (int)(row % GROUP_ROWS), out + b * f.bytes, true);
    }
}

void gemm32_x16(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1,
                const Activations32 &act, float *dst, size_t dst_stride, Isa isa) {
    if (!is_x16(type) || r0 % GROUP_ROWS != 0 || r1 % GROUP_ROWS != 0) return;
    run_gemm32<X16Tiles>(q32_format(type), w, w_row_bytes, r0, r1, act, dst, dst_stride, isa);
}

}  // namespace speclm
