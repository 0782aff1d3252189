// The op harness, LoRA part: Backend::lora_segments (the grouped LoRA product of a step whose rows
// belong to several adapters) on every target, and its default (lora_segments_via_host, what a
// device backend without a kernel of its own runs), against a scalar reference computed here in double.
//
// Bound: y + s B (A x) with t = A x (k products summed in f32), scaled, then B t (r products) added to y
// in any grouping: |err| <= |s| gamma(k + r + 2) sum_j |b_oj| sum_i |a_ji x_i| (the roundings of t and of
// the products, bounded by the magnitudes) plus gamma(additions into y) (|y| + |y0|).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/lora.h"
#include "kernels/op_harness.h"

namespace cera::harness {
namespace {

const auto* const kReleaseBackends = ::testing::AddGlobalTestEnvironment(new ReleaseBackends);

struct Seg {
    int64_t start, n;
    int adapter;  // which of the case's adapters
    float scale;
};

// Segments out of row order, one covering rows another covers (two adapters on one sequence),
// rows in no segment, length-1 segments; for 40 rows, more segments than a launch takes (kLoraSegsPerLaunch);
// for 300, one of cuda::kLoraGemmRows rows and more (CUDA's cuBLAS form) over the others.
std::vector<Seg> segments_for(int64_t n_tokens) {
    if (n_tokens == 1) return {{0, 1, 0, 0.5f}, {0, 1, 1, -2.0f}};
    if (n_tokens == 3) return {{2, 1, 1, 1.0f}, {0, 2, 0, 0.25f}, {1, 2, 2, 3.0f}};
    if (n_tokens == 40) {
        std::vector<Seg> segs{{0, n_tokens, 2, 0.75f}};
        for (int64_t i = n_tokens - 1; i >= 0; --i) segs.push_back({i, 1, int(i % 3), 1.0f - 0.05f * float(i)});
        return segs;
    }
    const int64_t h = n_tokens / 2;
    return {{h, n_tokens - h, 2, 1.0f}, {0, h - 1, 0, 2.0f}, {1, 1, 1, -1.0f}, {0, n_tokens, 1, 0.125f}};
}

void check(bool via_host, GgmlType type) {
    std::mt19937 rng(35);
    const int64_t shapes[][3] = {{1, 1, 1}, {7, 96, 4}, {96, 7, 1}, {256, 768, 16}, {288, 96, 8}, {4097, 32, 16},
                                 {768, 4097, 16}, {512, 300, 64}};  // k, n_out, max rank
    for (const auto& sh : shapes) {
        const int64_t k = sh[0], n_out = sh[1];
        for (int64_t n_tokens : {int64_t(1), int64_t(3), int64_t(17), int64_t(40), int64_t(64), int64_t(300)}) {
            if (n_tokens * (k + n_out) > kMaxElems) continue;
            // Three adapters of ranks max, max/2 (at least 1) and 1.
            const int64_t ranks[3] = {sh[2], std::max<int64_t>(1, sh[2] / 2), 1};
            std::vector<std::vector<float>> a(3), b(3);
            for (int i = 0; i < 3; ++i) {
                a[size_t(i)] = randn(size_t(ranks[i] * k), rng, 0.1f);
                b[size_t(i)] = randn(size_t(n_out * ranks[i]), rng, 0.1f);
                // F16 copies: the reference uses the values they hold.
                if (type == GgmlType::kF16)
                    for (auto* v : {&a[size_t(i)], &b[size_t(i)]})
                        for (float& x : *v) x = fp16_to_fp32(fp32_to_fp16(x));
            }
            const std::vector<float> x = activations(size_t(n_tokens * k), rng);
            const std::vector<float> y0 = randn(size_t(n_tokens * n_out), rng);
            const std::vector<Seg> segs = segments_for(n_tokens);
            // The reference, with each value's bound.
            std::vector<double> want(y0.begin(), y0.end()), bound(y0.size(), 0.0);
            // CUDA's segments of many rows run through cuBLAS on x and t rounded to F16: 2^-11 of the
            // magnitudes each, on top.
            std::vector<double> bound_f16(y0.size(), 0.0);
            std::vector<int64_t> adds(size_t(n_tokens), 0);  // additions into each row of y: its segments' ranks
            for (const Seg& g : segs) {
                const int64_t r = ranks[g.adapter];
                const float* A = a[size_t(g.adapter)].data();
                const float* B = b[size_t(g.adapter)].data();
                for (int64_t t = g.start; t < g.start + g.n; ++t) {
                    adds[size_t(t)] += r;
                    std::vector<double> tv(static_cast<size_t>(r)), tm(static_cast<size_t>(r));
                    for (int64_t j = 0; j < r; ++j)
                        for (int64_t i = 0; i < k; ++i) {
                            const double p = double(A[j * k + i]) * x[size_t(t * k + i)];
                            tv[size_t(j)] += p, tm[size_t(j)] += std::fabs(p);
                        }
                    for (int64_t o = 0; o < n_out; ++o) {
                        double acc = 0, mag = 0;
                        for (int64_t j = 0; j < r; ++j) {
                            acc += double(B[o * r + j]) * tv[size_t(j)];
                            mag += std::fabs(double(B[o * r + j])) * tm[size_t(j)];
                        }
                        want[size_t(t * n_out + o)] += double(g.scale) * acc;
                        bound[size_t(t * n_out + o)] += std::fabs(double(g.scale)) * gamma(k + r + 2) * mag;
                        if (type == GgmlType::kF16 && g.n >= cuda::kLoraGemmRows)
                            bound_f16[size_t(t * n_out + o)] += std::fabs(double(g.scale)) * 2.1 * 0x1p-11 * mag;
                    }
                }
            }
            // y's own roundings: one per addition into it, at most the ranks of every segment on a row (the CPU
            // adds Bᵀ's rows one by one).
            for (size_t i = 0; i < want.size(); ++i)
                bound[i] += gamma(2 * adds[i / size_t(n_out)] + 2) * (std::fabs(want[i]) + std::fabs(y0[i])) + 1e-37;
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                OnBackend ob(t);
                std::vector<Tensor> A(3), B(3);
                for (int i = 0; i < 3; ++i) {
                    std::vector<float> bt(b[size_t(i)].size());  // B [n_out, r] -> Bᵀ [r, n_out]
                    for (int64_t o = 0; o < n_out; ++o)
                        for (int64_t j = 0; j < ranks[i]; ++j)
                            bt[size_t(j * n_out + o)] = b[size_t(i)][size_t(o * ranks[i] + j)];
                    if (type == GgmlType::kF32) {
                        A[size_t(i)] = ob.f32({k, ranks[i]}, a[size_t(i)]);
                        B[size_t(i)] = ob.f32({n_out, ranks[i]}, bt);
                        continue;
                    }
                    std::vector<uint16_t> ha, hb;
                    for (float x : a[size_t(i)]) ha.push_back(fp32_to_fp16(x));
                    for (float x : bt) hb.push_back(fp32_to_fp16(x));
                    A[size_t(i)] = ob.alloc(GgmlType::kF16, {k, ranks[i]}, ha.data());
                    B[size_t(i)] = ob.alloc(GgmlType::kF16, {n_out, ranks[i]}, hb.data());
                }
                const Tensor X = ob.f32({k, n_tokens}, x), Y = ob.f32({n_out, n_tokens}, y0);
                std::vector<LoraSegment> ls;
                for (const Seg& g : segs) ls.push_back({g.start, g.n, A[size_t(g.adapter)], B[size_t(g.adapter)], g.scale});
                if (via_host)
                    lora_segments_via_host(ob.be(), X, ls, Y);
                else
                    ob.be().lora_segments(X, ls, Y);
                Checker c(str(t.name, via_host ? " lora_segments_via_host " : " lora_segments ", type_name(type), " k ", k, " n_out ",
                              n_out, " n_tokens ", n_tokens));
                const std::vector<float> y = ob.read(Y);
                for (size_t i = 0; i < y.size(); ++i)
                    c.near(y[i], want[i], bound[i] + (t.cuda() && !via_host ? bound_f16[i] : 0.0), "y ", i);
                if (via_host) break;  // one target is enough for the default
            }
        }
    }
}

// A product followed by the LoRA deltas of its rows, back to back in one step (on CUDA a one-row step
// runs the deltas first, in a kernel of their own, and the product takes them as its bias) against the
// two ops in steps of their own (each checked against its reference above and in op_harness_test).
// Each path's deltas are within gamma(k + r + 2) |s| sum_j |b_oj| sum_i |a_ji x_i| of the exact ones
// (as in check()), so they differ by twice that at most; the rest is the order of y's last additions.
// With the product's own bias, and two adapters on the row.
TEST(OpHarness, LoraAfterItsProduct) {
    std::mt19937 rng(36);
    // k, adapters, rank: on CUDA a thread of the one-row form takes one chunk of 8 columns of k up to
    // k = 2,048 and several beyond (the first before the PDL wait, the others after it).
    const int64_t shapes[][3] = {{512, 2, 16}, {8192, 1, 16}, {6144 + 512, 1, 8}, {4096, 2, 16}};
    for (const auto& sh : shapes)
        for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ6_K, GgmlType::kF16})
            for (int64_t n_tokens : {int64_t(1), int64_t(3)})
                for (bool bias : {false, true}) {
                    const int64_t k = sh[0], rows = 320, r = sh[2];
                    const int n_ad = int(sh[1]);
                    const Weight w = make_weight(type, rows, k, rng);
                    const std::vector<float> x = activations(size_t(n_tokens * k), rng), b = randn(size_t(rows), rng);
                    std::vector<std::vector<uint16_t>> a(static_cast<size_t>(n_ad)), bt(static_cast<size_t>(n_ad));
                    for (int i = 0; i < n_ad; ++i) {
                        for (float v : randn(size_t(r * k), rng, 0.05f)) a[size_t(i)].push_back(fp32_to_fp16(v));
                        for (float v : randn(size_t(r * rows), rng, 0.05f)) bt[size_t(i)].push_back(fp32_to_fp16(v));
                    }
                    // sum_i |s_i| sum_j |b_oj| sum_c |a_jc x_c| for each output.
                    std::vector<double> lora_mag(size_t(rows * n_tokens), 0.0);
                    for (int64_t tk = 0; tk < n_tokens; ++tk)
                        for (int i = 0; i < n_ad; ++i)
                            for (int64_t j = 0; j < r; ++j) {
                                double tm = 0;
                                for (int64_t c = 0; c < k; ++c)
                                    tm += std::fabs(double(fp16_to_fp32(a[size_t(i)][size_t(j * k + c)])) *
                                                    x[size_t(tk * k + c)]);
                                for (int64_t o = 0; o < rows; ++o)
                                    lora_mag[size_t(tk * rows + o)] +=
                                        (i ? 0.75 : 1.5) *
                                        std::fabs(double(fp16_to_fp32(bt[size_t(i)][size_t(j * rows + o)]))) * tm;
                            }
                    for (const Target& t : targets()) {
                        if (t.moe_only) continue;
                        OnBackend ob(t);
                        const Tensor W = ob.weight(type, {k, rows}, w.bytes.data()), X = ob.f32({k, n_tokens}, x);
                        const Tensor Bias = bias ? ob.f32({rows}, b) : Tensor{};
                        std::vector<LoraSegment> ls;
                        for (int i = 0; i < n_ad; ++i)
                            ls.push_back({0, n_tokens, ob.alloc(GgmlType::kF16, {k, r}, a[size_t(i)].data()),
                                          ob.alloc(GgmlType::kF16, {rows, r}, bt[size_t(i)].data()),
                                          i ? -0.75f : 1.5f});
                        const Tensor Y1 = ob.f32({rows, n_tokens}, std::vector<float>(size_t(rows * n_tokens)));
                        const Tensor Y2 = ob.f32({rows, n_tokens}, std::vector<float>(size_t(rows * n_tokens)));
                        ob.be().matmul(W, X, Bias, Y1);
                        const std::vector<float> base = ob.read(Y1);  // the step ends here
                        ob.be().lora_segments(X, ls, Y1);
                        ob.be().matmul(W, X, Bias, Y2);
                        ob.be().lora_segments(X, ls, Y2);
                        const std::vector<float> apart = ob.read(Y1), together = ob.read(Y2);
                        Checker c(str(t.name, " ", type_name(type), " k ", k, " adapters ", n_ad, " n_tokens ",
                                      n_tokens, bias ? " with bias" : ""));
                        for (size_t i = 0; i < apart.size(); ++i) {
                            const double bd = lora_mag[i];
                            const double ends = std::fabs(double(base[i])) + std::fabs(double(apart[i])) +
                                                std::fabs(double(together[i]));
                            c.near(together[i], apart[i], 2 * gamma(k + r + 2) * bd + gamma(4) * ends + 1e-37, "y ", i);
                        }
                    }
                }
}

TEST(OpHarness, LoraSegments) {
    check(false, GgmlType::kF32);
    check(false, GgmlType::kF16);
}
TEST(OpHarness, LoraSegmentsViaHost) {
    check(true, GgmlType::kF32);
    check(true, GgmlType::kF16);
}

}  // namespace
}  // namespace cera::harness
