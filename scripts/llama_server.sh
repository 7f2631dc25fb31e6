#!/usr/bin/env bash
# llama.cpp's own server, built from the llama.cpp source vendored in the llama-cpp-python
# sdist speclm installs (same version, so the same CPU kernels), for comparing servers
# (docs/results.md). Not a dependency of the package or the tests.
#
#   scripts/llama_server.sh build [DIR]             # DIR default ~/.cache/speclm/llama-server
#   scripts/llama_server.sh run MODEL PORT SLOTS [DIR] [THREADS]
#
# `run` serves MODEL (a GGUF path, e.g. `python -m speclm models path qwen2.5-coder-1.5b`)
# with SLOTS parallel slots and continuous batching, n_ctx 4096 per slot as speclm's.
# Measure it with `speclm bench --endpoint http://127.0.0.1:PORT/v1 ...` as speclm serve.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
cmd="${1:-}"
case "$cmd" in
  build)
    dir="${2:-$HOME/.cache/speclm/llama-server}"
    mkdir -p "$dir"
    cd "$dir"
    if [ ! -d "llama_cpp_python-$VERSION" ]; then
      python -m pip download "llama-cpp-python==$VERSION" --no-binary :all: --no-deps -d . -q
      tar xzf "llama_cpp_python-$VERSION.tar.gz"
    fi
    src="llama_cpp_python-$VERSION/vendor/llama.cpp"
    cmake -S "$src" -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF > cmake.log
    cmake --build build --target llama-server -j "$(nproc)" > build.log
    echo "$dir/build/bin/llama-server"
    ;;
  run)
    model="$2"; port="$3"; slots="$4"
    dir="${5:-$HOME/.cache/speclm/llama-server}"
    threads="${6:-$(nproc)}"
    exec "$dir/build/bin/llama-server" -m "$model" --port "$port" --host 127.0.0.1 \
      -np "$slots" -c "$((4096 * slots))" -t "$threads" -tb "$threads" -cb --no-webui
    ;;
  *)
    sed -n '2,11p' "$0"; exit 2
    ;;
esac
