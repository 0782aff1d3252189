#include "backends/backend.h"

#include "backends/cpu/cpu_backend.h"
#include "core/check.h"

namespace cera {

// Defined by the CUDA backend (src/backends/cuda/) when it is linked in; weak so that a
// build without it still links, and create_backend reports the device as unavailable.
__attribute__((weak)) std::unique_ptr<Backend> make_cuda_backend(int gpu_index, const CudaOptions& options);

std::unique_ptr<Backend> create_backend(const BackendOptions& opts) {
    switch (opts.device) {
        case DeviceKind::kCpu:
            return make_cpu_backend(opts.n_threads, opts.cpu_isa, opts.observer);
        case DeviceKind::kCuda:
            if (opts.observer) throw_error(ErrorCode::kUnsupported, "the matmul observer (imatrix) needs the cpu device");
            if (&make_cuda_backend == nullptr)
                throw_error(ErrorCode::kDevice, "device cuda: this build has no CUDA backend");
            return make_cuda_backend(opts.gpu_index, opts.cuda);
    }
    throw_error(ErrorCode::kDevice, "unknown device kind %d", int(opts.device));
}

}  // namespace cera
