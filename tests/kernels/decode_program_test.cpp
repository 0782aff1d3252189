// The decode-program builder (src/backends/cuda/decode_program.h) is host code: the phases it makes
// from a recorded single-token step are checked here without a GPU. Pointers are addresses inside a
// host buffer standing for device memory (the builder only compares and offsets them).
#include <gtest/gtest.h>

#if CERA_TEST_HAVE_CUDA
#include <vector>

#include "backends/cuda/decode_program.h"

namespace cera::cuda {
namespace {

using K = MxKind;

// A fake device heap: disjoint, 256-byte aligned blocks.
struct Heap {
    std::vector<uint8_t> mem = std::vector<uint8_t>(64u << 20);
    size_t top = 256;
    float* f32(int64_t n) { return reinterpret_cast<float*>(take(size_t(n) * 4)); }
    int32_t* i32(int64_t n) { return reinterpret_cast<int32_t*>(take(size_t(n) * 4)); }
    uint8_t* take(size_t bytes) {
        uint8_t* p = mem.data() + top;
        top += (bytes + 255) / 256 * 256;
        EXPECT_LE(top, mem.size());
        return p;
    }
    WeightRef weight(GgmlType t, int64_t rows, int64_t k) {
        WeightRef w;
        w.type = t, w.k = k, w.image_rows = rows;
        w.image = take(weight_image_bytes(t, rows, k) + 64);
        return w;
    }
};

constexpr int kGrid = 132;
constexpr int64_t kE = 256, kFf = 512, kVocab = 1000;

std::vector<MxKind> kinds(const std::vector<MxPhase>& ph) {
    std::vector<MxKind> k;
    for (const MxPhase& p : ph) k.push_back(p.kind);
    return k;
}

// An LFM2-style conv block, its SwiGLU block and the LM head with the device arg-max.
TEST(DecodeProgram, FoldsNormsResidualsSwigluAndArgmax) {
    Heap h;
    float *x = h.f32(kE), *hn = h.f32(kE), *bcx = h.f32(3 * kE), *gated = h.f32(kE), *y = h.f32(kE);
    float *g = h.f32(kFf), *u = h.f32(kFf), *state = h.f32(2 * kE), *hid = h.f32(kE), *logits = h.f32(kVocab);
    float *nw = h.f32(kE), *conv_w = h.f32(3 * kE);
    int32_t* id = h.i32(1);
    const WeightRef w_in = h.weight(GgmlType::kQ4_0, 3 * kE, kE), w_out = h.weight(GgmlType::kQ4_0, kE, kE);
    const WeightRef w_g = h.weight(GgmlType::kQ4_K, kFf, kE), w_u = h.weight(GgmlType::kQ4_K, kFf, kE);
    const WeightRef w_d = h.weight(GgmlType::kQ8_0, kE, kFf), w_lm = h.weight(GgmlType::kQ6_K, kVocab, kE);
    DecodeRecorder r;
    r.rms_norm(x, 1, kE, nw, 1e-5f, hn);
    r.matmul(w_in, 3 * kE, hn, 1, nullptr, bcx);
    r.short_conv(bcx, conv_w, 3, state, 1, kE, gated);
    r.matmul(w_out, kE, gated, 1, nullptr, y);
    r.add(x, y, 1.0f, kE, x);
    r.rms_norm(x, 1, kE, nw, 1e-5f, hn);
    r.matmul(w_g, kFf, hn, 1, nullptr, g);
    r.matmul(w_u, kFf, hn, 1, nullptr, u);
    r.swiglu(g, u, kFf, g);
    r.matmul(w_d, kE, g, 1, nullptr, y);
    r.add(x, y, 0.5f, kE, x);
    r.rms_norm(x, 1, kE, nw, 1e-5f, hid);
    r.matmul(w_lm, kVocab, hid, 1, nullptr, logits);
    r.argmax(logits, 1, kVocab, id);
    std::vector<MxPhase> ph;
    ASSERT_TRUE(r.build(kGrid, ph)) << r.why();
    ASSERT_EQ(kinds(ph), (std::vector<MxKind>{K::kGemv, K::kConv, K::kGemv, K::kGemv, K::kGemv, K::kGemv,
                                              K::kArgmaxFinal}));
    // Every phase here reads what the one before wrote: a barrier before each but the first.
    for (size_t i = 0; i < ph.size(); ++i) EXPECT_EQ(ph[i].barrier, i > 0 ? 1 : 0) << "phase " << i;
    // The norms are folded into the products that read them, the normalised row still written.
    EXPECT_EQ(ph[0].pro, MxPrologue::kNorm);
    EXPECT_EQ(ph[0].x, x);
    EXPECT_EQ(ph[0].pro_out, hn);
    EXPECT_EQ(ph[2].pro, MxPrologue::kNone);
    EXPECT_EQ(ph[2].mm[0].res_a, x);  // residual add in the out-projection's epilogue
    EXPECT_EQ(ph[2].mm[0].res_out, x);
    EXPECT_EQ(ph[3].glu, 1);  // gate/up paired with their SwiGLU
    EXPECT_EQ(ph[3].act, g);
    EXPECT_EQ(ph[3].n_mm, 2);
    EXPECT_EQ(ph[4].mm[0].res_scale, 0.5f);
    EXPECT_EQ(ph[5].pro_out, hid);
    EXPECT_NE(ph[5].argmax_key, nullptr);
    EXPECT_EQ(ph[6].out_i, id);
    // Work units cover every row once, each fitting a ring stage.
    for (const MxPhase& p : ph) {
        if (p.kind != K::kGemv) continue;
        for (int i = 0; i < p.n_mm; ++i) {
            const MxMatmul& m = p.mm[i];
            EXPECT_GE(m.unit_rows * m.n_units, m.rows);
            EXPECT_LT((m.n_units - 1) * m.unit_rows, m.rows);
            EXPECT_LE(m.unit_rows * (m.q_row_bytes + m.m_row_bytes) * (p.glu ? 2 : 1) + 64 * (p.glu ? 2 : 1),
                      mx_stage_bytes());
        }
    }
}

// Attention: q/k/v share the folded norm in one phase; RoPE + KV store fuse; attention partials and
// their merge; independent phases run without a barrier between them.
TEST(DecodeProgram, AttentionBlockAndIndependentPhases) {
    Heap h;
    const int n_head = 4, n_kv = 2, hd = 64;
    const int64_t qw = n_head * hd, kvw = n_kv * hd, n_ctx = 128;
    float *x = h.f32(kE), *hn = h.f32(kE), *q = h.f32(qw), *k = h.f32(kvw), *v = h.f32(kvw), *att = h.f32(qw);
    float *y = h.f32(kE), *nw = h.f32(kE), *qn = h.f32(hd), *kn = h.f32(hd), *a = h.f32(kE), *b = h.f32(kE);
    int32_t* pos = h.i32(1);
    void* kc = h.take(size_t(n_ctx * kvw) * 2);
    void* vc = h.take(size_t(n_ctx * kvw) * 2);
    const WeightRef wq = h.weight(GgmlType::kQ4_0, qw, kE), wk = h.weight(GgmlType::kQ4_0, kvw, kE);
    const WeightRef wv = h.weight(GgmlType::kQ4_0, kvw, kE), wo = h.weight(GgmlType::kQ4_0, kE, qw);
    RopeArgs rope;
    rope.mode = 2, rope.n_rot = hd;
    AttentionArgs at;
    at.q = q, at.k_cache = kc, at.v_cache = vc, at.f16 = true, at.pos = pos, at.n_tokens = 1, at.n_ctx = n_ctx;
    at.n_head = n_head, at.n_head_kv = n_kv, at.head_dim = hd, at.scale = 0.125f, at.out = att;
    DecodeRecorder r;
    r.rms_norm(x, 1, kE, nw, 1e-5f, hn);
    r.matmul(wq, qw, hn, 1, nullptr, q);
    r.matmul(wk, kvw, hn, 1, nullptr, k);
    r.matmul(wv, kvw, hn, 1, nullptr, v);
    r.norm_rope(q, 1, n_head, hd, qn, 1e-5f, pos, rope);
    r.norm_rope(k, 1, n_kv, hd, kn, 1e-5f, pos, rope);
    r.kv_store(k, v, 1, kvw, pos, kc, vc, true, n_ctx);
    r.attention(at);
    r.matmul(wo, kE, att, 1, nullptr, y);
    r.add(x, y, 1.0f, kE, x);
    r.scale(a, 2.0f, kE);  // touches nothing the step used so far: no barrier
    r.add(a, b, 1.0f, kE, b);  // reads what the scale wrote: barrier
    std::vector<MxPhase> ph;
    ASSERT_TRUE(r.build(kGrid, ph)) << r.why();
    ASSERT_EQ(kinds(ph), (std::vector<MxKind>{K::kGemv, K::kRopeStore, K::kAttn, K::kAttnCombine, K::kGemv,
                                              K::kScale, K::kAdd}));
    EXPECT_EQ(ph[0].n_mm, 3);
    EXPECT_EQ(ph[0].pro, MxPrologue::kNorm);
    EXPECT_EQ(ph[1].n_head, n_head);
    EXPECT_EQ(ph[1].n_head_kv, n_kv);
    EXPECT_GE(ph[2].max_chunks, 1);
    EXPECT_GE(r.partial_floats(), size_t(n_head) * size_t(ph[2].max_chunks) * size_t(hd + 2));
    const std::vector<int> barriers{0, 1, 1, 1, 1, 0, 1};
    for (size_t i = 0; i < ph.size(); ++i) EXPECT_EQ(ph[i].barrier, barriers[i]) << "phase " << i;
}

// What the program does not cover makes the step stay a graph, with the reason.
TEST(DecodeProgram, RefusesWhatItDoesNotCover) {
    Heap h;
    float *x = h.f32(8 * kE), *y = h.f32(8 * kE);
    const WeightRef w = h.weight(GgmlType::kQ4_0, kE, kE);
    {
        DecodeRecorder r;
        r.matmul(w, kE, x, 8, nullptr, y);  // a prefill-sized batch
        std::vector<MxPhase> ph;
        EXPECT_FALSE(r.build(kGrid, ph));
        EXPECT_NE(r.why().find("several tokens"), std::string::npos) << r.why();
    }
    {
        DecodeRecorder r;
        r.matmul(w, kE, x, 1, nullptr, y);
        r.unsupported("moe_ffn");
        std::vector<MxPhase> ph;
        EXPECT_FALSE(r.build(kGrid, ph));
        EXPECT_EQ(r.why(), "moe_ffn");
    }
    {
        DecodeRecorder r;  // an arg-max that does not follow its matmul
        r.argmax(x, 1, kE, reinterpret_cast<int32_t*>(y));
        std::vector<MxPhase> ph;
        EXPECT_FALSE(r.build(kGrid, ph));
    }
}

}  // namespace
}  // namespace cera::cuda

#else
TEST(DecodeProgram, NeedsCudaBuild) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif
