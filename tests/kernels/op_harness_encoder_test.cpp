// The op harness, encoder part (layer_norm, gelu, attention_full: the vision tower's ops), on every
// target, against double references written here, and the through-the-host defaults a device backend
// inherits (backend.h's *_via_host) against the same references.
#include <cmath>

#include "kernels/op_harness.h"

namespace cera::harness {
namespace {

std::vector<double> layer_norm_ref(const std::vector<float>& x, int64_t n, const std::vector<float>& w,
                                   const std::vector<float>& b, double eps) {
    std::vector<double> out(x.size());
    for (size_t r = 0; r < x.size() / size_t(n); ++r) {
        const float* xr = x.data() + r * size_t(n);
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < n; ++i) mean += xr[i];
        mean /= double(n);
        for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
        var /= double(n);
        for (int64_t i = 0; i < n; ++i)
            out[r * size_t(n) + size_t(i)] = (xr[i] - mean) / std::sqrt(var + eps) * w[size_t(i)] + b[size_t(i)];
    }
    return out;
}

double gelu_ref(double x, GeluKind kind) {
    if (kind == GeluKind::kErf) return 0.5 * x * std::erfc(-x / std::sqrt(2.0));
    return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// layer_norm: a float kernel's mean and variance are sums of n terms (gamma(n) relative to the sums
// of magnitudes), then a square root, a division and a multiply-add: bounded here by
// (gamma(2 n) + 8 u) times |w| |x - mean| / sd + |b|, with sd >= sqrt(eps).
TEST(OpHarness, LayerNorm) {
    std::mt19937 rng(31);
    for (int64_t n : kLengths) {
        for (int64_t rows : kRowCounts) {
            if (rows * n > kMaxElems) continue;
            const std::vector<float> x = randn(size_t(rows * n), rng, 3.0f), w = randn(size_t(n), rng),
                                     b = randn(size_t(n), rng);
            const float eps = 1e-6f;
            const std::vector<double> ref = layer_norm_ref(x, n, w, b, eps);
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                for (int via_host = 0; via_host < 2; ++via_host) {
                    OnBackend ob(t);
                    Tensor X = ob.f32({n, rows}, x), W = ob.f32({n}, w), B = ob.f32({n}, b);
                    Tensor out = ob.alloc(GgmlType::kF32, {n, rows});
                    if (via_host)
                        layer_norm_via_host(ob.be(), X, W, B, eps, out);
                    else
                        ob.be().layer_norm(X, W, B, eps, out);
                    const std::vector<float> y = ob.read(out);
                    Checker c(str(t.name, via_host ? " via host" : "", " layer_norm n ", n, " rows ", rows));
                    for (size_t i = 0; i < y.size(); ++i) {
                        const double scale = std::fabs(ref[i] - b[i % size_t(n)]) + std::fabs(b[i % size_t(n)]);
                        c.near(y[i], ref[i], (gamma(2 * n) * 8 + 8 * kU) * (scale + 1.0) * std::sqrt(double(n)), "at ",
                               i);
                    }
                }
            }
        }
    }
}

// gelu: tanh / erf and a few products: 16 u relative, plus 1e-30 for results near 0. In place too.
TEST(OpHarness, Gelu) {
    std::mt19937 rng(32);
    for (GeluKind kind : {GeluKind::kTanh, GeluKind::kErf})
        for (int64_t n : kLengths) {
            std::vector<float> x = randn(size_t(n) * 7, rng, 4.0f);
            if (x.size() >= 3) x[0] = -30.0f, x[1] = 30.0f, x[2] = 0.0f;
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                for (int mode = 0; mode < 3; ++mode) {  // out separate, in place, via host
                    OnBackend ob(t);
                    Tensor X = ob.f32({n, 7}, x);
                    Tensor out = mode == 1 ? X : ob.alloc(GgmlType::kF32, {n, 7});
                    if (mode == 2)
                        gelu_via_host(ob.be(), X, kind, out);
                    else
                        ob.be().gelu(X, kind, out);
                    const std::vector<float> y = ob.read(out);
                    Checker c(str(t.name, " gelu ", kind == GeluKind::kErf ? "erf" : "tanh", " n ", n, " mode ", mode));
                    for (size_t i = 0; i < y.size(); ++i) {
                        const double ref = gelu_ref(x[i], kind);
                        c.near(y[i], ref, 16 * kU * std::fabs(ref) + 1e-30 + 16 * kU * std::fabs(x[i]) * 1e-6, "at ",
                               i);
                    }
                }
            }
        }
}

// attention_full: every query over every key, softmax in double here. A float kernel's scores are
// dot products of head_dim terms (gamma(head_dim) |q| |k|), its exponentials and the weighted sum of
// n_tokens rows of v (gamma(n_tokens)): bounded by (gamma(head_dim) scale |q| |k| + gamma(n_tokens) +
// 8 u) times max |v|, with |q| |k| the largest product of norms.
TEST(OpHarness, AttentionFull) {
    std::mt19937 rng(33);
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 2, 32}, {33, 3, 64}, {280, 2, 32}, {513, 1, 72}};  // n, heads, dim
    for (const auto& s : shapes) {
        const int64_t n = s[0], n_head = s[1], hd = s[2], width = n_head * hd;
        const std::vector<float> q = randn(size_t(n * width), rng, 2.0f), k = randn(q.size(), rng, 2.0f),
                                 v = randn(q.size(), rng);
        const double scale = 1.0 / std::sqrt(double(hd));
        std::vector<double> ref(q.size());
        double vmax = 0.0, qk = 0.0;
        for (float a : v) vmax = std::max(vmax, double(std::fabs(a)));
        for (int64_t h = 0; h < n_head; ++h)
            for (int64_t t = 0; t < n; ++t) {
                std::vector<double> sc(static_cast<size_t>(n));
                double mx = -INFINITY, sum = 0.0, nq = 0.0;
                for (int64_t c = 0; c < hd; ++c)
                    nq += double(q[size_t(t * width + h * hd + c)]) * q[size_t(t * width + h * hd + c)];
                for (int64_t j = 0; j < n; ++j) {
                    double d = 0.0, nk = 0.0;
                    for (int64_t c = 0; c < hd; ++c) {
                        d += double(q[size_t(t * width + h * hd + c)]) * k[size_t(j * width + h * hd + c)];
                        nk += double(k[size_t(j * width + h * hd + c)]) * k[size_t(j * width + h * hd + c)];
                    }
                    qk = std::max(qk, std::sqrt(nq * nk));
                    sc[size_t(j)] = d * scale;
                    mx = std::max(mx, sc[size_t(j)]);
                }
                for (double& x : sc) sum += (x = std::exp(x - mx));
                for (int64_t c = 0; c < hd; ++c) {
                    double acc = 0.0;
                    for (int64_t j = 0; j < n; ++j) acc += sc[size_t(j)] * v[size_t(j * width + h * hd + c)];
                    ref[size_t(t * width + h * hd + c)] = acc / sum;
                }
            }
        const double bound = (gamma(hd) * scale * qk * 4 + gamma(n) * 2 + 8 * kU) * vmax;
        for (const Target& t : targets()) {
            if (t.moe_only) continue;
            for (int via_host = 0; via_host < 2; ++via_host) {
                OnBackend ob(t);
                Tensor Q = ob.f32({width, n}, q), K = ob.f32({width, n}, k), V = ob.f32({width, n}, v);
                Tensor out = ob.alloc(GgmlType::kF32, {width, n});
                if (via_host)
                    attention_full_via_host(ob.be(), Q, K, V, int(n_head), int(hd), float(scale), out);
                else
                    ob.be().attention_full(Q, K, V, int(n_head), int(hd), float(scale), out);
                const std::vector<float> y = ob.read(out);
                Checker c(
                    str(t.name, via_host ? " via host" : "", " attention_full n ", n, " heads ", n_head, " dim ", hd));
                for (size_t i = 0; i < y.size(); ++i) c.near(y[i], ref[i], bound, "at ", i);
            }
        }
    }
}

}  // namespace
}  // namespace cera::harness
