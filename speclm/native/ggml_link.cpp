// Looking up and checking ggml's interface (ggml_link.h).
#include "ggml_link.h"

#include <dlfcn.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace speclm_abi {

Ggml g;
int op_mul_mat = -1;

namespace {
std::string error;
}  // namespace

const char *last_error() { return error.c_str(); }

bool fail(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    error = buf;
    return false;
}

namespace {

template <typename F> bool find(void *lib, const char *name, F &fn) {
    fn = reinterpret_cast<F>(dlsym(lib, name));
    return fn != nullptr || fail("symbol %s not found in llama.cpp's libraries", name);
}

// The library llama_cpp loaded (by its soname, as libllama.so's dependencies name it, or its path).
bool open_lib(const std::string &dir, const char *name, void *&lib) {
    for (const std::string &path : {std::string(name) + ".0", dir + "/" + name + ".0", dir + "/" + name})
        if ((lib = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) != nullptr) return true;
    return fail("%s/%s is not loaded in this process (import llama_cpp first)", dir.c_str(), name);
}

}  // namespace

bool resolve(const std::string &dir) {
    void *base, *cpu;
    return open_lib(dir, "libggml-base.so", base) && open_lib(dir, "libggml-cpu.so", cpu) &&
           find(base, "ggml_backend_cpu_buffer_type", g.cpu_buffer_type) &&
           find(base, "ggml_backend_buft_alloc_buffer", g.buft_alloc_buffer) &&
           find(base, "ggml_backend_buft_get_alignment", g.buft_get_alignment) &&
           find(base, "ggml_backend_buft_is_host", g.buft_is_host) &&
           find(base, "ggml_backend_buffer_get_type", g.buffer_get_type) &&
           find(base, "ggml_backend_buffer_get_size", g.buffer_get_size) &&
           find(base, "ggml_backend_buffer_free", g.buffer_free) && find(cpu, "ggml_backend_cpu_reg", g.cpu_reg) &&
           find(base, "ggml_backend_reg_dev_get", g.reg_dev_get) &&
           find(base, "ggml_backend_reg_get_proc_address", g.reg_get_proc_address) &&
           find(base, "ggml_op_name", g.op_name) && find(base, "ggml_type_name", g.type_name) &&
           find(base, "ggml_row_size", g.row_size) && find(base, "ggml_init", g.init) &&
           find(base, "ggml_free", g.free) && find(base, "ggml_new_tensor_2d", g.new_tensor_2d) &&
           find(base, "ggml_mul_mat", g.mul_mat) && find(base, "ggml_get_data", g.get_data) &&
           find(cpu, "ggml_barrier", g.barrier) && find(cpu, "ggml_threadpool_chunk_set", g.chunk_set) &&
           find(cpu, "ggml_threadpool_chunk_add", g.chunk_add) &&
           find(cpu, "_Z39ggml_backend_cpu_get_extra_buffer_typesv", g.extra_buffer_types) &&
           find(cpu, "ggml_tiled_wdata_size", g.tiled_wdata_size);
}

// The layouts in ggml_abi.h against the loaded library: a tensor and a matmul made by ggml, a
// buffer allocated by ggml, the type numbers by their names.
bool abi_check() {
    // each type ggml numbers here, by name, with the bytes of one 256-value row
    const struct { int type; const char *name; size_t bytes; } types[] = {
        {TYPE_F32, "f32", 1024},  {TYPE_Q4_0, "q4_0", 144}, {TYPE_Q4_1, "q4_1", 160}, {TYPE_Q5_0, "q5_0", 176},
        {TYPE_Q8_0, "q8_0", 272}, {TYPE_Q8_1, "q8_1", 288}, {TYPE_Q4_K, "q4_K", 144}, {TYPE_Q6_K, "q6_K", 210},
        {TYPE_Q8_K, "q8_K", 292}, {TYPE_IQ4_NL, "iq4_nl", 144}};
    for (const auto &t : types) {
        const char *got = g.type_name(t.type);
        if (!got || std::strcmp(got, t.name) != 0)
            return fail("ggml type %d is %s, expected %s", t.type, got ? got : "?", t.name);
        if (g.row_size(t.type, 256) != t.bytes)
            return fail("ggml's %s rows of 256 values are %zu bytes, expected %zu", t.name, g.row_size(t.type, 256),
                        t.bytes);
    }
    void *ctx = g.init({1 << 20, nullptr, false});
    if (!ctx) return fail("ggml_init failed");
    tensor *a = g.new_tensor_2d(ctx, TYPE_Q4_K, 512, 3), *b = g.new_tensor_2d(ctx, TYPE_F32, 512, 2);
    tensor *c = g.mul_mat(ctx, a, b);
    bool ok = a->type == TYPE_Q4_K && a->ne[0] == 512 && a->ne[1] == 3 && a->nb[1] == 288 && a->buf == nullptr &&
              a->data == g.get_data(a) && c->src[0] == a && c->src[1] == b && c->ne[0] == 3 && c->ne[1] == 2 &&
              c->nb[1] == 12;
    op_mul_mat = c->op;
    const char *op = g.op_name(c->op);
    g.free(ctx);
    if (!ok) return fail("ggml_tensor's layout differs from the one speclm was written for");
    if (!op || std::strcmp(op, "MUL_MAT") != 0) return fail("ggml_tensor's op field is not where speclm expects it");
    buffer *buf = g.buft_alloc_buffer(g.cpu_buffer_type(), 4096);
    if (!buf) return fail("ggml could not allocate a 4 KiB CPU buffer");
    ok = buf->buft == g.buffer_get_type(buf) && buf->size == g.buffer_get_size(buf);
    g.buffer_free(buf);
    return ok || fail("ggml_backend_buffer's layout differs from the one speclm was written for");
}

}  // namespace speclm_abi
