// The CUDA backend's decode steps against the same ops unfused and on the CPU backend: the launches
// decode fusion makes (residual epilogues with the norm after them, SwiGLU pairs, q/k/v with RoPE and
// the KV store, norms in prologues), steps recorded as graphs and replayed, and captures cut short
// where a scratch buffer grows (cuda_backend.cpp). Skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "core/fp16.h"
#include "core/quant/quant.h"
#include "kernels/cuda_fixture.h"
#include "test_util.h"

namespace cera {
namespace {

// A residual product followed by rms_norm() of its sum and a product reading the norm: the CUDA
// backend makes the norm in the residual product's launch (its last block, gemv.cu last_block_norm)
// for rows of 256-4096 floats (DecodeFusionsMatchUnfused covers the launches that make it in their
// prologue instead). Against the same ops with fusion off and on the CPU backend, three times in a
// row (the tickets must be back at zero), with and without a norm weight.
TEST_F(CudaBackendTest, ResidualNormFoldMatchesUnfused) {
    using G = GgmlType;
    auto plain = cuda_backend_with([](CudaOptions& o) { o.fuse = false; });
    // A plain product does not take the norm in its prologue; the fourth backend never does (the same
    // here: a check that the held residual product still goes out with its norm).
    auto fold = cuda_backend_with([](CudaOptions& o) { o.variants.norm_prologues = 0; });
    constexpr int kBes = 4;
    Backend* bes[kBes] = {gpu_.get(), plain.get(), cpu_.get(), fold.get()};
    const int64_t k = 256, m = 64;
    for (G type : {G::kQ4_0, G::kQ8_0, G::kQ4_K}) {
        for (int64_t n : {256, 512, 1024, 2048, 4096}) {
            const auto wa = make_weight(type, randn(size_t(n * k), rng_, 0.1f), n, k);
            const auto wb = make_weight(type, randn(size_t(m * n), rng_, 0.05f), m, n);
            const auto nw = randn(size_t(n), rng_);
            for (int64_t nt : {1, 3}) {
                for (bool weighted : {true, false}) {
                    SCOPED_TRACE(std::string(type_name(type)) + " n " + std::to_string(n) + " n_tokens " +
                                 std::to_string(nt) + (weighted ? " weighted" : " no weight"));
                    struct Bufs {
                        Tensor wa, wb, nw, a, x, y, h, z;
                    } b[kBes];
                    const auto x0 = randn(size_t(n * nt), rng_);
                    for (int i = 0; i < kBes; ++i) {
                        Backend& be = *bes[i];
                        const int64_t ne_a[2] = {k, n}, ne_b[2] = {n, m};
                        b[i].wa = be.upload_weight(type, ne_a, wa.data());
                        b[i].wb = be.upload_weight(type, ne_b, wb.data());
                        b[i].nw = f32_on(be, {n}, &nw), b[i].a = f32_on(be, {k, nt});
                        b[i].x = f32_on(be, {n, nt}, &x0), b[i].y = f32_on(be, {n, nt});
                        b[i].h = f32_on(be, {n, nt}), b[i].z = f32_on(be, {m, nt});
                    }
                    for (int rep = 0; rep < 3; ++rep) {
                        const auto av = randn(size_t(k * nt), rng_);
                        for (int i = 0; i < kBes; ++i) {
                            Backend& be = *bes[i];
                            be.write(b[i].a, av.data(), av.size() * 4);
                            be.matmul(b[i].wa, b[i].a, Tensor{}, b[i].y);
                            be.add(b[i].x, b[i].y, 0.5f, b[i].x);
                            be.rms_norm(b[i].x, weighted ? b[i].nw : Tensor{}, 1e-5f, b[i].h);
                            be.matmul(b[i].wb, b[i].h, Tensor{}, b[i].z);
                        }
                        auto diff = [&](Tensor Bufs::*f, int i, int j) {
                            return max_rel_diff(get(b[i].*f, *bes[i]), get(b[j].*f, *bes[j]));
                        };
                        // The same products; only the norm's sum of squares is added in another order,
                        // and an 8-bit rounding of h may rarely flip a step in z.
                        EXPECT_LT(diff(&Bufs::x, 0, 1), 1e-6) << "x, rep " << rep;
                        EXPECT_LT(diff(&Bufs::h, 0, 1), 1e-5) << "h, rep " << rep;
                        EXPECT_LT(diff(&Bufs::z, 0, 1), 2e-2) << "z, rep " << rep;
                        EXPECT_LT(diff(&Bufs::h, 0, 2), 5e-2) << "h against the CPU, rep " << rep;
                        EXPECT_LT(diff(&Bufs::z, 0, 2), 1e-1) << "z against the CPU, rep " << rep;
                        EXPECT_LT(diff(&Bufs::h, 3, 1), 1e-5) << "h, norm in the residual product, rep " << rep;
                        EXPECT_LT(diff(&Bufs::z, 3, 1), 2e-2) << "z, norm in the residual product, rep " << rep;
                    }
                    for (int i = 0; i < kBes; ++i)
                        for (Tensor* t : {&b[i].wa, &b[i].wb, &b[i].nw, &b[i].a, &b[i].x, &b[i].y, &b[i].h, &b[i].z})
                            bes[i]->free(*t);
                }
            }
        }
    }
}

// The SwiGLU pair after an RMSNorm, as a decode step makes it (the staged kernel with the norm in its
// prologue), for rows of several blocks (an odd count too): the K-quants' 32-byte items (the default)
// against their 16-byte items (CudaVariants::glu_narrow), the register kernel, the CPU backend, and (k <=
// 2048) the prologue's x in registers (the default there) against x in shared memory.
TEST_F(CudaBackendTest, SwiGluPairMatchesCpu) {
    using G = GgmlType;
    auto narrow = cuda_backend_with([](CudaOptions& o) { o.variants.glu_narrow = true; });
    auto regs = cuda_backend_with([](CudaOptions& o) { o.variants.glu_registers = true; });
    auto xsmem = cuda_backend_with([](CudaOptions& o) { o.variants.pro_smem = true; });
    constexpr int kBes = 5;
    Backend* bes[kBes] = {gpu_.get(), narrow.get(), regs.get(), cpu_.get(), xsmem.get()};
    const int64_t rows = 512;
    for (G type : {G::kQ4_K, G::kQ5_K, G::kQ4_0, G::kQ2_K, G::kQ3_K, G::kIQ4_NL, G::kIQ4_XS}) {
        for (int64_t k : {512, 2304, 2048}) {
            const auto wg = make_weight(type, randn(size_t(rows * k), rng_, 0.1f), rows, k);
            const auto wu = make_weight(type, randn(size_t(rows * k), rng_, 0.1f), rows, k);
            const auto nw = randn(size_t(k), rng_);
            const auto x0 = randn(size_t(k), rng_);
            SCOPED_TRACE(std::string(type_name(type)) + " k " + std::to_string(k));
            struct Bufs {
                Tensor wg, wu, nw, x, h, g, u;
            } b[kBes];
            for (int i = 0; i < kBes; ++i) {
                Backend& be = *bes[i];
                const int64_t ne[2] = {k, rows};
                b[i].wg = be.upload_weight(type, ne, wg.data());
                b[i].wu = be.upload_weight(type, ne, wu.data());
                b[i].nw = f32_on(be, {k}, &nw), b[i].x = f32_on(be, {k}, &x0), b[i].h = f32_on(be, {k});
                b[i].g = f32_on(be, {rows}), b[i].u = f32_on(be, {rows});
                if (be.step_begin(uint64_t(7000 + k + int(type)))) continue;
                be.rms_norm(b[i].x, b[i].nw, 1e-5f, b[i].h);
                be.matmul(b[i].wg, b[i].h, Tensor{}, b[i].g);
                be.matmul(b[i].wu, b[i].h, Tensor{}, b[i].u);
                be.swiglu(b[i].g, b[i].u, b[i].g);
                be.step_end();
            }
            auto diff = [&](Tensor Bufs::*f, int i, int j) {
                return max_rel_diff(get(b[i].*f, *bes[i]), get(b[j].*f, *bes[j]));
            };
            // The same 8-bit activations and integer dots; only the float sums go in another order.
            EXPECT_LT(diff(&Bufs::u, 0, 1), 1e-5) << "up, 32-byte vs 16-byte items";
            EXPECT_LT(diff(&Bufs::g, 0, 1), 1e-5) << "swiglu, 32-byte vs 16-byte items";
            EXPECT_LT(diff(&Bufs::u, 0, 2), 1e-5) << "up, staged vs register kernel";
            // The same arithmetic in the same order: x held in registers or in shared memory.
            EXPECT_LT(diff(&Bufs::h, 0, 4), 1e-7) << "normed x, x in registers vs shared memory";
            EXPECT_LT(diff(&Bufs::g, 0, 4), 1e-7) << "swiglu, x in registers vs shared memory";
            // The CPU rounds the activations in its own groups (Q8_K for the K-quants); silu(gate) * up
            // carries both products' differences.
            EXPECT_LT(diff(&Bufs::u, 0, 3), 2e-2) << "up against the CPU";
            EXPECT_LT(diff(&Bufs::g, 0, 3), 5e-2) << "swiglu against the CPU";
            for (int i = 0; i < kBes; ++i)
                for (Tensor* t : {&b[i].wg, &b[i].wu, &b[i].nw, &b[i].x, &b[i].h, &b[i].g, &b[i].u}) bes[i]->free(*t);
        }
    }
}

// The SwiGLU pair of a step of several tokens (a speculative verification, a few sequences' decode): the
// staged kernel, whose blocks take the tokens side by side where that grid fits one wave (or one after
// another), against the register kernel (a block a token) and the CPU backend.
TEST_F(CudaBackendTest, SwiGluPairOfSeveralTokensMatches) {
    using G = GgmlType;
    auto regs = cuda_backend_with([](CudaOptions& o) { o.variants.glu_registers = true; });
    Backend* bes[3] = {gpu_.get(), regs.get(), cpu_.get()};
    for (G type : {G::kQ8_0, G::kQ4_0, G::kQ4_K, G::kQ6_K}) {
        for (int64_t rows : {256, 2048}) {
            const int64_t k = 512;
            const auto wg = make_weight(type, randn(size_t(rows * k), rng_, 0.1f), rows, k);
            const auto wu = make_weight(type, randn(size_t(rows * k), rng_, 0.1f), rows, k);
            for (int64_t n : {2, 3, 8}) {
                SCOPED_TRACE(std::string(type_name(type)) + " rows " + std::to_string(rows) + " tokens " +
                             std::to_string(n));
                const auto x0 = randn(size_t(n * k), rng_);
                std::vector<float> out[3];
                for (int i = 0; i < 3; ++i) {
                    Backend& be = *bes[i];
                    const int64_t ne[2] = {k, rows};
                    Tensor tg = be.upload_weight(type, ne, wg.data()), tu = be.upload_weight(type, ne, wu.data());
                    Tensor x = f32_on(be, {k, n}, &x0), g = f32_on(be, {rows, n}), u = f32_on(be, {rows, n});
                    if (!be.step_begin(uint64_t(9100 + 16 * rows + n + 64 * int(type)))) {
                        be.matmul(tg, x, Tensor{}, g);
                        be.matmul(tu, x, Tensor{}, u);
                        be.swiglu(g, u, g);
                        be.step_end();
                    }
                    out[i] = get(g, be);
                    for (Tensor* t : {&tg, &tu, &x, &g, &u}) be.free(*t);
                }
                EXPECT_LT(max_rel_diff(out[0], out[1]), 1e-5) << "staged vs register kernel";
                EXPECT_LT(max_rel_diff(out[0], out[2]), 5e-2) << "against the CPU";
            }
        }
    }
}

// A step recorded as a graph (or decode program) replays with new inputs.
TEST_F(CudaBackendTest, GraphReplayTracksInputs) {
    const int64_t n = 4096, rows = 1024;
    const auto wf = randn(size_t(rows * n), rng_);
    const auto bytes = make_weight(GgmlType::kQ4_0, wf, rows, n);
    const int64_t ne[2] = {n, rows};
    Tensor w = gpu_->upload_weight(GgmlType::kQ4_0, ne, bytes.data());
    Tensor x = gpu_->alloc(GgmlType::kF32, {n}), h = gpu_->alloc(GgmlType::kF32, {n}),
           y = gpu_->alloc(GgmlType::kF32, {rows});
    std::vector<float> first;
    for (int step = 0; step < 5; ++step) {
        const auto xv = randn(size_t(n), rng_);
        gpu_->write(x, xv.data(), xv.size() * 4);
        const bool replayed = gpu_->step_begin(42);
        if (!replayed) {
            gpu_->rms_norm(x, Tensor{}, 1e-5f, h);
            gpu_->matmul(w, h, Tensor{}, y);
            gpu_->step_end();
        }
        std::vector<float> got(static_cast<size_t>(rows));
        gpu_->read(got.data(), y, got.size() * 4);
        // The same ops run eagerly give the reference.
        gpu_->rms_norm(x, Tensor{}, 1e-5f, h);
        gpu_->matmul(w, h, Tensor{}, y);
        std::vector<float> want(static_cast<size_t>(rows));
        gpu_->read(want.data(), y, want.size() * 4);
        // A stale replay would be off by O(1), the inputs being new every step.
        double err = 0, mag = 0;
        for (size_t i = 0; i < got.size(); ++i) err += std::abs(double(got[i]) - want[i]), mag += std::abs(double(want[i]));
        EXPECT_LT(err / mag, 1e-5) << "step " << step;
        EXPECT_EQ(replayed, step >= 2) << "step " << step;
    }
}

// max |a - ref| over max(|ref|, 1e-3) of the first n halves of two f16 buffers (KV caches).
// The first n values of two caches of one type (any KV cache type): max |a - ref| over max |ref|, and how
// many values differ by more than tol times that (a value at a rounding boundary of a quantized type can
// take either neighbouring code when its input differs in the last bits).
struct CacheDiff {
    double rel;
    int64_t over;
};
CacheDiff cache_diff(Backend& be_a, const Tensor& a, Backend& be_ref, const Tensor& ref, int64_t n, double tol) {
    std::vector<uint8_t> ba(a.n_bytes()), br(ba.size());
    be_a.read(ba.data(), a, ba.size());
    be_ref.read(br.data(), ref, br.size());
    std::vector<float> fa(static_cast<size_t>(a.n_elements())), fr(fa.size());
    dequantize_row_ref(a.type, ba.data(), fa.data(), int64_t(fa.size()));
    dequantize_row_ref(ref.type, br.data(), fr.data(), int64_t(fr.size()));
    double err = 0, mag = 1e-3;
    for (size_t e = 0; e < size_t(n); ++e) mag = std::max(mag, double(std::fabs(fr[e])));
    int64_t over = 0;
    for (size_t e = 0; e < size_t(n); ++e) {
        const double d = std::fabs(fa[e] - fr[e]);
        err = std::max(err, d);
        over += d > tol * mag;
    }
    return {err / mag, over};
}

// A decode-shaped layer (attention, short conv and SwiGLU blocks, each with its norm and residual
// add) run step by step as recorded graphs: the fused decode launches (8-bit side outputs, grouped
// q/k/v and gate/up products, SwiGLU and residual epilogues, q/k RoPE + KV store) against the same
// ops on a CUDA backend with fusion off (CudaOptions::fuse = false) and on the CPU backend. Every tensor an
// op writes is compared, not only the residual stream. Head size 128 runs with q/k/v biases and an
// 8192-row SwiGLU pair (on the register kernel, more 32-row groups than an H200 has SMs: blocks walk
// several), and one-token K-quant steps take the fused in_proj + short conv launch (gemv_fused.cu).
TEST_F(CudaBackendTest, DecodeFusionsMatchUnfused) {
    using G = GgmlType;
    // The reference CUDA path: no fusion, steps replayed as graphs. A fourth backend fuses every
    // product with its consumer, also where the default leaves it (gemv_fused.cu). A one-token norm
    // after a residual product is made in the prologue of some launches that read it (the staged
    // SwiGLU pair, q/k/v, in_proj + conv), else in the residual product's launch: a fifth backend
    // makes them all there, a sixth in every launch that can take the prologue.
    auto plain = cuda_backend_with([](CudaOptions& o) { o.fuse = false; });
    auto all = cuda_backend_with([](CudaOptions& o) { o.variants.fuse_all_products = true; });
    auto fold = cuda_backend_with([](CudaOptions& o) { o.variants.norm_prologues = 0; });
    auto every = cuda_backend_with([](CudaOptions& o) { o.variants.norm_prologues = 15; });
    // A seventh keeps every SwiGLU pair on the register kernel (the staged one takes every pair here).
    auto regs = cuda_backend_with([](CudaOptions& o) { o.variants.glu_registers = true; });
    constexpr int kBes = 7;
    Backend* bes[kBes] = {gpu_.get(), plain.get(), cpu_.get(), all.get(), fold.get(), every.get(), regs.get()};
    const int64_t n_embd = 256, n_head = 4, n_head_kv = 2, n_ctx = 64, L = 3;
    for (int64_t hd : {64, 128})
    for (G type : {G::kQ4_0, G::kQ8_0, G::kQ4_K, G::kF16, G::kQ5_1, G::kQ6_K, G::kQ5_K, G::kQ2_K, G::kQ3_K, G::kIQ4_NL,
                   G::kIQ4_XS}) {
        if (hd == 128 && type != G::kQ4_0 && type != G::kQ4_K) continue;
        // The cache types ride along with the weight types: the fused q/k/v launch stores every one.
        const G kv = type == G::kQ4_0 ? (hd == 64 ? G::kQ8_0 : G::kQ4_0)
                     : type == G::kQ4_K ? G::kQ8_0
                     : type == G::kQ5_1 ? G::kBF16
                     : type == G::kQ3_K ? G::kQ4_0
                                        : G::kF16;
        const int64_t qw = n_head * hd, kvw = n_head_kv * hd;
        const bool bias = hd == 128;
        const int64_t n_ff = hd == 128 ? 8192 : 512;
        for (int64_t nt : {1, 3}) {
            SCOPED_TRACE(std::string(type_name(type)) + " head_dim " + std::to_string(hd) + " n_tokens " +
                         std::to_string(nt) + " kv " + type_name(kv));
            struct Mat {
                int64_t rows, k;
                std::vector<uint8_t> bytes;
            };
            auto mat = [&](int64_t rows, int64_t k) {
                const auto wf = randn(size_t(rows * k), rng_, 1.0f / std::sqrt(float(k)));
                Mat m{rows, k, {}};
                if (type == G::kF16) {
                    m.bytes.resize(wf.size() * 2);
                    for (size_t i = 0; i < wf.size(); ++i) reinterpret_cast<uint16_t*>(m.bytes.data())[i] = fp32_to_fp16(wf[i]);
                } else {
                    m.bytes = make_weight(type, wf, rows, k);
                }
                return m;
            };
            std::vector<Mat> mats = {mat(qw, n_embd),     mat(kvw, n_embd),  mat(kvw, n_embd),
                                     mat(n_embd, qw),     mat(n_ff, n_embd), mat(n_ff, n_embd),
                                     mat(n_embd, n_ff),   mat(3 * n_embd, n_embd), mat(n_embd, n_embd)};
            const auto norm_a = randn(size_t(n_embd), rng_), norm_f = randn(size_t(n_embd), rng_);
            const auto qn = randn(size_t(hd), rng_), kn = randn(size_t(hd), rng_);
            const auto conv_w = randn(size_t(n_embd * L), rng_, 0.5f);
            const auto x0 = randn(size_t(n_embd * nt), rng_);
            const auto bq = randn(size_t(qw), rng_, 0.3f), bk = randn(size_t(kvw), rng_, 0.3f),
                       bv = randn(size_t(kvw), rng_, 0.3f);
            struct Bufs {
                Tensor w[9], na, nf, qn, kn, cw, x, h, y, q, k, v, attn, g, u, bcx, gated, kc, vc, state, pos, bq, bk, bv;
            } b[kBes];
            for (int i = 0; i < kBes; ++i) {
                Backend& be = *bes[i];
                Bufs& t = b[i];
                for (size_t m = 0; m < mats.size(); ++m) {
                    const int64_t ne[2] = {mats[m].k, mats[m].rows};
                    t.w[m] = be.upload_weight(type, ne, mats[m].bytes.data());
                }
                auto f32 = [&](std::initializer_list<int64_t> ne, const std::vector<float>* v) {
                    return f32_on(be, ne, v);
                };
                t.na = f32({n_embd}, &norm_a), t.nf = f32({n_embd}, &norm_f), t.qn = f32({hd}, &qn), t.kn = f32({hd}, &kn);
                t.cw = f32({L, n_embd}, &conv_w), t.x = f32({n_embd, nt}, &x0);
                t.h = f32({n_embd, nt}, nullptr), t.y = f32({n_embd, nt}, nullptr), t.q = f32({qw, nt}, nullptr);
                t.k = f32({kvw, nt}, nullptr), t.v = f32({kvw, nt}, nullptr), t.attn = f32({qw, nt}, nullptr);
                t.g = f32({n_ff, nt}, nullptr), t.u = f32({n_ff, nt}, nullptr), t.bcx = f32({3 * n_embd, nt}, nullptr);
                t.gated = f32({n_embd, nt}, nullptr), t.state = f32({n_embd, L - 1}, nullptr);
                t.kc = be.alloc(kv, {kvw, n_ctx}), t.vc = be.alloc(kv, {kvw, n_ctx});
                t.pos = be.alloc(G::kI32, {nt});
                if (bias) t.bq = f32({qw}, &bq), t.bk = f32({kvw}, &bk), t.bv = f32({kvw}, &bv);
            }
            RopeParams rope;
            rope.mode = RopeMode::kNeox, rope.n_rot = int(hd), rope.freq_base = 10000.0f;
            AttentionParams ap;
            ap.n_head = int(n_head), ap.n_head_kv = int(n_head_kv), ap.head_dim = int(hd), ap.scale = 0.125f;
            for (int step = 0; step < 5; ++step) {
                std::vector<int32_t> pos(static_cast<size_t>(nt));
                for (int64_t j = 0; j < nt; ++j) pos[size_t(j)] = int32_t(step * nt + j);
                for (int i = 0; i < kBes; ++i) {
                    Backend& be = *bes[i];
                    const Bufs& t = b[i];
                    be.write(t.pos, pos.data(), pos.size() * 4);
                    if (be.step_begin(uint64_t(100 + nt + hd))) continue;  // buffers grow with hd: a key per size
                    // A residual product first, so that every norm follows one (the q/k/v read it too).
                    be.matmul(t.w[8], t.x, Tensor{}, t.y);
                    be.add(t.x, t.y, 0.25f, t.x);
                    be.rms_norm(t.x, t.na, 1e-5f, t.h);
                    be.matmul(t.w[0], t.h, t.bq, t.q);
                    be.matmul(t.w[1], t.h, t.bk, t.k);
                    be.matmul(t.w[2], t.h, t.bv, t.v);
                    be.norm_rope(t.q, int(n_head), int(hd), t.qn, 1e-5f, t.pos, rope);
                    be.norm_rope(t.k, int(n_head_kv), int(hd), t.kn, 1e-5f, t.pos, rope);
                    be.kv_store(t.k, t.v, t.pos, t.kc, t.vc);
                    be.attention(t.q, t.kc, t.vc, t.pos, ap, t.attn);
                    be.matmul(t.w[3], t.attn, Tensor{}, t.y);
                    be.add(t.x, t.y, 1.0f, t.x);
                    be.rms_norm(t.x, t.na, 1e-5f, t.h);
                    be.matmul(t.w[7], t.h, Tensor{}, t.bcx);
                    be.short_conv(t.bcx, t.cw, t.state, t.gated);
                    be.matmul(t.w[8], t.gated, Tensor{}, t.y);
                    be.add(t.x, t.y, 0.5f, t.x);
                    be.rms_norm(t.x, t.nf, 1e-5f, t.h);
                    be.matmul(t.w[4], t.h, Tensor{}, t.g);
                    be.matmul(t.w[5], t.h, Tensor{}, t.u);
                    be.swiglu(t.g, t.u, t.g);
                    be.matmul(t.w[6], t.g, Tensor{}, t.y);
                    be.add(t.x, t.y, 1.0f, t.x);
                    be.step_end();
                }
                auto diff = [&](Tensor Bufs::*f, int i, int j) {
                    return max_rel_diff(get(b[i].*f, *bes[i]), get(b[j].*f, *bes[j]));
                };
                // Against the CPU, a Q4_0 cache code that rounds the other way (the backends' k differ in the
                // last bits) moves its value by a step, an eighth of its block's largest magnitude.
                const double tight = type == G::kF16 ? 1e-4 : 2e-2,
                             loose = type == G::kF16 ? 1e-3 : kv == G::kQ4_0 ? 0.3 : 1e-1;
                using Field = std::pair<Tensor Bufs::*, const char*>;
                for (const auto& [f, name] : std::vector<Field>{
                         {&Bufs::x, "x"}, {&Bufs::q, "q"}, {&Bufs::k, "k"}, {&Bufs::v, "v"}, {&Bufs::attn, "attn"},
                         {&Bufs::g, "swiglu out"}, {&Bufs::u, "up"}, {&Bufs::y, "y"}, {&Bufs::gated, "conv out"},
                         {&Bufs::state, "conv state"}, {&Bufs::h, "h"}, {&Bufs::bcx, "in_proj out"}}) {
                    EXPECT_LT(diff(f, 0, 1), tight) << name << " fused vs unfused, step " << step;
                    EXPECT_LT(diff(f, 0, 2), loose) << name << " fused vs cpu, step " << step;
                    EXPECT_LT(diff(f, 3, 1), tight) << name << " every product fused vs unfused, step " << step;
                    EXPECT_LT(diff(f, 4, 1), tight) << name << " norms in the residual products vs unfused, step "
                                                    << step;
                    EXPECT_LT(diff(f, 5, 1), tight) << name << " norms in every prologue vs unfused, step " << step;
                    EXPECT_LT(diff(f, 6, 1), tight) << name << " register SwiGLU kernel vs unfused, step " << step;
                }
                // The KV cache rows written so far: within tight of the unfused path's, but for the codes a
                // quantized type rounds the other way (at most 2% of them).
                const int64_t n_kv = kvw * (step + 1) * nt;
                const bool blocks = kv == G::kQ8_0 || kv == G::kQ4_0;
                for (auto [f, other] : {std::pair{&Bufs::kc, 0}, {&Bufs::vc, 0}, {&Bufs::kc, 3}, {&Bufs::vc, 3},
                                        {&Bufs::kc, 4}, {&Bufs::vc, 4}, {&Bufs::kc, 5}, {&Bufs::vc, 5},
                                        {&Bufs::kc, 6}, {&Bufs::vc, 6}}) {
                    const CacheDiff d = cache_diff(*bes[other], b[other].*f, *bes[1], b[1].*f, n_kv, tight);
                    if (blocks) EXPECT_LE(d.over, n_kv / 50) << "kv cache, step " << step << " (max " << d.rel << ")";
                    else EXPECT_LT(d.rel, tight) << "kv cache, step " << step;
                }
            }
            for (int i = 0; i < kBes; ++i) {
                Bufs& t = b[i];
                for (Tensor& w : t.w) bes[i]->free(w);
                for (Tensor* x : {&t.na, &t.nf, &t.qn, &t.kn, &t.cw, &t.x, &t.h, &t.y, &t.q, &t.k, &t.v, &t.attn, &t.g,
                                  &t.u, &t.bcx, &t.gated, &t.kc, &t.vc, &t.state, &t.pos, &t.bq, &t.bk, &t.bv})
                    if (*x) bes[i]->free(*x);
            }
        }
    }
}

// The q/k/v launch whose warps normalize and rotate their own rows (gemv_fused.cu's rows kernel):
// adjacent pairs, neox pairs, partial rotations (the rest of the head passes through), llama-3
// frequency factors, heads with no RoPE, with and without a per-head RMSNorm (head_dim 128 with the
// norm takes the block-a-head launch). Each against the block-a-head launch (CudaVariants::qkv_head_blocks: the
// same row sums, so equal but for the rounding of the norm and rotation), the unfused ops
// (CudaOptions::fuse = false) and the CPU, with and without the RMSNorm prologue, through the KV cache and the
// attention after it, over several recorded steps; a step opening with the norm holds it for the
// prologue without a residual product (the first layer's).
TEST_F(CudaBackendTest, QkvRopeRowsMatchBlockAHead) {
    using G = GgmlType;
    auto heads = cuda_backend_with([](CudaOptions& o) { o.variants.qkv_head_blocks = true; });
    auto plain = cuda_backend_with([](CudaOptions& o) { o.fuse = false; });
    auto fold = cuda_backend_with([](CudaOptions& o) { o.variants.norm_prologues = 0; });  // q/k/v read the residual product's 8-bit rows
    constexpr int kBes = 5;
    Backend* bes[kBes] = {gpu_.get(), heads.get(), plain.get(), cpu_.get(), fold.get()};
    const int64_t n_embd = 256, n_head = 8, n_head_kv = 2, n_ctx = 32;
    struct Case {
        int64_t hd;
        RopeMode mode;
        int n_rot;
        bool factors, norm;
    };
    const Case cases[] = {{64, RopeMode::kNorm, 64, false, false},  {64, RopeMode::kNeox, 64, false, false},
                          {64, RopeMode::kNorm, 32, true, false},   {64, RopeMode::kNeox, 32, false, true},
                          {64, RopeMode::kNone, 0, false, false},   {128, RopeMode::kNorm, 128, true, false},
                          {128, RopeMode::kNeox, 96, false, false}, {128, RopeMode::kNeox, 128, true, false},
                          {64, RopeMode::kNeox, 64, false, true},   {64, RopeMode::kNorm, 64, true, true},
                          {64, RopeMode::kNone, 0, false, true},    {128, RopeMode::kNeox, 128, false, true}};
    // v in another type than q and k: llama-quantize's mixtures (gemv_qkv_v_fits), one launch all the same.
    const std::pair<G, G> types[] = {{G::kQ4_0, G::kQ4_0}, {G::kQ8_0, G::kQ8_0}, {G::kQ4_K, G::kQ4_K},
                                     {G::kQ6_K, G::kQ6_K}, {G::kQ4_K, G::kQ6_K}, {G::kQ5_K, G::kQ6_K},
                                     {G::kQ4_K, G::kQ5_K}, {G::kQ2_K, G::kQ2_K}, {G::kQ3_K, G::kQ3_K},
                                     {G::kIQ4_NL, G::kIQ4_NL}, {G::kIQ4_XS, G::kIQ4_XS}, {G::kQ2_K, G::kQ4_K},
                                     {G::kQ3_K, G::kQ5_K}, {G::kIQ4_XS, G::kQ5_K}};
    int n_case = 0;
    for (const Case& cs : cases)
    for (auto [type, vtype] : types)
    for (int64_t nt : {1, 3}) {
        const int64_t hd = cs.hd, qw = n_head * hd, kvw = n_head_kv * hd;
        const bool bias = n_case % 2 == 0;
        // Every third case opens the step with the norm, as the first layer after the embedding does:
        // the one-token norm is then held for the q/k/v launch's prologue without a residual product.
        const bool first = n_case++ % 3 == 0;
        SCOPED_TRACE(std::string(type_name(type)) + (vtype != type ? std::string(" v ") + type_name(vtype) : "") +
                     " head_dim " + std::to_string(hd) + " mode " +
                     std::to_string(int(cs.mode)) + " n_rot " + std::to_string(cs.n_rot) + " n_tokens " +
                     std::to_string(nt) + (bias ? " bias" : "") + (cs.norm ? " norm" : "") +
                     (first ? " first" : ""));
        auto weight = [&](int64_t rows, int64_t k, G t) {
            return make_weight(t, randn(size_t(rows * k), rng_, 1.0f / std::sqrt(float(k))), rows, k);
        };
        const std::vector<uint8_t> wq = weight(qw, n_embd, type), wk = weight(kvw, n_embd, type),
                                   wv = weight(kvw, n_embd, vtype), wr = weight(n_embd, n_embd, type);
        const auto norm_a = randn(size_t(n_embd), rng_), x0 = randn(size_t(n_embd * nt), rng_);
        const auto qn = randn(size_t(hd), rng_), kn = randn(size_t(hd), rng_);
        const auto bq = randn(size_t(qw), rng_, 0.3f), bk = randn(size_t(kvw), rng_, 0.3f),
                   bv = randn(size_t(kvw), rng_, 0.3f);
        std::vector<float> ff(size_t(std::max(cs.n_rot / 2, 1)));
        for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 0.5f * float(i % 5);
        struct Bufs {
            Tensor wq, wk, wv, wr, na, x, h, y, q, k, v, attn, kc, vc, pos, bq, bk, bv, ff, qn, kn;
        } b[kBes];
        for (int i = 0; i < kBes; ++i) {
            Backend& be = *bes[i];
            Bufs& t = b[i];
            auto up = [&](const std::vector<uint8_t>& w, int64_t rows, G wt) {
                const int64_t ne[2] = {n_embd, rows};
                return be.upload_weight(wt, ne, w.data());
            };
            t.wq = up(wq, qw, type), t.wk = up(wk, kvw, type), t.wv = up(wv, kvw, vtype), t.wr = up(wr, n_embd, type);
            t.na = f32_on(be, {n_embd}, &norm_a), t.x = f32_on(be, {n_embd, nt}, &x0);
            t.h = f32_on(be, {n_embd, nt}), t.y = f32_on(be, {n_embd, nt}), t.q = f32_on(be, {qw, nt});
            t.k = f32_on(be, {kvw, nt}), t.v = f32_on(be, {kvw, nt}), t.attn = f32_on(be, {qw, nt});
            t.kc = be.alloc(G::kF16, {kvw, n_ctx}), t.vc = be.alloc(G::kF16, {kvw, n_ctx});
            t.pos = be.alloc(G::kI32, {nt});
            if (bias) t.bq = f32_on(be, {qw}, &bq), t.bk = f32_on(be, {kvw}, &bk), t.bv = f32_on(be, {kvw}, &bv);
            if (cs.factors) t.ff = f32_on(be, {int64_t(ff.size())}, &ff);
            if (cs.norm) t.qn = f32_on(be, {hd}, &qn), t.kn = f32_on(be, {hd}, &kn);
        }
        AttentionParams ap;
        ap.n_head = int(n_head), ap.n_head_kv = int(n_head_kv), ap.head_dim = int(hd), ap.scale = 0.125f;
        for (int step = 0; step < 4; ++step) {
            std::vector<int32_t> pos(static_cast<size_t>(nt));
            for (int64_t j = 0; j < nt; ++j) pos[size_t(j)] = int32_t(step * nt + j);
            for (int i = 0; i < kBes; ++i) {
                Backend& be = *bes[i];
                const Bufs& t = b[i];
                RopeParams rope;
                rope.mode = cs.mode, rope.n_rot = cs.n_rot, rope.freq_base = 10000.0f, rope.freq_factors = t.ff;
                be.write(t.pos, pos.data(), pos.size() * 4);
                if (be.step_begin(uint64_t(7000 + 16 * n_case + nt))) continue;
                if (!first) {
                    be.matmul(t.wr, t.x, Tensor{}, t.y);  // a residual product first, as in a decode step
                    be.add(t.x, t.y, 0.5f, t.x);
                }
                be.rms_norm(t.x, t.na, 1e-5f, t.h);
                be.matmul(t.wq, t.h, t.bq, t.q);
                be.matmul(t.wk, t.h, t.bk, t.k);
                be.matmul(t.wv, t.h, t.bv, t.v);
                be.norm_rope(t.q, int(n_head), int(hd), t.qn, 1e-5f, t.pos, rope);
                be.norm_rope(t.k, int(n_head_kv), int(hd), t.kn, 1e-6f, t.pos, rope);
                be.kv_store(t.k, t.v, t.pos, t.kc, t.vc);
                be.attention(t.q, t.kc, t.vc, t.pos, ap, t.attn);
                be.step_end();
            }
            const double tight = 2e-2, loose = 1e-1;
            for (auto [f, name] : {std::pair{&Bufs::q, "q"}, {&Bufs::k, "k"}, {&Bufs::v, "v"}, {&Bufs::attn, "attn"},
                                   {&Bufs::h, "h"}}) {
                auto at = [&](int i) { return get(b[i].*f, *bes[i]); };
                const auto rows = at(0);
                // The attention reads k and v back from the f16 cache, where a last-bit difference of a
                // normalized row can round to the next half: 1e-3 there, 1e-5 for the launch's own rows.
                const double same = f == &Bufs::attn ? 1e-3 : 1e-5;
                EXPECT_LT(max_rel_diff(rows, at(1)), same) << name << " rows vs block-a-head kernel, step " << step;
                EXPECT_LT(max_rel_diff(rows, at(2)), tight) << name << " rows vs unfused, step " << step;
                EXPECT_LT(max_rel_diff(rows, at(3)), loose) << name << " rows vs cpu, step " << step;
                EXPECT_LT(max_rel_diff(at(4), at(2)), tight) << name << " without the prologue vs unfused, step "
                                                             << step;
            }
            for (auto f : {&Bufs::kc, &Bufs::vc})
                EXPECT_LT(cache_diff(*bes[0], b[0].*f, *bes[2], b[2].*f, kvw * (step + 1) * nt, tight).rel, tight)
                    << "kv cache vs unfused, step " << step;
        }
        for (int i = 0; i < kBes; ++i) {
            Bufs& t = b[i];
            for (Tensor* x : {&t.wq, &t.wk, &t.wv, &t.wr, &t.na, &t.x, &t.h, &t.y, &t.q, &t.k, &t.v, &t.attn, &t.kc,
                              &t.vc, &t.pos, &t.bq, &t.bk, &t.bv, &t.ff, &t.qn, &t.kn})
                if (*x) bes[i]->free(*x);
        }
    }
}

// A recorded step that needs a scratch buffer (the 8-bit side rows of the norms and SwiGLU outputs)
// larger than the steps before it left: the capture ends where the buffer grows (what was captured
// runs as a graph of its own, the rest of the step eagerly) instead of aborting, and the key is
// recorded at its next step. The key's first step runs one token eagerly and its later steps three
// (recorded, cut short; recorded; replayed), each against a CUDA backend without graphs
// (CudaOptions::graphs = false) and the CPU.
TEST_F(CudaBackendTest, ScratchGrowsInsideRecordedStep) {
    using G = GgmlType;
    auto eager = cuda_backend_with([](CudaOptions& o) { o.graphs = false; });
    constexpr int kBes = 3;
    Backend* bes[kBes] = {gpu_.get(), eager.get(), cpu_.get()};
    const std::pair<int64_t, int64_t> shapes[] = {{1024, 2048}, {2048, 8192}, {512, 4096}, {4096, 1024}};
    uint64_t key = 9000;
    for (G type : {G::kQ4_0, G::kQ4_K})
    for (auto [n_embd, n_ff] : shapes) {
        SCOPED_TRACE(std::string(type_name(type)) + " n_embd " + std::to_string(n_embd) + " n_ff " +
                     std::to_string(n_ff));
        const int64_t nt = 3;
        ++key;
        auto weight = [&](int64_t rows, int64_t k) {
            return make_weight(type, randn(size_t(rows * k), rng_, 1.0f / std::sqrt(float(k))), rows, k);
        };
        const std::vector<uint8_t> wr = weight(n_embd, n_embd), wg = weight(n_ff, n_embd), wu = weight(n_ff, n_embd),
                                   wd = weight(n_embd, n_ff), wo = weight(n_embd, n_embd);
        const auto norm_w = randn(size_t(n_embd), rng_), x0 = randn(size_t(n_embd * nt), rng_);
        struct Bufs {
            Tensor wr, wg, wu, wd, wo, nw, x, h, y, g, u, out;
        } b[kBes];
        for (int i = 0; i < kBes; ++i) {
            Backend& be = *bes[i];
            Bufs& t = b[i];
            auto up = [&](const std::vector<uint8_t>& w, int64_t k, int64_t rows) {
                const int64_t ne[2] = {k, rows};
                return be.upload_weight(type, ne, w.data());
            };
            t.wr = up(wr, n_embd, n_embd), t.wg = up(wg, n_embd, n_ff), t.wu = up(wu, n_embd, n_ff);
            t.wd = up(wd, n_ff, n_embd), t.wo = up(wo, n_embd, n_embd);
            t.nw = f32_on(be, {n_embd}, &norm_w), t.x = f32_on(be, {n_embd, nt}, &x0);
            t.h = f32_on(be, {n_embd, nt}), t.y = f32_on(be, {n_embd, nt}), t.out = f32_on(be, {n_embd, nt});
            t.g = f32_on(be, {n_ff, nt}), t.u = f32_on(be, {n_ff, nt});
        }
        for (int step = 0; step < 4; ++step) {
            const int64_t n = step == 0 ? 1 : nt;
            for (int i = 0; i < kBes; ++i) {
                Backend& be = *bes[i];
                Bufs t = b[i];
                for (Tensor* r : {&t.x, &t.h, &t.y, &t.g, &t.u, &t.out}) *r = r->row_slice(0, n);
                if (be.step_begin(key)) continue;
                be.matmul(t.wr, t.x, Tensor{}, t.y);
                be.add(t.x, t.y, 0.5f, t.x);
                be.rms_norm(t.x, t.nw, 1e-5f, t.h);
                for (int r = 0; r < 2; ++r) {
                    be.matmul(t.wg, t.h, Tensor{}, t.g);
                    be.matmul(t.wu, t.h, Tensor{}, t.u);
                    be.swiglu(t.g, t.u, t.g);
                    be.matmul(t.wd, t.g, Tensor{}, t.y);
                    be.add(t.x, t.y, 1.0f, t.x);
                    be.rms_norm(t.x, t.nw, 1e-5f, t.h);
                }
                be.matmul(t.wo, t.h, Tensor{}, t.out);
                be.step_end();
            }
            for (auto [f, name] : {std::pair{&Bufs::x, "x"}, {&Bufs::h, "h"}, {&Bufs::out, "out"}}) {
                auto at = [&](int i) { return get((b[i].*f).row_slice(0, n), *bes[i]); };
                const auto got = at(0);
                EXPECT_LT(max_rel_diff(got, at(1)), 2e-2) << name << " vs no graphs, step " << step;
                EXPECT_LT(max_rel_diff(got, at(2)), 1e-1) << name << " vs cpu, step " << step;
            }
        }
        for (int i = 0; i < kBes; ++i) {
            Bufs& t = b[i];
            for (Tensor* x : {&t.wr, &t.wg, &t.wu, &t.wd, &t.wo, &t.nw, &t.x, &t.h, &t.y, &t.g, &t.u, &t.out})
                bes[i]->free(*x);
        }
    }
}

}  // namespace
}  // namespace cera
