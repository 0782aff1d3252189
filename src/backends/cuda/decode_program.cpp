// The decode program builder (decode_program.h).
#include "backends/cuda/decode_program.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "backends/cuda/cuda_check.h"
#include "core/check.h"

namespace cera::cuda {

struct DecodeRecorder::Op {
    enum Kind { kEmbed, kNorm, kMatmul, kNormRope, kKvStore, kAttn, kConv, kSwiglu, kAdd, kScale, kArgmax };
    explicit Op(Kind k) : kind(k) {}
    Kind kind;
    WeightRef w;
    int64_t rows = 0, n = 0;
    const float* x = nullptr;
    const float* x2 = nullptr;
    const float* p = nullptr;  // norm weight, bias, conv weight
    float* out = nullptr;
    float eps = 0.0f, s = 1.0f;
    const int32_t* idx = nullptr;  // ids or pos
    int32_t* out_i = nullptr;
    int n_head = 0, head_dim = 0, conv_l = 0;
    RopeArgs rope;
    void* kc = nullptr;
    void* vc = nullptr;
    bool f16 = true;
    int64_t n_ctx = 0;
    float* state = nullptr;
    AttentionArgs attn;
};

namespace {

using Op = DecodeRecorder::Op;

struct Range {
    uintptr_t lo = 0, hi = 0;
};
Range range(const void* p, size_t bytes) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return {a, a + bytes};
}
bool overlap(const Range& a, const Range& b) { return a.lo < b.hi && b.lo < a.hi; }
bool any_overlap(const std::vector<Range>& a, const std::vector<Range>& b) {
    for (const Range& x : a)
        for (const Range& y : b)
            if (overlap(x, y)) return true;
    return false;
}
Range floats(const float* p, int64_t n) { return range(p, size_t(n) * 4); }

// Pseudo address ranges (never real device memory) for the buffers the backend allocates after the
// build: the attention partial sums and the argmax key.
const Range kPartialRange{16, 1u << 12};
const Range kKeyRange{8, 16};

}  // namespace

// ------------------------------------------------------------------ recording
DecodeRecorder::DecodeRecorder() = default;
DecodeRecorder::~DecodeRecorder() = default;

void DecodeRecorder::embed(const WeightRef& table, const int32_t* ids, int64_t n_ids, float scale, float* out) {
    if (n_ids != 1) return unsupported("embed of several tokens");
    Op o{Op::kEmbed};
    o.w = table, o.idx = ids, o.s = scale, o.out = out, o.n = table.k;
    ops_.push_back(o);
}
void DecodeRecorder::rms_norm(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* out) {
    if (rows != 1) return unsupported("rms_norm of several rows");
    Op o{Op::kNorm};
    o.x = x, o.rows = rows, o.n = n, o.p = w, o.eps = eps, o.out = out;
    ops_.push_back(o);
}
void DecodeRecorder::matmul(const WeightRef& w, int64_t rows, const float* x, int64_t n_tokens, const float* bias,
                            float* out) {
    if (n_tokens != 1) return unsupported("matmul of several tokens");
    if (w.k > kMxMaxK) return unsupported("matmul input longer than the program's buffers");
    Op o{Op::kMatmul};
    o.w = w, o.rows = rows, o.n = w.k, o.x = x, o.p = bias, o.out = out;
    ops_.push_back(o);
}
void DecodeRecorder::norm_rope(float* x, int64_t n_tokens, int n_head, int head_dim, const float* norm_w, float eps,
                               const int32_t* pos, const RopeArgs& rope) {
    if (n_tokens != 1) return unsupported("norm_rope of several tokens");
    Op o{Op::kNormRope};
    o.out = x, o.n_head = n_head, o.head_dim = head_dim, o.p = norm_w, o.eps = eps, o.idx = pos, o.rope = rope;
    ops_.push_back(o);
}
void DecodeRecorder::kv_store(const float* k, const float* v, int64_t n_tokens, int64_t width, const int32_t* pos,
                              void* k_cache, void* v_cache, bool f16, int64_t n_ctx) {
    if (n_tokens != 1) return unsupported("kv_store of several tokens");
    Op o{Op::kKvStore};
    o.x = k, o.x2 = v, o.n = width, o.idx = pos, o.kc = k_cache, o.vc = v_cache, o.f16 = f16, o.n_ctx = n_ctx;
    ops_.push_back(o);
}
void DecodeRecorder::attention(const AttentionArgs& a) {
    if (a.n_tokens != 1) return unsupported("attention of several queries");
    const bool hd_ok = a.head_dim == 32 || a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256;
    if (!hd_ok || a.head_dim > kMxMaxHeadDim || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
        return unsupported("attention head shape");
    Op o{Op::kAttn};
    o.attn = a;
    ops_.push_back(o);
}
void DecodeRecorder::short_conv(const float* bcx, const float* w, int L, float* state, int64_t n_tokens,
                                int64_t n_embd, float* out) {
    if (n_tokens != 1 || L < 2 || L > kMxMaxConv) return unsupported("short_conv shape");
    Op o{Op::kConv};
    o.x = bcx, o.p = w, o.conv_l = L, o.state = state, o.n = n_embd, o.out = out;
    ops_.push_back(o);
}
void DecodeRecorder::swiglu(const float* gate, const float* up, int64_t n, float* out) {
    Op o{Op::kSwiglu};
    o.x = gate, o.x2 = up, o.n = n, o.out = out;
    ops_.push_back(o);
}
void DecodeRecorder::add(const float* a, const float* b, float scale, int64_t n, float* out) {
    Op o{Op::kAdd};
    o.x = a, o.x2 = b, o.s = scale, o.n = n, o.out = out;
    ops_.push_back(o);
}
void DecodeRecorder::scale(float* x, float s, int64_t n) {
    Op o{Op::kScale};
    o.out = x, o.s = s, o.n = n;
    ops_.push_back(o);
}
void DecodeRecorder::argmax(const float* x, int64_t rows, int64_t n, int32_t* out) {
    if (rows != 1) return unsupported("argmax of several rows");
    Op o{Op::kArgmax};
    o.x = x, o.n = n, o.out_i = out;
    ops_.push_back(o);
}
void DecodeRecorder::unsupported(const std::string& what) {
    if (why_.empty()) why_ = what;
}

// ------------------------------------------------------------------ building
namespace {

// The stream pointers and row sizes of o's weight; `n_mats` > 0: also its work units for a ring
// stage shared by n_mats matrices (false when one row does not fit).
bool make_matmul(const Op& o, int n_mats, MxMatmul& m) {
    const GgmlType t = o.w.type;
    const QuantLayout L = quant_layout(t);
    const int64_t k = o.w.k;
    m = MxMatmul{};
    m.type = t;
    m.rows = o.rows;
    const auto* img = static_cast<const uint8_t*>(o.w.image);
    if (L.block_elems > 0) {
        if (k % L.block_elems != 0 || k % 32 != 0) return false;
        const int64_t nb = k / L.block_elems;
        m.q_row_bytes = nb * L.q_bytes;
        m.m_row_bytes = nb * L.m_bytes;
        m.q = img + o.w.row0 * m.q_row_bytes;
        m.m = scale_stream(o.w) + o.w.row0 * m.m_row_bytes;
    } else if (t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16) {
        m.q_row_bytes = k * (t == GgmlType::kF32 ? 4 : 2);
        m.q = img + o.w.row0 * m.q_row_bytes;
    } else {
        return false;
    }
    m.bias = o.p;
    m.y = o.out;
    if (n_mats == 0) return true;
    m.unit_rows = mx_unit_rows(m, n_mats, mx_stage_bytes());
    if (m.unit_rows < 1) return false;
    m.n_units = (m.rows + m.unit_rows - 1) / m.unit_rows;
    return true;
}

struct Builder {
    Builder(const std::vector<Op>& o, int g, std::vector<MxPhase>& ph, size_t& pf, std::string& w)
        : ops(o), grid(g), phases(ph), partial_floats(pf), why(w) {}
    const std::vector<Op>& ops;
    int grid;
    std::vector<MxPhase>& phases;
    size_t& partial_floats;
    std::string& why;
    std::vector<Range> since_r, since_w;  // what the phases since the last barrier read and write
    int64_t unit_sum = 0;

    void emit(MxPhase ph, const std::vector<Range>& r, const std::vector<Range>& w) {
        const bool bar = !phases.empty() &&
                         (any_overlap(r, since_w) || any_overlap(w, since_r) || any_overlap(w, since_w));
        ph.barrier = bar ? 1 : 0;
        if (bar) since_r.clear(), since_w.clear();
        since_r.insert(since_r.end(), r.begin(), r.end());
        since_w.insert(since_w.end(), w.begin(), w.end());
        if (ph.kind == MxKind::kGemv) {
            ph.rot = int32_t(unit_sum % grid);
            unit_sum += ph.n_units;
        }
        phases.push_back(ph);
    }
    bool fail(const char* what) {
        if (why.empty()) why = what;
        return false;
    }

    // Matmuls from ops[j] on that share its input, with the prologue `pro` (a kNorm op or null).
    bool gemv(size_t& j, const Op* pro) {
        const Op& first = ops[j];
        const float* x = pro ? pro->x : first.x;
        const int64_t k = first.n;
        MxPhase ph;
        ph.kind = MxKind::kGemv;
        ph.k = k;
        ph.x = x;
        std::vector<Range> r{floats(x, k)}, w;
        if (pro) {
            ph.pro = MxPrologue::kNorm;
            ph.pro_w = pro->p, ph.eps = pro->eps, ph.pro_out = pro->out;
            w.push_back(floats(pro->out, k));
        }
        const Range in = floats(x, k);
        size_t e = j;
        std::vector<const Op*> mms;
        while (e < ops.size() && mms.size() < size_t(kMxMaxMm) && ops[e].kind == Op::kMatmul &&
               ops[e].x == first.x && ops[e].n == k) {
            const Range out = floats(ops[e].out, ops[e].rows);
            bool clash = overlap(out, in) || (pro && overlap(out, floats(pro->out, k)));
            for (const Op* m : mms) clash = clash || overlap(out, floats(m->out, m->rows));
            if (clash) break;
            mms.push_back(&ops[e++]);
        }
        if (mms.empty()) return fail("matmul output overlaps its input");
        // gate/up followed by swiglu(gate, up): one paired phase.
        if (mms.size() == 2 && e < ops.size() && ops[e].kind == Op::kSwiglu && ops[e].x == mms[0]->out &&
            ops[e].x2 == mms[1]->out && ops[e].n == mms[0]->rows && mms[0]->rows == mms[1]->rows &&
            mms[0]->w.type == mms[1]->w.type && !overlap(floats(ops[e].out, ops[e].n), in)) {
            ph.glu = 1;
            ph.n_mm = 2;
            if (!make_matmul(*mms[0], 2, ph.mm[0]) || !make_matmul(*mms[1], 2, ph.mm[1])) return fail("matmul shape");
            const int64_t ur = std::min(ph.mm[0].unit_rows, ph.mm[1].unit_rows);
            for (MxMatmul& m : ph.mm) m.unit_rows = ur, m.n_units = (m.rows + ur - 1) / ur;
            ph.act = ops[e].out;
            ph.n_units = ph.mm[0].n_units;
            for (const Op* m : mms) w.push_back(floats(m->out, m->rows));
            w.push_back(floats(ops[e].out, ops[e].n));
            emit(ph, r, w);
            j = e + 1;
            return true;
        }
        ph.n_mm = int32_t(mms.size());
        for (size_t i = 0; i < mms.size(); ++i) {
            if (!make_matmul(*mms[i], 1, ph.mm[i])) return fail("matmul type or row length");
            ph.n_units += ph.mm[i].n_units;
            w.push_back(floats(mms[i]->out, mms[i]->rows));
        }
        bool argmax_final = false;
        int32_t* argmax_out = nullptr;
        if (mms.size() == 1) {
            MxMatmul& m = ph.mm[0];
            const Range y = floats(m.y, m.rows);
            if (e < ops.size() && ops[e].kind == Op::kScale && ops[e].out == m.y && ops[e].n == m.rows) {
                m.out_scale = ops[e].s;
                ++e;
            }
            if (e < ops.size() && ops[e].kind == Op::kAdd && ops[e].x2 == m.y && ops[e].n == m.rows) {
                const Op& a = ops[e];
                const Range ra = floats(a.x, a.n), ro = floats(a.out, a.n);
                const bool ok = !overlap(ra, y) && !overlap(ro, y) && !overlap(ro, in) &&
                                !(pro && overlap(ro, floats(pro->out, k))) && (a.out == a.x || !overlap(ro, ra));
                if (ok) {
                    m.res_a = a.x, m.res_out = a.out, m.res_scale = a.s;
                    r.push_back(ra);
                    w.push_back(ro);
                    ++e;
                }
            }
            if (e < ops.size() && ops[e].kind == Op::kArgmax && ops[e].x == m.y && ops[e].n == m.rows) {
                ph.argmax_key = mx_argmax_placeholder();
                w.push_back(kKeyRange);
                argmax_final = true;
                argmax_out = ops[e].out_i;
                ++e;
            }
        }
        emit(ph, r, w);
        if (argmax_final) {
            MxPhase f;
            f.kind = MxKind::kArgmaxFinal;
            f.argmax_key = mx_argmax_placeholder();
            f.out_i = argmax_out;
            emit(f, {kKeyRange}, {kKeyRange, range(argmax_out, 4)});
        }
        j = e;
        return true;
    }

    bool run() {
        size_t i = 0;
        while (i < ops.size()) {
            const Op& o = ops[i];
            switch (o.kind) {
                case Op::kEmbed: {
                    MxPhase ph;
                    ph.kind = MxKind::kEmbed;
                    Op t = o;
                    t.rows = o.w.image_rows - o.w.row0;
                    if (!make_matmul(t, 0, ph.mm[0])) return fail("embedding type");
                    ph.ids = o.idx, ph.scale = o.s, ph.out = o.out, ph.k = o.n;
                    emit(ph, {range(o.idx, 4)}, {floats(o.out, o.n)});
                    ++i;
                    break;
                }
                case Op::kNorm: {
                    const Op* next = i + 1 < ops.size() ? &ops[i + 1] : nullptr;
                    if (next && next->kind == Op::kMatmul && next->x == o.out && next->n == o.n &&
                        !overlap(floats(o.out, o.n), floats(o.x, o.n))) {
                        size_t j = i + 1;
                        if (!gemv(j, &o)) return false;
                        i = j;
                        break;
                    }
                    MxPhase ph;
                    ph.kind = MxKind::kNorm;
                    ph.a = o.x, ph.pro_w = o.p, ph.eps = o.eps, ph.out = o.out, ph.n = o.n;
                    emit(ph, {floats(o.x, o.n)}, {floats(o.out, o.n)});
                    ++i;
                    break;
                }
                case Op::kMatmul:
                    if (!gemv(i, nullptr)) return false;
                    break;
                case Op::kNormRope: {
                    // q rope, k rope, kv_store(k, v): one phase (also k rope + store alone).
                    const Op* q = nullptr;
                    const Op* kr = nullptr;
                    const Op* st = nullptr;
                    size_t used = 0;
                    if (i + 2 < ops.size() && ops[i + 1].kind == Op::kNormRope && ops[i + 2].kind == Op::kKvStore)
                        q = &o, kr = &ops[i + 1], st = &ops[i + 2], used = 3;
                    else if (i + 1 < ops.size() && ops[i + 1].kind == Op::kKvStore)
                        kr = &o, st = &ops[i + 1], used = 2;
                    const bool fused = st && st->x == kr->out && st->idx == kr->idx &&
                                       int64_t(kr->n_head) * kr->head_dim == st->n &&
                                       (!q || (q->idx == kr->idx && q->head_dim == kr->head_dim));
                    if (fused) {
                        MxPhase ph;
                        ph.kind = MxKind::kRopeStore;
                        ph.head_dim = kr->head_dim;
                        ph.n_head_kv = kr->n_head;
                        ph.c = kr->out, ph.k_norm = kr->p, ph.k_eps = kr->eps, ph.k_rope = kr->rope;
                        if (q) {
                            ph.n_head = q->n_head;
                            ph.out = q->out, ph.q_norm = q->p, ph.q_eps = q->eps, ph.q_rope = q->rope;
                        }
                        ph.v = st->x2, ph.pos = st->idx, ph.k_cache = st->kc, ph.v_cache = st->vc;
                        ph.f16 = st->f16, ph.n_ctx = st->n_ctx;
                        const size_t es = st->f16 ? 2 : 4;
                        std::vector<Range> r{floats(kr->out, st->n), floats(st->x2, st->n), range(st->idx, 4)};
                        std::vector<Range> w{floats(kr->out, st->n), range(st->kc, size_t(st->n_ctx * st->n) * es),
                                             range(st->vc, size_t(st->n_ctx * st->n) * es)};
                        if (q) {
                            r.push_back(floats(q->out, int64_t(q->n_head) * q->head_dim));
                            w.push_back(floats(q->out, int64_t(q->n_head) * q->head_dim));
                        }
                        emit(ph, r, w);
                        i += used;
                        break;
                    }
                    MxPhase ph;
                    ph.kind = MxKind::kNormRope;
                    ph.out = o.out, ph.n_head = o.n_head, ph.head_dim = o.head_dim, ph.q_norm = o.p, ph.q_eps = o.eps;
                    ph.q_rope = o.rope, ph.pos = o.idx;
                    const Range x = floats(o.out, int64_t(o.n_head) * o.head_dim);
                    emit(ph, {x, range(o.idx, 4)}, {x});
                    ++i;
                    break;
                }
                case Op::kKvStore: {
                    MxPhase ph;
                    ph.kind = MxKind::kKvStore;
                    ph.a = o.x, ph.v = o.x2, ph.n = o.n, ph.pos = o.idx, ph.k_cache = o.kc, ph.v_cache = o.vc;
                    ph.f16 = o.f16, ph.n_ctx = o.n_ctx;
                    const size_t es = o.f16 ? 2 : 4;
                    emit(ph, {floats(o.x, o.n), floats(o.x2, o.n), range(o.idx, 4)},
                         {range(o.kc, size_t(o.n_ctx * o.n) * es), range(o.vc, size_t(o.n_ctx * o.n) * es)});
                    ++i;
                    break;
                }
                case Op::kAttn: {
                    const AttentionArgs& a = o.attn;
                    MxPhase ph;
                    ph.kind = MxKind::kAttn;
                    ph.a = a.q, ph.k_cache = const_cast<void*>(a.k_cache), ph.v_cache = const_cast<void*>(a.v_cache);
                    ph.f16 = a.f16, ph.pos = a.pos, ph.n_ctx = a.n_ctx, ph.n_head = a.n_head,
                    ph.n_head_kv = a.n_head_kv, ph.head_dim = a.head_dim, ph.scale = a.scale,
                    ph.window = a.sliding_window, ph.out = a.out;
                    const int64_t by_grid = std::max<int64_t>(1, int64_t(grid) * 16 / a.n_head);
                    ph.max_chunks = int32_t(std::max<int64_t>(1, std::min<int64_t>(by_grid, (a.n_ctx + 31) / 32)));
                    partial_floats = std::max(partial_floats, size_t(a.n_head) * size_t(ph.max_chunks) *
                                                                  size_t(a.head_dim + 2));
                    const size_t es = a.f16 ? 2 : 4;
                    const int64_t kvw = int64_t(a.n_head_kv) * a.head_dim;
                    const Range q = floats(a.q, int64_t(a.n_head) * a.head_dim);
                    emit(ph,
                         {q, range(a.k_cache, size_t(a.n_ctx * kvw) * es), range(a.v_cache, size_t(a.n_ctx * kvw) * es),
                          range(a.pos, 4)},
                         {kPartialRange});
                    MxPhase c = ph;
                    c.kind = MxKind::kAttnCombine;
                    emit(c, {kPartialRange, range(a.pos, 4)}, {floats(a.out, int64_t(a.n_head) * a.head_dim)});
                    ++i;
                    break;
                }
                case Op::kConv: {
                    MxPhase ph;
                    ph.kind = MxKind::kConv;
                    ph.a = o.x, ph.conv_w = o.p, ph.conv_l = o.conv_l, ph.state = o.state, ph.n = o.n, ph.out = o.out;
                    const Range st = floats(o.state, int64_t(o.conv_l - 1) * o.n);
                    emit(ph, {floats(o.x, 3 * o.n), st}, {st, floats(o.out, o.n)});
                    ++i;
                    break;
                }
                case Op::kSwiglu:
                case Op::kAdd: {
                    MxPhase ph;
                    ph.kind = o.kind == Op::kSwiglu ? MxKind::kSwiglu : MxKind::kAdd;
                    ph.a = o.x, ph.b = o.x2, ph.out = o.out, ph.n = o.n, ph.scale = o.s;
                    emit(ph, {floats(o.x, o.n), floats(o.x2, o.n)}, {floats(o.out, o.n)});
                    ++i;
                    break;
                }
                case Op::kScale: {
                    MxPhase ph;
                    ph.kind = MxKind::kScale;
                    ph.out = o.out, ph.n = o.n, ph.scale = o.s;
                    emit(ph, {floats(o.out, o.n)}, {floats(o.out, o.n)});
                    ++i;
                    break;
                }
                case Op::kArgmax:
                    return fail("argmax not after its matmul");
            }
        }
        return true;
    }
};

}  // namespace

bool DecodeRecorder::build(int grid, std::vector<MxPhase>& phases) {
    phases.clear();
    partial_floats_ = 0;
    if (!why_.empty()) return false;
    if (grid <= 0) {
        why_ = "no grid";
        return false;
    }
    if (ops_.empty()) {
        why_ = "empty step";
        return false;
    }
    Builder b(ops_, grid, phases, partial_floats_, why_);
    if (!b.run()) {
        phases.clear();
        return false;
    }
    return true;
}

DecodeProgram::~DecodeProgram() {
    for (void* q : owned) cudaFree(q);
}

std::unique_ptr<DecodeProgram> make_decode_program(DecodeRecorder& rec, Stream stream, bool profile) {
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int grid = decode_program_grid();
    std::vector<MxPhase> phases;
    if (!rec.build(grid, phases)) {
        if (profile) std::fprintf(stderr, "cuda: step not run as a decode program: %s\n", rec.why().c_str());
        return nullptr;
    }
    auto prog = std::make_unique<DecodeProgram>();
    auto dev = [&](size_t bytes) {
        void* q = nullptr;
        CUDA_CHECK(cudaMalloc(&q, std::max<size_t>(bytes, 16)));
        CUDA_CHECK(cudaMemsetAsync(q, 0, std::max<size_t>(bytes, 16), st));
        prog->owned.push_back(q);
        return q;
    };
    float* partial = rec.partial_floats() ? static_cast<float*>(dev(rec.partial_floats() * sizeof(float))) : nullptr;
    auto* key = static_cast<unsigned long long*>(dev(sizeof(unsigned long long)));
    int barriers = 0;
    for (MxPhase& ph : phases) {
        if (ph.kind == MxKind::kAttn || ph.kind == MxKind::kAttnCombine) ph.partial = partial;
        if (ph.argmax_key) ph.argmax_key = key;
        barriers += ph.barrier;
    }
    auto* d_phases = static_cast<MxPhase*>(dev(phases.size() * sizeof(MxPhase)));
    CUDA_CHECK(cudaMemcpyAsync(d_phases, phases.data(), phases.size() * sizeof(MxPhase),
                               cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaStreamSynchronize(st));  // `phases` is pageable and goes out of scope
    prog->p.phases = d_phases;
    prog->p.n_phases = int32_t(phases.size());
    prog->p.sync = static_cast<unsigned*>(dev(kMxSyncWords * sizeof(unsigned)));
    prog->p.grid = grid;
    prog->p.stages = mx_stages();
    prog->p.stage_bytes = mx_stage_bytes();
    if (profile && std::getenv("CERA_CUDA_MX_PROF")) {
        prog->p.prof = static_cast<long long*>(dev((phases.size() + 2) * size_t(grid) * 2 * sizeof(long long)));
        if (const char* d = std::getenv("CERA_CUDA_MX_DEBUG")) prog->p.debug = std::atoi(d);
        prog->kinds.reserve(phases.size());
        for (const MxPhase& ph : phases) prog->kinds.push_back(int(ph.kind) * 2 + ph.barrier);
    }
    if (profile)
        std::fprintf(stderr, "cuda: decode program of %zu phases, %d grid barriers\n", phases.size(), barriers);
    return prog;
}

void print_decode_program_profile(const DecodeProgram& prog, Stream stream, int device) {
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    const int grid = prog.p.grid, n = prog.p.n_phases;
    std::vector<long long> t(size_t(n + 2) * grid * 2);
    CUDA_CHECK(cudaStreamSynchronize(st));
    CUDA_CHECK(cudaMemcpy(t.data(), prog.p.prof, t.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    int khz = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    const double mhz = khz / 1000.0;
    std::map<int, std::array<double, 4>> by;  // count, wait, work, max work
    double tw = 0, tk = 0;
    for (int i = 0; i < n; ++i) {
        double w = 0, k = 0, mx = 0;
        for (int b = 0; b < grid; ++b) {
            w += double(t[(size_t(i) * grid + b) * 2]), k += double(t[(size_t(i) * grid + b) * 2 + 1]);
            mx = std::max(mx, double(t[(size_t(i) * grid + b) * 2 + 1]));
        }
        auto& e = by[prog.kinds[size_t(i)]];
        e[0] += 1, e[1] += w / grid / mhz, e[2] += k / grid / mhz, e[3] += mx / mhz;
        tw += w / grid / mhz, tk += k / grid / mhz;
    }
    for (auto& [key, e] : by)
        std::fprintf(stderr, "mx kind %2d barrier %d: %3.0f phases, wait %7.1f us, work %7.1f us (max %7.1f)\n",
                     key / 2, key % 2, e[0], e[1], e[2], e[3]);
    double e[4] = {0, 0, 0, 0};
    for (int b = 0; b < grid; ++b)
        for (int j = 0; j < 4; ++j) e[j] += double(t[size_t(n) * grid * 2 + size_t(b) * 4 + j]);
    std::fprintf(stderr,
                 "mx total: wait %.1f us, work %.1f us; matmul prologues %.1f us (input loads %.1f), waits for "
                 "weights %.1f us, row dots %.1f us\n",
                 tw, tk, e[0] / grid / mhz, e[2] / grid / mhz, e[1] / grid / mhz, e[3] / grid / mhz);
}

}  // namespace cera::cuda
