#!/usr/bin/env bash
# Builds .venv-llama: llama.cpp for benchmarks/llama_cpp.py, the CPU sampling peer.
#
#   scripts/venv_llama.sh DEST PYTHON
#
# PyPI has no prebuilt CPU wheel of llama-cpp-python for Linux, so this compiles the
# llama.cpp vendored in its sdist, once, for both things the benchmark runs:
#   DEST/llama.cpp/llama-server   continuous batching behind an OpenAI-compatible HTTP API
#   DEST's llama-cpp-python       the Python binding, on the same shared libraries
# The kernels are AVX2/FMA/F16C only, every AVX512 and AMX option off, whatever this CPU
# has: the benchmark compares us with llama.cpp as an AVX2-only CPU runs it. Override with
# LLAMA_CMAKE_ARGS. The compile runs under `nice -n 19` on LLAMA_BUILD_JOBS cores (default
# all); it takes 10-20 minutes on two cores. Never part of `make venv` or `make test`.
set -euo pipefail

dest=${1:?usage: scripts/venv_llama.sh DEST PYTHON}
python=${2:?usage: scripts/venv_llama.sh DEST PYTHON}
version=0.3.36
jobs=${LLAMA_BUILD_JOBS:-$(nproc)}
pip_quiet=(--quiet --disable-pip-version-check)
avx2_only=(
	-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF
	-DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON
	-DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
	-DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
)
read -r -a extra <<<"${LLAMA_CMAKE_ARGS:-}"

rm -rf "$dest"
"$python" -m venv "$dest"
dest=$(cd "$dest" && pwd)
work="$dest/.build"
mkdir -p "$work"
"$dest/bin/pip" download "${pip_quiet[@]}" --no-deps --no-binary=:all: \
	"llama-cpp-python==$version" -d "$work"
tar -xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
src="$work/llama_cpp_python-$version"

# llama.cpp itself: shared libraries and llama-server, each finding the others beside it.
cmake -S "$src/vendor/llama.cpp" -B "$work/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release \
	-DBUILD_SHARED_LIBS=ON '-DCMAKE_BUILD_RPATH=$ORIGIN' \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
	-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
	-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
	"${avx2_only[@]}" "${extra[@]}"
nice -n 19 cmake --build "$work/cmake" -j "$jobs" --target llama-server
mkdir -p "$dest/llama.cpp"
cp -P "$work/cmake/bin/llama-server" "$work/cmake/bin/"*.so* "$dest/llama.cpp/"
"$dest/llama.cpp/llama-server" --version

# The binding without a second compile: it loads libllama.so from llama_cpp/lib.
CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" "$dest/bin/pip" install "${pip_quiet[@]}" "$src"
lib=$("$dest/bin/python" -c 'import importlib.util as u, pathlib as p; print(p.Path(u.find_spec("llama_cpp").origin).parent / "lib")')
mkdir -p "$lib"
cp -P "$work/cmake/bin/"*.so* "$lib/"
"$dest/bin/python" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__)'
rm -rf "$work"
