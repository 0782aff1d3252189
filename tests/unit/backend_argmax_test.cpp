// Backend::argmax (the greedy pick on the device) against a plain reference loop: the CPU backend's
// override and the interface's default (host round trip), over row lengths around the unroll width,
// ties, negative rows, -inf and NaN; and against the host Sampler's greedy pick on the same rows,
// which the device path must reproduce exactly. Also the ladder of token counts a warm-up readies.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backends/backend.h"
#include "cera/sampler.h"
#include "core/check.h"

namespace cera {
namespace {

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The specification: the lowest index of the largest non-NaN value; 0 when every value is NaN.
int32_t reference(const float* x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(x[i])) continue;
        if (best < 0 || x[i] > x[best]) best = i;
    }
    return best < 0 ? 0 : int32_t(best);
}

// Rows of every kind for a length n: random, all negative, with ties of the maximum planted at
// random places, constant, with NaN and -inf sprinkled in, all -inf, all NaN, NaN then -inf.
std::vector<std::vector<float>> rows_for(int64_t n, std::mt19937& rng) {
    std::normal_distribution<float> g(0.0f, 3.0f);
    std::uniform_int_distribution<int64_t> at(0, n - 1);
    std::vector<std::vector<float>> out;
    auto random_row = [&] {
        std::vector<float> r(static_cast<size_t>(n));
        for (float& v : r) v = g(rng);
        return r;
    };
    out.push_back(random_row());
    {
        auto r = random_row();
        for (float& v : r) v = -std::fabs(v) - 1.0f;
        out.push_back(r);
    }
    for (int ties : {2, 3, 9}) {
        auto r = random_row();
        float mx = -kInf;
        for (float v : r) mx = std::max(mx, v);
        for (int t = 0; t < ties; ++t) r[size_t(at(rng))] = mx + 1.0f;
        out.push_back(r);
    }
    {
        auto r = random_row();  // the tie at the very end and just before it
        r[size_t(n - 1)] = 100.0f;
        if (n > 1) r[size_t(n - 2)] = 100.0f;
        out.push_back(r);
    }
    out.push_back(std::vector<float>(size_t(n), -2.5f));
    out.push_back(std::vector<float>(size_t(n), 0.0f));
    {
        auto r = random_row();
        for (int t = 0; t < 4; ++t) r[size_t(at(rng))] = kNan;
        for (int t = 0; t < 4; ++t) r[size_t(at(rng))] = -kInf;
        out.push_back(r);
    }
    {
        auto r = random_row();
        r[size_t(at(rng))] = kInf;
        r[size_t(at(rng))] = kInf;
        out.push_back(r);
    }
    {
        std::vector<float> r(size_t(n), -0.0f);  // -0 and +0 are equal: the first wins
        r[size_t(at(rng))] = 0.0f;
        out.push_back(r);
    }
    out.push_back(std::vector<float>(size_t(n), -kInf));
    out.push_back(std::vector<float>(size_t(n), kNan));
    {
        std::vector<float> r(size_t(n), kNan);
        r[size_t(n - 1)] = -kInf;
        out.push_back(r);
    }
    return out;
}

const int64_t kLengths[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 64, 100, 1000, 4099, 50257};

// Runs be.argmax over every row kind of each length as one [rows, n] tensor.
void check_backend(Backend& be) {
    std::mt19937 rng(5);
    for (int64_t n : kLengths) {
        const auto rows = rows_for(n, rng);
        const int64_t m = int64_t(rows.size());
        Tensor x = be.alloc(GgmlType::kF32, {n, m});
        Tensor out = be.alloc(GgmlType::kI32, {m});
        for (int64_t r = 0; r < m; ++r)
            be.write(x, rows[size_t(r)].data(), size_t(n) * 4, size_t(r * n) * 4);
        be.argmax(x, out);
        std::vector<int32_t> got(static_cast<size_t>(m));
        be.read(got.data(), out, got.size() * 4);
        for (int64_t r = 0; r < m; ++r)
            EXPECT_EQ(got[size_t(r)], reference(rows[size_t(r)].data(), n)) << "n " << n << " row kind " << r;
        // One row alone (a view of a later row: no alignment assumption).
        if (m > 2) {
            be.argmax(x.row_slice(2, 1), out);
            int32_t one = -1;
            be.read(&one, out, 4);
            EXPECT_EQ(one, reference(rows[2].data(), n)) << "n " << n;
        }
        be.free(x);
        be.free(out);
    }
}

TEST(BackendArgmax, CpuMatchesReference) {
    auto be = create_backend({.device = DeviceKind::kCpu, .n_threads = 1});
    check_backend(*be);
}

// A backend of host memory that keeps the interface's default argmax (synchronize, read, host loop,
// write): the fallback every backend without its own kernel gets.
class HostMemoryBackend final : public Backend {
   public:
    DeviceKind kind() const override { return DeviceKind::kCpu; }
    std::string description() const override { return "host memory, default ops"; }
    Tensor upload_weight(GgmlType, std::span<const int64_t>, const void*) override { return unused(); }
    Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne) override {
        Tensor t;
        t.type = type;
        int d = 0;
        for (int64_t v : ne) t.ne[d++] = v;
        buffers_.emplace_back(t.n_bytes(), uint8_t(0));
        t.data = buffers_.back().data();
        return t;
    }
    void free(Tensor& t) override { t = Tensor{}; }  // released with the backend
    void write(const Tensor& dst, const void* host, size_t n, size_t off) override {
        std::memcpy(static_cast<uint8_t*>(dst.data) + off, host, n);
    }
    void read(void* host, const Tensor& src, size_t n, size_t off) override {
        std::memcpy(host, static_cast<const uint8_t*>(src.data) + off, n);
        ++reads;
    }
    void copy(const Tensor& dst, const Tensor& src) override { std::memcpy(dst.data, src.data, src.n_bytes()); }
    void zero(const Tensor& t) override { std::memset(t.data, 0, t.n_bytes()); }
    void synchronize() override { ++syncs; }
    void embed(const Tensor&, const Tensor&, float, const Tensor&) override { unused(); }
    void rms_norm(const Tensor&, const Tensor&, float, const Tensor&) override { unused(); }
    void matmul(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override { unused(); }
    void norm_rope(const Tensor&, int, int, const Tensor&, float, const Tensor&, const RopeParams&) override {
        unused();
    }
    void kv_store(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {
        unused();
    }
    void attention(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionParams&,
                   const Tensor&) override {
        unused();
    }
    void short_conv(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override { unused(); }
    void swiglu(const Tensor&, const Tensor&, const Tensor&) override { unused(); }
    void add(const Tensor&, const Tensor&, float, const Tensor&) override { unused(); }
    void scale(const Tensor&, float) override { unused(); }
    void rotate_heads(const Tensor&, int, bool) override { unused(); }
    void moe_route(const Tensor&, const Tensor&, const MoeParams&, const Tensor&, const Tensor&) override {
        unused();
    }
    void moe_ffn(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 const Tensor&) override {
        unused();
    }
    int syncs = 0, reads = 0;

   private:
    static Tensor unused() {
        CERA_CHECK(false, "not used by this test");
        return {};
    }
    std::vector<std::vector<uint8_t>> buffers_;
};

TEST(BackendArgmax, DefaultImplementationMatchesReference) {
    HostMemoryBackend be;
    check_backend(be);
    EXPECT_GT(be.syncs, 0);  // it waited for the queued work before reading
}

// The device pick is the host sampler's greedy pick (temperature 0, no penalties) on the same row.
TEST(BackendArgmax, EqualsTheGreedySamplerPick) {
    auto be = create_backend({.device = DeviceKind::kCpu, .n_threads = 1});
    std::mt19937 rng(9);
    for (int64_t n : kLengths) {
        SamplerParams p;
        p.temperature = 0.0f;
        Sampler greedy(p, int32_t(n));
        ASSERT_TRUE(greedy.picks_argmax());
        Tensor x = be->alloc(GgmlType::kF32, {n, 1});
        Tensor out = be->alloc(GgmlType::kI32, {1});
        for (const auto& row : rows_for(n, rng)) {
            be->write(x, row.data(), size_t(n) * 4);
            be->argmax(x, out);
            int32_t id = -1;
            be->read(&id, out, 4);
            EXPECT_EQ(id, greedy.sample(row.data())) << "n " << n;
        }
        be->free(x);
        be->free(out);
    }
}

// argmax_feed: the pick goes to out and to ids[0], and pos[0] becomes the last position + 1; the other
// entries stay. Checked on the default (through the host) and on the CPU backend.
void check_feed(Backend& be) {
    std::mt19937 rng(21);
    for (int64_t n : {int64_t(1), int64_t(7), int64_t(4099)}) {
        for (int64_t n_pos : {int64_t(1), int64_t(5)}) {
            Tensor x = be.alloc(GgmlType::kF32, {n, 1});
            Tensor out = be.alloc(GgmlType::kI32, {1});
            Tensor ids = be.alloc(GgmlType::kI32, {n_pos});
            Tensor pos = be.alloc(GgmlType::kI32, {n_pos});
            std::vector<int32_t> ids0(static_cast<size_t>(n_pos)), pos0(static_cast<size_t>(n_pos));
            for (int64_t i = 0; i < n_pos; ++i) ids0[size_t(i)] = int32_t(100 + i), pos0[size_t(i)] = int32_t(40 + 3 * i);
            for (const auto& row : rows_for(n, rng)) {
                be.write(x, row.data(), size_t(n) * 4);
                be.write(ids, ids0.data(), ids0.size() * 4);
                be.write(pos, pos0.data(), pos0.size() * 4);
                be.argmax_feed(x, out, ids, pos);
                int32_t want = -1, got = -1, fed = -1;
                argmax_rows_host(row.data(), 1, n, &want);
                be.read_wait(be.read_fed_async(out), &fed);  // as a decode step reads its pick
                EXPECT_EQ(fed, want) << "n " << n;
                std::vector<int32_t> ids1(ids0.size()), pos1(pos0.size());
                be.read(&got, out, 4);
                be.read(ids1.data(), ids, ids1.size() * 4);
                be.read(pos1.data(), pos, pos1.size() * 4);
                EXPECT_EQ(got, want) << "n " << n;
                EXPECT_EQ(ids1[0], want);
                EXPECT_EQ(pos1[0], pos0.back() + 1);
                for (size_t i = 1; i < ids1.size(); ++i) {
                    EXPECT_EQ(ids1[i], ids0[i]);
                    EXPECT_EQ(pos1[i], pos0[i]);
                }
            }
            for (Tensor* t : {&x, &out, &ids, &pos}) be.free(*t);
        }
    }
}

TEST(BackendArgmax, FeedDefaultAndCpu) {
    HostMemoryBackend host;
    check_feed(host);
    auto cpu = create_backend({.device = DeviceKind::kCpu, .n_threads = 1});
    check_feed(*cpu);
}

// read_async / read_wait (the default, on the CPU backend): each ticket returns the bytes of its own
// read, for as many outstanding tickets as kAsyncReads.
TEST(BackendArgmax, AsyncReadsKeepTheirBytes) {
    auto be = create_backend({.device = DeviceKind::kCpu, .n_threads = 1});
    Tensor t = be->alloc(GgmlType::kI32, {16});
    std::vector<int> tickets;
    for (int i = 0; i < Backend::kAsyncReads; ++i) {
        std::vector<int32_t> v(16, 1000 * i);
        v[3] = -i;
        be->write(t, v.data(), v.size() * 4);
        tickets.push_back(be->read_async(t, size_t(4 + 4 * i)));
    }
    for (int i = 0; i < Backend::kAsyncReads; ++i) {
        int32_t got[16] = {};
        for (int32_t& g : got) g = 77;
        be->read_wait(tickets[size_t(i)], got);
        for (int j = 0; j < 1 + i; ++j) EXPECT_EQ(got[j], j == 3 ? -i : 1000 * i) << "ticket " << i << " entry " << j;
        for (int j = 1 + i; j < 16; ++j) EXPECT_EQ(got[j], 77);  // nothing past the requested bytes
    }
    be->free(t);
}

TEST(BackendArgmax, SamplerPicksArgmaxOnlyWhenPlainGreedy) {
    SamplerParams p;
    EXPECT_FALSE(Sampler(p, 10).picks_argmax());  // temperature 0.8
    p.temperature = 0.0f;
    EXPECT_TRUE(Sampler(p, 10).picks_argmax());
    p.repeat_penalty = 1.1f;
    EXPECT_FALSE(Sampler(p, 10).picks_argmax());
    p.penalty_last_n = 0;  // the window is off: the penalty is not in effect
    EXPECT_TRUE(Sampler(p, 10).picks_argmax());
    p.penalty_last_n = 64;
    p.repeat_penalty = 1.0f;
    p.frequency_penalty = 0.5f;
    EXPECT_FALSE(Sampler(p, 10).picks_argmax());
    p.frequency_penalty = 0.0f;
    p.presence_penalty = -0.5f;
    EXPECT_FALSE(Sampler(p, 10).picks_argmax());
    p.presence_penalty = 0.0f;
    p.temperature = -1.0f;  // <= 0 is greedy
    EXPECT_TRUE(Sampler(p, 10).picks_argmax());
}

TEST(BackendWarmUp, ProductCountLadder) {
    EXPECT_TRUE(product_count_ladder(0).empty());
    EXPECT_EQ(product_count_ladder(8), std::vector<int64_t>({8}));
    EXPECT_EQ(product_count_ladder(64), std::vector<int64_t>({16, 20, 24, 28, 32, 40, 48, 56, 64}));
    EXPECT_EQ(product_count_ladder(100), std::vector<int64_t>({16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 100}));
    // Every multiple of 1024 up to 8192 (the encoder's tile batches) is on the ladder.
    const std::vector<int64_t> l = product_count_ladder(8192);
    for (int64_t n = 1024; n <= 8192; n += 1024) EXPECT_NE(std::find(l.begin(), l.end(), n), l.end()) << n;
    EXPECT_TRUE(std::is_sorted(l.begin(), l.end()));
    EXPECT_EQ(l.back(), 8192);
}

}  // namespace
}  // namespace cera
