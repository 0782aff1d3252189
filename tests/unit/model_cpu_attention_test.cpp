// The CPU backend's vectorized attention rows against the scalar specification,
// over awkward shapes: head sizes that are not a multiple of 16, one key, GQA
// groups, a sliding window, F32, F16, BF16, Q8_0 and Q4_0 caches, positions not starting at 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/kernels_attention.h"
#include "core/cpu_features.h"
#include "core/quant/quant.h"

namespace cera::cpu_attention {
namespace {

struct Case {
    int n_head, n_head_kv, head_dim, n_tokens, pos0, window;
    Elem type;
};

using RowsFn = void (*)(const Args&, int64_t, int64_t, float*);
using BlockFn = void (*)(const Args&, int64_t, int64_t, int, float*);

void run_case(const Case& c, RowsFn rows, BlockFn block, const char* name) {
    std::mt19937 rng(1234 + c.head_dim * 7 + c.n_tokens);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t n_ctx = c.pos0 + c.n_tokens;
    const int64_t kv_width = int64_t(c.n_head_kv) * c.head_dim;
    std::vector<float> q(size_t(c.n_tokens) * c.n_head * c.head_dim);
    for (float& x : q) x = nd(rng);
    std::vector<float> k32(size_t(n_ctx * kv_width)), v32(k32.size());
    for (float& x : k32) x = nd(rng);
    for (float& x : v32) x = nd(rng);
    // The caches in the case's type, row by row as the backend stores them.
    const GgmlType gt[] = {GgmlType::kF32,  GgmlType::kF16,   GgmlType::kBF16, GgmlType::kQ8_0,
                           GgmlType::kQ4_0, GgmlType::kQ3_KV, GgmlType::kQ4_KV};
    const GgmlType t = gt[int(c.type)];
    const size_t row = row_size(t, kv_width);
    std::vector<uint8_t> kc(row * size_t(n_ctx)), vc(kc.size());
    for (int64_t r = 0; r < n_ctx; ++r) {
        quantize_row_ref(t, k32.data() + r * kv_width, kc.data() + size_t(r) * row, kv_width);
        quantize_row_ref(t, v32.data() + r * kv_width, vc.data() + size_t(r) * row, kv_width);
    }
    std::vector<int32_t> pos(size_t(c.n_tokens));
    for (int t = 0; t < c.n_tokens; ++t) pos[size_t(t)] = c.pos0 + t;
    Args a;
    a.q = q.data();
    a.k = kc.data();
    a.v = vc.data();
    a.k_type = a.v_type = c.type;
    a.pos = pos.data();
    a.n_head = c.n_head;
    a.group = c.n_head / c.n_head_kv;
    a.head_dim = c.head_dim;
    a.kv_width = kv_width;
    a.window = c.window;
    a.scale = 1.0f / std::sqrt(float(c.head_dim));
    const int64_t n_rows = int64_t(c.n_tokens) * c.n_head;
    std::vector<float> scratch(size_t(scratch_floats(n_ctx, c.head_dim, c.n_head / c.n_head_kv)));
    std::vector<float> want(q.size()), got(q.size());
    a.out = want.data();
    rows_ref(a, 0, n_rows, scratch.data());
    for (int pass = rows ? 0 : 1; pass < 2; ++pass) {
        std::fill(got.begin(), got.end(), NAN);
        a.out = got.data();
        if (pass == 0) {
            rows(a, 0, n_rows, scratch.data());
        } else {
            for (int64_t t0 = 0; t0 < c.n_tokens; t0 += kBlockTokens)
                for (int hk = 0; hk < c.n_head_kv; ++hk)
                    block(a, t0, std::min<int64_t>(c.n_tokens, t0 + kBlockTokens), hk, scratch.data());
        }
        double max_d = 0;
        for (size_t i = 0; i < want.size(); ++i) max_d = std::max(max_d, double(std::fabs(want[i] - got[i])));
        EXPECT_LT(max_d, 2e-5) << name << (pass ? " block" : " rows") << " head_dim " << c.head_dim << " n_tokens "
                               << c.n_tokens << " pos0 " << c.pos0 << " window " << c.window << " type " << int(c.type);
    }
}

constexpr Elem F32 = Elem::kF32, F16 = Elem::kF16, BF16 = Elem::kBF16, Q8 = Elem::kQ8_0, Q4 = Elem::kQ4_0,
               Q3 = Elem::kQ3_KV, Q4KV = Elem::kQ4_KV;
const Case kCases[] = {
    {4, 2, 64, 7, 0, 0, F32},    {4, 2, 64, 1, 200, 0, F32},    {4, 4, 48, 5, 3, 0, F16},
    {2, 1, 16, 33, 0, 0, F32},   {8, 2, 80, 3, 17, 0, F16},     {4, 2, 32, 20, 5, 8, F32},
    {1, 1, 8, 1, 0, 0, F32},     {6, 3, 128, 4, 60, 0, F16},    {4, 1, 24, 9, 1, 0, F32},
    {16, 8, 64, 40, 0, 0, F32},  {16, 8, 64, 37, 100, 0, F16},  {4, 2, 64, 50, 3, 20, F32},
    {8, 2, 32, 17, 0, 0, F32},   {4, 2, 64, 7, 0, 0, BF16},     {8, 2, 48, 3, 9, 0, BF16},
    {4, 2, 64, 1, 200, 0, Q8},   {16, 8, 64, 37, 100, 0, Q8},   {6, 3, 128, 4, 60, 0, Q8},
    {4, 2, 32, 20, 5, 8, Q8},    {4, 2, 64, 1, 200, 0, Q4},     {16, 8, 64, 37, 100, 0, Q4},
    {6, 3, 128, 4, 60, 0, Q4},   {8, 2, 32, 17, 0, 0, Q4},      {4, 2, 64, 1, 200, 0, Q3},
    {16, 8, 64, 37, 100, 0, Q3}, {6, 3, 128, 4, 60, 0, Q3},     {8, 2, 32, 17, 0, 0, Q3},
    {4, 2, 64, 1, 1500, 0, F32}, {4, 2, 64, 5, 300, 37, F16},   {4, 2, 64, 70, 10, 0, F32},
    {2, 1, 256, 3, 20, 0, F32},  {4, 2, 96, 6, 41, 13, Q8},     {4, 2, 64, 5, 1000, 0, Q4},
    {4, 2, 64, 1, 200, 0, Q4KV}, {16, 8, 64, 37, 100, 0, Q4KV}, {6, 3, 128, 4, 60, 0, Q4KV},
    {8, 2, 32, 17, 0, 0, Q4KV},  {8, 4, 8, 9, 70, 0, Q4KV},
};

TEST(CpuAttention, Avx512MatchesReference) {
    if (!cpu_features().has_avx512_set()) GTEST_SKIP() << "no AVX-512";
    for (const Case& c : kCases) run_case(c, rows_avx512, block_avx512, "avx512");
}

TEST(CpuAttention, RefBlocksMatchRefRows) {
    for (const Case& c : kCases) run_case(c, rows_ref, block_ref, "ref");
}

TEST(CpuAttention, Avx2MatchesReference) {
    if (!cpu_features().has_avx2_set()) GTEST_SKIP() << "no AVX2";
    for (const Case& c : kCases) run_case(c, nullptr, block_avx2, "avx2");  // AVX2 has no row kernel of its own
}

// A row's output does not depend on the other rows of its block: a decode step (one token) and a
// speculative verification (several) give the same bits, windowed or not.
TEST(CpuAttention, Avx2RowsDoNotDependOnTheirBlock) {
    if (!cpu_features().has_avx2_set()) GTEST_SKIP() << "no AVX2";
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (const int window : {0, 29}) {
        const int n_head = 4, n_kv = 2, hd = 64, n_tokens = 6, pos0 = 203;
        const int64_t n_ctx = pos0 + n_tokens, kv_width = int64_t(n_kv) * hd;
        std::vector<float> q(size_t(n_tokens) * n_head * hd), k(size_t(n_ctx * kv_width)), v(k.size());
        for (float& x : q) x = nd(rng);
        for (float& x : k) x = nd(rng);
        for (float& x : v) x = nd(rng);
        std::vector<int32_t> pos;
        for (int t = 0; t < n_tokens; ++t) pos.push_back(pos0 + t);
        Args a;
        a.q = q.data(), a.k = k.data(), a.v = v.data(), a.pos = pos.data();
        a.n_head = n_head, a.group = n_head / n_kv, a.head_dim = hd, a.kv_width = kv_width, a.window = window;
        a.scale = 0.125f;
        std::vector<float> scratch(size_t(scratch_floats(n_ctx, hd, a.group)));
        std::vector<float> together(q.size()), alone(q.size());
        a.out = together.data();
        for (int hk = 0; hk < n_kv; ++hk) block_avx2(a, 0, n_tokens, hk, scratch.data());
        a.out = alone.data();
        for (int t = 0; t < n_tokens; ++t)
            for (int hk = 0; hk < n_kv; ++hk) block_avx2(a, t, t + 1, hk, scratch.data());
        EXPECT_EQ(together, alone) << "window " << window;
    }
}

}  // namespace
}  // namespace cera::cpu_attention
