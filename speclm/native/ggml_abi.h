// The parts of ggml's internal C/C++ interface speclm's kernels plug into, declared here
// for the ggml that llama-cpp-python 0.3.36 vendors (the version pyproject.toml pins).
//
// Nothing here is linked: every ggml function is looked up with dlsym at registration, and
// registration first checks these layouts against the loaded library (abi_check in
// buffer_type.cpp). A llama-cpp-python whose layout differs is refused with a message and
// speclm runs on llama.cpp's own kernels (docs/kernels.md#speclms-kernels).
#pragma once

#include <cstddef>
#include <cstdint>

namespace speclm_abi {

constexpr int MAX_DIMS = 4;
constexpr int MAX_SRC = 10;
constexpr int MAX_OP_PARAMS = 64;
constexpr int MAX_NAME = 64;

struct buffer;
struct buffer_type;

// struct ggml_tensor
struct tensor {
    int32_t type;  // enum ggml_type
    buffer *buf;
    int64_t ne[MAX_DIMS];
    size_t nb[MAX_DIMS];
    int32_t op;  // enum ggml_op
    int32_t op_params[MAX_OP_PARAMS / sizeof(int32_t)];
    int32_t flags;
    tensor *src[MAX_SRC];
    tensor *view_src;
    size_t view_offs;
    void *data;
    char name[MAX_NAME];
    void *extra;
    char padding[8];
};

// struct ggml_backend_buffer_type_i, ggml_backend_buffer_type
struct buffer_type_iface {
    const char *(*get_name)(buffer_type *);
    buffer *(*alloc_buffer)(buffer_type *, size_t size);
    size_t (*get_alignment)(buffer_type *);
    size_t (*get_max_size)(buffer_type *);
    size_t (*get_alloc_size)(buffer_type *, const tensor *);
    bool (*is_host)(buffer_type *);
};

struct buffer_type {
    buffer_type_iface iface;
    void *device;
    void *context;  // for an extra buffer type: its extra_buffer_type object
};

// struct ggml_backend_buffer_i, ggml_backend_buffer
struct buffer_iface {
    void (*free_buffer)(buffer *);
    void *(*get_base)(buffer *);
    int (*init_tensor)(buffer *, tensor *);
    void (*memset_tensor)(buffer *, tensor *, uint8_t, size_t, size_t);
    void (*set_tensor)(buffer *, tensor *, const void *, size_t, size_t);
    void (*get_tensor)(buffer *, const tensor *, void *, size_t, size_t);
    void (*set_tensor_2d)(buffer *, tensor *, const void *, size_t, size_t, size_t, size_t, size_t);
    void (*get_tensor_2d)(buffer *, const tensor *, void *, size_t, size_t, size_t, size_t, size_t);
    bool (*cpy_tensor)(buffer *, const tensor *, tensor *);
    void (*clear)(buffer *, uint8_t);
    void (*reset)(buffer *);
};

struct buffer {
    buffer_iface iface;
    buffer_type *buft;
    void *context;
    size_t size;
    int usage;
};

// struct ggml_compute_params (ggml-cpu-impl.h)
struct compute_params {
    int ith, nth;
    size_t wsize;
    void *wdata;
    void *threadpool;
    bool use_ref;
};

// ggml::cpu::tensor_traits and ggml::cpu::extra_buffer_type (ggml-cpu/traits.h): ggml calls
// them through their vtables, so only the order of the virtual functions matters.
class tensor_traits {
  public:
    virtual ~tensor_traits() {}
    virtual bool work_size(int n_threads, const tensor *op, size_t &size) = 0;
    virtual bool compute_forward(compute_params *params, tensor *op) = 0;
};

class extra_buffer_type {
  public:
    virtual ~extra_buffer_type() {}
    virtual bool supports_op(void *dev, const tensor *op) = 0;
    virtual tensor_traits *get_tensor_traits(const tensor *op) = 0;
};

}  // namespace speclm_abi
