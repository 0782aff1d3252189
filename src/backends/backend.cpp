#include "backends/backend.h"

#include <limits>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "core/check.h"

namespace cera {

// Defined by the CUDA backend (src/backends/cuda/) when it is linked in; weak so that a
// build without it still links, and create_backend reports the device as unavailable.
__attribute__((weak)) std::unique_ptr<Backend> make_cuda_backend(int gpu_index, const CudaOptions& options);

const char* device_kind_name(DeviceKind kind) {
    switch (kind) {
        case DeviceKind::kCpu:
            return "cpu";
        case DeviceKind::kCuda:
            return "cuda";
    }
    return "?";
}

void argmax_rows_host(const float* x, int64_t rows, int64_t n, int32_t* out) {
    for (int64_t r = 0; r < rows; ++r, x += n) {
        // Eight independent running maxima (no serial dependency; `v > m ? v : m` never takes a NaN and
        // compiles to vector max instructions), then the first index holding the maximum.
        float m[8];
        for (float& v : m) v = -std::numeric_limits<float>::infinity();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
        float best = -std::numeric_limits<float>::infinity();
        for (; i < n; ++i) best = x[i] > best ? x[i] : best;
        for (float v : m) best = v > best ? v : best;
        int32_t id = 0;  // every value NaN
        for (i = 0; i < n; ++i)
            if (x[i] == best) {
                id = int32_t(i);
                break;
            }
        out[r] = id;
    }
}

void argmax_via_host(Backend& be, const Tensor& x, const Tensor& out) {
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kI32, "argmax: x must be f32 and out i32");
    CERA_CHECK(out.n_elements() >= x.rows(), "argmax: out holds %lld ids for %lld rows", (long long)out.n_elements(),
               (long long)x.rows());
    be.synchronize();
    std::vector<float> host(size_t(x.n_elements()));
    std::vector<int32_t> ids(size_t(x.rows()));
    be.read(host.data(), x, host.size() * sizeof(float));
    argmax_rows_host(host.data(), x.rows(), x.ne[0], ids.data());
    be.write(out, ids.data(), ids.size() * sizeof(int32_t));
}

void argmax_feed_via_host(Backend& be, const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos) {
    CERA_CHECK(x.rows() == 1 && ids.type == GgmlType::kI32 && pos.type == GgmlType::kI32 && ids.n_elements() >= 1 &&
                   pos.n_elements() >= 1,
               "argmax_feed: one row of logits, i32 ids and positions");
    be.argmax(x, out);
    int32_t id = 0, last = 0;
    be.read(&id, out, sizeof id);
    be.read(&last, pos, sizeof last, size_t(pos.n_elements() - 1) * sizeof(int32_t));
    ++last;
    be.write(ids, &id, sizeof id);
    be.write(pos, &last, sizeof last);
}

std::unique_ptr<Backend> create_backend(const BackendOptions& opts) {
    switch (opts.device) {
        case DeviceKind::kCpu:
            return make_cpu_backend(opts.n_threads, opts.cpu_isa);
        case DeviceKind::kCuda:
            if (&make_cuda_backend == nullptr)
                throw_error(ErrorCode::kDevice, "device cuda: this build has no CUDA backend");
            return make_cuda_backend(opts.gpu_index, opts.cuda);
    }
    throw_error(ErrorCode::kDevice, "unknown device kind %d", int(opts.device));
}

}  // namespace cera
