// The references of the vision encoder's ops (layer norm, GELU, bidirectional attention) and their
// through-the-host defaults. Plain loops with double accumulators: the specification the kernels are
// checked against, not a fast path.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backends/backend.h"

namespace cera {

void layer_norm_rows_host(const float* x, int64_t n, const float* w, const float* b, float eps, float* out, int64_t r0,
                          int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * n;
        float* o = out + r * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; ++i) sum += xr[i];
        const double mean = sum / double(n);
        double var = 0.0;
        for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
        const double inv = 1.0 / std::sqrt(var / double(n) + double(eps));
        for (int64_t i = 0; i < n; ++i) {
            const double v = (xr[i] - mean) * inv;
            o[i] = float(v * (w ? w[i] : 1.0f) + (b ? b[i] : 0.0f));
        }
    }
}

void gelu_host(const float* x, float* out, int64_t n, GeluKind kind) {
    const double k = std::sqrt(2.0 / 3.14159265358979323846);
    for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        out[i] = kind == GeluKind::kTanh ? float(0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v))))
                                         : float(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
    }
}

void attention_full_host(const float* q, const float* k, const float* v, int64_t n_tokens, int n_head, int head_dim,
                         float scale, float* out, int64_t r0, int64_t r1) {
    const int64_t width = int64_t(n_head) * head_dim;
    std::vector<double> s(static_cast<size_t>(n_tokens)), acc(static_cast<size_t>(head_dim));
    for (int64_t t = r0; t < r1; ++t) {
        for (int h = 0; h < n_head; ++h) {
            const float* qh = q + t * width + int64_t(h) * head_dim;
            double mx = -INFINITY;
            for (int64_t j = 0; j < n_tokens; ++j) {
                const float* kh = k + j * width + int64_t(h) * head_dim;
                double d = 0.0;
                for (int c = 0; c < head_dim; ++c) d += double(qh[c]) * kh[c];
                s[size_t(j)] = d * scale;
                mx = std::max(mx, s[size_t(j)]);
            }
            double sum = 0.0;
            for (double& a : acc) a = 0.0;
            for (int64_t j = 0; j < n_tokens; ++j) {
                const double p = std::exp(s[size_t(j)] - mx);
                sum += p;
                const float* vh = v + j * width + int64_t(h) * head_dim;
                for (int c = 0; c < head_dim; ++c) acc[size_t(c)] += p * vh[c];
            }
            float* o = out + t * width + int64_t(h) * head_dim;
            for (int c = 0; c < head_dim; ++c) o[c] = float(acc[size_t(c)] / sum);
        }
    }
}

namespace {
std::vector<float> to_host(Backend& be, const Tensor& t) {
    std::vector<float> h(static_cast<size_t>(t.n_elements()));
    if (t) be.read(h.data(), t, h.size() * sizeof(float));
    return h;
}
}  // namespace

void layer_norm_via_host(Backend& be, const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out) {
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kF32, "layer_norm: f32 only");
    be.synchronize();
    std::vector<float> hx = to_host(be, x), hw, hb, ho(hx.size());
    if (w) hw = to_host(be, w);
    if (b) hb = to_host(be, b);
    layer_norm_rows_host(hx.data(), x.ne[0], w ? hw.data() : nullptr, b ? hb.data() : nullptr, eps, ho.data(), 0,
                         x.rows());
    be.write(out, ho.data(), ho.size() * sizeof(float));
}

void gelu_via_host(Backend& be, const Tensor& x, GeluKind kind, const Tensor& out) {
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kF32, "gelu: f32 only");
    be.synchronize();
    std::vector<float> hx = to_host(be, x), ho(hx.size());
    gelu_host(hx.data(), ho.data(), int64_t(hx.size()), kind);
    be.write(out, ho.data(), ho.size() * sizeof(float));
}

void attention_full_via_host(Backend& be, const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int head_dim,
                             float scale, const Tensor& out) {
    CERA_CHECK(q.ne[0] == int64_t(n_head) * head_dim && k.ne[0] == q.ne[0] && v.ne[0] == q.ne[0] &&
                   k.rows() == q.rows() && v.rows() == q.rows(),
               "attention_full: q, k, v must be [n_tokens, n_head * head_dim]");
    be.synchronize();
    std::vector<float> hq = to_host(be, q), hk = to_host(be, k), hv = to_host(be, v), ho(hq.size());
    attention_full_host(hq.data(), hk.data(), hv.data(), q.rows(), n_head, head_dim, scale, ho.data(), 0, q.rows());
    be.write(out, ho.data(), ho.size() * sizeof(float));
}

}  // namespace cera
