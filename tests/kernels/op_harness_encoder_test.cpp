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
// (gamma(2 n) + 8 u) times |w| |x - mean| / sd + |b|, with sd >= sqrt(eps). Out apart from x, in place,
// without weight and bias (empty tensors: 1 and 0), and through the host.
TEST(OpHarness, LayerNorm) {
    std::mt19937 rng(31);
    for (int64_t n : kLengths) {
        for (int64_t rows : kRowCounts) {
            if (rows * n > kMaxElems) continue;
            const std::vector<float> x = randn(size_t(rows * n), rng, 3.0f), w = randn(size_t(n), rng),
                                     b = randn(size_t(n), rng);
            const std::vector<float> ones(size_t(n), 1.0f), zeros(size_t(n), 0.0f);
            const float eps = 1e-6f;
            const std::vector<double> ref = layer_norm_ref(x, n, w, b, eps),
                                      ref_plain = layer_norm_ref(x, n, ones, zeros, eps);
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                for (int mode = 0; mode < 4; ++mode) {  // out apart, in place, no weight and bias, via host
                    OnBackend ob(t);
                    Tensor X = ob.f32({n, rows}, x), W = ob.f32({n}, w), B = ob.f32({n}, b);
                    Tensor out = mode == 1 ? X : ob.alloc(GgmlType::kF32, {n, rows});
                    if (mode == 3)
                        layer_norm_via_host(ob.be(), X, W, B, eps, out);
                    else if (mode == 2)
                        ob.be().layer_norm(X, Tensor{}, Tensor{}, eps, out);
                    else
                        ob.be().layer_norm(X, W, B, eps, out);
                    const std::vector<float> y = ob.read(out);
                    const std::vector<double>& want = mode == 2 ? ref_plain : ref;
                    const std::vector<float>& bias = mode == 2 ? zeros : b;
                    Checker c(str(t.name, " layer_norm n ", n, " rows ", rows, " mode ", mode));
                    for (size_t i = 0; i < y.size(); ++i) {
                        const double bi = bias[i % size_t(n)], scale = std::fabs(want[i] - bi) + std::fabs(bi);
                        c.near(y[i], want[i], (gamma(2 * n) * 8 + 8 * kU) * (scale + 1.0) * std::sqrt(double(n)), "at ",
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
// CUDA's kernel (attention_full.cu) sends q (times scale log2 e), k, p and v to the tensor cores as f16
// hi + lo pairs and forms each product as hi hi + lo hi + hi lo: 3 2^-22 = 12 u relative per product
// (the two lo roundings and the dropped lo lo), plus 2^-25 absolute per operand below f16's normal
// range (the lo of a value under 2^-3). So a score moves by up to (12 u + 2 u for q's scaling) scale
// |q| |k| + 2^-25 sqrt(head_dim) (scale |q| + |k|), counted four times as the f32 score error is; and
// the weighted sum by 12 u max |v| + 2^-25 (n_tokens max |v| + 1) over the normaliser (>= 1). The
// tensor cores' f32 accumulators round (truncate) once per group of products, fewer times than the
// gamma terms count for f32 sums, at most twice u each.
// Shapes: one token, a few, the 256 and 1,024 patches of the encoder's tiles, 1,500; head_dim 1, 16,
// 32, 64, 72 (SigLIP2's), 100 and 128, and 160 (beyond CUDA's kernel: the backend goes through the
// host there).
TEST(OpHarness, AttentionFull) {
    std::mt19937 rng(33);
    const int64_t shapes[][3] = {{1, 1, 1},     {1, 3, 72},     {7, 2, 32},     {7, 3, 16},   {9, 1, 160},
                                 {33, 3, 64},   {256, 2, 16},   {256, 1, 100},  {280, 2, 32}, {513, 1, 72},
                                 {1024, 2, 72}, {1024, 1, 128}, {1500, 1, 128}, {1500, 2, 64}};  // n, heads, dim
    for (const auto& s : shapes) {
        const int64_t n = s[0], n_head = s[1], hd = s[2], width = n_head * hd;
        const std::vector<float> q = randn(size_t(n * width), rng, 2.0f), k = randn(q.size(), rng, 2.0f),
                                 v = randn(q.size(), rng);
        const double scale = 1.0 / std::sqrt(double(hd));
        std::vector<double> ref(q.size());
        double vmax = 0.0, qk = 0.0, qn = 0.0, kn = 0.0;  // qn, kn: the largest norms of q and k rows
        for (float a : v) vmax = std::max(vmax, double(std::fabs(a)));
        for (int64_t h = 0; h < n_head; ++h) {
            auto norm_max = [&](const std::vector<float>& x) {
                double m = 0.0;
                for (int64_t t = 0; t < n; ++t) {
                    double s2 = 0.0;
                    for (int64_t c = 0; c < hd; ++c)
                        s2 += double(x[size_t(t * width + h * hd + c)]) * x[size_t(t * width + h * hd + c)];
                    m = std::max(m, std::sqrt(s2));
                }
                return m;
            };
            const double qh = norm_max(q), kh = norm_max(k);
            qk = std::max(qk, qh * kh), qn = std::max(qn, qh), kn = std::max(kn, kh);
            std::vector<double> sc(static_cast<size_t>(n)), acc(static_cast<size_t>(hd));
            for (int64_t t = 0; t < n; ++t) {
                const float* qt = q.data() + t * width + h * hd;
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < n; ++j) {
                    const float* kj = k.data() + j * width + h * hd;
                    double d = 0.0;
                    for (int64_t c = 0; c < hd; ++c) d += double(qt[c]) * kj[c];
                    sc[size_t(j)] = d * scale;
                    mx = std::max(mx, sc[size_t(j)]);
                }
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int64_t j = 0; j < n; ++j) {
                    const double p = std::exp(sc[size_t(j)] - mx);
                    sum += p;
                    const float* vj = v.data() + j * width + h * hd;
                    for (int64_t c = 0; c < hd; ++c) acc[size_t(c)] += p * vj[c];
                }
                for (int64_t c = 0; c < hd; ++c) ref[size_t(t * width + h * hd + c)] = acc[size_t(c)] / sum;
            }
        }
        const double bound = (gamma(hd) * scale * qk * 4 + gamma(n) * 2 + 8 * kU) * vmax;
        const double split = (16 * kU * scale * qk + 0x1p-25 * std::sqrt(double(hd)) * (scale * qn + kn)) * 4 * vmax +
                             12 * kU * vmax + 0x1p-25 * (double(n) * vmax + 1.0);
        for (const Target& t : targets()) {
            if (t.moe_only) continue;
            // Through the host: the one reference whatever the CPU table, so on the first CPU target and CUDA.
            const bool host_too = t.cuda() || &t == &targets().front();
            for (int via_host = 0; via_host < (host_too ? 2 : 1); ++via_host) {
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
                const double b = bound + (t.cuda() && !via_host && hd <= 128 ? split : 0.0);
                for (size_t i = 0; i < y.size(); ++i) c.near(y[i], ref[i], b, "at ", i);
            }
        }
    }
}

}  // namespace
}  // namespace cera::harness
