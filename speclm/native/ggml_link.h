// ggml's functions and type numbers as speclm's buffer types use them: looked up with dlsym in the
// libraries llama_cpp loaded (resolve) and checked against ggml_abi.h (abi_check) at registration.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ggml_abi.h"

namespace speclm_abi {

struct init_params {  // struct ggml_init_params
    size_t mem_size;
    void *mem_buffer;
    bool no_alloc;
};

// ggml's functions, looked up at registration
struct Ggml {
    buffer_type *(*cpu_buffer_type)();
    buffer *(*buft_alloc_buffer)(buffer_type *, size_t);
    size_t (*buft_get_alignment)(buffer_type *);
    bool (*buft_is_host)(buffer_type *);
    buffer_type *(*buffer_get_type)(buffer *);
    size_t (*buffer_get_size)(buffer *);
    void (*buffer_free)(buffer *);
    void *(*cpu_reg)();
    void *(*reg_dev_get)(void *, size_t);
    void *(*reg_get_proc_address)(void *, const char *);
    const char *(*op_name)(int);
    const char *(*type_name)(int);
    size_t (*row_size)(int, int64_t);
    void *(*init)(struct init_params);
    void (*free)(void *);
    tensor *(*new_tensor_2d)(void *, int, int64_t, int64_t);
    tensor *(*mul_mat)(void *, tensor *, tensor *);
    void *(*get_data)(const tensor *);
    void (*barrier)(void *);
    void (*chunk_set)(void *, int);
    int (*chunk_add)(void *, int);
    std::vector<buffer_type *> &(*extra_buffer_types)();
    size_t (*tiled_wdata_size)(int, tensor *);
};

// ggml's type numbers, checked by name at registration
constexpr int TYPE_F32 = 0, TYPE_Q4_0 = 2, TYPE_Q4_1 = 3, TYPE_Q5_0 = 6, TYPE_Q8_0 = 8, TYPE_Q8_1 = 9, TYPE_Q4_K = 12,
              TYPE_Q6_K = 14, TYPE_Q8_K = 15, TYPE_IQ4_NL = 20;

extern Ggml g;
extern int op_mul_mat;  // ggml's number for MUL_MAT (abi_check finds it)

bool resolve(const std::string &lib_dir);  // fills g; false: a library or symbol is missing
bool abi_check();  // false: the loaded ggml's layouts or type numbers differ from ggml_abi.h's
bool fail(const char *fmt, ...);  // records why registration failed (last_error) and returns false
const char *last_error();

}  // namespace speclm_abi
