// The fusion passes over a recorded step (step.h). Each rule looks at neighbouring nodes only: the
// model issues the ops of a fusable pattern back to back, and anything between them (another op, a
// flush) keeps them apart, so a rule never has to prove that reordering is safe.
#include <algorithm>

#include "backends/cuda/backend_switches.h"
#include "backends/cuda/step.h"

namespace cera::cuda {
namespace {

template <class T>
T* as(Node& n) {
    return std::get_if<T>(&n);
}
template <class T>
T* at(Step& s, size_t i) {
    return i < s.nodes.size() ? as<T>(s.nodes[i]) : nullptr;
}

void compact(Step& s) {
    std::erase_if(s.nodes, [](const Node& n) { return std::holds_alternative<std::monostate>(n); });
}

// Which of two neighbours a rule merged the other into (the other leaves the step).
enum class Kept { kBoth, kFirst, kSecond };

// A rule over each pair of neighbours of types A then B: merge(a, b, first) may fold one into the
// other (or put another node in `first`, the first's slot) and says which stays.
template <class A, class B, class F>
void fuse_pairs(Step& s, const FusionRules& r, F merge) {
    if (!r.fuse) return;
    for (size_t i = 0; i + 1 < s.nodes.size(); ++i) {
        A* a = at<A>(s, i);
        B* b = at<B>(s, i + 1);
        if (!a || !b) continue;
        const Kept k = merge(*a, *b, s.nodes[i]);
        if (k == Kept::kFirst) s.nodes[i + 1] = std::monostate{};
        if (k == Kept::kSecond) s.nodes[i] = std::monostate{};
    }
    compact(s);
}

bool is_block(GgmlType t) { return quant_layout(t).block_elems > 0; }

bool fuses_product(const FusionRules& r, GgmlType t, bool conv) {
    return r.fuse_products == 2 || (r.fuse_products == 1 && (conv ? r.caps.heavy_scales(t) : is_block(t)));
}

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
    const auto *pa = static_cast<const uint8_t*>(a), *pb = static_cast<const uint8_t*>(b);
    return a && b && pa < pb + nb && pb < pa + na;
}

size_t floats(int64_t n) { return size_t(n) * sizeof(float); }

// The f32 memory a node writes, as (pointer, bytes) calls of f; OtherNode reports null (anything).
template <class F>
void writes(const Node& node, F&& f) {
    auto gemv = [&](const GemvArgs& a) {
        f(a.y, floats((a.n_y - 1) * a.ldy + a.rows));
        if (a.res_out) f(a.res_out, floats(a.n_y * a.ldy));
        if (a.norm_out) f(a.norm_out, floats(a.n_y * a.rows));
        if (a.pro_out) f(a.pro_out, floats(a.w.k));
    };
    auto cache = [&](void* c, int64_t n_ctx, int64_t width, KvCodec codec) {
        f(c, size_t(n_ctx * kv_row_bytes(codec, width)));
    };
    std::visit(
        [&](const auto& n) {
            using T = std::decay_t<decltype(n)>;
            if constexpr (std::is_same_v<T, GemvNode>) {
                for (int i = 0; i < n.n; ++i) gemv(n.a[i]);
            } else if constexpr (std::is_same_v<T, GemmNode>) {
                f(n.y, floats(n.n_tokens * n.rows));
            } else if constexpr (std::is_same_v<T, NormNode>) {
                f(n.out, floats(n.rows * n.k));
            } else if constexpr (std::is_same_v<T, RopeNode>) {
                f(n.x, floats(n.n_tokens * n.n_head * n.head_dim));
            } else if constexpr (std::is_same_v<T, KvStoreNode>) {
                cache(n.k_cache, n.n_ctx, n.width, n.codec), cache(n.v_cache, n.n_ctx, n.width, n.v_codec);
            } else if constexpr (std::is_same_v<T, QkvRopeNode>) {
                const QkvRopeArgs& r = n.r;
                if (r.q) f(r.q, floats(r.n_tokens * r.n_head * r.head_dim));
                f(r.k, floats(r.n_tokens * r.n_head_kv * r.head_dim));
                cache(r.k_cache, r.n_ctx, r.n_head_kv * r.head_dim, r.codec);
                cache(r.v_cache, r.n_ctx, r.n_head_kv * r.head_dim, r.v_codec);
                if (n.products) gemv(n.qkv[2]);
            } else if constexpr (std::is_same_v<T, ConvNode>) {
                f(n.out, floats(n.n_tokens * n.n_embd));
                f(n.state, floats((n.taps - 1) * n.n_embd));
                if (n.state_prev) f(n.state_prev, floats((n.taps - 1) * n.n_embd));
                if (n.product) gemv(n.in);
            } else if constexpr (std::is_same_v<T, SwigluNode>) {
                f(n.out, floats(n.n));
            } else if constexpr (std::is_same_v<T, GluNode>) {
                gemv(n.g), gemv(n.u), f(n.act, floats(n.g.n_y * n.g.rows));
            } else if constexpr (std::is_same_v<T, AddNode>) {
                f(n.out, floats(n.n));
            } else if constexpr (std::is_same_v<T, AttentionNode>) {
                f(n.a.out, floats(n.a.n_tokens * n.a.n_head * n.a.head_dim));
            } else if constexpr (std::is_same_v<T, PickNode>) {
                f(n.out, 4), f(n.ids, 4), f(n.pos, size_t(n.pos_last + 1) * 4);
                if (n.product) gemv(n.head);
            } else if constexpr (std::is_same_v<T, RotateNode>) {
                f(n.x, floats(n.n_heads * n.head_dim));
            } else if constexpr (std::is_same_v<T, LoraNode>) {
                for (int i = 0; i < n.n; ++i)
                    if (n.p[i].delta)
                        f(n.p[i].delta, floats(n.p[i].n_out));
                    else
                        f(n.p[i].y, floats(n.n_rows * n.p[i].n_out));
            } else if constexpr (std::is_same_v<T, OtherNode>) {
                f(nullptr, 0);
            }
        },
        node);
}

// The products of a node that read 8-bit rows of their input (all share x, n_y and k).
std::vector<GemvArgs*> quantized_reads(Node& node) {
    std::vector<GemvArgs*> v;
    auto add = [&](GemvArgs& a) {
        if (a.xq == kXqPending && !a.pro_x) v.push_back(&a);
    };
    if (auto* g = as<GemvNode>(node))
        for (int i = 0; i < g->n; ++i) add(g->a[i]);
    if (auto* g = as<GluNode>(node)) add(g->g), add(g->u);
    if (auto* q = as<QkvRopeNode>(node); q && q->products)
        for (GemvArgs& a : q->qkv) add(a);
    if (auto* c = as<ConvNode>(node); c && c->product) add(c->in);
    if (auto* p = as<PickNode>(node); p && p->product) add(p->head);
    return v;
}

// The f32 rows [rows, k] a node makes that it can also write as 8-bit rows, and where it takes them.
struct Sidecar {
    const float* out = nullptr;
    int64_t rows = 0, k = 0;
    void** xq = nullptr;
};
Sidecar sidecar(Node& node) {
    if (auto* n = as<NormNode>(node)) return {n->out, n->rows, n->k, &n->xq};
    if (auto* g = as<GemvNode>(node); g && g->a[0].norm_out)
        return {g->a[0].norm_out, g->a[0].n_y, g->a[0].rows, &g->a[0].norm_xq};
    if (auto* n = as<SwigluNode>(node)) return {n->out, n->n / n->row, n->row, &n->xq};
    if (auto* n = as<GluNode>(node)) return {n->act, n->g.n_y, n->g.rows, &n->xq};
    if (auto* n = as<ConvNode>(node)) return {n->out, n->n_tokens, n->n_embd, &n->xq};
    if (auto* n = as<AttentionNode>(node); n && n->a.head_dim % 32 == 0 && n->a.head_dim <= 128)
        return {n->a.out, n->a.n_tokens, int64_t(n->a.n_head) * n->a.head_dim, &n->a.out_xq};
    return {};
}

// A one-row LoRA node right after its product, which can take the deltas as its bias instead.
// (lora_delta's kernel reads F16 weights, A and x 16-byte aligned, k a multiple of 8).
bool hoistable(const GemvNode& g, const LoraNode& l) {
    const GemvArgs& a = g.a[0];
    bool ok = g.n == 1 && l.n == 1 && !l.delta() && l.n_rows == 1 && a.n_y == 1 && !a.ids && !a.accumulate &&
              !a.pro_x && a.x == l.x && reinterpret_cast<uintptr_t>(l.x) % 16 == 0 && a.w.k == l.k && a.y == l.p[0].y &&
              a.rows == l.p[0].n_out && l.k % 8 == 0 && l.k <= kLoraDeltaMaxK &&
              l.p[0].segs.size() <= size_t(kLoraDeltaSegs);
    for (const LoraSegDev& sg : l.p[0].segs)
        ok = ok && sg.a_f16 && sg.bt_f16 && reinterpret_cast<uintptr_t>(sg.a) % 16 == 0;
    return ok;
}

}  // namespace

void hoist_lora(Step& s, const FusionRules& r, const std::function<void*(Slot, size_t)>& buffer) {
    if (!r.fuse) return;
    int64_t most = 0;
    for (size_t i = 0; i + 1 < s.nodes.size(); ++i) {
        const GemvNode* g = at<GemvNode>(s, i);
        const LoraNode* l = at<LoraNode>(s, i + 1);
        if (g && l && hoistable(*g, *l)) most = std::max(most, l->p[0].n_out);
    }
    if (!most) return;
    // Deltas go to kRegions regions in turn, so a launch of up to kMaxSegs products never writes the
    // delta that a product between it and its own products still has to read.
    constexpr int kRegions = kMaxSegs + 1;
    const int64_t region = (most + 63) / 64 * 64;
    float* base = static_cast<float*>(buffer(kLoraDelta, floats(kRegions * region)));
    int next = 0;
    for (size_t i = 0; i + 1 < s.nodes.size(); ++i) {
        GemvNode* g = at<GemvNode>(s, i);
        LoraNode* l = at<LoraNode>(s, i + 1);
        if (!g || !l || !hoistable(*g, *l)) continue;
        LoraProductNode& p = l->p[0];
        p.bias = g->a[0].bias, p.delta = base + (next++ % kRegions) * region;
        g->a[0].bias = p.delta;
        std::swap(s.nodes[i], s.nodes[i + 1]);
        ++i;
    }
    // Each one moves in front of the products before it that read the same row (q/k/v, gate/up)...
    for (size_t i = 1; i < s.nodes.size(); ++i) {
        for (size_t j = i; j >= 1; --j) {
            const LoraNode* l = at<LoraNode>(s, j);
            const GemvNode* g = at<GemvNode>(s, j - 1);
            if (!l || !l->delta() || !g || g->n != 1 || g->a[0].x != l->x || g->a[0].n_y != 1) break;
            bool clash = false;
            writes(s.nodes[j - 1],
                   [&](const void* p, size_t bytes) { clash |= !p || overlaps(p, bytes, l->x, floats(l->k)); });
            for (int q = 0; q < l->n; ++q)
                clash |= overlaps(g->a[0].bias, floats(g->a[0].rows), l->p[q].delta, floats(l->p[q].n_out));
            if (clash) break;
            std::swap(s.nodes[j - 1], s.nodes[j]);
        }
    }
    // ...where neighbours of one input become one launch.
    LoraNode* open = nullptr;
    for (Node& node : s.nodes) {
        LoraNode* l = as<LoraNode>(node);
        if (!l || !l->delta()) {
            open = nullptr;
            continue;
        }
        if (open && open->n < kMaxSegs && open->x == l->x && open->k == l->k) {
            open->p[open->n++] = std::move(l->p[0]);
            node = std::monostate{};
            continue;
        }
        open = l;
    }
    compact(s);
}

void group_products(Step& s, const FusionRules& r) {
    if (!r.fuse) return;
    GemvNode* open = nullptr;
    for (Node& node : s.nodes) {
        GemvNode* g = as<GemvNode>(node);
        if (!g || g->n != 1) {
            open = g;
            continue;
        }
        if (open) {
            const GemvArgs &p = open->a[0], &a = g->a[0];
            // A third product of another type may still be the v of a q/k/v launch (llama-quantize's
            // mixtures); the executor launches each run of one type apart if it is not.
            const bool v_type = open->n == 2 && open->a[1].w.type == p.w.type && r.caps.qkv_v_fits(p.w.type, a.w.type);
            if (open->n < kMaxSegs && !p.ids && !a.ids && p.x == a.x && (p.w.type == a.w.type || v_type) &&
                p.w.k == a.w.k && p.n_y == a.n_y && !p.res_out && !a.res_out) {
                open->a[open->n++] = a;
                node = std::monostate{};
                continue;
            }
        }
        open = g;
    }
    compact(s);
}

void fuse_glu(Step& s, const FusionRules& r) {
    fuse_pairs<GemvNode, SwigluNode>(s, r, [&](GemvNode& p, SwigluNode& sw, Node& first) {
        if (p.n != 2) return Kept::kBoth;
        const bool first_is_gate = p.a[0].y == sw.gate;
        const GemvArgs& g = p.a[first_is_gate ? 0 : 1];
        const GemvArgs& u = p.a[first_is_gate ? 1 : 0];
        if (g.y != sw.gate || u.y != sw.up || g.rows * g.n_y != sw.n || u.rows != g.rows || g.ldy != g.rows ||
            u.ldy != u.rows || g.res_out || u.res_out || g.w.type != u.w.type || !r.caps.glu(g.w.type, g.rows))
            return Kept::kBoth;
        GluNode glu{g, u, sw.out, nullptr};
        glu.g.glu_stage = r.glu_stage, glu.g.glu_wide = r.glu_wide, glu.g.pro_xreg = r.pro_xreg;
        first = glu;
        return Kept::kFirst;
    });
}

void fuse_residual(Step& s, const FusionRules& r) {
    fuse_pairs<GemvNode, AddNode>(s, r, [](GemvNode& p, AddNode& ad, Node&) {
        GemvArgs& m = p.a[0];
        const size_t bytes = floats(ad.n);
        if (p.n != 1 || m.y != ad.b || m.res_out || m.ldy != m.rows || m.rows * m.n_y != ad.n ||
            overlaps(ad.out, bytes, m.x, floats(m.n_y * m.ldx)) || overlaps(ad.out, bytes, ad.b, bytes) ||
            overlaps(ad.a, bytes, ad.b, bytes))
            return Kept::kBoth;
        m.res_a = ad.a, m.res_out = ad.out, m.res_scale = ad.scale;
        return Kept::kFirst;
    });
}

void fuse_norm(Step& s, const FusionRules& r) {
    fuse_pairs<GemvNode, NormNode>(s, r, [&](GemvNode& p, NormNode& nm, Node&) {
        GemvArgs& m = p.a[0];
        if (p.n != 1 || !m.res_out || nm.x != m.res_out || nm.rows != m.n_y || nm.k != m.rows || !nm.w_f32)
            return Kept::kBoth;
        GemvArgs f = m;
        f.norm_w = nm.w, f.norm_eps = nm.eps, f.norm_out = nm.out, f.norm_xq = nullptr, f.norm_ctr = r.norm_ctr;
        if (!r.caps.norm_epilogue(f)) return Kept::kBoth;
        m = f;
        return Kept::kFirst;
    });
}

void fuse_qkv_rope(Step& s, const FusionRules& r) {
    if (!r.fuse) return;
    for (size_t i = 1; i < s.nodes.size(); ++i) {
        KvStoreNode* kv = at<KvStoreNode>(s, i);
        if (!kv) continue;
        // Rotated caches: up to three forward rotations (of q, k, v) between the RoPEs and the store.
        size_t top = i;  // the first rotation (or the store)
        RotateNode* rots[3] = {};
        int n_rots = 0;
        while (top >= 1 && n_rots < 3 && at<RotateNode>(s, top - 1)) rots[n_rots++] = at<RotateNode>(s, --top);
        RopeNode* kr = top >= 1 ? at<RopeNode>(s, top - 1) : nullptr;
        if (!kr || kv->n_tokens > kGemvMaxTokens || kr->x != kv->k || kr->pos != kv->pos ||
            kr->n_tokens != kv->n_tokens || int64_t(kr->n_head) * kr->head_dim != kv->width)
            continue;
        RopeNode* qr = top >= 2 ? at<RopeNode>(s, top - 2) : nullptr;
        if (qr && (qr->pos != kr->pos || qr->head_dim != kr->head_dim || qr->n_tokens != kr->n_tokens)) qr = nullptr;
        QkvRopeNode f;
        QkvRopeArgs& a = f.r;
        a.k = kr->x, a.v = kv->v;
        bool rotations_fit = true;
        for (int ri = 0; ri < n_rots; ++ri) {
            const RotateNode& rn = *rots[ri];
            const bool q = qr && rn.x == qr->x, kv_head = rn.x == kv->k || rn.x == kv->v;
            const int64_t heads = kv->n_tokens * (q ? qr->n_head : kr->n_head);
            rotations_fit = rotations_fit && (q || kv_head) && !rn.inverse && rn.head_dim == kr->head_dim &&
                            rn.n_heads == heads;
            a.rotate_q = a.rotate_q || q;
            a.rotate_k = a.rotate_k || rn.x == kv->k;
            a.rotate_v = a.rotate_v || rn.x == kv->v;
        }
        if (!rotations_fit) continue;
        a.n_tokens = kv->n_tokens, a.n_head_kv = kr->n_head, a.head_dim = kr->head_dim;
        a.k_norm = kr->norm_w, a.k_eps = kr->eps, a.k_rope = kr->rope;
        if (qr) a.q = qr->x, a.n_head = qr->n_head, a.q_norm = qr->norm_w, a.q_eps = qr->eps, a.q_rope = qr->rope;
        a.pos = kv->pos, a.k_cache = kv->k_cache, a.v_cache = kv->v_cache, a.codec = kv->codec, a.v_codec = kv->v_codec;
        a.n_ctx = kv->n_ctx;
        a.rows_kernel = r.qkv_rows;
        const size_t first = qr ? top - 2 : top - 1;
        // The q/k/v products right before, when their launch can take the RoPEs and the store.
        GemvNode* p = first >= 1 ? at<GemvNode>(s, first - 1) : nullptr;
        if (qr && p && p->n == 3 && fuses_product(r, p->a[0].w.type, false)) {
            const void* outs[3] = {a.q, a.k, a.v};
            bool found = true;
            for (int j = 0; j < 3 && found; ++j) {
                const GemvArgs* m = std::find_if(p->a, p->a + 3, [&](const GemvArgs& g) { return g.y == outs[j]; });
                found = m != p->a + 3;
                if (found) f.qkv[j] = *m;
            }
            if (found && r.caps.qkv_rope(f.qkv, a)) {
                f.products = true;
                s.nodes[first - 1] = std::monostate{};
            }
        }
        for (size_t j = first; j < i; ++j) s.nodes[j] = std::monostate{};
        s.nodes[i] = f;
    }
    compact(s);
}

void fuse_conv(Step& s, const FusionRules& r) {
    fuse_pairs<GemvNode, ConvNode>(s, r, [&](GemvNode& p, ConvNode& c, Node&) {
        if (p.n != 1 || c.product || p.a[0].y != c.bcx || c.n_tokens != 1 || !fuses_product(r, p.a[0].w.type, true) ||
            !r.caps.conv(p.a[0], c.taps))
            return Kept::kBoth;
        c.in = p.a[0], c.product = true;
        return Kept::kSecond;
    });
}

void fuse_pick(Step& s, const FusionRules& r) {
    fuse_pairs<GemvNode, PickNode>(s, r, [](GemvNode& p, PickNode& k, Node&) {
        if (p.n != 1 || p.a[0].y != k.x || p.a[0].rows != k.n || p.a[0].res_out) return Kept::kBoth;
        k.head = p.a[0], k.product = true;
        return Kept::kSecond;
    });
}

void norm_prologues(Step& s, const FusionRules& r) {
    if (!r.fuse || !r.pro_mask) return;
    for (size_t i = 0; i + 1 < s.nodes.size(); ++i) {
        // The norm: a one-token rms_norm of its own, or the one a residual product makes.
        NormNode* nm = at<NormNode>(s, i);
        GemvNode* res = at<GemvNode>(s, i);
        const float *src, *w;
        float* out;
        float eps;
        int64_t k;
        if (nm && nm->rows == 1 && nm->w_f32 && reinterpret_cast<uintptr_t>(nm->x) % 16 == 0) {
            src = nm->x, w = nm->w, eps = nm->eps, out = nm->out, k = nm->k;
        } else if (res && res->n == 1 && res->a[0].norm_out && res->a[0].n_y == 1) {
            const GemvArgs& m = res->a[0];
            src = m.res_out, w = m.norm_w, eps = m.norm_eps, out = m.norm_out, k = m.rows;
        } else {
            continue;
        }
        // The launch reading it (after the one-row LoRA deltas of its products, which then make the norm
        // too), and which kind of prologue that is (ProKind).
        LoraNode* lora = at<LoraNode>(s, i + 1);
        const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
        if (lora && (!lora->delta() || lora->x != out || lora->k != k || lora->pro_x || !aligned(src) || !aligned(w) ||
                     i + 2 >= s.nodes.size()))
            continue;
        GemvArgs* readers[3] = {};
        int n = 0, use = 0;
        Node& next = s.nodes[i + (lora ? 2 : 1)];
        if (auto* g = as<GluNode>(next)) readers[0] = &g->g, readers[1] = &g->u, n = 2;
        if (auto* q = as<QkvRopeNode>(next); q && q->products) {
            for (int j = 0; j < 3; ++j) readers[j] = &q->qkv[j];
            n = 3, use = kProQkv;
        }
        if (auto* c = as<ConvNode>(next); c && c->product) readers[0] = &c->in, n = 1, use = kProConv;
        bool ok = n > 0;
        for (int j = 0; j < n && ok; ++j) {
            const GemvArgs& a = *readers[j];
            ok = a.x == out && a.w.k == k && a.n_y == 1 && !a.pro_x && r.caps.norm_prologue(a.w.type, k, 1);
        }
        if (!ok) continue;
        GemvArgs saved[3];
        for (int j = 0; j < n; ++j) {
            GemvArgs& a = *readers[j];
            saved[j] = a;
            a.pro_x = src, a.pro_w = w, a.pro_eps = eps, a.pro_out = out, a.xq = nullptr;
        }
        if (auto* g = as<GluNode>(next)) use = r.caps.glu_staged(g->g, g->u) ? kProGluStaged : kProGluWave;
        if (!(r.pro_mask & use)) {
            for (int j = 0; j < n; ++j) *readers[j] = saved[j];
            continue;
        }
        if (lora) lora->pro_x = src, lora->pro_w = w, lora->pro_eps = eps;
        if (nm) s.nodes[i] = std::monostate{};
        else res->a[0].norm_out = nullptr, res->a[0].norm_w = nullptr, res->a[0].norm_xq = nullptr;
    }
    compact(s);
}

void quantize_inputs(Step& s, const FusionRules& r, const std::function<void*(Slot, size_t)>& buffer) {
    // 8-bit copies valid at the current node.
    struct Copy {
        const float* src;
        int64_t rows, k;
        Slot slot;
    };
    std::vector<Copy> valid;
    // Buffers are sized for the whole step before any pointer is handed out (a buffer that grows moves).
    std::vector<std::pair<void**, Slot>> patches;             // sidecar and QuantizeNode outputs
    std::vector<std::pair<const void**, Slot>> read_patches;  // GemvArgs::xq
    size_t need[kSlots] = {};
    auto take = [&](Slot slot, int64_t rows, int64_t k, void** field) {
        std::erase_if(valid, [&](const Copy& c) { return c.slot == slot; });
        need[slot] = std::max(need[slot], size_t(rows * q8_row_bytes(k)));
        patches.push_back({field, slot});
    };
    auto drop_written = [&](const Node& node) {
        writes(node, [&](const void* p, size_t bytes) {
            std::erase_if(valid, [&](const Copy& c) { return !p || overlaps(p, bytes, c.src, floats(c.rows * c.k)); });
        });
    };
    // Whether a node after i reads out (rows, k) as 8-bit rows before anything writes it.
    auto read_later = [&](size_t i, const Sidecar& sc) {
        for (size_t j = i + 1; j < s.nodes.size(); ++j) {
            const std::vector<GemvArgs*> rd = quantized_reads(s.nodes[j]);
            if (!rd.empty() && rd[0]->x == sc.out && rd[0]->n_y == sc.rows && rd[0]->w.k == sc.k) return true;
            bool hit = false;
            writes(s.nodes[j], [&](const void* p, size_t bytes) {
                hit |= !p || overlaps(p, bytes, sc.out, floats(sc.rows * sc.k));
            });
            if (hit) return false;
        }
        return false;
    };

    std::vector<Node> out;
    out.reserve(2 * s.nodes.size());  // stable addresses for the patches
    bool side_b = false;
    for (size_t i = 0; i < s.nodes.size(); ++i) {
        Node& node = s.nodes[i];
        std::vector<GemvArgs*> rd = quantized_reads(node);
        int read_slot = -1;
        if (!rd.empty()) {
            const GemvArgs& a = *rd[0];
            auto c = std::find_if(valid.begin(), valid.end(),
                                  [&](const Copy& c) { return c.src == a.x && c.rows == a.n_y && c.k == a.w.k; });
            if (c == valid.end()) {
                QuantizeNode q{a.x, a.n_y, a.w.k, nullptr};
                out.push_back(q);
                take(kXq, a.n_y, a.w.k, &std::get<QuantizeNode>(out.back()).xq);
                valid.push_back({a.x, a.n_y, a.w.k, kXq});
                c = valid.end() - 1;
            }
            read_slot = c->slot;
        }
        drop_written(node);
        out.push_back(std::move(node));
        Node& placed = out.back();
        // The readers' xq: the same buffer as the copy found above, patched like it.
        for (GemvArgs* a : quantized_reads(placed)) read_patches.push_back({&a->xq, Slot(read_slot)});
        const Sidecar sc = sidecar(placed);
        if (r.fuse && sc.out && sc.rows > 0 && sc.rows <= kGemvMaxTokens && sc.k % 32 == 0 && read_later(i, sc)) {
            Slot slot = side_b ? kXqB : kXqA;
            if (slot == read_slot) slot = slot == kXqA ? kXqB : kXqA;
            side_b = slot == kXqA;
            take(slot, sc.rows, sc.k, sc.xq);
            valid.push_back({sc.out, sc.rows, sc.k, slot});
        }
    }
    s.nodes = std::move(out);
    void* base[kSlots] = {};
    for (int k = 0; k < kSlots; ++k)
        if (need[k]) base[k] = buffer(Slot(k), need[k]);
    for (auto& [field, slot] : patches) *field = base[slot];
    for (auto& [field, slot] : read_patches) *field = base[slot];
}

void fuse_step(Step& s, const FusionRules& r, const std::function<void*(Slot, size_t)>& buffer) {
    hoist_lora(s, r, buffer);
    group_products(s, r);
    fuse_glu(s, r);
    fuse_residual(s, r);
    fuse_norm(s, r);
    fuse_qkv_rope(s, r);
    fuse_conv(s, r);
    fuse_pick(s, r);
    norm_prologues(s, r);
    quantize_inputs(s, r, buffer);
}

}  // namespace cera::cuda
