"""Builds speclm's native kernels (speclm/native) beside the Python package.

The extension is optional: where it cannot be compiled the install still succeeds, and speclm
runs on llama.cpp's own kernels and says why (`speclm doctor`, docs/kernels.md#speclms-kernels).
It is a plain shared library loaded with ctypes, not a Python module: one binary for every x86-64
CPU, its AVX2 and AVX-512 functions chosen at run time.
"""

import platform

from setuptools import Extension, setup

native = []
if platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64"):
    native.append(Extension(
        "speclm.native._kernels",
        sources=["speclm/native/quant_gemm.cpp", "speclm/native/quant_gemm_q32.cpp",
                 "speclm/native/quant_gemm_q32x16.cpp", "speclm/native/quant_gemm_k16.cpp",
                 "speclm/native/buffer_type.cpp",
                 "speclm/native/ggml_link.cpp", "speclm/native/quantize.cpp"],
        depends=["speclm/native/quant_gemm.h", "speclm/native/quant_gemm_q32_kernels.h", "speclm/native/ggml_abi.h",
                 "speclm/native/ggml_link.h"],
        extra_compile_args=["-O3", "-std=c++17", "-fvisibility=hidden", "-fno-strict-aliasing"],
        libraries=["stdc++", "dl"],
        optional=True,
    ))

setup(ext_modules=native)
