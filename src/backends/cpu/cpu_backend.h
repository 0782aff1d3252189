// The CPU implementation of the backend interface: every op runs at once on
// the calling thread plus the backend's thread pool. Weights are views into
// the mapped GGUF; a matrix the kernel table keeps repacked (repack.h) lives in
// its packed copy, and the file's pages under it are dropped. Buffers are
// 64-byte aligned host memory. Matmuls go to the kernel table of
// src/backends/cpu/kernels.h (ref / AVX2 / AVX-512).
#pragma once
#include <memory>

#include "backends/backend.h"

namespace cera {

// n_threads <= 0: the number of physical cores. Throws cera::Error(kDevice) when this CPU cannot run
// the kernel table `isa` names.
std::unique_ptr<Backend> make_cpu_backend(int n_threads, CpuIsa isa = CpuIsa::kAuto, MatmulObserver* observer = nullptr);

}  // namespace cera
