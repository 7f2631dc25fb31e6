// Q4_K and Q6_K in speclm's interleaved layout (X16, as the 32-value formats have it): sixteen weight
// rows' blocks in one superblock, laid out so that a register lane holds one weight row. Four
// activation values, broadcast, then meet four values of every row in one multiply, and a sub-block's
// scale multiplies each row's integer sum once (per 32 values for Q4_K, 16 for Q6_K), where the kernels
// on ggml's layout (quant_gemm.cpp) multiply by a scale for every pair of values of every row.
//
// Every output sums its block exactly in int32 (the scales, and Q4_K's mins or Q6_K's -32 offset,
// applied in integers), then adds dy · (d · Σ − dmin · Σmins) in float, one row and one block at a
// time: the same operations whatever the number of activation rows, so a row's outputs do not depend
// on the block it is verified in, one row included. docs/kernels.md#the-interleaved-k-quant-layout.
#include <immintrin.h>

#include <cstring>

#include "quant_gemm.h"

namespace speclm {
namespace {

#define SPECLM_AVX2 "avx2,fma,f16c"
#define SPECLM_AVX512 "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"

constexpr int GROUP_ROWS = 16;
constexpr int ROW_TILE = 64;  // activation rows whose sums live on the stack at once

// Q4_K superblock (16 · 144 = 2304 bytes, ggml's size):
//   0     d[16] (f16), row r at 2r;  32  dmin[16]
//   64    sc[8][16]: byte 16s + r = row r's sub-block s scale (6 bits) | its min's low two bits << 6
//   192   mh[4][16]: byte 16t + r = row r's mins of sub-blocks 2t (low nibble) and 2t + 1 (high), bits 2..5
//   256   chunks (c, i), c = 0..3, i = 0..7, at 256 + 64(8c + i): bytes 4r..4r+3 = row r's qs[32c + 4i ..]:
//         low nibbles values 64c + 4i + j (sub-block 2c), high nibbles 64c + 32 + 4i + j (sub-block 2c + 1)
struct Q4KX16 {
    static constexpr size_t bytes = 16 * 144;
    static constexpr int D = 0, DMIN = 32, SC = 64, MH = 192, QS = 256;
};

// Q6_K superblock (16 · 210 = 3360 bytes):
//   0     d[16] (f16)
//   32    sc[8][16][2]: bytes 32 + 32t + 2r, +1 = row r's scales (int8) of sub-blocks 2t, 2t + 1
//   288   ql chunks (n, h, i), n, h = 0..1, i = 0..7, at 288 + 64(16n + 8h + i): row r's ql[64n + 32h + 4i ..]
//   2336  qh chunks (n, i) at 2336 + 64(8n + i): row r's qh[32n + 4i ..]
// Value 128n + 32g + 4i + j (sub-block 8n + 2g + i / 4): nibble g / 2 of ql chunk (n, g % 2, i), and bits
// 2g, 2g + 1 of qh chunk (n, i) as its bits 4, 5.
struct Q6KX16 {
    static constexpr size_t bytes = 16 * 210;
    static constexpr int D = 0, SC = 32, QL = 288, QH = 2336;
};

inline const uint8_t *superblock(const uint8_t *w, size_t row_bytes, size_t bytes, int64_t rt, int b) {
    return w + (rt / GROUP_ROWS) * GROUP_ROWS * row_bytes + (size_t)b * bytes;
}

// Part `part` of `parts` of the superblock AHEAD blocks after `sb` (a group's blocks follow each other):
// the work per block is long enough that the loads would otherwise wait on each miss in turn, and asking
// for a whole superblock at once would fill the core's queue of misses.
constexpr int AHEAD = 2;
inline void prefetch_part(const uint8_t *sb, size_t bytes, int part, int parts) {
    const char *p = (const char *)sb + AHEAD * bytes;
    for (size_t off = bytes * part / parts / 64 * 64; off < bytes * (part + 1) / parts; off += 64)
        _mm_prefetch(p + off, _MM_HINT_T0);
}

inline int32_t int_at(const void *p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Sub-block j's 6-bit scale and min from a Q4_K block's twelve scale bytes (ggml's get_scale_min_k4), and
// eight of each packed back into twelve bytes.
void q4k_scale_min(int j, const uint8_t q[12], uint8_t &scale, uint8_t &min) {
    if (j < 4) {
        scale = q[j] & 63;
        min = q[j + 4] & 63;
    } else {
        scale = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        min = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void q4k_pack_scales(const uint8_t scale[8], const uint8_t min[8], uint8_t q[12]) {
    for (int j = 0; j < 4; ++j) {
        q[j] = (uint8_t)(scale[j] | ((scale[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)(min[j] | ((min[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((scale[j + 4] & 0xF) | ((min[j + 4] & 0xF) << 4));
    }
}

// Row r's ggml block `blk` into superblock `sb`, or (back) the other way.
void place_q4k(uint8_t *sb, int r, uint8_t *blk, bool back) {
    auto move = [back](uint8_t *x16, uint8_t *ggml, size_t n) { x16_move(back, x16, ggml, n); };
    move(sb + Q4KX16::D + 2 * r, blk, 2);
    move(sb + Q4KX16::DMIN + 2 * r, blk + 2, 2);
    for (int c = 0; c < 4; ++c)
        for (int i = 0; i < 8; ++i) move(sb + Q4KX16::QS + 64 * (8 * c + i) + 4 * r, blk + 16 + 32 * c + 4 * i, 4);
    uint8_t s[8], m[8];
    if (!back)
        for (int t = 0; t < 8; ++t) q4k_scale_min(t, blk + 4, s[t], m[t]);
    for (int t = 0; t < 8; ++t) {
        uint8_t &sc = sb[Q4KX16::SC + 16 * t + r], &mh = sb[Q4KX16::MH + 16 * (t / 2) + r];
        const int shift = 4 * (t % 2);
        if (back) {
            s[t] = sc & 63;
            m[t] = (uint8_t)((sc >> 6) | (((mh >> shift) & 0xF) << 2));
        } else {
            sc = (uint8_t)(s[t] | ((m[t] & 3) << 6));
            mh = (uint8_t)((mh & ~(0xF << shift)) | ((m[t] >> 2) << shift));
        }
    }
    if (back) q4k_pack_scales(s, m, blk + 4);
}

void place_q6k(uint8_t *sb, int r, uint8_t *blk, bool back) {
    auto move = [back](uint8_t *x16, uint8_t *ggml, size_t n) { x16_move(back, x16, ggml, n); };
    move(sb + Q6KX16::D + 2 * r, blk + 208, 2);
    for (int t = 0; t < 8; ++t) move(sb + Q6KX16::SC + 32 * t + 2 * r, blk + 192 + 2 * t, 2);
    for (int n = 0; n < 2; ++n)
        for (int i = 0; i < 8; ++i) {
            for (int h = 0; h < 2; ++h)
                move(sb + Q6KX16::QL + 64 * (16 * n + 8 * h + i) + 4 * r, blk + 64 * n + 32 * h + 4 * i, 4);
            move(sb + Q6KX16::QH + 64 * (8 * n + i) + 4 * r, blk + 128 + 32 * n + 4 * i, 4);
        }
}

// ---- Q4_K ---------------------------------------------------------------------------------------
// The int16 pairs (v, v) in each 32-bit lane, for madd: v · (a + b) of a lane's two int16 sums.
__attribute__((target(SPECLM_AVX512))) inline __m512i dup512(__m512i v) { return _mm512_or_si512(v, _mm512_slli_epi32(v, 16)); }
__attribute__((target(SPECLM_AVX2))) inline __m256i dup256(__m256i v) { return _mm256_or_si256(v, _mm256_slli_epi32(v, 16)); }

// Sixteen rows: sub-block s's scales and mins as (v, v) pairs per row lane.
__attribute__((target(SPECLM_AVX512))) inline void q4k_scales512(const uint8_t *sb, __m512i sc[8], __m512i mn[8]) {
    const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15);
    for (int t = 0; t < 8; ++t) {
        const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sb + Q4KX16::SC + 16 * t)));
        const __m512i hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sb + Q4KX16::MH + 16 * (t / 2))));
        sc[t] = dup512(_mm512_and_si512(v, m63));
        const __m512i high = _mm512_and_si512(_mm512_srli_epi32(hi, 4 * (t % 2)), m15);
        mn[t] = dup512(_mm512_or_si512(_mm512_srli_epi32(v, 6), _mm512_slli_epi32(high, 2)));
    }
}

__attribute__((target(SPECLM_AVX512))) void q4k_x16_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                           const Activations &act, int j0, int j1, float *dst,
                                                           size_t dst_stride) {
    __m512 acc[ROW_TILE];
    __m512i isum[ROW_TILE];
    const int n = j1 - j0;
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t rt = r0; rt < r1; rt += GROUP_ROWS) {
        for (int j = 0; j < n; ++j) acc[j] = _mm512_setzero_ps();
        for (int b = 0; b < act.nb; ++b) {
            const uint8_t *sb = superblock(w, row_bytes, Q4KX16::bytes, rt, b);
            __m512i sc[8], mn[8];
            q4k_scales512(sb, sc, mn);
            for (int j = 0; j < n; ++j) isum[j] = _mm512_setzero_si512();
            for (int c = 0; c < 4; ++c) {
                prefetch_part(sb, Q4KX16::bytes, c, 4);
                __m512i lo[8], hi[8];
                for (int i = 0; i < 8; ++i) {
                    const __m512i q = _mm512_loadu_si512(sb + Q4KX16::QS + 64 * (8 * c + i));
                    lo[i] = _mm512_and_si512(q, low);
                    hi[i] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low);
                }
                for (int j = 0; j < n; ++j) {
                    const int8_t *y = act.row_qs(b, j0 + j) + 64 * c;
                    __m512i a = _mm512_maddubs_epi16(lo[0], _mm512_set1_epi32(int_at(y)));
                    __m512i h = _mm512_maddubs_epi16(hi[0], _mm512_set1_epi32(int_at(y + 32)));
                    for (int i = 1; i < 8; ++i) {  // |a|, |h| <= 16 · 15 · 128 < 2^15
                        a = _mm512_add_epi16(a, _mm512_maddubs_epi16(lo[i], _mm512_set1_epi32(int_at(y + 4 * i))));
                        h = _mm512_add_epi16(h, _mm512_maddubs_epi16(hi[i], _mm512_set1_epi32(int_at(y + 32 + 4 * i))));
                    }
                    isum[j] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isum[j], a, sc[2 * c]), h, sc[2 * c + 1]);
                }
            }
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + Q4KX16::D)));
            const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + Q4KX16::DMIN)));
            for (int j = 0; j < n; ++j) {
                const int16_t *bs = act.row_bsums(b, j0 + j);
                __m512i bias = _mm512_setzero_si512();
                for (int s = 0; s < 8; ++s) bias = _mm512_dpwssd_epi32(bias, mn[s], _mm512_set1_epi32(int_at(bs + 2 * s)));
                const __m512 t = _mm512_fnmadd_ps(dmin, _mm512_cvtepi32_ps(bias), _mm512_mul_ps(d, _mm512_cvtepi32_ps(isum[j])));
                acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(act.row_d(b, j0 + j)), t, acc[j]);
            }
        }
        for (int j = 0; j < n; ++j) _mm512_storeu_ps(dst + (size_t)(j0 + j) * dst_stride + rt, acc[j]);
    }
}

// AVX2: the same sums with madd in place of vpdpwssd, eight rows (half hf of the group) a register; both
// halves of a block before the next block, so the weights stream through once.
//
// vpshufb controls that spread bytes 8hf..8hf+7 of a register (its 128 bits in both halves) into
// (v, v) int16 pairs, one row a 32-bit lane.
__attribute__((target(SPECLM_AVX2))) inline __m256i dup_rows(int hf) {
    const int base = 8 * hf;
    return _mm256_setr_epi32((int)(0x80008000u | (base + 0) * 0x10001u), (int)(0x80008000u | (base + 1) * 0x10001u),
                             (int)(0x80008000u | (base + 2) * 0x10001u), (int)(0x80008000u | (base + 3) * 0x10001u),
                             (int)(0x80008000u | (base + 4) * 0x10001u), (int)(0x80008000u | (base + 5) * 0x10001u),
                             (int)(0x80008000u | (base + 6) * 0x10001u), (int)(0x80008000u | (base + 7) * 0x10001u));
}

// Sixteen rows' scales and mins of sub-block s (16 bytes each, row r at byte r).
__attribute__((target(SPECLM_AVX2))) inline void q4k_bytes(const uint8_t *sb, int s, __m128i &scale, __m128i &min) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(sb + Q4KX16::SC + 16 * s));
    const __m128i hi = _mm_loadu_si128((const __m128i *)(sb + Q4KX16::MH + 16 * (s / 2)));
    const __m128i m15 = _mm_set1_epi8(15), m3 = _mm_set1_epi8(3);
    scale = _mm_and_si128(v, _mm_set1_epi8(63));
    const __m128i high = _mm_and_si128(s % 2 ? _mm_srli_epi16(hi, 4) : hi, m15);
    min = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 6), m3), _mm_slli_epi16(high, 2));
}

__attribute__((target(SPECLM_AVX2))) void q4k_x16_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                       const Activations &act, int j0, int j1, float *dst,
                                                       size_t dst_stride) {
    __m256 acc[2][ROW_TILE];
    __m256i isum[ROW_TILE];
    const int n = j1 - j0;
    const __m256i low = _mm256_set1_epi8(0x0F), dup[2] = {dup_rows(0), dup_rows(1)};
    for (int64_t rt = r0; rt < r1; rt += GROUP_ROWS) {
        for (int j = 0; j < n; ++j) acc[0][j] = acc[1][j] = _mm256_setzero_ps();
        for (int b = 0; b < act.nb; ++b) {
            const uint8_t *sb = superblock(w, row_bytes, Q4KX16::bytes, rt, b);
            __m256i scales[8], mins[8];  // both halves' bytes in each 128-bit half
            for (int s = 0; s < 8; ++s) {
                __m128i sc, mn;
                q4k_bytes(sb, s, sc, mn);
                scales[s] = _mm256_broadcastsi128_si256(sc);
                mins[s] = _mm256_broadcastsi128_si256(mn);
            }
            for (int hf = 0; hf < 2; ++hf) {
                for (int j = 0; j < n; ++j) isum[j] = _mm256_setzero_si256();
                for (int c = 0; c < 4; ++c) {
                    prefetch_part(sb, Q4KX16::bytes, 4 * hf + c, 8);
                    const __m256i sc0 = _mm256_shuffle_epi8(scales[2 * c], dup[hf]);
                    const __m256i sc1 = _mm256_shuffle_epi8(scales[2 * c + 1], dup[hf]);
                    const uint8_t *chunks = sb + Q4KX16::QS + 64 * 8 * c + 32 * hf;
                    if (n == 1) {  // one row: each chunk once, both nibbles
                        const int8_t *y = act.row_qs(b, j0) + 64 * c;
                        __m256i a = _mm256_setzero_si256(), h = _mm256_setzero_si256();
                        for (int i = 0; i < 8; ++i) {
                            const __m256i x = _mm256_loadu_si256((const __m256i *)(chunks + 64 * i));
                            a = _mm256_add_epi16(a, _mm256_maddubs_epi16(_mm256_and_si256(x, low), _mm256_set1_epi32(int_at(y + 4 * i))));
                            h = _mm256_add_epi16(h, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x, 4), low),
                                                                         _mm256_set1_epi32(int_at(y + 32 + 4 * i))));
                        }
                        isum[0] = _mm256_add_epi32(isum[0], _mm256_add_epi32(_mm256_madd_epi16(a, sc0), _mm256_madd_epi16(h, sc1)));
                        continue;
                    }
                    for (int half = 0; half < 2; ++half) {  // sub-block 2c + half: the low nibbles, then the high
                        __m256i q[8];
                        for (int i = 0; i < 8; ++i) {
                            const __m256i x = _mm256_loadu_si256((const __m256i *)(chunks + 64 * i));
                            q[i] = _mm256_and_si256(half ? _mm256_srli_epi16(x, 4) : x, low);
                        }
                        const __m256i sc = half ? sc1 : sc0;
                        for (int j = 0; j < n; ++j) {
                            const int8_t *y = act.row_qs(b, j0 + j) + 64 * c + 32 * half;
                            __m256i a = _mm256_maddubs_epi16(q[0], _mm256_set1_epi32(int_at(y)));
                            for (int i = 1; i < 8; ++i)  // |a| <= 16 · 15 · 128 < 2^15
                                a = _mm256_add_epi16(a, _mm256_maddubs_epi16(q[i], _mm256_set1_epi32(int_at(y + 4 * i))));
                            isum[j] = _mm256_add_epi32(isum[j], _mm256_madd_epi16(a, sc));
                        }
                    }
                }
                __m256i mn[8];
                for (int s = 0; s < 8; ++s) mn[s] = _mm256_shuffle_epi8(mins[s], dup[hf]);
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + Q4KX16::D + 16 * hf)));
                const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + Q4KX16::DMIN + 16 * hf)));
                for (int j = 0; j < n; ++j) {
                    const int16_t *bs = act.row_bsums(b, j0 + j);
                    __m256i bias = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(int_at(bs)));
                    for (int s = 1; s < 8; ++s)
                        bias = _mm256_add_epi32(bias, _mm256_madd_epi16(mn[s], _mm256_set1_epi32(int_at(bs + 2 * s))));
                    const __m256 t = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(bias), _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum[j])));
                    acc[hf][j] = _mm256_fmadd_ps(_mm256_set1_ps(act.row_d(b, j0 + j)), t, acc[hf][j]);
                }
            }
        }
        for (int j = 0; j < n; ++j) {
            float *out = dst + (size_t)(j0 + j) * dst_stride + rt;
            _mm256_storeu_ps(out, acc[0][j]);
            _mm256_storeu_ps(out + 8, acc[1][j]);
        }
    }
}

// ---- Q6_K ---------------------------------------------------------------------------------------
// vpshufb controls that copy each 32-bit lane's first (EVEN) or second (ODD) int16 into both its halves.
#define DUP_EVEN _mm_setr_epi32(0x01000100, 0x05040504, 0x09080908, 0x0D0C0D0C)
#define DUP_ODD _mm_setr_epi32(0x03020302, 0x07060706, 0x0B0A0B0A, 0x0F0E0F0E)

// Quads ii = 0..3 of sub-block 8n + 2g + ih (values 128n + 32g + 16ih + 4ii ..), one register each.
__attribute__((target(SPECLM_AVX512))) inline void q6k_quads512(const uint8_t *sb, int n, int ih, __m512i wv[4][4]) {
    const __m512i low = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x30);
    for (int ii = 0; ii < 4; ++ii) {
        const int i = 4 * ih + ii;
        const __m512i qh = _mm512_loadu_si512(sb + Q6KX16::QH + 64 * (8 * n + i));
        const __m512i l0 = _mm512_loadu_si512(sb + Q6KX16::QL + 64 * (16 * n + i));
        const __m512i l1 = _mm512_loadu_si512(sb + Q6KX16::QL + 64 * (16 * n + 8 + i));
        wv[0][ii] = _mm512_or_si512(_mm512_and_si512(l0, low), _mm512_and_si512(_mm512_slli_epi16(qh, 4), two));
        wv[1][ii] = _mm512_or_si512(_mm512_and_si512(l1, low), _mm512_and_si512(_mm512_slli_epi16(qh, 2), two));
        wv[2][ii] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), low), _mm512_and_si512(qh, two));
        wv[3][ii] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), low),
                                    _mm512_and_si512(_mm512_srli_epi16(qh, 2), two));
    }
}

__attribute__((target(SPECLM_AVX512))) void q6k_x16_avx512(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                           const Activations &act, int j0, int j1, float *dst,
                                                           size_t dst_stride) {
    __m512 acc[ROW_TILE];
    __m512i isum[ROW_TILE];
    const int n = j1 - j0;
    const __m512i even = _mm512_broadcast_i32x4(DUP_EVEN), odd = _mm512_broadcast_i32x4(DUP_ODD);
    for (int64_t rt = r0; rt < r1; rt += GROUP_ROWS) {
        for (int j = 0; j < n; ++j) acc[j] = _mm512_setzero_ps();
        for (int b = 0; b < act.nb; ++b) {
            const uint8_t *sb = superblock(w, row_bytes, Q6KX16::bytes, rt, b);
            __m512i pair[8], sc[16];  // pair[t]: (scale 2t, scale 2t + 1) per row lane; sc[s]: (scale s, scale s)
            for (int t = 0; t < 8; ++t) {
                pair[t] = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(sb + Q6KX16::SC + 32 * t)));
                sc[2 * t] = _mm512_shuffle_epi8(pair[t], even);
                sc[2 * t + 1] = _mm512_shuffle_epi8(pair[t], odd);
            }
            for (int j = 0; j < n; ++j) isum[j] = _mm512_setzero_si512();
            for (int nn = 0; nn < 2; ++nn)
                for (int ih = 0; ih < 2; ++ih) {
                    __m512i wv[4][4];
                    prefetch_part(sb, Q6KX16::bytes, 2 * nn + ih, 4);
                    q6k_quads512(sb, nn, ih, wv);
                    for (int j = 0; j < n; ++j) {
                        const int8_t *y = act.row_qs(b, j0 + j) + 128 * nn + 16 * ih;
                        __m512i s = isum[j];
                        for (int g = 0; g < 4; ++g) {  // each pair of products <= 2 · 63 · 128: two fit int16
                            const int8_t *yg = y + 32 * g;
                            const __m512i a = _mm512_add_epi16(_mm512_maddubs_epi16(wv[g][0], _mm512_set1_epi32(int_at(yg))),
                                                               _mm512_maddubs_epi16(wv[g][1], _mm512_set1_epi32(int_at(yg + 4))));
                            const __m512i c = _mm512_add_epi16(_mm512_maddubs_epi16(wv[g][2], _mm512_set1_epi32(int_at(yg + 8))),
                                                               _mm512_maddubs_epi16(wv[g][3], _mm512_set1_epi32(int_at(yg + 12))));
                            const __m512i scale = sc[8 * nn + 2 * g + ih];
                            s = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(s, a, scale), c, scale);
                        }
                        isum[j] = s;
                    }
                }
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(sb + Q6KX16::D)));
            for (int j = 0; j < n; ++j) {
                const int16_t *bs = act.row_bsums(b, j0 + j);
                __m512i bias = _mm512_setzero_si512();  // Σ scale · (sum of 16 activations): the -32 offset's
                for (int t = 0; t < 8; ++t) bias = _mm512_dpwssd_epi32(bias, pair[t], _mm512_set1_epi32(int_at(bs + 2 * t)));
                const __m512i total = _mm512_sub_epi32(isum[j], _mm512_slli_epi32(bias, 5));
                acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(act.row_d(b, j0 + j)), _mm512_mul_ps(d, _mm512_cvtepi32_ps(total)),
                                         acc[j]);
            }
        }
        for (int j = 0; j < n; ++j) _mm512_storeu_ps(dst + (size_t)(j0 + j) * dst_stride + rt, acc[j]);
    }
}

__attribute__((target(SPECLM_AVX2))) void q6k_x16_avx2(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1,
                                                       const Activations &act, int j0, int j1, float *dst,
                                                       size_t dst_stride) {
    __m256 acc[2][ROW_TILE];
    __m256i isum[ROW_TILE];
    const int n = j1 - j0;
    const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30);
    const __m256i even = _mm256_broadcastsi128_si256(DUP_EVEN), odd = _mm256_broadcastsi128_si256(DUP_ODD);
    for (int64_t rt = r0; rt < r1; rt += GROUP_ROWS) {
        for (int j = 0; j < n; ++j) acc[0][j] = acc[1][j] = _mm256_setzero_ps();
        for (int b = 0; b < act.nb; ++b) {
            const uint8_t *sb = superblock(w, row_bytes, Q6KX16::bytes, rt, b);
            for (int hf = 0; hf < 2; ++hf) {
                __m256i pair[8];
                for (int t = 0; t < 8; ++t)
                    pair[t] = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(sb + Q6KX16::SC + 32 * t + 16 * hf)));
                for (int j = 0; j < n; ++j) isum[j] = _mm256_setzero_si256();
                for (int nn = 0; nn < 2; ++nn)
                    for (int ih = 0; ih < 2; ++ih)
                        for (int h = 0; h < 2; ++h) {  // sub-blocks s0 (g = h: low nibbles) and s0 + 4 (g = h + 2)
                            const int s0 = 8 * nn + 2 * h + ih;
                            if (hf == 0) prefetch_part(sb, Q6KX16::bytes, 4 * nn + 2 * ih + h, 8);
                            __m256i q[2][4];
                            for (int ii = 0; ii < 4; ++ii) {
                                const int i = 4 * ih + ii;
                                const __m256i qh = _mm256_loadu_si256((const __m256i *)(sb + Q6KX16::QH + 64 * (8 * nn + i) + 32 * hf));
                                const __m256i l = _mm256_loadu_si256((const __m256i *)(sb + Q6KX16::QL + 64 * (16 * nn + 8 * h + i) + 32 * hf));
                                const __m256i hl = h ? _mm256_slli_epi16(qh, 2) : _mm256_slli_epi16(qh, 4);
                                const __m256i hh = h ? _mm256_srli_epi16(qh, 2) : qh;
                                q[0][ii] = _mm256_or_si256(_mm256_and_si256(l, low), _mm256_and_si256(hl, two));
                                q[1][ii] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, 4), low), _mm256_and_si256(hh, two));
                            }
                            const __m256i sc0 = _mm256_shuffle_epi8(pair[s0 / 2], s0 % 2 ? odd : even);
                            const __m256i sc1 = _mm256_shuffle_epi8(pair[(s0 + 4) / 2], s0 % 2 ? odd : even);
                            for (int j = 0; j < n; ++j) {
                                const int8_t *y = act.row_qs(b, j0 + j) + 16 * s0;
                                __m256i sum = isum[j];
                                for (int u = 0; u < 2; ++u) {  // each pair of products <= 2 · 63 · 128: two fit int16
                                    const int8_t *yu = y + 64 * u;
                                    const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(q[u][0], _mm256_set1_epi32(int_at(yu))),
                                                                       _mm256_maddubs_epi16(q[u][1], _mm256_set1_epi32(int_at(yu + 4))));
                                    const __m256i c = _mm256_add_epi16(_mm256_maddubs_epi16(q[u][2], _mm256_set1_epi32(int_at(yu + 8))),
                                                                       _mm256_maddubs_epi16(q[u][3], _mm256_set1_epi32(int_at(yu + 12))));
                                    const __m256i scale = u ? sc1 : sc0;
                                    sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_madd_epi16(a, scale), _mm256_madd_epi16(c, scale)));
                                }
                                isum[j] = sum;
                            }
                        }
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(sb + Q6KX16::D + 16 * hf)));
                for (int j = 0; j < n; ++j) {
                    const int16_t *bs = act.row_bsums(b, j0 + j);
                    __m256i bias = _mm256_madd_epi16(pair[0], _mm256_set1_epi32(int_at(bs)));
                    for (int t = 1; t < 8; ++t)
                        bias = _mm256_add_epi32(bias, _mm256_madd_epi16(pair[t], _mm256_set1_epi32(int_at(bs + 2 * t))));
                    const __m256i total = _mm256_sub_epi32(isum[j], _mm256_slli_epi32(bias, 5));
                    acc[hf][j] = _mm256_fmadd_ps(_mm256_set1_ps(act.row_d(b, j0 + j)), _mm256_mul_ps(d, _mm256_cvtepi32_ps(total)),
                                                 acc[hf][j]);
                }
            }
        }
        for (int j = 0; j < n; ++j) {
            float *out = dst + (size_t)(j0 + j) * dst_stride + rt;
            _mm256_storeu_ps(out, acc[0][j]);
            _mm256_storeu_ps(out + 8, acc[1][j]);
        }
    }
}

}  // namespace

bool repack_k16(WeightType type, const uint8_t *src, int64_t rows, int64_t k, uint8_t *dst) {
    if ((type != WeightType::Q4_K && type != WeightType::Q6_K) || rows % GROUP_ROWS || k % QK || k <= 0) return false;
    const size_t block = weight_block_bytes(type), row_bytes = block * (size_t)(k / QK);
    std::memset(dst, 0, row_bytes * rows);
    for (int64_t g = 0; g < rows / GROUP_ROWS; ++g)
        for (int64_t b = 0; b < k / QK; ++b) {
            uint8_t *sb = dst + g * GROUP_ROWS * row_bytes + b * GROUP_ROWS * block;
            for (int r = 0; r < GROUP_ROWS; ++r) {
                uint8_t *blk = const_cast<uint8_t *>(src + (g * GROUP_ROWS + r) * row_bytes + b * block);
                type == WeightType::Q4_K ? place_q4k(sb, r, blk, false) : place_q6k(sb, r, blk, false);
            }
        }
    return true;
}

void unpack_k16_row(WeightType type, const uint8_t *x16, int64_t k, int64_t row, uint8_t *out) {
    const size_t block = weight_block_bytes(type), row_bytes = block * (size_t)(k / QK);
    for (int64_t b = 0; b < k / QK; ++b) {
        uint8_t *sb = const_cast<uint8_t *>(superblock(x16, row_bytes, GROUP_ROWS * block, row, (int)b));
        type == WeightType::Q4_K ? place_q4k(sb, (int)(row % GROUP_ROWS), out + b * block, true)
                                 : place_q6k(sb, (int)(row % GROUP_ROWS), out + b * block, true);
    }
}

void gemm_k16(WeightType type, const uint8_t *w, size_t w_row_bytes, int64_t r0, int64_t r1, const Activations &act,
              float *dst, size_t dst_stride, Isa isa) {
    if (!is_k16(type) || r0 % GROUP_ROWS != 0 || r1 % GROUP_ROWS != 0) return;
    using Kernel = void (*)(const uint8_t *, size_t, int64_t, int64_t, const Activations &, int, int, float *, size_t);
    const bool wide = isa == Isa::AVX512_VNNI;
    const Kernel kernel = type == WeightType::Q4_K_X16 ? (wide ? q4k_x16_avx512 : q4k_x16_avx2)
                                                       : (wide ? q6k_x16_avx512 : q6k_x16_avx2);
    for (int j0 = 0; j0 < act.ny; j0 += ROW_TILE) {
        const int j1 = act.ny < j0 + ROW_TILE ? act.ny : j0 + ROW_TILE;
        kernel(w, w_row_bytes, r0, r1, act, j0, j1, dst, dst_stride);
    }
}

}  // namespace speclm
