// The CUDA backend's fusion passes (backends/cuda/step_fusion.cpp), without a GPU: steps shaped like
// the models' decode and prefill steps are run through a host interpreter of the nodes, once as
// recorded (no fusion) and once fused; every output must be bit-identical, and the fused step must
// hold the launches the rules promise. The interpreter keeps a copy of x for each 8-bit buffer when it
// is written, so a product that reads rows made before its input changed gives a different result.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "backends/cuda/backend_switches.h"
#include "backends/cuda/step.h"
#include "core/rotation.h"

namespace cera::cuda {
namespace {

bool yes_glu(GgmlType, int64_t) { return true; }
bool yes_pro(GgmlType, int64_t k, int n_y) { return n_y == 1 && k % 32 == 0; }
bool yes_norm(const GemvArgs& a) { return a.n_y <= 64; }
bool staged(const GemvArgs&, const GemvArgs&) { return true; }
bool yes_qkv(const GemvArgs (&)[3], const QkvRopeArgs&) { return true; }
bool v_fits(GgmlType t, GgmlType tv) { return t == tv; }
bool yes_conv(const GemvArgs& a, int) { return a.n_y == 1; }
bool heavy(GgmlType) { return true; }

FusionRules rules(bool fuse) {
    FusionRules r;
    r.fuse = fuse;
    r.fuse_products = fuse ? 1 : 0;
    r.pro_mask = fuse ? kProDefault : 0;
    r.caps = {yes_pro, yes_norm, yes_glu, staged, yes_qkv, v_fits, yes_conv, heavy};
    return r;
}

// Host memory of a step: named f32 buffers, weights as f32 rows (the type only steers the passes).
struct Mem {
    std::map<std::string, std::vector<float>> buf;
    std::mt19937 rng{7};
    float* make(const std::string& name, size_t n, bool random = false) {
        auto& v = buf[name];
        v.assign(n, 0.0f);
        std::normal_distribution<float> d(0.0f, 0.5f);
        if (random)
            for (float& f : v) f = d(rng);
        return v.data();
    }
    float* at(const std::string& name) { return buf.at(name).data(); }
};

constexpr int64_t kEmbd = 64, kFf = 96, kHead = 32, kHeads = 2, kKvHeads = 1, kCtx = 16, kVocab = 80, kTaps = 3;

struct Interp {
    std::map<const void*, std::vector<float>> q8;  // 8-bit buffer -> the rows it holds (as f32)
    static void norm(const float* x, const float* w, float eps, int64_t k, float* out) {
        double ss = 0;
        for (int64_t i = 0; i < k; ++i) ss += double(x[i]) * x[i];
        const float s = float(1.0 / std::sqrt(ss / double(k) + eps));
        for (int64_t i = 0; i < k; ++i) out[i] = x[i] * s * (w ? w[i] : 1.0f);
    }
    void gemv(const GemvArgs& a) {
        const int64_t k = a.w.k;
        const float* w = static_cast<const float*>(a.w.image) + a.w.row0 * k;
        std::vector<float> in(size_t(a.n_y * k));
        for (int j = 0; j < a.n_y; ++j) {
            if (a.pro_x) {
                norm(a.pro_x, a.pro_w, a.pro_eps, k, &in[size_t(j * k)]);
                if (a.pro_out) std::copy_n(&in[size_t(j * k)], k, a.pro_out);
            } else if (a.xq) {
                ASSERT_NE(a.xq, kXqPending) << "a product left without its 8-bit rows";
                const std::vector<float>& rows = q8.at(a.xq);
                ASSERT_GE(rows.size(), size_t((j + 1) * k));
                std::copy_n(&rows[size_t(j * k)], k, &in[size_t(j * k)]);
            } else {
                std::copy_n(a.x + j * a.ldx, k, &in[size_t(j * k)]);
            }
        }
        // The bias after the products, as a LoRA delta node adds its deltas after them.
        for (int j = 0; j < a.n_y; ++j)
            for (int64_t r = 0; r < a.rows; ++r) {
                float s = 0.0f;
                for (int64_t i = 0; i < k; ++i) s += w[r * k + i] * in[size_t(j * k + i)];
                a.y[j * a.ldy + r] = a.bias ? s + a.bias[r] : s;
            }
        if (!a.res_out) return;
        for (int j = 0; j < a.n_y; ++j)
            for (int64_t r = 0; r < a.rows; ++r)
                a.res_out[j * a.ldy + r] = a.res_a[j * a.ldy + r] + a.res_scale * a.y[j * a.ldy + r];
        if (!a.norm_out) return;
        for (int j = 0; j < a.n_y; ++j) norm(a.res_out + j * a.ldy, a.norm_w, a.norm_eps, a.rows, a.norm_out + j * a.rows);
        side(a.norm_xq, a.norm_out, a.n_y * a.rows);
    }
    void side(const void* xq, const float* x, int64_t n) {
        if (xq) q8[xq].assign(x, x + n);
    }
    static void rope(float* x, int64_t n_tokens, int n_head, int hd, const float* nw, float eps, const int32_t* pos,
                     const RopeArgs& r) {
        for (int64_t t = 0; t < n_tokens; ++t)
            for (int h = 0; h < n_head; ++h) {
                float* v = x + (t * n_head + h) * hd;
                if (nw) norm(v, nw, eps, hd, v);
                for (int i = 0; i < r.n_rot / 2; ++i) {
                    const float th = float(pos[t]) * std::pow(r.freq_base, -2.0f * float(i) / float(r.n_rot));
                    const float a = v[i], b = v[i + r.n_rot / 2];
                    v[i] = a * std::cos(th) - b * std::sin(th), v[i + r.n_rot / 2] = a * std::sin(th) + b * std::cos(th);
                }
            }
    }
    static void store(const float* k, const float* v, int64_t n_tokens, int64_t width, const int32_t* pos, void* kc,
                      void* vc) {
        for (int64_t t = 0; t < n_tokens; ++t) {
            std::copy_n(k + t * width, width, static_cast<float*>(kc) + pos[t] * width);
            std::copy_n(v + t * width, width, static_cast<float*>(vc) + pos[t] * width);
        }
    }
    void run(Node& node) {
        std::visit([&](auto& n) { run(n); }, node);
    }
    void run(std::monostate&) {}
    void run(GemvNode& n) {
        for (int i = 0; i < n.n; ++i) gemv(n.a[i]);
    }
    void run(GemmNode& n) {
        GemvArgs a;
        a.w = n.w, a.rows = n.rows, a.n_y = int(n.n_tokens), a.x = n.x, a.ldx = n.w.k, a.bias = n.bias, a.y = n.y;
        a.ldy = n.rows;
        gemv(a);
    }
    void run(NormNode& n) {
        for (int64_t r = 0; r < n.rows; ++r) norm(n.x + r * n.k, n.w, n.eps, n.k, n.out + r * n.k);
        side(n.xq, n.out, n.rows * n.k);
    }
    void run(RopeNode& n) { rope(n.x, n.n_tokens, n.n_head, n.head_dim, n.norm_w, n.eps, n.pos, n.rope); }
    void run(KvStoreNode& n) { store(n.k, n.v, n.n_tokens, n.width, n.pos, n.k_cache, n.v_cache); }
    static void rotate(float* x, int64_t n_heads, int head_dim, bool inverse) {
        for (int64_t h = 0; h < n_heads; ++h) rotate_head(x + h * head_dim, head_dim, inverse);
    }
    void run(RotateNode& n) { rotate(n.x, n.n_heads, n.head_dim, n.inverse); }
    void run(QkvRopeNode& n) {
        if (n.products)
            for (GemvArgs& a : n.qkv) gemv(a);
        const QkvRopeArgs& r = n.r;
        if (r.q) rope(r.q, r.n_tokens, r.n_head, r.head_dim, r.q_norm, r.q_eps, r.pos, r.q_rope);
        rope(r.k, r.n_tokens, r.n_head_kv, r.head_dim, r.k_norm, r.k_eps, r.pos, r.k_rope);
        if (r.rotate_q) rotate(r.q, r.n_tokens * r.n_head, r.head_dim, false);
        if (r.rotate_k) rotate(r.k, r.n_tokens * r.n_head_kv, r.head_dim, false);
        if (r.rotate_v) rotate(r.v, r.n_tokens * r.n_head_kv, r.head_dim, false);
        store(r.k, r.v, r.n_tokens, int64_t(r.n_head_kv) * r.head_dim, r.pos, r.k_cache, r.v_cache);
    }
    void run(ConvNode& n) {
        if (n.product) gemv(n.in);
        const int64_t e = n.n_embd, L = n.taps;
        for (int64_t t = 0; t < n.n_tokens; ++t) {
            const float* b = n.bcx + t * 3 * e;
            if (n.state_prev) std::copy_n(n.state, (L - 1) * e, n.state_prev);
            for (int64_t c = 0; c < e; ++c) {
                const float bx = b[c] * b[2 * e + c];
                float s = n.w[c * L + L - 1] * bx;
                for (int64_t j = 0; j < L - 1; ++j) s += n.w[c * L + j] * n.state[j * e + c];
                for (int64_t j = 0; j + 1 < L - 1; ++j) n.state[j * e + c] = n.state[(j + 1) * e + c];
                n.state[(L - 2) * e + c] = bx;
                n.out[t * e + c] = b[e + c] * s;
            }
        }
        side(n.xq, n.out, n.n_tokens * e);
    }
    void run(SwigluNode& n) {
        for (int64_t i = 0; i < n.n; ++i) n.out[i] = n.gate[i] / (1.0f + std::exp(-n.gate[i])) * n.up[i];
        side(n.xq, n.out, n.n);
    }
    void run(GluNode& n) {
        gemv(n.g), gemv(n.u);
        const int64_t m = n.g.n_y * n.g.rows;
        for (int64_t i = 0; i < m; ++i) n.act[i] = n.g.y[i] / (1.0f + std::exp(-n.g.y[i])) * n.u.y[i];
        side(n.xq, n.act, m);
    }
    void run(AddNode& n) {
        for (int64_t i = 0; i < n.n; ++i) n.out[i] = n.a[i] + n.scale * n.b[i];
    }
    void run(AttentionNode& n) {  // a stand-in: the passes only move its output's 8-bit rows
        const int64_t m = n.a.n_tokens * n.a.n_head * n.a.head_dim;
        for (int64_t i = 0; i < m; ++i) n.a.out[i] = 0.5f * n.a.q[i];
        side(n.a.out_xq, n.a.out, m);
    }
    void run(PickNode& n) {
        if (n.product) gemv(n.head);
        n.out[0] = int32_t(std::max_element(n.x, n.x + n.n) - n.x);
        n.ids[0] = n.out[0];
        n.pos[0] = n.pos[n.pos_last] + 1;
    }
    void run(QuantizeNode& n) { side(n.xq, n.x, n.rows * n.k); }
    void run(LoraNode& n) {
        const int64_t k = n.k;
        std::vector<float> in(size_t(n.n_rows * k));
        for (int64_t j = 0; j < n.n_rows; ++j)
            if (n.pro_x)
                norm(n.pro_x, n.pro_w, n.pro_eps, k, &in[size_t(j * k)]);
            else
                std::copy_n(n.x + j * k, k, &in[size_t(j * k)]);
        for (int q = 0; q < n.n; ++q) {
            const LoraProductNode& p = n.p[q];
            for (int64_t j = 0; j < n.n_rows; ++j) {
                std::vector<float> acc(size_t(p.n_out), 0.0f);
                for (const LoraSegDev& sg : p.segs) {
                    if (j < sg.start || j >= sg.start + sg.n) continue;
                    const auto* A = static_cast<const float*>(sg.a);
                    const auto* Bt = static_cast<const float*>(sg.bt);
                    for (int i = 0; i < sg.r; ++i) {
                        float t = 0.0f;
                        for (int64_t c = 0; c < k; ++c) t += A[i * k + c] * in[size_t(j * k + c)];
                        t *= sg.scale;
                        for (int64_t o = 0; o < p.n_out; ++o) acc[size_t(o)] += Bt[i * p.n_out + o] * t;
                    }
                }
                for (int64_t o = 0; o < p.n_out; ++o)
                    if (p.delta)
                        p.delta[o] = p.bias ? p.bias[o] + acc[size_t(o)] : acc[size_t(o)];
                    else
                        p.y[j * p.n_out + o] += acc[size_t(o)];
            }
        }
    }
    void run(OtherNode& n) { n.run(); }
};

// The ops of an LFM2-like step of n tokens (a conv layer, an attention layer with q/k norms, each with
// its FFN; the LM head, and with one token the greedy pick), as the CUDA backend records them.
struct Builder {
    Mem m;
    Step s;
    int64_t n;
    GgmlType type;
    bool rotated;  // the attention layer's cache is rotated (tq4): q, k, v rotated before the store
    bool lora;     // every product but the LM head has a LoRA node after it (two adapters on row 0)
    WeightRef weight(const std::string& name, int64_t rows, int64_t k) {
        return {type, m.make(name, size_t(rows * k), true), rows, k, 0};
    }
    void mm(const std::string& w, int64_t rows, int64_t k, const std::string& x, const std::string& y) {
        const WeightRef wr = weight(w, rows, k);
        if (!m.buf.count(y)) m.make(y, size_t(kCtx * rows));
        if (n > kGemvMaxTokens) {
            s.nodes.push_back(GemmNode{wr, rows, n, m.at(x), nullptr, m.at(y)});
            if (lora) adapt(w, rows, k, x, y);
            return;
        }
        GemvNode g;
        GemvArgs& a = g.a[0];
        a.w = wr, a.rows = rows, a.n_y = int(n), a.x = m.at(x), a.ldx = k, a.xq = kXqPending, a.y = m.at(y), a.ldy = rows;
        s.nodes.push_back(g);
        if (lora) adapt(w, rows, k, x, y);
    }
    void adapt(const std::string& w, int64_t rows, int64_t k, const std::string& x, const std::string& y) {
        LoraNode l;
        l.x = m.at(x), l.k = k, l.n_rows = n;
        l.p[0].y = m.at(y), l.p[0].n_out = rows;
        const int ranks[2] = {4, 2};
        for (int i = 0; i < 2; ++i) {
            LoraSegDev d;
            d.start = 0, d.n = i == 0 ? n : 1, d.r = ranks[i], d.scale = i == 0 ? 0.5f : -1.5f;
            d.a_f16 = d.bt_f16 = true;  // as the adapter cache keeps them; the interpreter reads f32
            d.a = m.make(w + "lora_a" + std::to_string(i), size_t(d.r * k), true);
            d.bt = m.make(w + "lora_bt" + std::to_string(i), size_t(d.r * rows), true);
            l.p[0].segs.push_back(d);
        }
        s.nodes.push_back(l);
    }
    void norm(const std::string& x, const std::string& w, const std::string& out) {
        s.nodes.push_back(NormNode{m.at(x), m.make(w, kEmbd, true), 1e-5f, n, kEmbd, m.at(out), true});
    }
    void add(const std::string& a, const std::string& b) {
        s.nodes.push_back(AddNode{m.at(a), m.at(b), 1.0f, n * kEmbd, m.at(a)});
    }
    void ffn(const std::string& l) {
        norm("x", l + "ffn_norm", "h");
        mm(l + "gate", kFf, kEmbd, "h", "g");
        mm(l + "up", kFf, kEmbd, "h", "u");
        s.nodes.push_back(SwigluNode{m.at("g"), m.at("u"), n * kFf, kFf, m.at("g")});
        mm(l + "down", kEmbd, kFf, "g", "y");
        add("x", "y");
    }
    Builder(int64_t n_tokens, GgmlType t, bool rotate = false, bool adapters = false)
        : n(n_tokens), type(t), rotated(rotate), lora(adapters) {
        for (const char* b : {"x", "h", "y", "attn"}) m.make(b, size_t(kCtx * kEmbd));
        m.make("bcx", size_t(kCtx * 3 * kEmbd));
        m.make("conv", size_t(kCtx * kEmbd));
        m.make("state", size_t((kTaps - 1) * kEmbd), true);
        m.make("kc", size_t(kCtx * kKvHeads * kHead)), m.make("vc", size_t(kCtx * kKvHeads * kHead));
        m.make("logits", size_t(kCtx * kVocab));
        m.make("g", size_t(kCtx * kFf)), m.make("u", size_t(kCtx * kFf));
        m.make("q", size_t(kCtx * kHeads * kHead)), m.make("k", size_t(kCtx * kKvHeads * kHead));
        m.make("v", size_t(kCtx * kKvHeads * kHead));
        m.make("embd", size_t(kVocab * kEmbd), true);
        auto& pos = m.buf["pos"];
        pos.resize(size_t(n));
        auto* p = reinterpret_cast<int32_t*>(pos.data());
        for (int64_t t = 0; t < n; ++t) p[t] = int32_t(t + 1);
        m.make("ids", 1), m.make("pick", 1);
        float* x = m.at("x");
        const float* e = m.at("embd");
        s.nodes.push_back(OtherNode{[=, this] { std::copy_n(e + 5 * kEmbd, n * kEmbd, x); }});
        // Conv layer.
        norm("x", "l0norm", "h");
        mm("l0in", 3 * kEmbd, kEmbd, "h", "bcx");
        ConvNode c;
        c.bcx = m.at("bcx"), c.w = m.make("l0conv", size_t(kEmbd * kTaps), true), c.taps = int(kTaps);
        c.state = m.at("state"), c.n_tokens = n, c.n_embd = kEmbd, c.out = m.at("conv");
        s.nodes.push_back(c);
        mm("l0out", kEmbd, kEmbd, "conv", "y");
        add("x", "y");
        ffn("l0");
        // Attention layer.
        norm("x", "l1norm", "h");
        mm("l1q", kHeads * kHead, kEmbd, "h", "q");
        mm("l1k", kKvHeads * kHead, kEmbd, "h", "k");
        mm("l1v", kKvHeads * kHead, kEmbd, "h", "v");
        const auto* pp = reinterpret_cast<const int32_t*>(m.at("pos"));
        RopeArgs r;
        r.mode = 2, r.n_rot = int(kHead), r.freq_base = 10000.0f;
        s.nodes.push_back(RopeNode{m.at("q"), n, int(kHeads), int(kHead), m.make("qn", kHead, true), 1e-5f, pp, r});
        s.nodes.push_back(RopeNode{m.at("k"), n, int(kKvHeads), int(kHead), m.make("kn", kHead, true), 1e-5f, pp, r});
        if (rotated)
            for (const char* x : {"q", "k", "v"})
                s.nodes.push_back(RotateNode{m.at(x), n * (x[0] == 'q' ? kHeads : kKvHeads), int(kHead), false});
        s.nodes.push_back(KvStoreNode{m.at("k"), m.at("v"), n, kKvHeads * kHead, pp, m.at("kc"), m.at("vc"), KvCodec::kF32, KvCodec::kF32, kCtx});
        AttentionNode at;
        at.a.q = m.at("q"), at.a.n_tokens = n, at.a.n_head = int(kHeads), at.a.head_dim = int(kHead), at.a.out = m.at("attn");
        s.nodes.push_back(at);
        if (rotated) s.nodes.push_back(RotateNode{m.at("attn"), n * kHeads, int(kHead), true});
        mm("l1o", kEmbd, kHeads * kHead, "attn", "y");
        add("x", "y");
        ffn("l1");
        // Head: the last token's norm, the LM head, the pick.
        const int64_t last = n - 1;
        s.nodes.push_back(NormNode{m.at("x") + last * kEmbd, m.make("onorm", kEmbd, true), 1e-5f, 1, kEmbd, m.at("h"), true});
        GemvNode head;
        GemvArgs& a = head.a[0];
        a.w = weight("head", kVocab, kEmbd), a.rows = kVocab, a.n_y = 1, a.x = m.at("h"), a.ldx = kEmbd;
        a.xq = kXqPending, a.y = m.at("logits"), a.ldy = kVocab;
        s.nodes.push_back(head);
        if (n == 1) {
            PickNode pk;
            pk.x = m.at("logits"), pk.n = kVocab, pk.out = reinterpret_cast<int32_t*>(m.at("pick"));
            pk.ids = reinterpret_cast<int32_t*>(m.at("ids")), pk.pos = reinterpret_cast<int32_t*>(m.at("pos"));
            pk.pos_last = 0;
            s.nodes.push_back(pk);
        }
    }
};

using Pass = void (*)(Step&, const FusionRules&);

// Runs the step through `passes` (all of fuse_step's when empty) and quantize_inputs; returns every
// buffer afterwards, and the fused node list's kinds.
std::map<std::string, std::vector<float>> run(int64_t n, GgmlType t, bool fuse, std::vector<size_t>* kinds = nullptr,
                                              std::vector<Pass> passes = {}, bool rotated = false, bool lora = false) {
    Builder b(n, t, rotated, lora);
    std::map<Slot, std::vector<uint8_t>> scratch;
    auto buffer = [&](Slot slot, size_t bytes) -> void* {
        auto& v = scratch[slot];
        v.resize(std::max(v.size(), bytes));
        return v.data();
    };
    if (passes.empty()) {
        fuse_step(b.s, rules(fuse), buffer);
    } else {
        hoist_lora(b.s, rules(fuse), buffer);
        for (Pass p : passes) p(b.s, rules(fuse));
        quantize_inputs(b.s, rules(fuse), buffer);
    }
    if (kinds)
        for (const Node& node : b.s.nodes) kinds->push_back(node.index());
    Interp in;
    for (Node& node : b.s.nodes) {
        in.run(node);
        if (::testing::Test::HasFatalFailure()) break;
    }
    return b.m.buf;
}

size_t kind_of(const Node& n) { return n.index(); }
const size_t kGemv = kind_of(GemvNode{}), kQuant = kind_of(QuantizeNode{}), kGlu = kind_of(GluNode{}),
             kQkv = kind_of(QkvRopeNode{}), kConv = kind_of(ConvNode{}), kPick = kind_of(PickNode{}),
             kAdd = kind_of(AddNode{}), kOther = kind_of(OtherNode{}), kAttn = kind_of(AttentionNode{}),
             kSwiglu = kind_of(SwigluNode{}), kGemm = kind_of(GemmNode{}), kRotate = kind_of(RotateNode{}),
             kLora = kind_of(LoraNode{});

TEST(CudaStep, FusedStepsComputeWhatTheRecordedOpsDo) {
    for (int64_t n : {1, 3, 8, 9}) {
        for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ6_K})
            for (bool rotated : {false, true})
                for (bool lora : {false, true}) {
                    SCOPED_TRACE("tokens " + std::to_string(n) + " " + type_name(t) +
                                 (rotated ? " rotated cache" : "") + (lora ? " adapters" : ""));
                    const auto plain = run(n, t, false, nullptr, {}, rotated, lora);
                    const auto fused = run(n, t, true, nullptr, {}, rotated, lora);
                    for (const auto& [name, v] : plain) {
                        const auto& f = fused.at(name);
                        ASSERT_EQ(v.size(), f.size());
                        for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], f[i]) << name << "[" << i << "]";
                    }
                }
    }
}

// Each rule alone (after the ones it builds on) keeps the results and takes launches away.
TEST(CudaStep, EachRuleAloneKeepsTheResults) {
    const std::vector<std::pair<const char*, std::vector<Pass>>> rules_alone = {
        {"group_products", {group_products}},
        {"fuse_glu", {group_products, fuse_glu}},
        {"fuse_residual", {fuse_residual}},
        {"fuse_norm", {fuse_residual, fuse_norm}},
        {"fuse_qkv_rope", {fuse_qkv_rope}},
        {"fuse_qkv_rope with products", {group_products, fuse_qkv_rope}},
        {"fuse_conv", {fuse_conv}},
        {"fuse_pick", {fuse_pick}},
        {"norm_prologues", {fuse_conv, norm_prologues}},
    };
    std::vector<size_t> none;  // 8-bit side rows, no rule
    run(1, GgmlType::kQ6_K, true, &none, {[](Step&, const FusionRules&) {}});
    const auto plain = run(1, GgmlType::kQ6_K, false);
    for (const auto& [name, passes] : rules_alone) {
        SCOPED_TRACE(name);
        std::vector<size_t> k;
        const auto fused = run(1, GgmlType::kQ6_K, true, &k, passes);
        EXPECT_LT(k.size(), none.size());
        for (const auto& [buf, v] : plain) ASSERT_EQ(v, fused.at(buf)) << buf;
    }
}

TEST(CudaStep, OneTokenDecodeIsTheFusedLaunches) {
    std::vector<size_t> k;
    run(1, GgmlType::kQ6_K, true, &k);
    // embed; conv layer: in_proj + conv with the first norm in its prologue, out_proj + residual +
    // the FFN norm; gate/up + SwiGLU with that norm in its prologue, down + residual + the next norm;
    // attention layer: q/k/v + RoPE + store with the norm in the prologue, attention, o + residual +
    // norm, the FFN again, its down product making the output norm; the LM head with the pick. No
    // quantize launch.
    const std::vector<size_t> want = {kOther, kConv, kGemv, kGlu, kGemv, kQkv, kAttn, kGemv, kGlu, kGemv, kPick};
    EXPECT_EQ(k, want);
    // A rotated cache: the rotations of q, k and v go into the q/k/v launch; the output's stays a launch,
    // and the out-projection's 8-bit rows then take one of their own.
    std::vector<size_t> kr;
    run(1, GgmlType::kQ6_K, true, &kr, {}, true);
    std::vector<size_t> want_r = want;
    want_r.insert(want_r.begin() + 7, {kRotate, kQuant});
    EXPECT_EQ(kr, want_r);
}

// With adapters, each launch of products is the same launch, after one launch of its products' deltas
// (which makes the norm too where the products do), and nothing else is added.
TEST(CudaStep, OneTokenDecodeWithAdaptersKeepsTheFusedLaunches) {
    std::vector<size_t> k;
    run(1, GgmlType::kQ6_K, true, &k, {}, false, true);
    const std::vector<size_t> want = {kOther, kLora, kConv, kLora, kGemv, kLora, kGlu,  kLora, kGemv, kLora,
                                      kQkv,   kAttn, kLora, kGemv, kLora, kGlu,  kLora, kGemv, kPick};
    EXPECT_EQ(k, want);
    // More rows: the deltas add into the outputs after the products, and no 8-bit rows are made twice.
    std::vector<size_t> k3, plain3;
    run(3, GgmlType::kQ6_K, true, &k3, {}, false, true);
    run(3, GgmlType::kQ6_K, true, &plain3);
    EXPECT_EQ(std::count(k3.begin(), k3.end(), kLora), 12);
    EXPECT_EQ(std::count(k3.begin(), k3.end(), kQuant), std::count(plain3.begin(), plain3.end(), kQuant));
}

TEST(CudaStep, UnfusedStepsQuantizeOncePerInput) {
    std::vector<size_t> k;
    run(1, GgmlType::kQ4_0, false, &k);
    EXPECT_EQ(std::count(k.begin(), k.end(), kGemv), 13);  // every product alone
    // One quantize for each distinct input: h (conv layer), conv, h (FFN), g, h (attention), attn, h
    // (FFN), g, the head's h.
    EXPECT_EQ(std::count(k.begin(), k.end(), kQuant), 9);
    EXPECT_EQ(std::count(k.begin(), k.end(), kAdd), 4);
    EXPECT_EQ(std::count(k.begin(), k.end(), kSwiglu), 2);
}

TEST(CudaStep, PrefillProductsAreBatched) {
    std::vector<size_t> k;
    run(9, GgmlType::kQ4_0, true, &k);
    EXPECT_EQ(std::count(k.begin(), k.end(), kGemm), 12);  // all but the one-row LM head
    EXPECT_EQ(std::count(k.begin(), k.end(), kQuant), 0);  // the one-row output norm writes the head's rows
    EXPECT_EQ(std::count(k.begin(), k.end(), kQkv), 0);
}

}  // namespace
}  // namespace cera::cuda
