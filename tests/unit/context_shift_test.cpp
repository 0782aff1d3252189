// Context shift: after a shift each kept key equals the unrotated key roped directly at its
// new position (NORM and NEOX, partial rotation, freq factors, linear scaling; F32 and F16
// caches), values move unchanged, the first n_keep rows and the conv state are untouched;
// sessions keep generating past the context on LFM2 (NEOX, conv state) and Llama (NORM).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backends/backend.h"
#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "core/fp16.h"
#include "core/rotation.h"
#include "models/context_shift.h"
#include "test_util.h"

namespace {

using cera::GgmlType;
using cera::RopeMode;
using cera::Tensor;

struct Case {
    const char* name;
    RopeMode mode;
    int n_rot;  // of head_dim 8
    bool freq_factors;
    float freq_scale;
    GgmlType kv;
};

std::vector<float> read_rows(cera::Backend& be, const Tensor& t, int64_t rows) {
    std::vector<float> out(size_t(rows * t.ne[0]));
    if (t.type == GgmlType::kF16) {
        std::vector<uint16_t> h(out.size());
        be.read(h.data(), t, h.size() * 2);
        for (size_t i = 0; i < h.size(); ++i) out[i] = cera::fp16_to_fp32(h[i]);
    } else {
        be.read(out.data(), t, out.size() * 4);
    }
    return out;
}

void write_rows(cera::Backend& be, const Tensor& t, const std::vector<float>& v) {
    if (t.type == GgmlType::kF16) {
        std::vector<uint16_t> h(v.size());
        for (size_t i = 0; i < v.size(); ++i) h[i] = cera::fp32_to_fp16(v[i]);
        be.write(t, h.data(), h.size() * 2);
    } else {
        be.write(t, v.data(), v.size() * 4);
    }
}

// RoPE of rows `x` ([n, width]) at the given positions, with the backend's own kernel.
std::vector<float> rope_at(cera::Backend& be, const std::vector<float>& x, int64_t width, int head_dim,
                           const std::vector<int32_t>& positions, const cera::RopeParams& rope) {
    const int64_t n = int64_t(positions.size());
    Tensor t = be.alloc(GgmlType::kF32, {width, n});
    Tensor pos = be.alloc(GgmlType::kI32, {n});
    be.write(t, x.data(), x.size() * 4);
    be.write(pos, positions.data(), positions.size() * 4);
    be.norm_rope(t, int(width / head_dim), head_dim, Tensor{}, 0.0f, pos, rope);
    std::vector<float> out(x.size());
    be.read(out.data(), t, out.size() * 4);
    be.free(t);
    be.free(pos);
    return out;
}

class ContextShiftKernel : public ::testing::TestWithParam<Case> {};

TEST_P(ContextShiftKernel, KeptKeysEqualDirectRopeAtTheirNewPositions) {
    const Case& c = GetParam();
    auto be = cera::create_backend({});
    constexpr int kHeadDim = 8, kHeads = 2, kCtx = 24, kPos = 20, kKeep = 3, kDiscard = 7;
    constexpr int64_t kWidth = kHeadDim * kHeads;
    cera::LayerStateSpec spec;
    spec.kv_width = kWidth;
    spec.head_dim = kHeadDim;
    spec.rope.mode = c.mode;
    spec.rope.n_rot = c.n_rot;
    spec.rope.freq_base = 10000.0f;
    spec.rope.freq_scale = c.freq_scale;
    Tensor ff;
    if (c.freq_factors) {
        ff = be->alloc(GgmlType::kF32, {c.n_rot / 2});
        std::vector<float> f(size_t(c.n_rot / 2));
        for (size_t i = 0; i < f.size(); ++i) f[i] = 1.0f + 3.0f * float(i) / float(f.size());
        be->write(ff, f.data(), f.size() * 4);
        spec.rope.freq_factors = ff;
    }
    cera::LayerStateSpec conv_spec;  // a conv layer next to it
    conv_spec.conv_channels = 16;
    conv_spec.conv_rows = 2;

    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    std::vector<float> raw(size_t(kPos * kWidth)), vals(size_t(kPos * kWidth)), conv(32);
    for (float& x : raw) x = nd(rng);
    for (float& x : vals) x = nd(rng);
    for (float& x : conv) x = nd(rng);
    std::vector<int32_t> positions(kPos);
    for (int i = 0; i < kPos; ++i) positions[size_t(i)] = i;

    cera::LayerCache attn_cache, conv_cache;
    attn_cache.k = be->alloc(c.kv, {kWidth, kCtx});
    attn_cache.v = be->alloc(c.kv, {kWidth, kCtx});
    conv_cache.conv = be->alloc(GgmlType::kF32, {16, 2});
    write_rows(*be, attn_cache.k, rope_at(*be, raw, kWidth, kHeadDim, positions, spec.rope));
    write_rows(*be, attn_cache.v, vals);
    be->write(conv_cache.conv, conv.data(), conv.size() * 4);
    const std::vector<float> k_before = read_rows(*be, attn_cache.k, kPos);
    const std::vector<float> v_before = read_rows(*be, attn_cache.v, kPos);

    const std::vector<cera::LayerStateSpec> specs = {conv_spec, spec};
    const std::vector<cera::LayerCache> caches = {conv_cache, attn_cache};
    cera::shift_kv_cache(*be, specs, caches, kPos, kKeep, kDiscard);

    const int n_after = kPos - kDiscard;
    const std::vector<float> k_after = read_rows(*be, attn_cache.k, n_after);
    const std::vector<float> v_after = read_rows(*be, attn_cache.v, n_after);
    // The unrotated keys of the kept rows, roped directly at their new positions.
    std::vector<float> moved_raw;
    std::vector<int32_t> new_pos;
    for (int p = kKeep + kDiscard; p < kPos; ++p) {
        moved_raw.insert(moved_raw.end(), raw.begin() + p * kWidth, raw.begin() + (p + 1) * kWidth);
        new_pos.push_back(p - kDiscard);
    }
    const std::vector<float> direct = rope_at(*be, moved_raw, kWidth, kHeadDim, new_pos, spec.rope);
    const float tol = c.kv == GgmlType::kF16 ? 4e-3f : 2e-5f;
    for (int r = 0; r < n_after; ++r) {
        for (int i = 0; i < kWidth; ++i) {
            const size_t at = size_t(r * kWidth + i);
            if (r < kKeep) {
                EXPECT_EQ(k_after[at], k_before[at]) << "row " << r << " inside n_keep changed";
                EXPECT_EQ(v_after[at], v_before[at]);
            } else {
                const size_t src = size_t((r + kDiscard) * kWidth + i);
                EXPECT_NEAR(k_after[at], direct[size_t((r - kKeep) * kWidth + i)], tol) << "row " << r << " dim " << i;
                EXPECT_EQ(v_after[at], v_before[src]) << "values move unchanged";
                if (i % kHeadDim >= c.n_rot) EXPECT_NEAR(k_after[at], k_before[src], 1e-6f) << "unrotated dims";
            }
        }
    }
    std::vector<float> conv_after(32);
    be->read(conv_after.data(), conv_cache.conv, 32 * 4);
    EXPECT_EQ(conv_after, conv);

    EXPECT_THROW(cera::shift_kv_cache(*be, specs, caches, kPos, kKeep, kPos), cera::Error);
    EXPECT_THROW(cera::shift_kv_cache(*be, specs, caches, kPos, -1, 1), cera::Error);
}

// A cache of rotated keys (tq4): the shift turns them back, ropes them and rotates them again, so the
// kept rows are the rotation of the keys roped directly at their new positions.
TEST(ContextShiftRotated, KeysAreRopedInTheModelsFrame) {
    auto be = cera::create_backend({});
    constexpr int kHeadDim = 32, kHeads = 2, kCtx = 24, kPos = 20, kKeep = 3, kDiscard = 7;
    constexpr int64_t kWidth = kHeadDim * kHeads;
    cera::LayerStateSpec spec;
    spec.kv_width = kWidth;
    spec.head_dim = kHeadDim;
    spec.rope.mode = RopeMode::kNeox;
    spec.rope.n_rot = kHeadDim;
    spec.rope.freq_base = 10000.0f;
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    std::vector<float> raw(size_t(kPos * kWidth)), vals(size_t(kPos * kWidth));
    for (float& x : raw) x = nd(rng);
    for (float& x : vals) x = nd(rng);
    std::vector<int32_t> positions(kPos);
    for (int i = 0; i < kPos; ++i) positions[size_t(i)] = i;
    auto rotated = [&](std::vector<float> x) {
        for (size_t h = 0; h < x.size() / kHeadDim; ++h) cera::rotate_head(x.data() + h * kHeadDim, kHeadDim, false);
        return x;
    };
    cera::LayerCache c;
    c.k = be->alloc(GgmlType::kF32, {kWidth, kCtx});
    c.v = be->alloc(GgmlType::kF32, {kWidth, kCtx});
    c.rotated_k = c.rotated_v = true;
    write_rows(*be, c.k, rotated(rope_at(*be, raw, kWidth, kHeadDim, positions, spec.rope)));
    write_rows(*be, c.v, vals);
    cera::shift_kv_cache(*be, std::vector<cera::LayerStateSpec>{spec}, std::vector<cera::LayerCache>{c}, kPos, kKeep,
                         kDiscard);
    std::vector<float> moved_raw;
    std::vector<int32_t> new_pos;
    for (int p = kKeep + kDiscard; p < kPos; ++p) {
        moved_raw.insert(moved_raw.end(), raw.begin() + p * kWidth, raw.begin() + (p + 1) * kWidth);
        new_pos.push_back(p - kDiscard);
    }
    const std::vector<float> want = rotated(rope_at(*be, moved_raw, kWidth, kHeadDim, new_pos, spec.rope));
    const std::vector<float> k_after = read_rows(*be, c.k, kPos - kDiscard);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(k_after[kKeep * kWidth + i], want[i], 2e-5f) << i;
    const std::vector<float> v_after = read_rows(*be, c.v, kPos - kDiscard);
    for (size_t i = 0; i < want.size(); ++i)
        EXPECT_EQ(v_after[kKeep * kWidth + i], vals[(kKeep + kDiscard) * kWidth + i]) << "values move unchanged";
    be->free(c.k);
    be->free(c.v);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ContextShiftKernel,
    ::testing::Values(Case{"neox", RopeMode::kNeox, 8, false, 1.0f, GgmlType::kF32},
                      Case{"norm", RopeMode::kNorm, 8, false, 1.0f, GgmlType::kF32},
                      Case{"norm_partial", RopeMode::kNorm, 4, false, 1.0f, GgmlType::kF32},
                      Case{"neox_partial", RopeMode::kNeox, 4, false, 1.0f, GgmlType::kF32},
                      Case{"norm_freq_factors", RopeMode::kNorm, 8, true, 1.0f, GgmlType::kF32},
                      Case{"neox_freq_factors_scaled", RopeMode::kNeox, 8, true, 0.25f, GgmlType::kF32},
                      Case{"neox_f16", RopeMode::kNeox, 8, false, 1.0f, GgmlType::kF16},
                      Case{"norm_f16_freq_factors", RopeMode::kNorm, 8, true, 1.0f, GgmlType::kF16}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

cera::GenerateOptions long_greedy(int32_t n, int32_t n_keep) {
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = n;
    g.ignore_eos = true;
    g.n_keep = n_keep;
    return g;
}

void generates_past_the_context(const std::string& model, cera::KvCacheType kv) {
    auto e = cera::Engine::load(model, {.device = "cpu", .threads = 1, .kv_type_k = kv, .kv_type_v = kv});
    constexpr int32_t kCtx = 48, kKeep = 5;
    cera::Session s(e, kCtx);
    s.append_text("Once upon a time, there was a little");
    const std::vector<int32_t> head(s.tokens().begin(), s.tokens().begin() + kKeep);
    cera::NullSink sink;
    const cera::GenerationResult r = s.generate(long_greedy(200, kKeep), sink);
    EXPECT_EQ(r.finish, cera::FinishReason::kLength);
    EXPECT_EQ(r.generated_tokens, 200);
    EXPECT_GE(r.context_shifts, 3);
    EXPECT_LE(s.position(), kCtx);
    EXPECT_TRUE(std::equal(head.begin(), head.end(), s.tokens().begin())) << "a shift touched the first n_keep";
    EXPECT_FALSE(r.text.empty());

    // Without n_keep the same run stops at the full context.
    cera::Session t(e, kCtx);
    t.append_text("Once upon a time, there was a little");
    EXPECT_EQ(t.generate(long_greedy(200, -1), sink).finish, cera::FinishReason::kContextFull);
    // n_keep as large as the context cannot shift: it stops too.
    cera::Session u(e, kCtx);
    u.append_text("Once upon a time, there was a little");
    EXPECT_EQ(u.generate(long_greedy(200, kCtx), sink).finish, cera::FinishReason::kContextFull);
}

TEST(ContextShiftSession, Lfm2GeneratesPastTheContext) {
    generates_past_the_context(cera::test::source_path("models/tiny-lfm2-Q8_0.gguf"), cera::KvCacheType::kF32);
}

TEST(ContextShiftSession, Lfm2GeneratesPastTheContextTq4) {
    generates_past_the_context(cera::test::source_path("models/tiny-lfm2-Q8_0.gguf"), cera::KvCacheType::kTq4);
}

TEST(ContextShiftSession, Lfm2GeneratesPastTheContextTq3) {
    generates_past_the_context(cera::test::source_path("models/tiny-lfm2-Q8_0.gguf"), cera::KvCacheType::kTq3);
}

TEST(ContextShiftSession, LlamaGeneratesPastTheContextF16) {
    generates_past_the_context(cera::test::source_path("models/stories260K.gguf"), cera::KvCacheType::kF16);
}

// Heads of 8: rotated and shifted keys in blocks that four heads share.
TEST(ContextShiftSession, LlamaGeneratesPastTheContextTq4) {
    generates_past_the_context(cera::test::source_path("models/stories260K.gguf"), cera::KvCacheType::kTq4);
}

// Keys coded per channel over groups of 64 tokens (kivi4): a shift codes the groups from n_keep's on again.
TEST(ContextShiftSession, LlamaGeneratesPastTheContextKivi4) {
    generates_past_the_context(cera::test::source_path("models/stories260K.gguf"), cera::KvCacheType::kKivi4);
}

TEST(ContextShiftSession, ShiftDropsHalfOfTheRestAndKeepsGoing) {
    auto e = cera::Engine::load(cera::test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cpu", .threads = 1});
    cera::Session s(e, 64);
    s.append_text("Once upon a time, there was a little girl named Lily. She liked to play.");
    cera::NullSink sink;
    s.generate(long_greedy(0, -1), sink);
    const std::vector<int32_t> before = s.tokens();
    const int32_t n = s.n_evaluated();
    const int32_t dropped = s.shift_context(4);
    EXPECT_EQ(dropped, (n - 4) / 2);
    EXPECT_EQ(s.n_evaluated(), n - dropped);
    EXPECT_TRUE(std::equal(before.begin(), before.begin() + 4, s.tokens().begin()));
    EXPECT_TRUE(std::equal(before.begin() + 4 + dropped, before.end(), s.tokens().begin() + 4));
    EXPECT_EQ(s.shift_context(s.n_evaluated()), 0);  // nothing after n_keep
    const cera::GenerationResult r = s.generate(long_greedy(8, -1), sink);
    EXPECT_EQ(r.generated_tokens, 8);
}

}  // namespace
