// Multi-row matmul of k-quant weights (Q4_K, Q6_K) with activation rows quantised to 8 bits
// the way ggml's Q8_K is (one scale per 256 values, sums per 16): dst[j][r] = W[r] . x[j];
// and of the 32-value block formats (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL) with activations quantised
// per 32 values the way ggml's Q8_0 is (quant_gemm_q32.cpp); the quantisers are in quantize.cpp.
// docs/kernels.md#speclms-kernels says how the loops are laid out and why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace speclm {

// Q4_K, Q6_K, Q4_0 .. IQ4_NL: ggml's formats in ggml's layout (Q4_0 .. IQ4_NL: the 32-value block formats: is_q32).
// Q4_0_X16 .. IQ4_NL_X16, Q4_K_X16, Q6_K_X16: those formats in speclm's interleaved layout (is_x16,
// repack_x16): rows in groups of sixteen, the row size still the format's. The numbers are speclm_gemm's
// (2 is unused).
enum class WeightType : int {
    Q4_K = 0, Q6_K = 1, Q4_0 = 3, Q4_1 = 4, Q5_0 = 5, Q8_0 = 6, IQ4_NL = 7,
    Q4_0_X16 = 8, Q4_1_X16 = 9, Q5_0_X16 = 10, Q8_0_X16 = 11, IQ4_NL_X16 = 12, Q4_K_X16 = 13, Q6_K_X16 = 14
};
enum class Isa : int { NONE = 0, AVX2 = 1, AVX512_VNNI = 2 };

constexpr int QK = 256;  // values per block, weights and activations alike

constexpr int QK32 = 32;  // values per block of the 32-value formats, weights and activations alike

inline bool is_k16(WeightType type) { return type == WeightType::Q4_K_X16 || type == WeightType::Q6_K_X16; }
inline bool is_q32(WeightType type) { return (int)type >= (int)WeightType::Q4_0 && !is_k16(type); }
inline bool is_x16(WeightType type) { return (int)type >= (int)WeightType::Q4_0_X16; }
// A 32-value format's place in the order Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL (0..4), in either layout.
inline int q32_format(WeightType type) {
    return (int)type - (int)(is_x16(type) ? WeightType::Q4_0_X16 : WeightType::Q4_0);
}
// A format in the X16 layout (Q4_K, Q6_K or a 32-value one), and the same format in ggml's.
inline WeightType x16_of(WeightType plain) {
    if (plain == WeightType::Q4_K) return WeightType::Q4_K_X16;
    if (plain == WeightType::Q6_K) return WeightType::Q6_K_X16;
    return (WeightType)((int)WeightType::Q4_0_X16 + q32_format(plain));
}
inline WeightType plain_of(WeightType x16) {
    if (x16 == WeightType::Q4_K_X16) return WeightType::Q4_K;
    if (x16 == WeightType::Q6_K_X16) return WeightType::Q6_K;
    return (WeightType)((int)WeightType::Q4_0 + q32_format(x16));
}
inline int block_values(WeightType type) { return is_q32(type) ? QK32 : QK; }

// 144 (Q4_K), 210 (Q6_K), 18 (Q4_0, IQ4_NL), 20 (Q4_1), 22 (Q5_0), 34 (Q8_0)
size_t weight_block_bytes(WeightType type);
size_t block_bytes32(WeightType type);  // the 32-value formats' (quant_gemm_q32.cpp declares each format once)

// The activations of `ny` rows of K values, quantised (Q8_K's rounding exactly), laid out block-major so
// that one weight block meets every row's matching block in consecutive memory:
// qs[b][j][256] int8, then bsums[b][j][16] int16, then d[b][j] float. Its size is ny * K/256 * 292
// bytes, the size ggml reserves for Q8_K activations (so ggml's own work buffer holds it).
struct Activations {
    int ny = 0, nb = 0;
    int8_t *qs = nullptr;
    int16_t *bsums = nullptr;
    float *d = nullptr;

    static size_t bytes(int ny, int64_t k) { return (size_t)ny * (size_t)(k / QK) * (QK + 32 + 4); }
    static Activations in(void *mem, int ny, int64_t k);  // any alignment: the kernels load unaligned
    const int8_t *row_qs(int b, int j) const { return qs + ((size_t)b * ny + j) * QK; }
    const int16_t *row_bsums(int b, int j) const { return bsums + ((size_t)b * ny + j) * 16; }
    float row_d(int b, int j) const { return d[(size_t)b * ny + j]; }
};

// Quantise rows [j0, j1) of x (row j at x + j * x_stride floats) into `act`.
void quantize_rows(const float *x, size_t x_stride, int j0, int j1, Activations &act);

// dst[j * dst_stride + r] = W[r] . x[j] for weight rows r in [r0, r1) and all act.ny rows; W's row r
// starts at w + r * w_row_bytes (Q4_K_X16, Q6_K_X16: gemm_k16). `isa` must be one the CPU has (best_isa()).
void gemm(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1, const Activations &act,
          float *dst, size_t dst_stride, Isa isa);

// Q4_K and Q6_K in the X16 layout (quant_gemm_k16.cpp): dst[j * dst_stride + r] = W[r] . x[j], r0 and r1
// multiples of 16; each output summed the same way whatever act.ny, one row included.
void gemm_k16(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1, const Activations &act,
              float *dst, size_t dst_stride, Isa isa);
// repack_x16 and unpack_x16_row for Q4_K and Q6_K (quant_gemm_k16.cpp; repack_x16 hands them on).
bool repack_k16(WeightType type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst);
void unpack_k16_row(WeightType type, const uint8_t *x16, int64_t k, int64_t row, uint8_t *out);

// One field of a block moved between ggml's layout and an X16 superblock: into it, or (back) out of it.
inline void x16_move(bool back, uint8_t *x16, uint8_t *ggml, size_t n) {
    std::memcpy(back ? ggml : x16, back ? x16 : ggml, n);
}

// The activations of `ny` rows for the 32-value formats, quantised per 32 values exactly as ggml's
// x86 quantize_row_q8_0 / q8_1 do (the inputs of ggml's own vec_dot): d = amax / 127 rounded to f16,
// q = x * (127 / amax) rounded half to even, and Q8_1's s = d * Σq (d before its rounding) rounded to
// f16. Block-major: qs[b][j][32] int8, then d[b][j] float (the f16 value), then s[b][j] float (the f16
// value: Q4_1's min multiplies it), then sums[b][j] int16 (Σq: the offset of Q4_0/Q5_0 and of the
// unsigned forms). ny * K/32 * 42 bytes: more than ggml reserves for Q8_0 (34) or Q8_1 (36)
// activations, so the buffer type asks for it (Traits::work_size).
struct Activations32 {
    int ny = 0, nb = 0;
    int8_t *qs = nullptr;
    float *d = nullptr, *s = nullptr;
    int16_t *sums = nullptr;

    static size_t bytes(int ny, int64_t k) { return (size_t)ny * (size_t)(k / QK32) * (QK32 + 4 + 4 + 2); }
    static Activations32 in(void *mem, int ny, int64_t k);  // any alignment
};

// Quantise rows [j0, j1) of x (row j at x + j * x_stride floats) into `act` (needs F16C: best_isa() != NONE).
void quantize_rows32(const float *x, size_t x_stride, int j0, int j1, Activations32 &act);

// gemm for the 32-value formats (is_q32(type)): dst[j * dst_stride + r] = W[r] . x[j], r in [r0, r1)
// (the X16 types: r0 and r1 multiples of 16; their outputs are the ggml-layout type's bit for bit).
void gemm32(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1, const Activations32 &act,
            float *dst, size_t dst_stride, Isa isa);
void gemm32_x16(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1,
                const Activations32 &act, float *dst, size_t dst_stride, Isa isa);  // quant_gemm_q32x16.cpp

// `rows` (a multiple of 16) rows of K values of format `type` (Q4_K, Q6_K or Q4_0 .. IQ4_NL, ggml's layout)
// at src, in the X16 layout at dst (the same number of bytes; dst must not overlap src). False: a type or
// shape the layout does not take (nothing written).
bool repack_x16(WeightType type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst);
// The inverse: one row of the X16 layout as ggml's blocks (tests, and reading a weight back).
void unpack_x16_row(WeightType type, const uint8_t *x16, int64_t k, int64_t row, uint8_t *out);

Isa best_isa();  // the widest kernel this CPU can run (NONE: no AVX2+FMA+F16C)

}  // namespace speclm
