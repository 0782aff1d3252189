// The CPU backend's vectorized attention rows against the scalar specification,
// over awkward shapes: head sizes that are not a multiple of 16, one key, GQA
// groups, a sliding window, F32 and F16 caches, positions not starting at 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backends/cpu/kernels_attention.h"
#include "core/cpu_features.h"
#include "core/fp16.h"

namespace cera::cpu_attention {
namespace {

struct Case {
    int n_head, n_head_kv, head_dim, n_tokens, pos0, window;
    bool f16;
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
    std::vector<uint16_t> k16(k32.size()), v16(v32.size());
    for (size_t i = 0; i < k32.size(); ++i) {
        k16[i] = fp32_to_fp16(k32[i]);
        v16[i] = fp32_to_fp16(v32[i]);
    }
    std::vector<int32_t> pos(size_t(c.n_tokens));
    for (int t = 0; t < c.n_tokens; ++t) pos[size_t(t)] = c.pos0 + t;
    Args a;
    a.q = q.data();
    a.k = c.f16 ? static_cast<const void*>(k16.data()) : k32.data();
    a.v = c.f16 ? static_cast<const void*>(v16.data()) : v32.data();
    a.f16 = c.f16;
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
    for (int pass = 0; pass < 2; ++pass) {
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
                               << c.n_tokens << " pos0 " << c.pos0 << " window " << c.window << " f16 " << c.f16;
    }
}

const Case kCases[] = {
    {4, 2, 64, 7, 0, 0, false},   {4, 2, 64, 1, 200, 0, false},  {4, 4, 48, 5, 3, 0, true},
    {2, 1, 16, 33, 0, 0, false},  {8, 2, 80, 3, 17, 0, true},    {4, 2, 32, 20, 5, 8, false},
    {1, 1, 8, 1, 0, 0, false},    {6, 3, 128, 4, 60, 0, true},   {4, 1, 24, 9, 1, 0, false},
    {16, 8, 64, 40, 0, 0, false}, {16, 8, 64, 37, 100, 0, true}, {4, 2, 64, 50, 3, 20, false},
    {8, 2, 32, 17, 0, 0, false},
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
    for (const Case& c : kCases) run_case(c, rows_avx2, block_avx2, "avx2");
}

}  // namespace
}  // namespace cera::cpu_attention
