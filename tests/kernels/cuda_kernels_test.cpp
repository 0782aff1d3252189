// The CUDA backend's kernel paths that the op harness (op_harness_test.cpp: every op on the shared
// shapes against the scalar references) does not reach: the GEMV's split-K and multi-row launches at
// decode sizes and row slices of weights, the streamed LM-head product, argmax on long rows and its
// pick mailbox, top_logits on vocabulary-sized rows and beyond its kernel, transfers, grouped MoE
// batches on uneven routings and LoRA on MoE experts (attention: cuda_attention_test.cpp; decode steps with their fused
// launches and graphs: cuda_decode_test.cpp; whole fixture models: cuda_model_test.cpp). Skips when
// no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/fp16.h"
#include "core/quant/quant.h"
#include "kernels/cuda_fixture.h"
#include "test_util.h"

namespace cera {
namespace {

// ---------------------------------------------------------------- matmul
struct MatmulCase {
    GgmlType type;
    int64_t rows, k, n_tokens;
};

TEST_F(CudaBackendTest, MatmulMatchesReference) {
    using G = GgmlType;
    std::vector<MatmulCase> cases;
    for (G t : {G::kQ4_0, G::kQ4_1, G::kQ5_0, G::kQ5_1, G::kQ8_0, G::kIQ4_NL}) {
        cases.push_back({t, 1, 32, 1});
        cases.push_back({t, 37, 96, 1});
        cases.push_back({t, 130, 2048, 3});
        cases.push_back({t, 67, 320, 9});  // cuBLAS path
        cases.push_back({t, 4099, 64, 1});
        cases.push_back({t, 77, 8192, 1});  // split-K: 4 warps per row group
        cases.push_back({t, 45, 4096, 2});  // split-K: 2 warps per row group
        cases.push_back({t, 9, 2048, 1});   // split-K: 2 warps, 32 items each
        cases.push_back({t, 2048, 2048, 1});  // decode shapes (rows % 16 == 0: the aligned slice below)
        cases.push_back({t, 160, 8192, 3});
        cases.push_back({t, 4096, 512, 8});  // 8 tokens
    }
    cases.push_back({G::kQ4_0, 2050, 8192, 1});  // split-K with 4 rows per warp, a partial last block
    cases.push_back({G::kQ4_K, 2050, 8192, 1});  // 2 rows a warp, split-K by 2: 4 items a lane in flight
    cases.push_back({G::kQ4_K, 2050, 6144, 1});  // 3 items a lane (the 4th slot idle)
    cases.push_back({G::kQ5_K, 2050, 8192, 1});
    cases.push_back({G::kQ6_K, 2050, 8192, 1});
    cases.push_back({G::kQ4_0, 1500, 12288, 1});  // 2 rows a warp, split-K by 4: 3 items a lane
    cases.push_back({G::kQ8_0, 600, 16384, 1});   // 4 items a lane
    for (G t : {G::kQ4_K, G::kQ5_K, G::kQ6_K, G::kQ2_K, G::kQ3_K, G::kIQ4_XS}) {
        cases.push_back({t, 1, 256, 1});
        cases.push_back({t, 41, 768, 2});
        cases.push_back({t, 300, 2048, 1});
        cases.push_back({t, 33, 512, 17});
        cases.push_back({t, 5000, 256, 1});
        cases.push_back({t, 19, 8192, 1});  // split-K
        cases.push_back({t, 50, 4096, 1});
        cases.push_back({t, 2048, 2048, 2});  // decode shapes
        cases.push_back({t, 96, 8192, 1});
    }
    for (G t : {G::kF32, G::kF16, G::kBF16}) {
        cases.push_back({t, 1, 1, 1});
        cases.push_back({t, 13, 37, 2});
        cases.push_back({t, 70, 1024, 1});
        cases.push_back({t, 257, 2056, 4});
        cases.push_back({t, 29, 100, 12});
        cases.push_back({t, 3000, 64, 1});
    }
    for (const MatmulCase& c : cases) {
        SCOPED_TRACE(std::string(type_name(c.type)) + " rows " + std::to_string(c.rows) + " k " +
                     std::to_string(c.k) + " n_tokens " + std::to_string(c.n_tokens));
        const auto wf = randn(size_t(c.rows * c.k), rng_);
        std::vector<uint8_t> bytes;
        if (c.type == G::kF16 || c.type == G::kBF16) {
            bytes.resize(size_t(c.rows * c.k) * 2);
            auto* h = reinterpret_cast<uint16_t*>(bytes.data());
            for (size_t i = 0; i < wf.size(); ++i) h[i] = c.type == G::kF16 ? fp32_to_fp16(wf[i]) : fp32_to_bf16(wf[i]);
        } else {
            bytes = make_weight(c.type, wf, c.rows, c.k);
        }
        const auto wd = c.type == G::kF32 ? wf : dequant(c.type, bytes, c.rows, c.k);
        const auto x = randn(size_t(c.n_tokens * c.k), rng_);
        const auto bias = randn(size_t(c.rows), rng_);
        const bool quant = type_info(c.type).quantized && c.n_tokens <= 8;
        const auto xr = quant ? q8_roundtrip(x) : x;
        const int64_t ne[2] = {c.k, c.rows};
        Tensor w = gpu_->upload_weight(c.type, ne, bytes.data());
        Tensor xg = gpu_->alloc(G::kF32, {c.k, c.n_tokens});
        gpu_->write(xg, x.data(), x.size() * 4);
        Tensor bg = gpu_->alloc(G::kF32, {c.rows});
        gpu_->write(bg, bias.data(), bias.size() * 4);
        Tensor yg = gpu_->alloc(G::kF32, {c.rows, c.n_tokens});
        gpu_->matmul(w, xg, bg, yg);
        std::vector<float> y(static_cast<size_t>(c.rows * c.n_tokens));
        gpu_->read(y.data(), yg, y.size() * 4);
        // Half-precision GEMM operands (prefill of non-F32 weights) round x and W to f16.
        const bool f16_gemm = c.n_tokens > 8 && c.type != G::kF32;
        const double rel = f16_gemm ? 2e-3 : quant ? 2e-5 : 1e-5;
        int bad = 0;
        for (int64_t t = 0; t < c.n_tokens; ++t)
            for (int64_t r = 0; r < c.rows; ++r) {
                double ref = bias[size_t(r)], mag = std::fabs(bias[size_t(r)]);
                for (int64_t i = 0; i < c.k; ++i) {
                    ref += double(wd[size_t(r * c.k + i)]) * xr[size_t(t * c.k + i)];
                    mag += std::fabs(double(wd[size_t(r * c.k + i)]) * xr[size_t(t * c.k + i)]);
                }
                const double got = y[size_t(t * c.rows + r)];
                if (!(std::fabs(got - ref) <= rel * mag + 1e-5) && bad++ < 3)
                    ADD_FAILURE() << "row " << r << " token " << t << ": " << got << " vs " << ref << " (mag " << mag
                                  << ")";
            }
        // Row slices of the weight read the right rows: one starting a row in, and one starting 16 rows
        // in with 16-row multiples (16-byte aligned offsets in both streams).
        auto check_slice = [&](int64_t r0, int64_t n) {
            Tensor ws = w.row_slice(r0, n);
            Tensor ys = gpu_->alloc(G::kF32, {n, c.n_tokens});
            gpu_->matmul(ws, xg, Tensor{}, ys);
            std::vector<float> v(static_cast<size_t>(n * c.n_tokens));
            gpu_->read(v.data(), ys, v.size() * 4);
            for (int64_t t = 0; t < c.n_tokens; ++t)
                for (int64_t r = 0; r < n; ++r) {
                    const float want = y[size_t(t * c.rows + r + r0)] - bias[size_t(r + r0)];
                    EXPECT_NEAR(v[size_t(t * n + r)], want, 1e-4 * (1 + std::fabs(want)));
                }
            gpu_->free(ys);
        };
        if (c.rows >= 3 && c.n_tokens <= 8) check_slice(1, c.rows - 2);
        if (c.rows >= 48 && c.rows % 16 == 0 && c.n_tokens <= 8) check_slice(16, c.rows - 32);
        gpu_->free(w), gpu_->free(xg), gpu_->free(bg), gpu_->free(yg);
    }
}

// Products of at least 32 MB for one token (LM heads) take the streamed kernel (gemv_stream_kernel):
// against the double-precision reference, against the register kernel (CudaVariants::head_register),
// and on a row slice.
TEST_F(CudaBackendTest, StreamedProductMatchesReference) {
    using G = GgmlType;
    struct Case {
        G type;
        int64_t rows, k;
    };
    // Row counts that leave a partial last tile in some blocks; every case is >= 32 MB of image.
    const Case cases[] = {{G::kQ6_K, 20011, 2048}, {G::kQ4_0, 15013, 4096}, {G::kQ8_0, 8009, 4096},
                          {G::kQ4_K, 14011, 4096}, {G::kQ5_1, 12007, 4096}};
    // The register kernel (CudaVariants::head_register) beside the streamed one.
    auto reg = cuda_backend_with([](CudaOptions& o) { o.variants.head_register = true; });
    for (const Case& c : cases) {
        SCOPED_TRACE(std::string(type_name(c.type)) + " rows " + std::to_string(c.rows) + " k " + std::to_string(c.k));
        auto bytes = make_weight(c.type, randn(size_t(c.rows * c.k), rng_), c.rows, c.k);
        // Two equal rows in different blocks' shares, biased to be the largest: the pick is the lower.
        const int64_t tie_a = c.rows / 3 + 5, tie_b = c.rows - 7;
        const size_t rb = row_size(c.type, c.k);
        std::memcpy(bytes.data() + size_t(tie_b) * rb, bytes.data() + size_t(tie_a) * rb, rb);
        const auto wd = dequant(c.type, bytes, c.rows, c.k);
        const auto x = randn(size_t(c.k), rng_);
        auto bias = randn(size_t(c.rows), rng_);
        bias[size_t(tie_a)] = bias[size_t(tie_b)] = 1e4f;
        const auto xr = q8_roundtrip(x);
        const int64_t ne[2] = {c.k, c.rows};
        Tensor w = gpu_->upload_weight(c.type, ne, bytes.data());
        Tensor xg = f32_on(*gpu_, {c.k}, &x), bg = f32_on(*gpu_, {c.rows}, &bias), yg = f32_on(*gpu_, {c.rows});
        std::vector<std::vector<float>> got;
        {
            Tensor wr = reg->upload_weight(c.type, ne, bytes.data());
            Tensor xr = f32_on(*reg, {c.k}, &x), br = f32_on(*reg, {c.rows}, &bias), yr = f32_on(*reg, {c.rows});
            reg->matmul(wr, xr, br, yr);
            got.push_back(get(yr, *reg));
            for (Tensor* t : {&wr, &xr, &br, &yr}) reg->free(*t);
        }
        gpu_->matmul(w, xg, bg, yg);
        got.push_back(get(yg, *gpu_));
        // A slice 32 rows in (aligned streams), without bias.
        const int64_t s0 = 32, sn = c.rows - 40;
        Tensor ys = f32_on(*gpu_, {sn});
        gpu_->matmul(w.row_slice(s0, sn), xg, Tensor{}, ys);
        const auto slice = get(ys, *gpu_);
        // The greedy pick made by the product's own launch (the product held until argmax_feed), twice
        // (the first call may grow the pick's scratch, which launches the product alone).
        Tensor pick = gpu_->alloc(G::kI32, {1}), ids = gpu_->alloc(G::kI32, {1}), pos = gpu_->alloc(G::kI32, {3});
        const int32_t pos0[3] = {4, 9, 41};
        for (int rep = 0; rep < 2; ++rep) {
            gpu_->write(pos, pos0, sizeof pos0);
            gpu_->zero(yg);
            gpu_->matmul(w, xg, bg, yg);
            gpu_->argmax_feed(yg, pick, ids, pos);
            int32_t got_pick = -1, got_id = -1, got_pos[3] = {};
            gpu_->read(&got_pick, pick, 4);
            gpu_->read(&got_id, ids, 4);
            gpu_->read(got_pos, pos, sizeof got_pos);
            EXPECT_EQ(got_pick, tie_a) << "rep " << rep;
            EXPECT_EQ(got_id, tie_a) << "rep " << rep;
            EXPECT_EQ(got_pos[0], 42) << "rep " << rep;
            EXPECT_LT(max_rel_diff(get(yg, *gpu_), got[1]), 1e-6) << "the product beside the pick, rep " << rep;
        }
        int bad = 0;
        for (int64_t r = 0; r < c.rows; ++r) {
            double ref = bias[size_t(r)], mag = std::fabs(bias[size_t(r)]);
            for (int64_t i = 0; i < c.k; ++i) {
                const double p = double(wd[size_t(r * c.k + i)]) * xr[size_t(i)];
                ref += p, mag += std::fabs(p);
            }
            for (size_t v = 0; v < got.size(); ++v) {
                const double g = got[v][size_t(r)];
                if (!(std::fabs(g - ref) <= 2e-5 * mag + 1e-5) && bad++ < 5)
                    ADD_FAILURE() << "variant " << v << " row " << r << ": " << g << " vs " << ref << " (mag " << mag << ")";
                // The same integer dots as the register kernel; only the float sums' order differs.
                if (v > 0 && !(std::fabs(g - got[0][size_t(r)]) <= 1e-5 * mag + 1e-6) && bad++ < 5)
                    ADD_FAILURE() << "variant " << v << " row " << r << ": " << g << " vs register kernel " << got[0][size_t(r)];
            }
            if (r >= s0 && r < s0 + sn) {
                const double want = got[0][size_t(r)] - bias[size_t(r)];
                if (!(std::fabs(slice[size_t(r - s0)] - want) <= 1e-5 * mag + 1e-5) && bad++ < 5)
                    ADD_FAILURE() << "slice row " << r << ": " << slice[size_t(r - s0)] << " vs " << want;
            }
        }
        for (Tensor* t : {&w, &xg, &bg, &yg, &ys, &pick, &ids, &pos}) gpu_->free(*t);
    }
}

// Greedy pick on the device (argmax.cu): the lowest index of the largest non-NaN value, 0 when every
// value is NaN (the host sampler's greedy pick), against a host reference loop. Odd lengths put every
// row but the first at an address that is not 16-byte aligned.
TEST_F(CudaBackendTest, ArgmaxMatchesReference) {
    auto reference = [](const float* x, int64_t n) {
        int64_t best = -1;
        for (int64_t i = 0; i < n; ++i)
            if (!std::isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
        return int32_t(best < 0 ? 0 : best);
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (int64_t n : {1, 31, 1000, 16384, 50257, 65536, 151936}) {
        SCOPED_TRACE(n);
        const int64_t rows = 9;
        std::vector<float> x = randn(size_t(n * rows), rng_, 4.0f);
        std::uniform_int_distribution<int64_t> at(0, n - 1);
        auto row = [&](int64_t r) { return x.data() + r * n; };
        // row 0: random; 1: planted ties of the maximum; 2: a tie at the two last elements;
        // 3: all negative; 4: constant; 5: NaN and -inf sprinkled, two +inf; 6: all -inf;
        // 7: all NaN; 8: NaN except a -inf at the end.
        for (int t = 0; t < 5; ++t) row(1)[at(rng_)] = 50.0f;
        row(2)[n - 1] = 60.0f;
        if (n > 1) row(2)[n - 2] = 60.0f;
        for (int64_t i = 0; i < n; ++i) row(3)[i] = -std::fabs(row(3)[i]) - 1.0f;
        std::fill(row(4), row(4) + n, -7.0f);
        for (int t = 0; t < 6; ++t) row(5)[at(rng_)] = nan, row(5)[at(rng_)] = -inf;
        row(5)[at(rng_)] = inf, row(5)[at(rng_)] = inf;
        std::fill(row(6), row(6) + n, -inf);
        std::fill(row(7), row(7) + n, nan);
        std::fill(row(8), row(8) + n, nan);
        row(8)[n - 1] = -inf;

        Tensor xg = gpu_->alloc(GgmlType::kF32, {n, rows});
        Tensor og = gpu_->alloc(GgmlType::kI32, {rows});
        gpu_->write(xg, x.data(), x.size() * 4);
        gpu_->argmax(xg, og);
        std::vector<int32_t> got(static_cast<size_t>(rows), -1);
        gpu_->read(got.data(), og, got.size() * 4);
        for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(got[size_t(r)], reference(row(r), n)) << "row " << r;
        // One row on its own, and rows starting at an odd offset.
        gpu_->argmax(xg.row_slice(5, 1), og);
        int32_t one = -1;
        gpu_->read(&one, og, 4);
        EXPECT_EQ(one, reference(row(5), n)) << "row 5 alone";
        gpu_->argmax(xg.row_slice(1, rows - 1), og);
        gpu_->read(got.data(), og, size_t(rows - 1) * 4);
        for (int64_t r = 1; r < rows; ++r) EXPECT_EQ(got[size_t(r - 1)], reference(row(r), n)) << "slice row " << r;
        // Every row on its own (one long row is split over blocks), also through argmax_feed: the pick
        // goes to out and ids[0], the last position + 1 to pos[0].
        Tensor ids = gpu_->alloc(GgmlType::kI32, {3}), pos = gpu_->alloc(GgmlType::kI32, {3});
        for (int64_t r = 0; r < rows; ++r) {
            gpu_->argmax(xg.row_slice(r, 1), og);
            gpu_->read(&one, og, 4);
            EXPECT_EQ(one, reference(row(r), n)) << "row " << r << " alone";
            const int32_t ids0[3] = {-1, 7, 8}, pos0[3] = {40, 41, int32_t(42 + r)};
            gpu_->write(ids, ids0, sizeof ids0);
            gpu_->write(pos, pos0, sizeof pos0);
            gpu_->argmax_feed(xg.row_slice(r, 1), og, ids, pos);
            int32_t fed = -1;  // the pick as a decode step hands it back (the mailbox, pick_mail.h)
            gpu_->read_wait(gpu_->read_fed_async(og), &fed);
            EXPECT_EQ(fed, reference(row(r), n)) << "row " << r << " read_fed_async";
            int32_t ids1[3], pos1[3];
            gpu_->read(&one, og, 4);
            gpu_->read(ids1, ids, sizeof ids1);
            gpu_->read(pos1, pos, sizeof pos1);
            EXPECT_EQ(one, reference(row(r), n)) << "row " << r << " fed";
            EXPECT_EQ(ids1[0], one);
            EXPECT_EQ(pos1[0], 43 + r);
            EXPECT_EQ(ids1[1], 7);
            EXPECT_EQ(pos1[2], 42 + r);
        }
        gpu_->free(ids);
        gpu_->free(pos);
        gpu_->free(xg);
        gpu_->free(og);
    }
}

// Writes and reads of every size class (pinned staging ring, its wrap-around, the pageable path for
// large ones) land where they should, and a write's source may be reused as soon as write() returns.
TEST_F(CudaBackendTest, TopLogitsMatchesReference) {
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (int64_t n : {1, 100, 4099, 5000, 65536, 151936}) {  // 4099: a scalar tail after the 16-byte loads
        for (int kind = 0; kind < 5; ++kind) {
            // 0: random; 1: values on a coarse grid (many ties) with NaN and -inf; 2: constant (every entry
            // ties); 3: all -inf but a few; 4: all NaN.
            std::vector<float> x = randn(size_t(n), rng_, 3.0f);
            std::uniform_int_distribution<int> pct(0, 99);
            for (float& v : x) {
                if (kind == 1) {
                    const int c = pct(rng_);
                    v = c == 0 ? nan : c == 1 ? -inf : c == 2 ? inf : std::round(v * 2.0f) / 2.0f;
                } else if (kind == 2) {
                    v = -0.0f;
                } else if (kind == 3) {
                    v = pct(rng_) == 0 ? v : -inf;
                } else if (kind == 4) {
                    v = nan;
                }
            }
            if (kind == 2 && n > 3) x[2] = 0.0f;  // +0 ties with -0
            Tensor xg = gpu_->alloc(GgmlType::kF32, {n});
            gpu_->write(xg, x.data(), x.size() * 4);
            std::uniform_int_distribution<int32_t> any(-2, int32_t(n) + 2);
            std::vector<int32_t> gather(17);
            for (int32_t& g : gather) g = any(rng_);
            Tensor gg = gpu_->alloc(GgmlType::kI32, {int64_t(gather.size())});
            gpu_->write(gg, gather.data(), gather.size() * 4);
            for (int32_t m : {1, 40, 104, 1024, 1500}) {  // 1500: beyond the kernel, through the host
                SCOPED_TRACE("n " + std::to_string(n) + " kind " + std::to_string(kind) + " m " + std::to_string(m));
                const int64_t out_n = 1 + 2 * int64_t(m) + int64_t(gather.size());
                std::vector<int32_t> want(static_cast<size_t>(out_n)), got(static_cast<size_t>(out_n), -5);
                top_logits_host(x.data(), n, m, gather.data(), int64_t(gather.size()), want.data());
                Tensor og = gpu_->alloc(GgmlType::kI32, {out_n});
                gpu_->top_logits(xg, m, gg, og);
                gpu_->read(got.data(), og, got.size() * 4);
                gpu_->free(og);
                ASSERT_EQ(got[0], want[0]);
                const int32_t c = want[0];
                int bad = 0;
                for (int32_t j = 0; j < c && bad < 3; ++j)
                    if (got[size_t(1 + j)] != want[size_t(1 + j)] || got[size_t(1 + m + j)] != want[size_t(1 + m + j)])
                        ADD_FAILURE() << "rank " << j << ": id " << got[size_t(1 + j)] << " vs " << want[size_t(1 + j)], ++bad;
                for (size_t k = 0; k < gather.size(); ++k)
                    EXPECT_EQ(got[size_t(1 + 2 * m) + k], want[size_t(1 + 2 * m) + k]) << "gather " << k;
            }
            gpu_->free(xg), gpu_->free(gg);
        }
    }
}

TEST_F(CudaBackendTest, TransfersRoundTrip) {
    const int64_t n = 1 << 20;  // 4 MiB of f32
    Tensor t = gpu_->alloc(GgmlType::kF32, {n});
    std::vector<float> want(static_cast<size_t>(n), 0.0f);
    std::vector<float> src;
    std::uniform_int_distribution<int64_t> at(0, n - 1);
    for (int i = 0; i < 400; ++i) {  // ~6 MB of small writes: the 2 MB ring wraps several times
        const int64_t len = 1 + (i * 997) % 4096, off = std::min(at(rng_), n - len);
        src = randn(size_t(len), rng_);
        gpu_->write(t, src.data(), size_t(len) * 4, size_t(off) * 4);
        std::copy(src.begin(), src.end(), want.begin() + off);
        std::fill(src.begin(), src.end(), -1.0f);  // reused at once
    }
    src = randn(size_t(n / 2), rng_);  // 2 MiB: the pageable path
    gpu_->write(t, src.data(), src.size() * 4, size_t(n / 4) * 4);
    std::copy(src.begin(), src.end(), want.begin() + n / 4);
    std::vector<float> got(static_cast<size_t>(n));
    gpu_->read(got.data(), t, got.size() * 4);  // large read
    EXPECT_EQ(got, want);
    for (int64_t len : {int64_t(1), int64_t(1000), int64_t(1) << 18}) {  // small reads
        std::vector<float> part(static_cast<size_t>(len));
        gpu_->read(part.data(), t, part.size() * 4, size_t(n - len) * 4);
        EXPECT_TRUE(std::equal(part.begin(), part.end(), want.end() - len)) << "read of " << len;
    }
    gpu_->free(t);
}

// Batches of MoE experts run grouped by expert (moe.cu: every expert's weights staged once, then its
// tokens) against the CPU backend and against the per-slot GEMV path (CudaVariants::moe_per_slot), on
// uneven routings: experts [n_expert / 2, n_expert - 1) get no token, the last one most of them.
// With 32 experts the tiles are forced to 24 rows (CudaVariants::moe_tile_rows), so that the last tile of
// every expert is cut short; with 8 experts and k = 4 to 128 rows (over 48 KB of shared memory for
// Q8_0 and Q6_K down). One token takes the decode path (per slot) on both sides.
TEST_F(CudaBackendTest, MoeGroupedMatchesPerSlot) {
    using G = GgmlType;
    // Each variant runs on a backend of its own, with its own copies of the weights and inputs.
    auto tile24 = cuda_backend_with([](CudaOptions& o) { o.variants.moe_tile_rows = 24; });
    auto tile128 = cuda_backend_with([](CudaOptions& o) { o.variants.moe_tile_rows = 128; });
    auto slots = cuda_backend_with([](CudaOptions& o) { o.variants.moe_per_slot = true; });
    const int64_t n_embd = 256, n_ff = 512;
    for (G t : {G::kQ4_0, G::kQ8_0, G::kQ4_K, G::kQ6_K}) {
        for (int n_expert : {8, 32}) {
            const auto gate_w = randn(size_t(n_expert * n_ff * n_embd), rng_, 0.1f);
            const auto up_w = randn(gate_w.size(), rng_, 0.1f);
            const auto down_w = randn(gate_w.size(), rng_, 0.1f);
            const auto gb = make_weight(t, gate_w, n_expert * n_ff, n_embd);
            const auto ub = make_weight(t, up_w, n_expert * n_ff, n_embd);
            const auto db = make_weight(t, down_w, n_expert * n_embd, n_ff);
            const int64_t ne_gu[3] = {n_embd, n_ff, n_expert}, ne_d[3] = {n_ff, n_embd, n_expert};
            Tensor g_c = cpu_->upload_weight(t, ne_gu, gb.data());
            Tensor u_c = cpu_->upload_weight(t, ne_gu, ub.data());
            Tensor d_c = cpu_->upload_weight(t, ne_d, db.data());
            for (int k : {2, 4}) {
                for (int64_t n_tokens : {1, 7, 64, 300}) {
                    SCOPED_TRACE(std::string(type_name(t)) + " n_expert " + std::to_string(n_expert) + " k " +
                                 std::to_string(k) + " n_tokens " + std::to_string(n_tokens));
                    // Token t: with probability 3/4 the hot expert then k - 1 distinct experts of the
                    // first half, else k distinct experts of the first half.
                    const int hot = n_expert - 1, pool = n_expert / 2;
                    std::vector<int32_t> idv;
                    std::vector<float> wv;
                    std::uniform_real_distribution<float> uw(0.1f, 1.0f);
                    std::vector<int32_t> cand(static_cast<size_t>(pool));
                    for (int64_t tok = 0; tok < n_tokens; ++tok) {
                        for (int e = 0; e < pool; ++e) cand[size_t(e)] = e;
                        std::shuffle(cand.begin(), cand.end(), rng_);
                        const bool use_hot = rng_() % 4 != 0;
                        for (int j = 0; j < k; ++j) {
                            idv.push_back(use_hot ? (j == 0 ? hot : cand[size_t(j - 1)]) : cand[size_t(j)]);
                            wv.push_back(uw(rng_));
                        }
                    }
                    const auto xv = randn(size_t(n_embd * n_tokens), rng_);
                    auto run = [&](Backend& be) {
                        Tensor gw = be.upload_weight(t, ne_gu, gb.data()), uw_ = be.upload_weight(t, ne_gu, ub.data());
                        Tensor dw = be.upload_weight(t, ne_d, db.data());
                        Tensor id = be.alloc(G::kI32, {k, n_tokens});
                        be.write(id, idv.data(), idv.size() * sizeof(int32_t));
                        Tensor wt = f32_on(be, {k, n_tokens}, &wv), xt = f32_on(be, {n_embd, n_tokens}, &xv);
                        Tensor o = f32_on(be, {n_embd, n_tokens});
                        be.moe_ffn(xt, gw, uw_, dw, id, wt, o);
                        std::vector<float> res = get(o, be);
                        for (Tensor* tt : {&gw, &uw_, &dw, &id, &wt, &xt, &o}) be.free(*tt);
                        return res;
                    };
                    Backend& tiled = n_expert == 32 ? *tile24 : n_expert == 8 && k == 4 ? *tile128 : *gpu_;
                    const auto a = run(tiled), b = run(*slots);
                    auto ids = both(G::kI32, {k, n_tokens}, idv.data());
                    auto wts = both({k, n_tokens}, wv);
                    auto x = both({n_embd, n_tokens}, xv);
                    auto out = both({n_embd, n_tokens}, std::vector<float>(size_t(n_embd * n_tokens)));
                    cpu_->moe_ffn(x.c, g_c, u_c, d_c, ids.c, wts.c, out.c);
                    EXPECT_LT(max_rel_diff(a, get(out.c, *cpu_)), 5e-2);  // both sides round activations to 8 bits
                    // The same 8-bit products summed in another order; the down input's 8-bit
                    // rounding may rarely flip a step.
                    double err = 0, mag = 1;
                    for (size_t i = 0; i < a.size(); ++i) {
                        err = std::max(err, std::isfinite(a[i]) ? double(std::fabs(a[i] - b[i])) : INFINITY);
                        mag = std::max(mag, double(std::fabs(b[i])));
                    }
                    EXPECT_LT(err / mag, 5e-3);
                    gpu_->free(ids.g), gpu_->free(wts.g), gpu_->free(x.g), gpu_->free(out.g);
                }
            }
        }
    }
}

// LoRA deltas on the experts' products (moe_ffn_lora: lora.cu's segment kernels in slot rows, each row
// reading its expert's A and Bᵀ) against the CPU backend's. F32 experts run per-slot f32 products on both
// sides, so the deltas are compared in f32 arithmetic; Q8_0 experts take the grouped kernels in batches
// (8-bit activations on both sides, the down product's input carrying the deltas). Two adapters of ranks 4
// and 3 as F32 or F16, in overlapping segments, the second leaving the up product alone; with more than
// one token the last row is in the second segment only.
TEST_F(CudaBackendTest, MoeLoraMatchesCpu) {
    using G = GgmlType;
    const int64_t n_embd = 256, n_ff = 320, n_expert = 8, ranks[2] = {4, 3};
    const int k = 2;
    for (G t : {G::kF32, G::kQ8_0})
        for (G lt : {G::kF32, G::kF16})
            for (int64_t n_tokens : {1, 5, 40}) {
                SCOPED_TRACE(std::string(type_name(t)) + " adapters " + type_name(lt) + " n_tokens " +
                             std::to_string(n_tokens));
                const auto gb = make_weight(t, randn(size_t(n_expert * n_ff * n_embd), rng_, 0.1f), n_expert * n_ff, n_embd);
                const auto ub = make_weight(t, randn(size_t(n_expert * n_ff * n_embd), rng_, 0.1f), n_expert * n_ff, n_embd);
                const auto db = make_weight(t, randn(size_t(n_expert * n_embd * n_ff), rng_, 0.1f), n_expert * n_embd, n_ff);
                const int64_t ne_gu[3] = {n_embd, n_ff, n_expert}, ne_d[3] = {n_ff, n_embd, n_expert};
                std::vector<int32_t> idv;
                std::vector<float> wv;
                std::vector<int32_t> cand(static_cast<size_t>(n_expert));
                for (int64_t tok = 0; tok < n_tokens; ++tok) {
                    for (int e = 0; e < n_expert; ++e) cand[size_t(e)] = e;
                    std::shuffle(cand.begin(), cand.end(), rng_);
                    for (int j = 0; j < k; ++j) idv.push_back(cand[size_t(j)]), wv.push_back(0.3f + 0.2f * float(j));
                }
                const auto xv = randn(size_t(n_embd * n_tokens), rng_);
                // Adapter i's pairs for gate, up and down: A [n_expert, r, k_p], Bᵀ [n_expert, r, n_out_p].
                std::vector<float> av[2][3], bv[2][3];
                for (int i = 0; i < 2; ++i)
                    for (int p = 0; p < 3; ++p) {
                        const int64_t kp = p == 2 ? n_ff : n_embd, np = p == 2 ? n_embd : n_ff;
                        av[i][p] = randn(size_t(n_expert * ranks[i] * kp), rng_, 0.1f);
                        bv[i][p] = randn(size_t(n_expert * ranks[i] * np), rng_, 0.1f);
                    }
                const float scales[2][3] = {{1.5f, -0.5f, 2.0f}, {0.7f, 0.0f, -1.2f}};
                const int64_t starts[2] = {0, n_tokens / 2}, counts[2] = {std::max<int64_t>(1, n_tokens - 1),
                                                                          n_tokens - n_tokens / 2};
                auto run = [&](Backend& be, bool with_lora) {
                    Tensor gw = be.upload_weight(t, ne_gu, gb.data()), uw = be.upload_weight(t, ne_gu, ub.data());
                    Tensor dw = be.upload_weight(t, ne_d, db.data());
                    Tensor id = be.alloc(G::kI32, {k, n_tokens});
                    be.write(id, idv.data(), idv.size() * sizeof(int32_t));
                    Tensor wt = f32_on(be, {k, n_tokens}, &wv), xt = f32_on(be, {n_embd, n_tokens}, &xv);
                    Tensor o = f32_on(be, {n_embd, n_tokens});
                    std::vector<Tensor> owned = {gw, uw, dw, id, wt, xt, o};
                    auto put = [&](const std::vector<float>& v, std::initializer_list<int64_t> ne) {
                        Tensor tt = be.alloc(lt, ne);
                        if (lt == G::kF32) {
                            be.write(tt, v.data(), v.size() * 4);
                        } else {
                            std::vector<uint16_t> h(v.size());
                            for (size_t e = 0; e < v.size(); ++e) h[e] = fp32_to_fp16(v[e]);
                            be.write(tt, h.data(), h.size() * 2);
                        }
                        owned.push_back(tt);
                        return tt;
                    };
                    std::vector<MoeLoraSegment> segs(2);
                    for (int i = 0; i < 2; ++i) {
                        segs[size_t(i)].start = starts[i], segs[size_t(i)].n = counts[i];
                        for (int p = 0; p < 3; ++p) {
                            if (scales[i][p] == 0.0f) continue;
                            const int64_t kp = p == 2 ? n_ff : n_embd, np = p == 2 ? n_embd : n_ff;
                            segs[size_t(i)].a[p] = put(av[i][p], {kp, ranks[i], n_expert});
                            segs[size_t(i)].bt[p] = put(bv[i][p], {np, ranks[i], n_expert});
                            segs[size_t(i)].scale[p] = scales[i][p];
                        }
                    }
                    if (with_lora)
                        be.moe_ffn_lora(xt, gw, uw, dw, id, wt, segs, o);
                    else
                        be.moe_ffn(xt, gw, uw, dw, id, wt, o);
                    std::vector<float> res = get(o, be);
                    for (Tensor& tt : owned) be.free(tt);
                    return res;
                };
                const auto got = run(*gpu_, true), want = run(*cpu_, true), plain = run(*cpu_, false);
                EXPECT_LT(max_rel_diff(got, want), t == G::kF32 ? 1e-4 : 5e-2);
                EXPECT_GT(max_rel_diff(plain, want), 0.2);  // the deltas are large enough to be seen
            }
}

}  // namespace
}  // namespace cera
