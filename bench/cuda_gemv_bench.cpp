// CUDA GEMV bandwidth: achieved GB/s of batch-1 matmuls per weight type on the benchmark shapes,
// against the device copy bandwidth measured in the same run, plus a decode-shaped chain of the
// lfm2-1.2b matmuls (weights only) as a tok/s ceiling, and that model's products over a 512-token
// prefill chunk per weight type. Each figure times CUDA-graph replays of
// matmuls over enough copies of the weight to defeat the 60 MB L2.
// Usage: cuda_gemv_bench [--quick].
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/device.h"
#include "core/dtype.h"

using namespace cera;

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Random GGUF bytes of a [rows, k] weight with every fp16 scale set to a sane value.
std::vector<uint8_t> random_weight(GgmlType type, int64_t rows, int64_t k, std::mt19937& rng) {
    const size_t bytes = row_size(type, k) * size_t(rows);
    std::vector<uint8_t> w(bytes);
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
        const uint32_t r = rng();
        std::memcpy(&w[i], &r, 4);
    }
    const TypeInfo& ti = type_info(type);
    auto set16 = [&](size_t off, uint16_t v) { std::memcpy(&w[off], &v, 2); };
    const size_t n_blocks = bytes / ti.type_size;
    switch (type) {
        case GgmlType::kF16:
        case GgmlType::kBF16:
            for (size_t i = 0; i < bytes / 2; ++i) set16(2 * i, type == GgmlType::kF16 ? 0x3000 + (i & 0x3ff) : 0x3e00 + (i & 0x7f));
            break;
        case GgmlType::kF32:
            for (size_t i = 0; i < bytes / 4; ++i) {
                const float f = float(int(i % 17) - 8) * 0.01f;
                std::memcpy(&w[4 * i], &f, 4);
            }
            break;
        case GgmlType::kQ4_0:
        case GgmlType::kQ8_0:
        case GgmlType::kQ5_0:
        case GgmlType::kIQ4_NL:
        case GgmlType::kIQ4_XS:
            for (size_t b = 0; b < n_blocks; ++b) set16(b * ti.type_size, 0x2000);
            break;
        case GgmlType::kQ2_K:
            for (size_t b = 0; b < n_blocks; ++b)
                set16(b * ti.type_size + 80, 0x2000), set16(b * ti.type_size + 82, 0x1800);
            break;
        case GgmlType::kQ3_K:
            for (size_t b = 0; b < n_blocks; ++b) set16(b * ti.type_size + 108, 0x2000);
            break;
        case GgmlType::kQ4_K:
        case GgmlType::kQ5_K:
            for (size_t b = 0; b < n_blocks; ++b) set16(b * ti.type_size, 0x2000), set16(b * ti.type_size + 2, 0x1800);
            break;
        case GgmlType::kQ6_K:
            for (size_t b = 0; b < n_blocks; ++b) set16(b * ti.type_size + 208, 0x2000);
            break;
        default: break;
    }
    return w;
}

struct Shape {
    const char* name;
    int64_t rows, k;
};

// Seconds per replay of a graph that runs `body`.
template <class F>
double time_graph(Backend& be, uint64_t key, int reps, F&& body) {
    for (int i = 0; i < 3; ++i)  // eager, capture, first replay
        if (!be.step_begin(key)) {
            body();
            be.step_end();
        }
    be.synchronize();
    std::vector<double> t;
    for (int r = 0; r < 5; ++r) {
        const double t0 = now_s();
        for (int i = 0; i < reps; ++i) {
            if (!be.step_begin(key)) {
                body();
                be.step_end();
            }
        }
        be.synchronize();
        t.push_back((now_s() - t0) / reps);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
    std::string why;
    const auto gpus = cuda_devices(&why);
    if (gpus.empty()) {
        std::printf("cuda_gemv_bench: no CUDA device (%s)\n", why.c_str());
        return 0;
    }
    BackendOptions o;
    o.device = DeviceKind::kCuda;
    auto be = create_backend(o);
    std::printf("device: %s\n", be->description().c_str());

    // Copy bandwidth: 1 GiB device to device, counting bytes read + written.
    {
        const int64_t n = int64_t(1) << 28;  // floats
        Tensor a = be->alloc(GgmlType::kF32, {n}), b = be->alloc(GgmlType::kF32, {n});
        const double s = time_graph(*be, 1, 5, [&] { be->copy(b, a); });
        std::printf("copy: %.1f GB/s (read + write of 1 GiB)\n", 2.0 * double(n) * 4 / s / 1e9);
        be->free(a), be->free(b);
    }

    std::mt19937 rng(7);
    const std::vector<Shape> shapes = {{"ffn_up 8192x2048", 8192, 2048},
                                       {"ffn_down 2048x8192", 2048, 8192},
                                       {"attn 2048x2048", 2048, 2048},
                                       {"lm_head 65536x2048", 65536, 2048},
                                       {"lm_head 50257x2048", 50257, 2048}};
    std::vector<GgmlType> types = {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kQ6_K,
                                   GgmlType::kF16};
    if (!quick)
        types.insert(types.end(), {GgmlType::kBF16, GgmlType::kQ5_K, GgmlType::kQ5_0, GgmlType::kF32, GgmlType::kIQ4_NL,
                                   GgmlType::kIQ4_XS, GgmlType::kQ3_K, GgmlType::kQ2_K});
    std::printf("\n%-8s %-22s %10s %10s %9s\n", "type", "shape", "MB", "us", "GB/s");
    uint64_t key = 100;
    for (GgmlType t : types) {
        for (const Shape& sh : shapes) {
            const size_t bytes = row_size(t, sh.k) * size_t(sh.rows);
            const int copies = int(std::max<size_t>(1, (size_t(256) << 20) / bytes));
            const auto host = random_weight(t, sh.rows, sh.k, rng);
            const int64_t ne[2] = {sh.k, sh.rows};
            std::vector<Tensor> ws;
            for (int c = 0; c < copies; ++c) ws.push_back(be->upload_weight(t, ne, host.data()));
            Tensor x = be->alloc(GgmlType::kF32, {sh.k}), y = be->alloc(GgmlType::kF32, {sh.rows});
            std::vector<float> xv(static_cast<size_t>(sh.k));
            for (auto& v : xv) v = float(int(rng() % 200) - 100) * 0.01f;
            be->write(x, xv.data(), xv.size() * 4);
            const double s = time_graph(*be, key++, 10, [&] {
                for (const Tensor& w : ws) be->matmul(w, x, Tensor{}, y);
            }) / copies;
            std::printf("%-8s %-22s %10.2f %10.2f %9.1f\n", type_name(t), sh.name, bytes / 1e6, s * 1e6,
                        bytes / s / 1e9);
            for (Tensor& w : ws) be->free(w);
            be->free(x), be->free(y);
        }
    }

    // The matmuls of one lfm2-1.2b step (10 conv + 6 attention layers, dense FFN; the 65536-row tied
    // LM head for decode).
    struct M {
        int64_t rows, k;
    };
    std::vector<M> ms;
    for (int l = 0; l < 16; ++l) {
        const bool attn = l == 2 || l == 5 || l == 8 || l == 10 || l == 12 || l == 14;
        if (attn) ms.insert(ms.end(), {{2048, 2048}, {512, 2048}, {512, 2048}, {2048, 2048}});
        else ms.insert(ms.end(), {{6144, 2048}, {2048, 2048}});
        ms.insert(ms.end(), {{8192, 2048}, {8192, 2048}, {2048, 8192}});
    }
    // A 512-token prefill chunk through those products (no LM head): block types expand each weight to
    // F16 for cuBLAS, so their time over F16's is the expansions' cost.
    {
        const int64_t n_tok = 512;
        Tensor x = be->alloc(GgmlType::kF32, {8192, n_tok}), y = be->alloc(GgmlType::kF32, {8192, n_tok});
        std::printf("\n");
        for (GgmlType t : {GgmlType::kF16, GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K}) {
            std::vector<Tensor> ws;
            for (const M& m : ms) {
                const auto host = random_weight(t, m.rows, m.k, rng);
                const int64_t ne[2] = {m.k, m.rows};
                ws.push_back(be->upload_weight(t, ne, host.data()));
            }
            auto chunk = [&] {
                for (const Tensor& w : ws)
                    be->matmul(w, x.reshaped(w.ne[0], n_tok), Tensor{}, y.reshaped(w.ne[1], n_tok));
            };
            chunk();
            be->synchronize();
            std::vector<double> ts;
            for (int r = 0; r < 5; ++r) {
                const double t0 = now_s();
                for (int i = 0; i < 4; ++i) chunk();
                be->synchronize();
                ts.push_back((now_s() - t0) / 4);
            }
            std::sort(ts.begin(), ts.end());
            std::printf("lfm2-1.2b-shaped prefill chunk %s: %zu products of %lld tokens, %.2f ms = %.0f tok/s\n",
                        type_name(t), ws.size(), (long long)n_tok, ts[2] * 1e3, double(n_tok) / ts[2]);
            for (Tensor& w : ws) be->free(w);
        }
        be->free(x), be->free(y);
    }

    // The decode step's matmuls with an RMSNorm before each group: a ceiling on decode tok/s from
    // weights alone.
    ms.push_back({65536, 2048});
    for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K}) {
        std::vector<Tensor> ws;
        size_t total = 0;
        for (const M& m : ms) {
            const auto host = random_weight(t, m.rows, m.k, rng);
            const int64_t ne[2] = {m.k, m.rows};
            ws.push_back(be->upload_weight(t, ne, host.data()));
            total += host.size();
        }
        Tensor x = be->alloc(GgmlType::kF32, {8192}), h = be->alloc(GgmlType::kF32, {8192}),
               y = be->alloc(GgmlType::kF32, {65536});
        const double s = time_graph(*be, key++, 20, [&] {
            for (size_t i = 0; i < ws.size(); ++i) {
                const Tensor xi = x.reshaped(ws[i].ne[0]);
                be->rms_norm(xi, Tensor{}, 1e-5f, h.reshaped(ws[i].ne[0]));
                be->matmul(ws[i], h.reshaped(ws[i].ne[0]), Tensor{}, y.reshaped(ws[i].ne[1]));
            }
        });
        std::printf("\nlfm2-1.2b-shaped decode chain %s: %zu matmuls, %.1f MB, %.1f us/token = %.0f tok/s (%.1f GB/s)\n",
                    type_name(t), ws.size(), total / 1e6, s * 1e6, 1.0 / s, total / s / 1e9);
        for (Tensor& w : ws) be->free(w);
        be->free(x), be->free(h), be->free(y);
    }
    return 0;
}
