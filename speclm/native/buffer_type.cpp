// speclm's kernels inside llama.cpp's own graph: extra CPU buffer types, put first in the list
// libggml-cpu consults, that claim the Q4_K, Q6_K and 32-value-block (Q4_0, Q4_1, Q5_0, Q8_0,
// IQ4_NL) matmul weights of the models loaded while claiming is on and compute their matmuls on
// ggml's own threads.
//
// CPU_SPECLM holds weights in ggml's own layout (ggml's CPU buffer, relabelled), for the `speclm`
// configuration: a matmul its kernels decline (a row count outside the range) runs ggml's vec_dot on
// the same bytes. CPU_SPECLM_X16 holds them with rows in sixteens in speclm's interleaved layout (X16:
// its buffers repack each weight as it is set), for `speclm-repack`, and computes every matmul on them,
// one row included; on `speclm-repack` the weights it cannot take stay in CPU_SPECLM.
// docs/kernels.md#speclms-kernels explains the contract.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

#include "ggml_link.h"
#include "quant_gemm.h"

using namespace speclm_abi;

namespace {

// The kernels' name for a ggml weight type; false: not one they take.
bool weight_type(int ggml_type, speclm::WeightType &out) {
    switch (ggml_type) {
        case TYPE_Q4_K: out = speclm::WeightType::Q4_K; return true;
        case TYPE_Q6_K: out = speclm::WeightType::Q6_K; return true;
        case TYPE_Q4_0: out = speclm::WeightType::Q4_0; return true;
        case TYPE_Q4_1: out = speclm::WeightType::Q4_1; return true;
        case TYPE_Q5_0: out = speclm::WeightType::Q5_0; return true;
        case TYPE_Q8_0: out = speclm::WeightType::Q8_0; return true;
        case TYPE_IQ4_NL: out = speclm::WeightType::IQ4_NL; return true;
        default: return false;
    }
}

buffer_type our_type, our_x16_type;
std::atomic<bool> interleaved{false};  // weights with rows in sixteens go to our_x16_type (else to our_type)
std::atomic<bool> claiming{false};
std::atomic<int> min_rows{2}, max_rows{64};
std::atomic<long> handled{0};
speclm::Isa isa = speclm::Isa::NONE;
bool registered = false;

bool in(const tensor *t, const buffer_type *type) { return t && t->buf && t->buf->buft == type; }

bool shape_ok(const tensor *op) {
    const tensor *w = op->src[0], *x = op->src[1];
    speclm::WeightType type;
    if (!weight_type(w->type, type)) return false;
    if (w->ne[2] != 1 || w->ne[3] != 1 || w->ne[0] % speclm::block_values(type) != 0) return false;
    if (!x || x->type != TYPE_F32 || x->ne[0] != w->ne[0] || x->ne[2] != 1 || x->ne[3] != 1) return false;
    if (x->nb[0] != sizeof(float) || op->nb[0] != sizeof(float)) return false;
    if (x->buf && !g.buft_is_host(x->buf->buft)) return false;
    return isa != speclm::Isa::NONE;
}

bool takes(const tensor *op) {
    int ny = (int)op->src[1]->ne[1];
    return op->op == op_mul_mat && in(op->src[0], &our_type) && shape_ok(op) && ny >= min_rows.load() &&
           ny <= max_rows.load();
}

// The X16 type of a weight with rows in sixteens (false: the X16 layout does not take it).
bool x16_type(const tensor *w, speclm::WeightType &out) {
    speclm::WeightType type;
    if (!weight_type(w->type, type)) return false;
    if (w->ne[1] % 16 != 0 || w->ne[2] != 1 || w->ne[3] != 1 || w->ne[0] % speclm::block_values(type) != 0) return false;
    if (w->nb[1] != g.row_size(w->type, w->ne[0]) || (w->view_src && w->view_offs % (16 * w->nb[1])))
        return false;  // rows not packed, or a view that does not start at a group of sixteen
    out = speclm::x16_of(type);
    return true;
}

bool x16_able(const tensor *w) {
    speclm::WeightType type;
    return x16_type(w, type);
}

// A matmul's weight rows cut into chunks for ggml's threads: four a thread (fewer where the matrix has
// fewer sixteen-row groups), as even as whole groups allow (X16 groups and the AVX-512 kernels' row
// pairs stay whole). Each thread then streams long runs of contiguous weights: 64-row chunks taken in
// turn cost 5-15 % at every row count, one-row decodes most (docs/kernels.md#work-split); one chunk a
// thread would leave run()'s shared counter nothing to even out.
struct Chunks {
    static constexpr int64_t GROUP = 16, PER_THREAD = 4;
    int64_t rows, groups, count;
    Chunks(int64_t rows_, int nth)
        : rows(rows_), groups((rows_ + GROUP - 1) / GROUP), count(std::min(groups, PER_THREAD * nth)) {}
    int64_t start(int64_t c) const { return std::min(rows, c * groups / count * GROUP); }  // c = count: rows
};

// The activations' bytes for a matmul of `type` (Q8_K-like for the k-quants, Activations32 else).
size_t activation_bytes(speclm::WeightType type, int ny, int64_t k) {
    return speclm::is_q32(type) ? speclm::Activations32::bytes(ny, k) : speclm::Activations::bytes(ny, k);
}

// One matmul's activations in `mem`, laid out as the kernels for its weight type read them, and those
// kernels: the one place the k-quants and the 32-value formats part ways.
struct Matmul {
    speclm::WeightType type;
    speclm::Activations act;
    speclm::Activations32 act32;

    Matmul(speclm::WeightType t, void *mem, int ny, int64_t k) : type(t) {
        if (speclm::is_q32(t)) act32 = speclm::Activations32::in(mem, ny, k);
        else act = speclm::Activations::in(mem, ny, k);
    }

    void quantize(const float *x, size_t x_stride, int j0, int j1) {
        if (speclm::is_q32(type)) speclm::quantize_rows32(x, x_stride, j0, j1, act32);
        else speclm::quantize_rows(x, x_stride, j0, j1, act);
    }

    void gemm(const uint8_t *w, size_t row_bytes, int64_t r0, int64_t r1, float *dst, size_t dst_stride,
              speclm::Isa isa_) const {
        if (speclm::is_q32(type)) speclm::gemm32(type, w, row_bytes, r0, r1, act32, dst, dst_stride, isa_);
        else speclm::gemm(type, w, row_bytes, r0, r1, act, dst, dst_stride, isa_);
    }
};

// The matmul on ggml's threads: activations quantised by every thread's share, then weight rows in
// chunks. False (nothing done) where the kernels decline it.
bool run(compute_params *p, tensor *op, speclm::WeightType type, bool row_range = true) {
    if (row_range && !takes(op)) return false;
    const tensor *w = op->src[0], *x = op->src[1];
    const int ny = (int)x->ne[1];
    const int64_t k = w->ne[0];
    if (p->wsize < activation_bytes(type, ny, k)) return false;  // the same answer on every thread
    Matmul mm(type, p->wdata, ny, k);
    if (p->ith == 0) g.chunk_set(p->threadpool, p->nth);  // chunks 0..nth-1 go to the threads in order
    mm.quantize((const float *)x->data, x->nb[1] / sizeof(float), ny * p->ith / p->nth, ny * (p->ith + 1) / p->nth);
    g.barrier(p->threadpool);
    // weight rows in chunks taken from ggml's shared counter, so a thread that another process slows
    // down leaves its share to the others instead of holding the step at the next barrier
    const Chunks chunks(w->ne[1], p->nth);
    for (int64_t c = p->ith; c < chunks.count; c = g.chunk_add(p->threadpool, 1))
        mm.gemm((const uint8_t *)w->data, w->nb[1], chunks.start(c), chunks.start(c + 1), (float *)op->data,
                op->nb[1] / sizeof(float), isa);
    if (p->ith == 0) handled.fetch_add(1, std::memory_order_relaxed);
    return true;
}

class Traits : public tensor_traits {  // weights in ggml's layout: declined matmuls go on to vec_dot
  public:
    // Q4_K/Q6_K: ggml reserves ny * K/256 * 292 bytes for Q8_K activations, exactly what these use (false:
    // ggml's own estimate stands). The 32-value formats' activations take 42 bytes per 32 values where ggml
    // reserves 34 (Q8_0) or 36 (Q8_1): ask for the larger of theirs and ggml's own estimate, which this
    // answer replaces for the node (ggml_graph_plan asks the extra buffer types first) and which a matmul
    // these kernels decline still needs.
    bool work_size(int n_threads, const tensor *op, size_t &size) override {
        speclm::WeightType type;
        if (op->op != op_mul_mat || !weight_type(op->src[0]->type, type) || !speclm::is_q32(type)) return false;
        const tensor *x = op->src[1];
        const int vec_dot = type == speclm::WeightType::Q4_1 ? TYPE_Q8_1 : TYPE_Q8_0;
        size_t own = x->type == vec_dot ? 0 : g.row_size(vec_dot, x->ne[0] * x->ne[1] * x->ne[2] * x->ne[3]);
        own = (own + 63) / 64 * 64 + g.tiled_wdata_size(n_threads, const_cast<tensor *>(op));
        const size_t ours = shape_ok(op) ? activation_bytes(type, (int)x->ne[1], op->src[0]->ne[0]) : 0;
        size = std::max(own, ours);
        return true;
    }

    bool compute_forward(compute_params *p, tensor *op) override {
        speclm::WeightType type;
        return weight_type(op->src[0]->type, type) && run(p, op, type);
    }
};

[[noreturn]] void die(const char *what, const tensor *t) {
    std::fprintf(stderr, "speclm: %s (%s); the X16 layout cannot serve it\n", what, t->name);
    std::abort();
}

// Weights in the X16 layout: ggml cannot read it, so every matmul on them runs here (any row count).
class TraitsX16 : public tensor_traits {
  public:
    bool work_size(int, const tensor *op, size_t &size) override {
        speclm::WeightType type;
        if (!x16_type(op->src[0], type)) return false;
        size = activation_bytes(type, (int)op->src[1]->ne[1], op->src[0]->ne[0]);
        return true;
    }

    bool compute_forward(compute_params *p, tensor *op) override {
        speclm::WeightType type;
        if (!x16_type(op->src[0], type) || !shape_ok(op)) die("a matmul of a shape speclm's kernels do not take", op);
        if (!run(p, op, type, false)) die("ggml's work buffer is smaller than asked for", op);
        return true;
    }
};

Traits traits;
TraitsX16 traits_x16;

// llama.cpp asks at load time with a zero-size buffer of the type (claim only while claiming); later
// asks are about weights already placed, which must keep their answer.
bool loading(const tensor *op) { return op->src[0]->buf->size == 0; }

class Extra : public extra_buffer_type {  // CPU_SPECLM
  public:
    bool supports_op(void *, const tensor *op) override {
        if (op->op != op_mul_mat || !in(op->src[0], &our_type)) return false;
        if (loading(op) && (!claiming.load() || (interleaved.load() && x16_able(op->src[0]))))
            return false;  // not this model's, or for CPU_SPECLM_X16
        return shape_ok(op);
    }

    tensor_traits *get_tensor_traits(const tensor *op) override {
        return op->op == op_mul_mat && in(op->src[0], &our_type) ? &traits : nullptr;
    }
};

class ExtraX16 : public extra_buffer_type {  // CPU_SPECLM_X16: MUL_MAT only (no GET_ROWS, no other op)
  public:
    bool supports_op(void *, const tensor *op) override {
        if (op->op != op_mul_mat || !in(op->src[0], &our_x16_type)) return false;
        if (loading(op) && !(claiming.load() && interleaved.load())) return false;
        return x16_able(op->src[0]) && shape_ok(op);
    }

    tensor_traits *get_tensor_traits(const tensor *op) override {
        return op->op == op_mul_mat && in(op->src[0], &our_x16_type) ? &traits_x16 : nullptr;
    }
};

const char *type_get_name(buffer_type *) { return "CPU_SPECLM"; }

buffer *type_alloc_buffer(buffer_type *bt, size_t size) {
    buffer *b = g.buft_alloc_buffer(g.cpu_buffer_type(), size);
    if (b) b->buft = bt;  // ggml's CPU buffer (same layout, same accessors), labelled as ours
    return b;
}

size_t type_get_alignment(buffer_type *) { return g.buft_get_alignment(g.cpu_buffer_type()); }

// The X16 buffer's accessors: a weight is set whole (as llama.cpp loads it) and repacked on the way in;
// reads give ggml's layout back, whole rows at a time.
size_t tensor_bytes(const tensor *t) { return g.row_size(t->type, t->ne[0]) * t->ne[1] * t->ne[2] * t->ne[3]; }

void x16_set_tensor(buffer *, tensor *t, const void *data, size_t offset, size_t size) {
    speclm::WeightType type;
    if (!x16_type(t, type)) die("a tensor the X16 layout does not take was placed in its buffer", t);
    if (offset != 0 || size != tensor_bytes(t)) die("a weight was set in parts", t);
    speclm::repack_x16(speclm::plain_of(type), (const uint8_t *)data, t->ne[1], t->ne[0], (uint8_t *)t->data);
}

void x16_get_tensor(buffer *, const tensor *t, void *data, size_t offset, size_t size) {
    speclm::WeightType type;
    const size_t row = t->nb[1];
    if (!x16_type(t, type) || offset % row || size % row) die("a read of part of a row", t);
    for (size_t r = 0; r < size / row; ++r)
        speclm::unpack_x16_row(speclm::plain_of(type), (const uint8_t *)t->data, t->ne[0], (int64_t)(offset / row + r),
                               (uint8_t *)data + r * row);
}

const char *x16_type_get_name(buffer_type *) { return "CPU_SPECLM_X16"; }

buffer *x16_type_alloc_buffer(buffer_type *bt, size_t size) {
    buffer *b = g.buft_alloc_buffer(g.cpu_buffer_type(), size);
    if (!b) return b;
    b->buft = bt;  // ggml's CPU buffer, its weights repacked as they are set
    b->iface.set_tensor = x16_set_tensor;
    b->iface.get_tensor = x16_get_tensor;
    b->iface.cpy_tensor = nullptr;  // ggml copies through get_tensor and set_tensor then
    return b;
}

}  // namespace

extern "C" {

// Put speclm's buffer type first in libggml-cpu's list of extra buffer types (lib_dir: the directory
// of llama-cpp-python's libggml-*.so, already loaded). Must run before the process loads its first
// model: llama.cpp copies the list then. Returns 0, or -1 with the reason in speclm_kernels_error().
__attribute__((visibility("default"))) int speclm_kernels_register(const char *lib_dir) {
    if (registered) return 0;
    isa = speclm::best_isa();
    if (isa == speclm::Isa::NONE) return fail("this CPU lacks AVX2 and FMA"), -1;
    if (!resolve(lib_dir) || !abi_check()) return -1;
    static Extra extra;
    static ExtraX16 extra_x16;
    our_type.iface = {type_get_name, type_alloc_buffer, type_get_alignment, nullptr, nullptr, nullptr};
    our_type.device = g.reg_dev_get(g.cpu_reg(), 0);
    our_type.context = &extra;
    our_x16_type.iface = {x16_type_get_name, x16_type_alloc_buffer, type_get_alignment, nullptr, nullptr, nullptr};
    our_x16_type.device = our_type.device;
    our_x16_type.context = &extra_x16;
    auto &list = g.extra_buffer_types();
    list.insert(list.begin(), &our_type);
    list.insert(list.begin(), &our_x16_type);
    // llama.cpp reads the device's copy of the list, made once at the first model load
    using get_extra = buffer_type **(*)(void *);
    auto copy = reinterpret_cast<get_extra>(g.reg_get_proc_address(g.cpu_reg(), "ggml_backend_dev_get_extra_bufts"));
    bool seen = false;
    for (buffer_type **t = copy ? copy(our_type.device) : nullptr; t && *t; ++t) seen |= *t == &our_type;
    if (!seen) {
        list.erase(std::find(list.begin(), list.end(), &our_type));
        list.erase(std::find(list.begin(), list.end(), &our_x16_type));
        return fail("llama.cpp already listed its buffer types (a model was loaded before speclm's kernels "
                    "registered)"), -1;
    }
    registered = true;
    return 0;
}

__attribute__((visibility("default"))) const char *speclm_kernels_error() { return last_error(); }

// Whether models loaded from now on put their matmul weights of the types above in speclm's buffer.
__attribute__((visibility("default"))) void speclm_kernels_claim(int on) { claiming = on != 0; }

// The matmuls speclm computes: those over min..max activation rows (others run ggml's kernels), and on
// weights in the X16 layout every one.
__attribute__((visibility("default"))) void speclm_kernels_rows(int lo, int hi) {
    min_rows = lo;
    max_rows = hi;
}

// Which kernels run: 2 AVX-512 VNNI, 1 AVX2 (a CPU's best by default; forcing one it lacks is refused).
__attribute__((visibility("default"))) int speclm_kernels_isa(int force) {
    if (force > 0 && force <= (int)speclm::best_isa()) isa = (speclm::Isa)force;
    return (int)isa;
}

__attribute__((visibility("default"))) long speclm_kernels_handled() { return handled.load(); }

// Whether models loaded from now on put their weights with rows in sixteens in the X16 layout (on: 1,
// off: 0, ask: -1). Returns the setting.
__attribute__((visibility("default"))) int speclm_kernels_interleaved(int on) {
    if (on >= 0) interleaved = on != 0;
    return interleaved.load() ? 1 : 0;
}

// One matmul outside llama.cpp (tests): out[j * nrows + r] = W[r] . x[j], x quantised as ggml's Q8_K;
// type 0 Q4_K, 1 Q6_K; 3..7 Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL with x quantised per 32 values (Activations32);
// 8..12 the same in the X16 layout and 13, 14 Q4_K, Q6_K in it (speclm_repack_x16's output; nrows a
// multiple of 16); 2 is unused.
// reps > 0: compute it that many times and return the fastest one's thread CPU time in ns (the
// quantisation of x not counted), to compare kernels on a shared machine.
// `rows` rows of K values of format `type` (0, 1 or 3..7 as in speclm_gemm) in ggml's layout at src, in
// the X16 layout at dst (out = 0), or (out = 1) the X16 rows at src back in ggml's layout. 0, or -1: a type
// or shape the layout does not take.
__attribute__((visibility("default"))) int speclm_repack_x16(int type, const void *src, int64_t rows, int64_t k,
                                                            void *dst, int out) {
    auto wt = (speclm::WeightType)type;
    if (type < 0 || type > 7 || type == 2) return -1;
    if (out == 0) return speclm::repack_x16(wt, (const uint8_t *)src, rows, k, (uint8_t *)dst) ? 0 : -1;
    const int values = speclm::block_values(wt);
    if (rows % 16 || k % values || k <= 0) return -1;
    const size_t row_bytes = speclm::weight_block_bytes(wt) * (size_t)(k / values);
    for (int64_t r = 0; r < rows; ++r)
        speclm::unpack_x16_row(wt, (const uint8_t *)src, k, r, (uint8_t *)dst + r * row_bytes);
    return 0;
}

__attribute__((visibility("default"))) double speclm_gemm(int type, const void *w, int64_t nrows, int64_t k,
                                                         const float *x, int ny, float *out, int isa_, int reps) {
    if (ny < 1 || isa_ < 1 || isa_ > (int)speclm::best_isa() || type < 0 || type > 14 || type == 2) return -1;
    auto wt = (speclm::WeightType)type;
    if (k % speclm::block_values(wt) || (speclm::is_x16(wt) && nrows % 16))
        return -1;
    std::vector<uint8_t> mem(activation_bytes(wt, ny, k) + 64);
    Matmul mm(wt, (void *)(((uintptr_t)mem.data() + 63) & ~(uintptr_t)63), ny, k);
    mm.quantize(x, (size_t)k, 0, ny);
    const size_t row_bytes = speclm::weight_block_bytes(wt) * (size_t)(k / speclm::block_values(wt));
    double best = 0;
    for (int rep = 0; rep < (reps > 0 ? reps : 1); ++rep) {
        timespec t0, t1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        mm.gemm((const uint8_t *)w, row_bytes, 0, nrows, out, (size_t)nrows, (speclm::Isa)isa_);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
        best = rep == 0 || ns < best ? ns : best;
    }
    return reps > 0 ? best : 0;
}

}  // extern "C"
