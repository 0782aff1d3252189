// The CUDA op tests' shared pieces: random data, GGUF weights made from f32 values, and the fixture
// with a CUDA and a CPU backend side by side (skips when no CUDA device is present). Used by
// cuda_kernels_test.cpp, cuda_decode_test.cpp and cuda_attention_test.cpp.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/device.h"
#include "core/fp16.h"
#include "core/quant/quant.h"
#include "kernels/test_weights.h"

namespace cera {

// GGUF bytes of a [rows, k] weight of `type` made from f32 values.
inline std::vector<uint8_t> make_weight(GgmlType type, const std::vector<float>& w, int64_t rows, int64_t k) {
    const size_t rb = row_size(type, k);
    std::vector<uint8_t> out(rb * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) {
        const float* src = w.data() + r * k;
        uint8_t* dst = out.data() + size_t(r) * rb;
        if (type == GgmlType::kF32) std::memcpy(dst, src, size_t(k) * 4);
        else
            quantize_row_ref(type, src, dst, k);
    }
    return out;
}

// A CUDA backend with the options that `set` makes (the defaults otherwise).
template <class F>
std::unique_ptr<Backend> cuda_backend_with(F set) {
    BackendOptions o;
    o.device = DeviceKind::kCuda;
    set(o.cuda);
    return create_backend(o);
}

// An f32 buffer of `be`, filled with *v when v is given.
inline Tensor f32_on(Backend& be, std::initializer_list<int64_t> ne, const std::vector<float>* v = nullptr) {
    Tensor t = be.alloc(GgmlType::kF32, ne);
    if (v) be.write(t, v->data(), v->size() * 4);
    return t;
}

// max |a - ref| over max(|ref|, 1e-3); infinite when a has a value that is not finite.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& ref) {
    double err = 0, mag = 1e-3;
    for (size_t e = 0; e < a.size(); ++e) {
        if (!std::isfinite(a[e])) return INFINITY;
        err = std::max(err, double(std::fabs(a[e] - ref[e])));
        mag = std::max(mag, double(std::fabs(ref[e])));
    }
    return err / mag;
}

// The 8-bit activations the CUDA GEMV uses, dequantized (same float operations as the kernel).
inline std::vector<float> q8_roundtrip(const std::vector<float>& x) {
    std::vector<float> out(x.size());
    for (size_t g = 0; g < x.size(); g += 32) {
        float amax = 0.0f;
        for (size_t i = g; i < g + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (size_t i = g; i < g + 32; ++i) out[i] = d * float(int(std::nearbyint(x[i] * id)));
    }
    return out;
}

class CudaBackendTest : public ::testing::Test {
   protected:
    void SetUp() override {
        std::string why;
        if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
        BackendOptions o;
        o.device = DeviceKind::kCuda;
        gpu_ = create_backend(o);
        o.device = DeviceKind::kCpu;
        o.n_threads = 2;
        cpu_ = create_backend(o);
    }

    // The same f32 (or i32) data in a buffer of each backend.
    struct Pair {
        Tensor g, c;
    };
    Pair both(GgmlType type, std::initializer_list<int64_t> ne, const void* data) {
        Pair p{gpu_->alloc(type, ne), cpu_->alloc(type, ne)};
        if (data) {
            gpu_->write(p.g, data, p.g.n_bytes());
            cpu_->write(p.c, data, p.c.n_bytes());
        }
        return p;
    }
    Pair both(std::initializer_list<int64_t> ne, const std::vector<float>& v) {
        return both(GgmlType::kF32, ne, v.data());
    }
    std::vector<float> get(const Tensor& t, Backend& be) {
        std::vector<float> v(static_cast<size_t>(t.n_elements()));
        be.read(v.data(), t, v.size() * 4);
        return v;
    }
    // Random K / V rows at positions 0 .. n_pos - 1 of both backends' caches, through kv_store, in
    // chunks of up to 512 positions.
    void fill_kv(const Pair& kc, const Pair& vc, int64_t width, int64_t n_pos) {
        for (int64_t p0 = 0; p0 < n_pos; p0 += 512) {
            const int64_t n = std::min<int64_t>(512, n_pos - p0);
            std::vector<int32_t> pos(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = int32_t(p0 + i);
            auto k = both({width, n}, randn(size_t(n * width), rng_));
            auto v = both({width, n}, randn(size_t(n * width), rng_));
            auto pp = both(GgmlType::kI32, {n}, pos.data());
            gpu_->kv_store(k.g, v.g, pp.g, kc.g, vc.g);
            cpu_->kv_store(k.c, v.c, pp.c, kc.c, vc.c);
        }
    }
    // max |gpu - cpu| over max(1, max |cpu|)
    double rel_diff(const Pair& p) {
        const auto a = get(p.g, *gpu_), b = get(p.c, *cpu_);
        double err = 0, mag = 1;
        for (size_t i = 0; i < a.size(); ++i) {
            if (!std::isfinite(a[i])) return INFINITY;
            err = std::max(err, double(std::fabs(a[i] - b[i])));
            mag = std::max(mag, double(std::fabs(b[i])));
        }
        return err / mag;
    }

    std::unique_ptr<Backend> gpu_, cpu_;
    std::mt19937 rng_{1234};
};

}  // namespace cera
