// Q4_CH, the kivi4 cache's keys (core/quant/kv_groups.h): groups coded per channel as defined, stores
// that give the same bytes however the rows come in steps, rows rolled back and slots given up, and the
// CPU attention kernels reading a query's own group as Q8_0 rows and the groups before as codes, against
// an attention computed here from that definition.
#include "core/quant/kv_groups.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernels_attention.h"
#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/quant/quant.h"

namespace cera {
namespace {

using kv_groups::kRows;

// Rows of width as the open groups hold them: Q8_0 rows.
std::vector<uint8_t> q8_rows(const float* x, int64_t n, int64_t width) {
    std::vector<uint8_t> q(row_size(GgmlType::kQ8_0, width) * size_t(n));
    quantize_row_ref(GgmlType::kQ8_0, x, q.data(), n * width);
    return q;
}
std::vector<float> q8_round(const float* x, int64_t n, int64_t width) {
    std::vector<float> y(size_t(n * width));
    dequantize_row_ref(GgmlType::kQ8_0, q8_rows(x, n, width).data(), y.data(), n * width);
    return y;
}

// Keys as small llama models make them: a few channels far from zero, token after token.
std::vector<float> keys(int64_t rows, int64_t width, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> k(size_t(rows * width));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < width; ++c)
            k[size_t(r * width + c)] = nd(rng) + (c % 8 == 7 ? (c % 16 == 7 ? 12.0f : -9.0f) : 0.0f);
    return k;
}

struct Cache {
    int64_t width;
    int slots;
    std::vector<uint8_t> codes;
    std::vector<uint8_t> open;
    Cache(int64_t w, int64_t groups, int s)
        : width(w), slots(s), codes(kv_groups::group_bytes(w) * size_t(groups)), open(kv_groups::open_bytes(w, s)) {
        kv_groups::clear_open(open.data(), width, slots);
    }
    void store(const float* k, int32_t first, int32_t n) {
        std::vector<int32_t> rows(static_cast<size_t>(n));
        for (int32_t i = 0; i < n; ++i) rows[size_t(i)] = first + i;
        kv_groups::store(k, rows.data(), n, width, codes.data(), open.data(), slots);
    }
    uint8_t* group(int64_t g) { return codes.data() + kv_groups::group_bytes(width) * size_t(g); }
};

TEST(KvGroups, GroupsFollowTheDefinition) {
    const int64_t width = 48;
    for (const int n : {1, 2, 17, 64}) {
        const std::vector<float> x = keys(n, width, uint32_t(n));
        std::vector<uint8_t> g(kv_groups::group_bytes(width), 0xff);
        kv_groups::quantize(x.data(), n, width, g.data());
        std::vector<float> y(x.size());
        kv_groups::dequantize(g.data(), n, width, y.data());
        for (int64_t c = 0; c < width; ++c) {
            float mn = INFINITY, mx = -INFINITY;
            for (int i = 0; i < n; ++i)
                mn = std::min(mn, x[size_t(i * width + c)]), mx = std::max(mx, x[size_t(i * width + c)]);
            const uint8_t* rec = g.data() + c * 36;
            uint16_t d16, m16;
            std::memcpy(&d16, rec, 2);
            std::memcpy(&m16, rec + 2, 2);
            ASSERT_EQ(d16, fp32_to_fp16((mx - mn) / 15.0f)) << n << " " << c;
            ASSERT_EQ(m16, fp32_to_fp16(mn)) << n << " " << c;
            const float d = fp16_to_fp32(d16), m = fp16_to_fp32(m16);
            for (int i = 0; i < kRows; ++i) {
                const int q = (rec[4 + i / 2] >> (4 * (i % 2))) & 15;
                if (i >= n) {
                    EXPECT_EQ(q, 0) << "rows past n take code 0";
                    continue;
                }
                const float xi = x[size_t(i * width + c)];
                const int want = int(std::clamp(std::nearbyint((xi - m) / d), 0.0f, 15.0f));
                if (std::fabs((xi - m) / d - std::floor((xi - m) / d) - 0.5f) > 1e-3f) {
                    EXPECT_EQ(q, want) << n << " " << c << " " << i;
                }
                EXPECT_FLOAT_EQ(y[size_t(i * width + c)], m + d * float(q));
                EXPECT_LE(std::fabs(y[size_t(i * width + c)] - xi),
                          0.5f * d + 1e-3f * (std::fabs(mx - mn) + std::fabs(mn)) + 1e-6f);
                EXPECT_EQ(kv_groups::value(g.data(), i, c, width), y[size_t(i * width + c)]);
            }
        }
    }
}

// Rows stored one at a time, in uneven steps or all at once leave the same codes, the codes of a full
// group are those of its Q8_0 rows, and the open group holds the rows of the group being filled.
TEST(KvGroups, StoresDoNotDependOnHowRowsAreSplit) {
    const int64_t width = 32, n = 200;
    const std::vector<float> k = keys(n, width, 5);
    Cache whole(width, 4, 2), single(width, 4, 2), steps(width, 4, 2);
    whole.store(k.data(), 0, int32_t(n));
    for (int32_t r = 0; r < n; ++r) single.store(k.data() + r * width, r, 1);
    for (int32_t r = 0, step = 1; r < n; r += step, step = step % 37 + 6)
        steps.store(k.data() + r * width, r, std::min<int32_t>(step, int32_t(n) - r));
    EXPECT_EQ(whole.codes, single.codes);
    EXPECT_EQ(whole.codes, steps.codes);
    for (int64_t g = 0; g < 3; ++g) {
        const std::vector<float> rows = q8_round(k.data() + g * kRows * width, kRows, width);
        std::vector<uint8_t> want(kv_groups::group_bytes(width));
        kv_groups::quantize(rows.data(), kRows, width, want.data());
        EXPECT_TRUE(std::equal(want.begin(), want.end(), whole.group(g))) << "group " << g;
    }
    const std::vector<uint8_t> last = q8_rows(k.data() + 3 * kRows * width, n - 3 * kRows, width);
    for (Cache* c : {&whole, &single, &steps}) {
        const uint8_t* open = kv_groups::find_open(c->open.data(), width, 2, 3, int(n - 3 * kRows));
        ASSERT_NE(open, nullptr);
        EXPECT_TRUE(std::equal(last.begin(), last.end(), open));
        EXPECT_EQ(kv_groups::find_open(c->open.data(), width, 2, 3, int(n - 3 * kRows) + 1), nullptr);
    }
}

// A store at row r ends its group at r (a rollback); a group whose slot was given up to another group
// reads its rows back from its codes.
TEST(KvGroups, RollbacksAndSlotsGivenUp) {
    const int64_t width = 32;
    const std::vector<float> k = keys(3 * kRows, width, 9);
    Cache c(width, 3, 1);
    c.store(k.data(), 0, 41);
    std::vector<float> row30(k.begin() + 100 * width, k.begin() + 101 * width);
    c.store(row30.data(), 30, 1);
    std::vector<float> rows = q8_round(k.data(), 31, width);
    const std::vector<float> r30 = q8_round(row30.data(), 1, width);
    std::copy(r30.begin(), r30.end(), rows.begin() + 30 * width);
    std::vector<uint8_t> want(kv_groups::group_bytes(width));
    kv_groups::quantize(rows.data(), 31, width, want.data());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), c.group(0)));
    EXPECT_NE(kv_groups::find_open(c.open.data(), width, 1, 0, 31), nullptr);
    EXPECT_EQ(kv_groups::find_open(c.open.data(), width, 1, 0, 32), nullptr);

    // Group 2 takes the only slot; row 31 of group 0 then comes back to rows 0..30 as coded (and held as
    // Q8_0 rows from there on).
    c.store(k.data() + 2 * kRows * width, 2 * kRows, 5);
    EXPECT_EQ(kv_groups::find_open(c.open.data(), width, 1, 0, 1), nullptr);
    std::vector<float> back(size_t(32 * width));
    kv_groups::dequantize(c.group(0), 31, width, back.data());
    const std::vector<float> decoded = q8_round(back.data(), 31, width);
    std::copy(decoded.begin(), decoded.end(), back.begin());
    const std::vector<float> r31 = q8_round(k.data() + 31 * width, 1, width);
    std::copy(r31.begin(), r31.end(), back.begin() + 31 * width);
    c.store(k.data() + 31 * width, 31, 1);
    kv_groups::quantize(back.data(), 32, width, want.data());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), c.group(0)));
}

// The attention a query at position p computes over a kivi4 cache: keys of p's group as Q8_0 rows, the
// keys before as the codes of their full groups, values exact (F32 here).
void attention_by_definition(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                             int n_head, int n_kv, int hd, int32_t pos0, int n_tokens, int window,
                             std::vector<float>& out) {
    const int64_t width = int64_t(n_kv) * hd, n_ctx = pos0 + n_tokens;
    std::vector<float> coded(k.size());
    const std::vector<float> held = q8_round(k.data(), n_ctx, width);
    for (int64_t g = 0; g * kRows + kRows <= n_ctx; ++g) {
        const std::vector<float> rows(held.begin() + g * kRows * width, held.begin() + (g + 1) * kRows * width);
        std::vector<uint8_t> bytes(kv_groups::group_bytes(width));
        kv_groups::quantize(rows.data(), kRows, width, bytes.data());
        kv_groups::dequantize(bytes.data(), kRows, width, coded.data() + g * kRows * width);
    }
    out.assign(size_t(n_tokens) * n_head * hd, 0.0f);
    for (int t = 0; t < n_tokens; ++t) {
        const int32_t p = pos0 + t, begin = window > 0 ? std::max(0, p + 1 - window) : 0;
        for (int h = 0; h < n_head; ++h) {
            const int hk = h / (n_head / n_kv);
            const float* qv = q.data() + (size_t(t) * n_head + h) * hd;
            std::vector<double> s;
            for (int32_t j = begin; j <= p; ++j) {
                double dot = 0;
                for (int d = 0; d < hd; ++d) {
                    const size_t i = size_t(j * width + hk * hd + d);
                    dot += double(qv[d]) * (j / kRows == p / kRows ? held[i] : coded[i]);
                }
                s.push_back(dot / std::sqrt(double(hd)));
            }
            const double mx = *std::max_element(s.begin(), s.end());
            double sum = 0;
            for (double& x : s) sum += (x = std::exp(x - mx));
            for (int32_t j = begin; j <= p; ++j)
                for (int d = 0; d < hd; ++d)
                    out[(size_t(t) * n_head + h) * hd + d] +=
                        float(s[size_t(j - begin)] / sum * v[size_t(j * width + hk * hd + d)]);
        }
    }
}

TEST(KvGroups, AttentionReadsTheQuerysGroupAsQ8_0Rows) {
    using namespace cpu_attention;
    struct Case {
        int n_head, n_kv, hd, n_tokens;
        int32_t pos0;
        int window;
    };
    for (const Case& cs :
         {Case{4, 2, 64, 1, 200, 0}, Case{4, 2, 64, 70, 30, 0}, Case{8, 4, 8, 150, 0, 0}, Case{4, 2, 32, 9, 127, 0},
          Case{2, 2, 48, 5, 64, 0}, Case{4, 2, 64, 3, 300, 90}, Case{4, 4, 16, 1, 63, 0}}) {
        const int64_t width = int64_t(cs.n_kv) * cs.hd, n_ctx = cs.pos0 + cs.n_tokens;
        const std::vector<float> k = keys(n_ctx, width, uint32_t(cs.pos0 + cs.hd));
        const std::vector<float> v = keys(n_ctx, width, 77), q = keys(int64_t(cs.n_tokens) * cs.n_head, cs.hd, 3);
        // The cache as a session leaves it: the positions before the step, then the step's keys.
        Cache c(width, (n_ctx + kRows - 1) / kRows, 2);
        if (cs.pos0 > 0) c.store(k.data(), 0, cs.pos0);
        c.store(k.data() + cs.pos0 * width, cs.pos0, cs.n_tokens);
        std::vector<int32_t> pos(size_t(cs.n_tokens));
        for (int t = 0; t < cs.n_tokens; ++t) pos[size_t(t)] = cs.pos0 + t;
        Args a;
        a.q = q.data(), a.k = c.codes.data(), a.v = v.data(), a.pos = pos.data();
        a.k_type = Elem::kQ4_CH, a.v_type = Elem::kF32;
        a.n_head = cs.n_head, a.group = cs.n_head / cs.n_kv, a.head_dim = cs.hd, a.kv_width = width;
        a.window = cs.window, a.scale = 1.0f / std::sqrt(float(cs.hd));
        // The step's keys as the backend hands them over (kv_groups::round_rows).
        std::vector<float> k_new(size_t(cs.n_tokens * width));
        kv_groups::round_rows(k.data() + cs.pos0 * width, cs.n_tokens, width, k_new.data());
        a.k_new = k_new.data(), a.new_first = cs.pos0;
        a.k_slot =
            cs.pos0 % kRows ? kv_groups::find_open(c.open.data(), width, 2, cs.pos0 / kRows, cs.pos0 % kRows) : nullptr;
        ASSERT_TRUE(a.k_slot || cs.pos0 % kRows == 0);
        std::vector<float> want;
        attention_by_definition(q, k, v, cs.n_head, cs.n_kv, cs.hd, cs.pos0, cs.n_tokens, cs.window, want);
        std::vector<float> scratch(size_t(scratch_floats(n_ctx, cs.hd, a.group))), got(want.size());
        const int64_t n_rows = int64_t(cs.n_tokens) * cs.n_head;
        double scale = 1;  // the outputs' largest magnitude (the values' outlier channels reach ~12)
        for (float x : want) scale = std::max(scale, double(std::fabs(x)));
        auto check = [&](const char* name, double tol) {
            double max_d = 0;
            for (size_t i = 0; i < want.size(); ++i) max_d = std::max(max_d, double(std::fabs(want[i] - got[i])));
            EXPECT_LT(max_d, tol * scale)
                << name << " hd " << cs.hd << " tokens " << cs.n_tokens << " pos0 " << cs.pos0;
        };
        a.out = got.data();
        rows_ref(a, 0, n_rows, scratch.data());
        check("ref", 1e-5);
        std::vector<float> ref = got;
        using Block = void (*)(const Args&, int64_t, int64_t, int, float*);
        auto blocks = [&](Block fn) {
            std::fill(got.begin(), got.end(), NAN);
            for (int64_t t0 = 0; t0 < cs.n_tokens; t0 += kBlockTokens)
                for (int hk = 0; hk < cs.n_kv; ++hk)
                    fn(a, t0, std::min<int64_t>(cs.n_tokens, t0 + kBlockTokens), hk, scratch.data());
        };
        if (cpu_features().has_avx512_set()) {
            std::fill(got.begin(), got.end(), NAN);
            rows_avx512(a, 0, n_rows, scratch.data());
            check("avx512 rows", 1e-5);
            blocks(block_avx512);
            check("avx512 blocks", 1e-5);
        }
        if (cpu_features().has_avx2_set()) {
            blocks(block_avx2);
            check("avx2 blocks", 1e-5);
        }
    }
}

}  // namespace
}  // namespace cera
