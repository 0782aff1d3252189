// The CUDA attention path against the CPU backend, beyond the op harness's shapes (op_harness_test.cpp
// checks norm_rope, kv_store and attention against the scalar references): long caches with many
// splits, decode and prefill batches of every kernel (decode kernel, tiles, tensor cores), and
// one-token decode steps as the models issue them. Skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/fp16.h"
#include "kernels/cuda_fixture.h"
#include "test_util.h"

namespace cera {
namespace {

TEST_F(CudaBackendTest, KvStoreAndAttention) {
    struct C {
        int n_head, n_head_kv, head_dim;
        int64_t n_ctx;
        GgmlType kv;
        int window;
    };
    for (const C& c : {C{4, 2, 64, 300, GgmlType::kF16, 0}, C{8, 8, 128, 2000, GgmlType::kF32, 0},
                       C{6, 2, 256, 700, GgmlType::kF16, 0}, C{4, 1, 64, 3000, GgmlType::kF16, 100},
                       C{2, 2, 72, 64, GgmlType::kF32, 0}, C{8, 8, 64, 9000, GgmlType::kF16, 0},
                       C{32, 4, 32, 1000, GgmlType::kF32, 0}, C{4, 2, 64, 300, GgmlType::kQ8_0, 0},
                       C{8, 2, 128, 2000, GgmlType::kQ4_0, 0}, C{4, 1, 64, 3000, GgmlType::kBF16, 100},
                       C{8, 8, 64, 9000, GgmlType::kQ8_0, 0}, C{6, 2, 256, 700, GgmlType::kQ4_0, 0},
                       C{32, 4, 32, 1000, GgmlType::kQ8_0, 0}, C{16, 2, 96, 500, GgmlType::kQ4_0, 0},
                       C{8, 2, 128, 2000, GgmlType::kQ3_KV, 0}, C{16, 2, 96, 500, GgmlType::kQ3_KV, 0},
                       C{4, 1, 64, 3000, GgmlType::kQ3_KV, 100}, C{32, 8, 64, 20000, GgmlType::kF16, 0},
                       C{16, 2, 128, 40000, GgmlType::kF16, 0}}) {
        SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " n_ctx " + std::to_string(c.n_ctx) + " " +
                     type_name(c.kv));
        // The tensor-core prefill decodes BF16, Q8_0 and Q4_0 rows into f16 tiles (attention_mma.cu); the
        // decode kernel takes q over a Q8_0 cache in 8-bit blocks (attention_decode.cu).
        const double tol = c.kv == GgmlType::kF32 || c.kv == GgmlType::kF16 ? 1e-4
                           : c.kv == GgmlType::kQ8_0                          ? 1e-2
                                                                              : 2e-3;
        const int64_t width = int64_t(c.n_head_kv) * c.head_dim;
        auto kc = both(c.kv, {width, c.n_ctx}, nullptr);
        auto vc = both(c.kv, {width, c.n_ctx}, nullptr);
        fill_kv(kc, vc, width, c.n_ctx);  // the whole cache
        AttentionParams ap;
        ap.n_head = c.n_head, ap.n_head_kv = c.n_head_kv, ap.head_dim = c.head_dim;
        ap.scale = 1.0f / std::sqrt(float(c.head_dim));
        ap.sliding_window = c.window;
        const int64_t last = c.n_ctx - 1;
        // Decode-sized batches (attention.cu's decode kernel: chunks, splits, the in-kernel merge).
        std::vector<std::vector<int32_t>> all = {{0}, {int32_t(last)}, {int32_t(last / 2)}, {5, 6, 7},
                                                 {int32_t(last), 3, int32_t(last / 3)}, {}};
        for (int64_t p : {int64_t(31), int64_t(32), int64_t(255), int64_t(256), int64_t(257), int64_t(4000)})
            if (p < c.n_ctx) all.insert(all.begin(), {int32_t(p)});
        for (int64_t p = std::max<int64_t>(0, last - 36); p <= last; ++p) all.back().push_back(int32_t(p));
        all.emplace_back();  // 10 queries: the per-query kernel, split over the keys when the cache is long
        for (int64_t p = std::max<int64_t>(0, last - 9); p <= last; ++p) all.back().push_back(int32_t(p));
        all.emplace_back();  // a prefill chunk: query tiles over the union of their key ranges
        for (int64_t p = 0; p < std::min<int64_t>(c.n_ctx, 203); ++p) all.back().push_back(int32_t(p));
        all.emplace_back();  // scattered positions in one batch
        for (int64_t i = 0; i < 40; ++i) all.back().push_back(int32_t((i * 37 + 11) % c.n_ctx));
        for (const auto& pos : all) {
            const int64_t n = int64_t(pos.size());
            auto q = both({int64_t(c.n_head) * c.head_dim, n}, randn(size_t(n * c.n_head * c.head_dim), rng_));
            auto pp = both(GgmlType::kI32, {n}, pos.data());
            auto out = both({int64_t(c.n_head) * c.head_dim, n}, std::vector<float>(size_t(n * c.n_head * c.head_dim)));
            gpu_->attention(q.g, kc.g, vc.g, pp.g, ap, out.g);
            cpu_->attention(q.c, kc.c, vc.c, pp.c, ap, out.c);
            EXPECT_LT(rel_diff(out), tol) << "n_tokens " << n << " first pos " << pos[0];
        }
    }
}

// One-token decode steps as the models issue them: q / k norm + RoPE, KV store, attention (on CUDA the
// first three are one launch, norm_rope.cu's qkv_rope_store). The output, the rotated q and k left in
// their buffers and every cache row match the CPU, for short and long caches (several splits, each
// walking several chunks), every cache type (over a Q8_0 cache the decode kernel rounds q to 8 bits:
// 1e-2), GQA groups of 1 to 8, with and without the per-head norm, both rotation layouts and a
// sliding window.
TEST_F(CudaBackendTest, DecodeStepRopeStoreAttention) {
    struct C {
        int n_head, n_head_kv, head_dim;
        int64_t n_ctx;
        GgmlType kv;
        int window;
        bool norm;
        RopeMode mode;
    };
    for (const C& c : {C{8, 2, 64, 300, GgmlType::kF16, 0, true, RopeMode::kNeox},
                       C{8, 8, 128, 2000, GgmlType::kF32, 0, false, RopeMode::kNorm},
                       C{32, 4, 64, 9000, GgmlType::kF16, 0, false, RopeMode::kNeox},
                       C{4, 1, 64, 3000, GgmlType::kF16, 100, true, RopeMode::kNorm},
                       C{16, 2, 128, 700, GgmlType::kF16, 0, true, RopeMode::kNeox},
                       C{8, 2, 64, 300, GgmlType::kQ8_0, 0, true, RopeMode::kNeox},
                       C{32, 4, 64, 9000, GgmlType::kQ4_0, 0, false, RopeMode::kNeox},
                       C{16, 2, 128, 700, GgmlType::kBF16, 0, true, RopeMode::kNorm},
                       C{8, 8, 128, 2000, GgmlType::kQ4_0, 0, false, RopeMode::kNorm},
                       C{32, 4, 64, 9000, GgmlType::kQ3_KV, 0, true, RopeMode::kNeox},
                       C{32, 8, 64, 20000, GgmlType::kF16, 0, false, RopeMode::kNeox},
                       C{16, 2, 128, 40000, GgmlType::kF16, 0, true, RopeMode::kNorm}}) {
        SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " n_ctx " + std::to_string(c.n_ctx) + " G " +
                     std::to_string(c.n_head / c.n_head_kv));
        const int64_t width = int64_t(c.n_head_kv) * c.head_dim, qw = int64_t(c.n_head) * c.head_dim;
        auto kc = both(c.kv, {width, c.n_ctx}, nullptr);
        auto vc = both(c.kv, {width, c.n_ctx}, nullptr);
        const int64_t fill = c.n_ctx - 8;
        fill_kv(kc, vc, width, fill);
        RopeParams rope;
        rope.mode = c.mode, rope.n_rot = c.head_dim, rope.freq_base = 10000.0f;
        AttentionParams ap;
        ap.n_head = c.n_head, ap.n_head_kv = c.n_head_kv, ap.head_dim = c.head_dim;
        ap.scale = 1.0f / std::sqrt(float(c.head_dim));
        ap.sliding_window = c.window;
        auto qn = both({c.head_dim}, randn(size_t(c.head_dim), rng_));
        auto kn = both({c.head_dim}, randn(size_t(c.head_dim), rng_));
        for (int64_t p = fill; p < c.n_ctx; ++p) {  // eight steps, each after the one before
            const int32_t pos = int32_t(p);
            auto q = both({qw, 1}, randn(size_t(qw), rng_));
            auto k = both({width, 1}, randn(size_t(width), rng_));
            auto v = both({width, 1}, randn(size_t(width), rng_));
            auto pp = both(GgmlType::kI32, {1}, &pos);
            auto out = both({qw, 1}, std::vector<float>(size_t(qw)));
            for (Backend* be : {gpu_.get(), cpu_.get()}) {
                const bool g = be == gpu_.get();
                auto T = [&](const Pair& x) { return g ? x.g : x.c; };
                be->norm_rope(T(q), c.n_head, c.head_dim, c.norm ? T(qn) : Tensor{}, 1e-6f, T(pp), rope);
                be->norm_rope(T(k), c.n_head_kv, c.head_dim, c.norm ? T(kn) : Tensor{}, 1e-6f, T(pp), rope);
                be->kv_store(T(k), T(v), T(pp), T(kc), T(vc));
                be->attention(T(q), T(kc), T(vc), T(pp), ap, T(out));
            }
            EXPECT_LT(rel_diff(out), c.kv == GgmlType::kQ8_0 ? 1e-2 : 1e-4) << "out, pos " << pos;
            EXPECT_LT(rel_diff(q), 1e-5) << "rotated q, pos " << pos;
            EXPECT_LT(rel_diff(k), 1e-5) << "rotated k, pos " << pos;
        }
        // Every cache row, the eight new ones included. The rotated k of the two backends differ in the
        // last bits, so an element at a rounding boundary of its type may land on either side: a Q8_0 or
        // Q4_0 code one step apart, or its block's scale one f16 step apart.
        for (Pair* cache : {&kc, &vc}) {
            std::vector<uint8_t> ba(cache->g.n_bytes()), bb(ba.size());
            gpu_->read(ba.data(), cache->g, ba.size());
            cpu_->read(bb.data(), cache->c, bb.size());
            std::vector<float> a(static_cast<size_t>(width * c.n_ctx)), b(a.size());
            dequantize_row_ref(c.kv, ba.data(), a.data(), int64_t(a.size()));
            dequantize_row_ref(c.kv, bb.data(), b.data(), int64_t(b.size()));
            double err = 0;
            int64_t off = 0;
            for (size_t i = 0; i < a.size(); ++i) {
                err = std::max(err, double(std::fabs(a[i] - b[i])));
                off += a[i] != b[i];
            }
            const char* what = cache == &kc ? "k cache" : "v cache";
            if (c.kv == GgmlType::kF32 || c.kv == GgmlType::kF16 || c.kv == GgmlType::kBF16)
                EXPECT_LT(err, c.kv == GgmlType::kF32 ? 1e-5 : c.kv == GgmlType::kF16 ? 8e-3 : 6e-2) << what;
            else
                EXPECT_LE(off, 64) << what << ": elements whose stored value differs (max |diff| " << err << ")";
            if (cache == &vc && (c.kv == GgmlType::kQ8_0 || c.kv == GgmlType::kQ4_0 || c.kv == GgmlType::kQ3_KV))
                EXPECT_EQ(ba, bb) << "v cache bytes: v is the same input on both backends";
        }
    }
}

// Prefill batches on a cache of any type but F32 take the tensor-core kernel (attention.cu). Q and P go
// to the tensor cores as f16 hi + lo pairs, so on an F16 cache the result matches the CPU reference to
// ~1e-6 (bound 1e-4, as the f32 kernels); BF16, Q8_0 and Q4_0 rows are decoded into f16 tiles, which
// rounds their values to f16 (2^-12 relative).
TEST_F(CudaBackendTest, FlashAttentionMatchesReference) {
    const double tol = 1e-4;
    struct C {
        int n_head, n_head_kv, head_dim;
    };
    const int64_t n_ctx = 1400;
    struct T {
        GgmlType kv;
        double tol;  // the other types' values are rounded to f16 in the tiles
    };
    for (const T& ty : {T{GgmlType::kF16, tol}, T{GgmlType::kBF16, 2e-3}, T{GgmlType::kQ8_0, 2e-3},
                        T{GgmlType::kQ4_0, 2e-3}, T{GgmlType::kQ3_KV, 2e-3}})
    for (const C& c : {C{4, 4, 64}, C{8, 2, 64}, C{4, 4, 128}, C{8, 2, 128}}) {
        if (ty.kv != GgmlType::kF16 && c.n_head == 4) continue;
        SCOPED_TRACE("n_head " + std::to_string(c.n_head) + " n_head_kv " + std::to_string(c.n_head_kv) +
                     " head_dim " + std::to_string(c.head_dim) + " " + type_name(ty.kv));
        const int64_t width = int64_t(c.n_head_kv) * c.head_dim;
        auto kc = both(ty.kv, {width, n_ctx}, nullptr);
        auto vc = both(ty.kv, {width, n_ctx}, nullptr);
        {
            std::vector<int32_t> pos(static_cast<size_t>(n_ctx));
            for (int64_t i = 0; i < n_ctx; ++i) pos[size_t(i)] = int32_t(i);
            auto k = both({width, n_ctx}, randn(size_t(n_ctx * width), rng_));
            auto v = both({width, n_ctx}, randn(size_t(n_ctx * width), rng_));
            auto pp = both(GgmlType::kI32, {n_ctx}, pos.data());
            gpu_->kv_store(k.g, v.g, pp.g, kc.g, vc.g);
            cpu_->kv_store(k.c, v.c, pp.c, kc.c, vc.c);
        }
        struct B {
            std::vector<int32_t> pos;
            int window;
            std::string what;
        };
        std::vector<B> batches;
        for (int start : {0, 300})
            for (int n : {16, 17, 64, 203, 1000}) {  // 16 over 1400 keys: split-K (attn_splits)
                B b{{}, 0, "start " + std::to_string(start) + " n " + std::to_string(n)};
                for (int i = 0; i < n; ++i) b.pos.push_back(start + i);
                batches.push_back(b);
            }
        for (int n : {203, 1000}) {  // sliding window of 100 over a prefix of 300
            B b{{}, 100, "window 100, start 300 n " + std::to_string(n)};
            for (int i = 0; i < n; ++i) b.pos.push_back(300 + i);
            batches.push_back(b);
        }
        {
            B b{{}, 0, "scattered 64"};
            for (int i = 0; i < 64; ++i) b.pos.push_back(int32_t((i * 37 + 11) % n_ctx));
            batches.push_back(b);
            B r{{}, 0, "descending 203, repeats"};
            for (int i = 0; i < 203; ++i) r.pos.push_back(int32_t(1399 - 6 * (i / 2)));
            batches.push_back(r);
            B w{{}, 50, "scattered 100, window 50"};
            for (int i = 0; i < 100; ++i) w.pos.push_back(int32_t((i * 211 + 5) % n_ctx));
            batches.push_back(w);
        }
        for (const B& b : batches) {
            AttentionParams ap;
            ap.n_head = c.n_head, ap.n_head_kv = c.n_head_kv, ap.head_dim = c.head_dim;
            ap.scale = 1.0f / std::sqrt(float(c.head_dim));
            ap.sliding_window = b.window;
            const int64_t n = int64_t(b.pos.size()), qw = int64_t(c.n_head) * c.head_dim;
            auto q = both({qw, n}, randn(size_t(n * qw), rng_));
            auto pp = both(GgmlType::kI32, {n}, b.pos.data());
            auto out = both({qw, n}, std::vector<float>(size_t(n * qw)));
            gpu_->attention(q.g, kc.g, vc.g, pp.g, ap, out.g);
            cpu_->attention(q.c, kc.c, vc.c, pp.c, ap, out.c);
            const double err = rel_diff(out);
            EXPECT_LT(err, ty.tol) << b.what;
            if (c.n_head == 8 && c.head_dim == 64 && b.pos.size() == 1000 && b.window == 0)
                std::printf("  [attention] %s n_head 8/2 hd 64 %s: rel err %.2e\n", type_name(ty.kv), b.what.c_str(),
                            err);
        }
    }
}

}  // namespace
}  // namespace cera
