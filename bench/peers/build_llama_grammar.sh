#!/usr/bin/env bash
# Builds bench/peers/llama_grammar.cpp against a llama.cpp source tree (its CPU libraries, Release).
#   bench/peers/build_llama_grammar.sh LLAMA_SRC_DIR [BUILD_DIR]   ->  BUILD_DIR/llama_grammar
set -euo pipefail
src=$(cd "$1" && pwd)
out=${2:-/tmp/llama-grammar-build}
here=$(cd "$(dirname "$0")" && pwd)
cmake -S "$src" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=OFF >/dev/null
cmake --build "$out" --target llama llama-common
g++ -O2 -std=c++17 "$here/llama_grammar.cpp" -I"$src/include" -I"$src/common" -I"$src/ggml/include" -I"$src/vendor" \
    "$out/common/libllama-common.a" "$out/common/libllama-common-base.a" "$out/src/libllama.a" \
    "$out/ggml/src/libggml.a" "$out/ggml/src/libggml-cpu.a" "$out/ggml/src/libggml-base.a" \
    -fopenmp -lpthread -ldl -o "$out/llama_grammar"
echo "$out/llama_grammar"
