// The CUDA backend's ops: each records a node of the step (step.h) and returns; run_step() passes the
// recorded nodes through the fusion rules (step_fusion.cpp) and launches them in order.
#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/encoder_ops.h"
#include "backends/cuda/lora.h"
#include "core/quant/quant.h"

namespace cera::cuda {

namespace {

RopeArgs rope_args(const RopeParams& rope) {
    RopeArgs r;
    r.mode = rope.mode == RopeMode::kNone ? 0 : rope.mode == RopeMode::kNorm ? 1 : 2;
    r.n_rot = rope.n_rot, r.freq_base = rope.freq_base, r.freq_scale = rope.freq_scale;
    r.freq_factors = rope.freq_factors ? rope.freq_factors.as<const float>() : nullptr;
    return r;
}

}  // namespace

// ------------------------------------------------------------------------------------------ recording

void CudaBackend::embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) {
    const cuda::WeightRef w = weights_.ref(table);
    record(OtherNode{[=, this] {
        cuda::dequantize_rows(w, ids.as<const int32_t>(), ids.ne[0], scale, out.data, false, stream_);
    }});
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
    CERA_CHECK(out.n_elements() == x.n_elements(), "rms_norm: out has %lld elements, x %lld",
               (long long)out.n_elements(), (long long)x.n_elements());
    record(NormNode{x.as<const float>(), w ? w.as<const float>() : nullptr, eps, x.rows(), x.ne[0], out.as<float>(),
                    !w || w.type == GgmlType::kF32});
}

void CudaBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) {
    const int64_t k = w.ne[0], rows = w.rows(), n_tokens = x.rows();
    CERA_CHECK(x.ne[0] == k && out.ne[0] == rows, "matmul shapes: w {%lld, %lld}, x ne0 %lld, out ne0 %lld",
               (long long)k, (long long)rows, (long long)x.ne[0], (long long)out.ne[0]);
    const cuda::WeightRef ref = weights_.ref(w);
    const float* b = bias ? bias.as<const float>() : nullptr;
    if (n_tokens > kGemvMaxTokens) {
        record(GemmNode{ref, rows, n_tokens, x.as<const float>(), b, out.as<float>()});
        return;
    }
    GemvNode g;
    cuda::GemvArgs& a = g.a[0];
    a.w = ref, a.rows = rows, a.n_y = int(n_tokens), a.no_stream = !sw_.head_stream;
    a.x = x.as<const float>(), a.ldx = k;
    a.xq = cuda::is_float_type(ref.type) ? nullptr : kXqPending;
    a.bias = b, a.y = out.as<float>(), a.ldy = rows;
    record(g);
}

void CudaBackend::norm_rope(const Tensor& x, int n_head, int head_dim, const Tensor& norm_w, float eps, const Tensor& pos,
                            const RopeParams& rope) {
    record(RopeNode{x.as<float>(), x.rows(), n_head, head_dim, norm_w ? norm_w.as<const float>() : nullptr, eps,
                    pos.as<const int32_t>(), rope_args(rope)});
}

void CudaBackend::kv_store(const Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& k_cache,
                           const Tensor& v_cache, const Tensor& k_open) {
    cuda::KvCodec codec, v_codec;
    CERA_CHECK(!k_open && cuda::kv_codec_of(k_cache.type, codec) && cuda::kv_codec_of(v_cache.type, v_codec) &&
                   v.ne[0] == k.ne[0] && v.rows() == k.rows() && v_cache.ne[1] == k_cache.ne[1],
               "kv_store: k and v of one shape, caches of F32, F16, BF16, Q8_0, Q4_0 or Q3_KV");
    record(KvStoreNode{k.as<float>(), v.as<float>(), k.rows(), k.ne[0], pos.as<const int32_t>(), k_cache.data,
                       v_cache.data, codec, v_codec, k_cache.ne[1]});
}

void CudaBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                            const AttentionParams& p, const Tensor& out) {
    AttentionNode n;
    cuda::AttentionArgs& a = n.a;
    CERA_CHECK(cuda::kv_codec_of(k_cache.type, a.codec) && cuda::kv_codec_of(v_cache.type, a.v_codec),
               "attention: caches of F32, F16, BF16, Q8_0, Q4_0 or Q3_KV");
    a.q = q.as<const float>(), a.k_cache = k_cache.data, a.v_cache = v_cache.data;
    a.pos = pos.as<const int32_t>();
    a.n_tokens = q.rows(), a.n_ctx = k_cache.ne[1];
    a.n_head = p.n_head, a.n_head_kv = p.n_head_kv, a.head_dim = p.head_dim;
    a.scale = p.scale, a.sliding_window = p.sliding_window;
    a.out = out.as<float>();
    if (!p.paging) return record(n);
    const KvPaging& pg = p.paging;
    CERA_CHECK(pg.block_size > 0 && (pg.block_size & (pg.block_size - 1)) == 0, "attention: block size %d",
               pg.block_size);
    a.block_table = pg.block_table.as<const int32_t>(), a.table_stride = int(pg.block_table.ne[0]);
    while ((1 << a.block_shift) < pg.block_size) ++a.block_shift;
    a.n_ctx = int64_t(a.table_stride) << a.block_shift;
    // One launch a prefill run (the tiled kernels share K/V tiles among the queries of one sequence) and
    // one for each stretch of one-token runs (decode tokens, a sequence each).
    int64_t total = 0;
    for (int32_t r : pg.runs) total += r;
    CERA_CHECK(!pg.runs.empty() && total == a.n_tokens, "attention: paged runs cover %lld of %lld queries",
               (long long)total, (long long)a.n_tokens);
    const int64_t qw = int64_t(p.n_head) * p.head_dim;
    for (size_t i = 0, row = 0; i < pg.runs.size();) {
        size_t j = i + 1;
        int64_t n_rows = pg.runs[i];
        if (n_rows == 1)
            while (j < pg.runs.size() && pg.runs[j] == 1) ++j, ++n_rows;
        AttentionNode r = n;
        r.a.q = a.q + int64_t(row) * qw, r.a.out = a.out + int64_t(row) * qw;
        r.a.pos = a.pos + row, r.a.seq = pg.seq.as<const int32_t>() + row;
        r.a.n_tokens = n_rows, r.a.each_seq = pg.runs[i] == 1;
        record(r);
        row += size_t(n_rows), i = j;
    }
}

void CudaBackend::short_conv(const Tensor& bcx, const Tensor& w, const Tensor& state, const Tensor& out,
                             const Tensor& state_prev) {
    const int64_t n_embd = out.ne[0];
    CERA_CHECK(w.type == GgmlType::kF32 && bcx.ne[0] == 3 * n_embd && state.ne[0] == n_embd &&
               (!state_prev || state_prev.n_bytes() >= state.n_bytes()));
    const cuda::WeightRef ref = weights_.ref_or_buffer(w);
    ConvNode c;
    c.bcx = bcx.as<const float>(), c.w = static_cast<const float*>(ref.image) + ref.row0 * ref.k, c.taps = int(w.ne[0]);
    c.state = state.as<float>(), c.state_prev = state_prev ? state_prev.as<float>() : nullptr;
    c.n_tokens = bcx.rows(), c.n_embd = n_embd, c.out = out.as<float>();
    record(c);
}

static_assert(cuda::kConvSegInts == kConvSegInts, "kernels.h and backend.h: one descriptor size");

void CudaBackend::short_conv_segments(const Tensor& bcx, const Tensor& w, const Tensor& states, const Tensor& out,
                                      const Tensor& segs, const Tensor& snaps, const Tensor& snapshots) {
    const int64_t n_embd = out.ne[0], L = w.ne[0];
    CERA_CHECK(w.type == GgmlType::kF32 && bcx.ne[0] == 3 * n_embd && states.ne[0] == (L - 1) * n_embd &&
                   segs.type == GgmlType::kI32 && segs.ne[0] == kConvSegInts &&
                   (!snapshots || snapshots.ne[0] == states.ne[0]),
               "short_conv_segments: f32 weights, segs i32 [n_seg, 6], states and snapshots rows of (L - 1) * n_embd");
    const cuda::WeightRef ref = weights_.ref_or_buffer(w);
    const float* wp = static_cast<const float*>(ref.image) + ref.row0 * ref.k;
    record(OtherNode{[=, this] {
        cuda::short_conv_segments(bcx.as<const float>(), wp, int(L), states.as<float>(), segs.as<const int32_t>(),
                                  int(segs.ne[1]), snaps ? snaps.as<const int32_t>() : nullptr,
                                  snapshots ? snapshots.as<float>() : nullptr, bcx.rows(), n_embd, out.as<float>(),
                                  stream_);
    }});
}

void CudaBackend::lora_segments(const Tensor& x, std::span<const LoraSegment> segs, const Tensor& y) {
    const int64_t k = x.ne[0], n_out = y.ne[0], n_rows = x.rows();
    LoraNode node;
    node.x = x.as<const float>(), node.k = k, node.n_rows = n_rows;
    LoraProductNode& p = node.p[0];
    p.y = y.as<float>(), p.n_out = n_out;
    int64_t t_floats = 0;
    for (const LoraSegment& sg : segs) {
        const int64_t r = sg.a.ne[1];
        const auto half_or_f32 = [](const Tensor& t) { return t.type == GgmlType::kF32 || t.type == GgmlType::kF16; };
        CERA_CHECK(half_or_f32(sg.a) && half_or_f32(sg.bt) && sg.a.ne[0] == k && sg.bt.ne[1] == r &&
                       sg.bt.ne[0] == n_out && sg.start >= 0 && sg.n >= 0 && sg.start + sg.n <= n_rows &&
                       n_rows == y.rows() && r <= INT32_MAX,
                   "lora_segments: segment rows %lld+%lld, a {%lld, %lld}, bt {%lld, %lld}, x ne0 %lld, y ne0 %lld",
                   (long long)sg.start, (long long)sg.n, (long long)sg.a.ne[0], (long long)r, (long long)sg.bt.ne[0],
                   (long long)sg.bt.ne[1], (long long)k, (long long)n_out);
        if (sg.n == 0 || r == 0) continue;
        LoraSegDev d;
        d.start = sg.start, d.n = sg.n, d.t_off = t_floats, d.a = sg.a.data, d.bt = sg.bt.data;
        d.scale = sg.scale, d.r = int(r), d.a_f16 = sg.a.type == GgmlType::kF16, d.bt_f16 = sg.bt.type == GgmlType::kF16;
        p.segs.push_back(d);
        t_floats += sg.n * r;
    }
    if (!p.segs.empty()) record(std::move(node));
}

void CudaBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out) {
    const int64_t n = x.ne[0];
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kF32 && out.n_elements() == x.n_elements() &&
                   (!w || (w.type == GgmlType::kF32 && w.n_elements() == n)) &&
                   (!b || (b.type == GgmlType::kF32 && b.n_elements() == n)),
               "layer_norm: f32 x and out of one size, w and b f32 [%lld] or empty", (long long)n);
    const float* wp = w ? w.as<const float>() : nullptr;
    const float* bp = b ? b.as<const float>() : nullptr;
    record(OtherNode{
        [=, this] { cuda::layer_norm(x.as<const float>(), wp, bp, eps, x.rows(), n, out.as<float>(), stream_); }});
}

void CudaBackend::gelu(const Tensor& x, GeluKind kind, const Tensor& out) {
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kF32 && out.n_elements() == x.n_elements(),
               "gelu: f32 x and out of one size");
    record(OtherNode{[=, this] {
        cuda::gelu(x.as<const float>(), x.n_elements(), kind == GeluKind::kErf, out.as<float>(), stream_);
    }});
}

void CudaBackend::attention_full(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int head_dim,
                                 float scale, const Tensor& out) {
    const int64_t n_tokens = q.rows();
    CERA_CHECK(n_head > 0 && head_dim > 0 && q.ne[0] == int64_t(n_head) * head_dim && k.ne[0] == q.ne[0] &&
                   v.ne[0] == q.ne[0] && out.ne[0] == q.ne[0] && k.rows() == n_tokens && v.rows() == n_tokens &&
                   out.rows() == n_tokens && q.type == GgmlType::kF32 && k.type == GgmlType::kF32 &&
                   v.type == GgmlType::kF32 && out.type == GgmlType::kF32,
               "attention_full: q, k, v and out f32 [n_tokens, n_head * head_dim]");
    if (head_dim > cuda::kAttnFullMaxHeadDim) {  // beyond the kernel
        attention_full_via_host(*this, q, k, v, n_head, head_dim, scale, out);
        return;
    }
    // The scratch is taken when the node runs: the encoder's layers use the one buffer in turn.
    record(OtherNode{[=, this] {
        void* s = scratch(kAttnFull, cuda::attention_full_scratch_bytes(n_tokens, n_head, head_dim));
        cuda::attention_full(q.as<const float>(), k.as<const float>(), v.as<const float>(), n_tokens, n_head, head_dim,
                             scale, out.as<float>(), s, stream_);
    }});
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
    record(SwigluNode{gate.as<const float>(), up.as<const float>(), gate.n_elements(), gate.ne[0], out.as<float>()});
}

void CudaBackend::add(const Tensor& a, const Tensor& b, float scale, const Tensor& out) {
    record(AddNode{a.as<const float>(), b.as<const float>(), scale, a.n_elements(), out.as<float>()});
}

void CudaBackend::scale(const Tensor& x, float s) {
    record(OtherNode{[=, this] { cuda::scale(x.as<float>(), s, x.n_elements(), stream_); }});
}

void CudaBackend::rotate_heads(const Tensor& x, int head_dim, bool inverse) {
    CERA_CHECK(x.type == GgmlType::kF32 && head_dim > 0 && x.ne[0] % head_dim == 0);
    const int64_t n_heads = x.n_elements() / head_dim;
    record(RotateNode{x.as<float>(), n_heads, head_dim, inverse});
}

void CudaBackend::top_logits(const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) {
    const int64_t n_g = top_logits_checked(x, m, gather, out);
    if (m > cuda::kTopLogitsMax || x.n_elements() >= INT32_MAX || n_g >= INT32_MAX) {  // beyond the kernel
        top_logits_via_host(*this, x, m, gather, out);
        return;
    }
    record(OtherNode{[=, this] {
        cuda::top_logits(x.as<const float>(), x.n_elements(), m, n_g ? gather.as<const int32_t>() : nullptr, int(n_g),
                         out.as<int32_t>(), stream_);
    }});
}

void CudaBackend::argmax(const Tensor& x, const Tensor& out) {
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kI32 && out.n_elements() >= x.rows(),
               "argmax: f32 rows in, one i32 per row out");
    record(OtherNode{[=, this] {
        cuda::argmax_rows(x.as<const float>(), x.rows(), x.ne[0], out.as<int32_t>(), stream_,
                          x.rows() == 1 ? scratch(kArgmax, cuda::kArgmaxScratchBytes) : nullptr);
    }});
}

void CudaBackend::argmax_feed(const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos) {
    CERA_CHECK(x.type == GgmlType::kF32 && x.rows() == 1 && out.type == GgmlType::kI32 &&
                   ids.type == GgmlType::kI32 && pos.type == GgmlType::kI32 && ids.n_elements() >= 1 &&
                   pos.n_elements() >= 1,
               "argmax_feed: one f32 row in; i32 out, ids and positions");
    PickNode p;
    p.x = x.as<const float>(), p.n = x.ne[0], p.out = out.as<int32_t>(), p.ids = ids.as<int32_t>();
    p.pos = pos.as<int32_t>(), p.pos_last = pos.n_elements() - 1;
    record(p);
}

void CudaBackend::moe_route(const Tensor& logits, const Tensor& bias, const MoeParams& p, const Tensor& ids,
                            const Tensor& weights) {
    record(OtherNode{[=, this] {
        cuda::moe_route(logits.as<const float>(), bias ? bias.as<const float>() : nullptr, logits.rows(),
                        int(logits.ne[0]), p.n_expert_used, p.gating == MoeGating::kSigmoid, p.normalize_weights,
                        p.weights_scale, ids.as<int32_t>(), weights.as<float>(), stream_);
    }});
}

void CudaBackend::moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                          const Tensor& ids, const Tensor& weights, const Tensor& out) {
    record_moe_ffn(x, gate_exps, up_exps, down_exps, ids, weights, out, {});
}

void CudaBackend::moe_ffn_lora(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps,
                               const Tensor& down_exps, const Tensor& ids, const Tensor& weights,
                               std::span<const MoeLoraSegment> segs, const Tensor& out) {
    // A segment's token rows [start, start + n) are the slot rows [start k, (start + n) k) of the products.
    moe_lora_checked(segs, gate_exps, up_exps, down_exps, x.rows());
    const int64_t k = ids.ne[0];
    MoeLora lora;
    for (const MoeLoraSegment& sg : segs)
        for (int p = 0; p < 3; ++p) {
            if (!sg.a[p] || sg.n == 0) continue;
            LoraSegDev d;
            d.start = sg.start * k, d.n = sg.n * k, d.t_off = lora.t_floats[p], d.a = sg.a[p].data, d.bt = sg.bt[p].data;
            d.scale = sg.scale[p], d.r = int(sg.a[p].ne[1]);
            d.a_f16 = sg.a[p].type == GgmlType::kF16, d.bt_f16 = sg.bt[p].type == GgmlType::kF16;
            lora.segs[p].push_back(d);
            lora.t_floats[p] += d.n * d.r;
        }
    record_moe_ffn(x, gate_exps, up_exps, down_exps, ids, weights, out, std::move(lora));
}

void CudaBackend::record_moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps,
                                 const Tensor& down_exps, const Tensor& ids, const Tensor& weights, const Tensor& out,
                                 MoeLora lora) {
    const int64_t n_slots = x.rows() * ids.ne[0];
    CERA_CHECK(n_slots <= 65535, "moe_ffn: %lld (token, expert) slots in one call", (long long)n_slots);
    CERA_CHECK(up_exps.ne[2] == gate_exps.ne[2] && down_exps.ne[2] == gate_exps.ne[2], "moe_ffn: expert counts differ");
    const cuda::WeightRef g = weights_.ref(gate_exps), u = weights_.ref(up_exps), d = weights_.ref(down_exps);
    record(OtherNode{[=, this, lora = std::move(lora)] {
        launch_moe_ffn(x, g, u, d, gate_exps.ne[1], int(gate_exps.ne[2]), ids, weights, out, lora);
    }});
}

// ------------------------------------------------------------------------------------------ execution

void CudaBackend::run_step() {
    if (step_.nodes.empty()) return;
    CUDA_CHECK(cudaSetDevice(device_));  // the ranks of a split model run on threads of their own
    cuda::fuse_step(step_, rules_, [this](Slot slot, size_t bytes) { return scratch(slot, bytes); });
    // The F16 expansion buffers, at their size for the step before any expansion is queued.
    expansions_.clear(), expanded_ = 0;
    size_t w16_bytes = 0;
    for (Node& node : step_.nodes)
        if (auto* g = std::get_if<GemmNode>(&node); g && g->w.type != GgmlType::kF16 && g->w.type != GgmlType::kF32) {
            g->expansion = int(expansions_.size());
            expansions_.push_back(g);
            w16_bytes = std::max(w16_bytes, size_t(g->rows * g->w.k) * 2);
        }
    if (w16_bytes) {
        scratch(kW16a, w16_bytes), scratch(kW16b, w16_bytes);
        // The side stream's expansions follow what is queued on the main one (a grown buffer's fill).
        CUDA_CHECK(cudaEventRecord(step_start_, stream_));
        CUDA_CHECK(cudaStreamWaitEvent(side_, step_start_));
    }
    for (size_t i = 0; i < step_.nodes.size(); ++i) {
        Node& node = step_.nodes[i];
        const GemvNode* next = i + 1 < step_.nodes.size() ? std::get_if<GemvNode>(&step_.nodes[i + 1]) : nullptr;
        std::visit([&](auto& n) { launch(n, next && next->n == 1 ? &next->a[0] : nullptr); }, node);
    }
    step_.nodes.clear();
}

void CudaBackend::launch(std::monostate&, const GemvArgs*) {}

void CudaBackend::launch(GemvNode& n, const GemvArgs*) {
    for (int i = 0, j; i < n.n; i = j) {  // one launch a run of one type (group_products)
        for (j = i + 1; j < n.n && n.a[j].w.type == n.a[i].w.type;) ++j;
        if (j - i == 1) cuda::gemv(n.a[i], stream_);
        else cuda::gemv_multi(n.a + i, j - i, stream_);
    }
}

void CudaBackend::expand(GemmNode& n) {
    const int buf = n.expansion % 2;
    void* w16 = scratch_[buf ? kW16b : kW16a].ptr;
    if (capturing_) {  // one stream inside a captured step
        cuda::dequantize_rows(n.w, nullptr, n.rows, 1.0f, w16, true, stream_);
        return;
    }
    CUDA_CHECK(cudaStreamWaitEvent(side_, expand_free_[buf]));
    cuda::dequantize_rows(n.w, nullptr, n.rows, 1.0f, w16, true, side_);
    CUDA_CHECK(cudaEventRecord(expand_done_[buf], side_));
}

// out[t] = W x[t]: cuBLAS on F16 (or F32) operands, f32 accumulation.
void CudaBackend::launch(GemmNode& n, const GemvArgs*) {
    const int64_t k = n.w.k, rows = n.rows, n_tokens = n.n_tokens;
    const float one = 1.0f, zero = 0.0f;
    if (n.w.type == GgmlType::kF32) {
        const float* wp = static_cast<const float*>(n.w.image) + n.w.row0 * k;
        CUBLAS_CHECK(cuda::cublas().sgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n_tokens), int(k), &one,
                                          wp, int(k), n.x, int(k), &zero, n.y, int(rows)));
    } else {
        const void* w16 = static_cast<const uint16_t*>(n.w.image) + n.w.row0 * k;
        if (n.expansion >= 0) {
            // This product's expansion and the next one's are queued (the next runs beside this product).
            while (expanded_ < expansions_.size() && expanded_ <= size_t(n.expansion) + 1) expand(*expansions_[expanded_++]);
            const int buf = n.expansion % 2;
            if (!capturing_) CUDA_CHECK(cudaStreamWaitEvent(stream_, expand_done_[buf]));
            w16 = scratch_[buf ? kW16b : kW16a].ptr;
        }
        if (std::find(gemm_shapes_.begin(), gemm_shapes_.end(), std::pair{rows, k}) == gemm_shapes_.end())
            gemm_shapes_.push_back({rows, k});
        void* x16 = scratch(kX16, size_t(n_tokens * k) * 2);
        cuda::convert_f32_to_f16(n.x, n_tokens * k, x16, stream_);
        CUBLAS_CHECK(cuda::cublas().gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n_tokens), int(k), &one,
                                            w16, CUDA_R_16F, int(k), x16, CUDA_R_16F, int(k), &zero, n.y, CUDA_R_32F,
                                            int(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        if (n.expansion >= 0 && !capturing_) CUDA_CHECK(cudaEventRecord(expand_free_[n.expansion % 2], stream_));
    }
    if (n.bias) cuda::add_bias(n.y, n.bias, n.n_tokens, n.rows, stream_);
}

void CudaBackend::warm_up_products(std::span<const int64_t> token_counts) {
    run_step();
    CERA_CHECK(!capturing_, "warm_up_products inside a step");
    const std::vector<std::pair<int64_t, int64_t>> shapes = std::move(gemm_shapes_);
    gemm_shapes_.clear();
    int64_t max_tokens = 0;
    for (int64_t n : token_counts) max_tokens = std::max(max_tokens, n);
    size_t w_elems = 0, x_elems = 0, y_elems = 0;
    for (const auto& [rows, k] : shapes) {
        w_elems = std::max(w_elems, size_t(rows * k));
        x_elems = std::max(x_elems, size_t(max_tokens * k));
        y_elems = std::max(y_elems, size_t(rows * max_tokens));
    }
    if (w_elems == 0 || max_tokens <= kGemvMaxTokens) return;
    // Operands of their own, zeroed and freed after, so that no buffer of a step changes size or content.
    // Without the memory for them the products stay cold (no error).
    void *w = nullptr, *x = nullptr, *y = nullptr;
    const bool have = cudaMalloc(&w, w_elems * 2) == cudaSuccess && cudaMalloc(&x, x_elems * 2) == cudaSuccess &&
                      cudaMalloc(&y, y_elems * 4) == cudaSuccess;
    if (have) {
        CUDA_CHECK(cudaMemsetAsync(w, 0, w_elems * 2, stream_));
        CUDA_CHECK(cudaMemsetAsync(x, 0, x_elems * 2, stream_));
        const float one = 1.0f, zero = 0.0f;
        for (const auto& [rows, k] : shapes)
            for (int64_t n : token_counts)
                if (n > kGemvMaxTokens)
                    CUBLAS_CHECK(cuda::cublas().gemm_ex(
                        cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n), int(k), &one, w, CUDA_R_16F, int(k), x,
                        CUDA_R_16F, int(k), &zero, y, CUDA_R_32F, int(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    } else {
        (void)cudaGetLastError();  // the failed allocation's error, not a sticky one
    }
    for (void* p : {w, x, y})
        if (p) CUDA_CHECK(cudaFree(p));
}

void CudaBackend::launch(NormNode& n, const GemvArgs*) {
    cuda::rms_norm(n.x, n.w, n.eps, n.rows, n.k, n.out, stream_, n.xq);
}

void CudaBackend::launch(RopeNode& n, const GemvArgs*) {
    cuda::norm_rope(n.x, n.n_tokens, n.n_head, n.head_dim, n.norm_w, n.eps, n.pos, n.rope, stream_);
}

void CudaBackend::launch(KvStoreNode& n, const GemvArgs*) {
    cuda::kv_store(n.k, n.v, n.n_tokens, n.width, n.pos, n.k_cache, n.v_cache, n.codec, n.v_codec, n.n_ctx, stream_);
}

void CudaBackend::launch(QkvRopeNode& n, const GemvArgs*) {
    attach_rope_table(n.r.k_rope, n.r.n_ctx);
    if (n.r.q) attach_rope_table(n.r.q_rope, n.r.n_ctx);
    if (n.products) cuda::gemv_qkv_rope_store(n.qkv, n.r, stream_);
    else cuda::qkv_rope_store(n.r, stream_);
}

void CudaBackend::launch(ConvNode& n, const GemvArgs*) {
    if (n.product) cuda::gemv_conv(n.in, n.w, n.taps, n.state, n.state_prev, n.out, n.xq, stream_);
    else cuda::short_conv(n.bcx, n.w, n.taps, n.state, n.n_tokens, n.n_embd, n.out, stream_, n.xq, n.state_prev);
}

void CudaBackend::launch(SwigluNode& n, const GemvArgs*) {
    cuda::swiglu(n.gate, n.up, n.n, n.out, stream_, n.xq, n.row);
}

// The product after the pair (the down product) has its weights prefetched into L2 while the pair runs.
void CudaBackend::launch(GluNode& n, const GemvArgs* next) {
    cuda::gemv_glu(n.g, n.u, n.act, n.xq, stream_, next);
}

void CudaBackend::launch(AddNode& n, const GemvArgs*) { cuda::add(n.a, n.b, n.scale, n.n, n.out, stream_); }

void CudaBackend::launch(AttentionNode& n, const GemvArgs*) {
    const size_t f = cuda::attention_scratch_floats(n.a);
    n.a.partial = f ? static_cast<float*>(scratch(kAttn, f * sizeof(float))) : nullptr;
    cuda::attention(n.a, stream_);
}

void CudaBackend::launch(PickNode& n, const GemvArgs*) {
    const cuda::PickMail mail = mail_ok_ ? mail_.device() : cuda::PickMail{};
    void* const pick_scratch = scratch(kArgmax, cuda::kArgmaxScratchBytes);
    // The LM head's own launch makes the pick where the streamed GEMV takes it (gemv_argmax_feed).
    bool picked = false;
    if (n.product) {
        picked = cuda::gemv_argmax_feed(n.head, n.out, n.ids, n.pos, n.pos_last, stream_, pick_scratch, mail);
        if (!picked) cuda::gemv(n.head, stream_);
    }
    if (!picked) cuda::argmax_feed(n.x, n.n, n.out, n.ids, n.pos, n.pos_last, stream_, pick_scratch, mail);
    if (capturing_) {
        CERA_CHECK(!capture_feed_out_, "argmax_feed: one per recorded step");
        capture_feed_out_ = n.out;
    } else if (mail_ok_) {
        mail_.queued(n.out);
    }
}

void CudaBackend::launch(QuantizeNode& n, const GemvArgs*) { cuda::quantize_q8(n.x, n.rows, n.k, n.k, n.xq, stream_); }

void CudaBackend::launch(RotateNode& n, const GemvArgs*) {
    cuda::rotate_heads(n.x, n.n_heads, n.head_dim, n.inverse, stream_);
}
void CudaBackend::launch(LoraNode& n, const GemvArgs*) {
    if (n.delta()) {
        cuda::LoraDeltaArgs a;
        a.x = n.x, a.k = n.k, a.pro_x = n.pro_x, a.pro_w = n.pro_w, a.pro_eps = n.pro_eps, a.n = n.n;
        for (int i = 0; i < n.n; ++i) {
            const LoraProductNode& p = n.p[i];
            cuda::LoraDeltaProduct& d = a.p[i];
            std::copy(p.segs.begin(), p.segs.end(), d.segs);
            d.n_segs = int(p.segs.size()), d.n_out = p.n_out, d.bias = p.bias, d.delta = p.delta;
        }
        cuda::lora_delta(a, stream_);
        return;
    }
    // The scratch is taken when the node runs: every LoRA node of a step uses the one buffer in turn.
    // The segments of many rows (cuda::kLoraGemmRows) go through cuBLAS, on x in F16 (made once here).
    auto gemm = [](const LoraSegDev& sg) { return sg.n >= cuda::kLoraGemmRows && sg.a_f16 && sg.bt_f16; };
    size_t t16_bytes = 0;
    for (int i = 0; i < n.n; ++i)
        for (const LoraSegDev& sg : n.p[i].segs)
            if (gemm(sg)) t16_bytes = std::max(t16_bytes, size_t(sg.n * sg.r) * 2);
    const void* x16 = nullptr;
    void* t16 = nullptr;
    if (t16_bytes) {
        void* buf = scratch(kLoraX16, size_t(n.n_rows * n.k) * 2);
        t16 = scratch(kLoraT16, t16_bytes);
        cuda::convert_f32_to_f16(n.x, n.n_rows * n.k, buf, stream_);
        x16 = buf;
    }
    for (int i = 0; i < n.n; ++i) {
        const LoraProductNode& p = n.p[i];
        std::vector<LoraSegDev> rest;
        int64_t t_floats = 0;
        for (const LoraSegDev& sg : p.segs) {
            if (!gemm(sg)) {
                rest.push_back(sg);
                t_floats = std::max(t_floats, sg.t_off + sg.n * sg.r);
                continue;
            }
            const float zero = 0.0f, one = 1.0f;
            // t [n, r] = s X Aᵀ: column-major, Aᵀ's k x r is A as stored, X's k x n likewise.
            CUBLAS_CHECK(cuda::cublas().gemm_ex(
                cublas_, CUBLAS_OP_T, CUBLAS_OP_N, sg.r, int(sg.n), int(n.k), &sg.scale, sg.a, CUDA_R_16F, int(n.k),
                static_cast<const uint16_t*>(x16) + sg.start * n.k, CUDA_R_16F, int(n.k), &zero, t16, CUDA_R_16F, sg.r,
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            // Y [n, n_out] += T Bᵀ: column-major, Bᵀ as stored is B's n_out x r.
            CUBLAS_CHECK(cuda::cublas().gemm_ex(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, int(p.n_out), int(sg.n), sg.r, &one,
                                                sg.bt, CUDA_R_16F, int(p.n_out), t16, CUDA_R_16F, sg.r, &one,
                                                p.y + sg.start * p.n_out, CUDA_R_32F, int(p.n_out), CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT));
        }
        if (rest.empty()) continue;
        float* t = static_cast<float*>(scratch(kLora, size_t(t_floats) * sizeof(float)));
        cuda::lora_segments(n.x, p.y, t, n.k, p.n_out, n.n_rows, rest.data(), int(rest.size()), stream_);
    }
}

void CudaBackend::launch(OtherNode& n, const GemvArgs*) { n.run(); }

void CudaBackend::attach_rope_table(cuda::RopeArgs& r, int64_t rows) {
    rope_tables_.attach(r, rows, capturing_, stream_, [&] {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        drop_graphs();
    });
}

void CudaBackend::launch_moe_ffn(const Tensor& x, const cuda::WeightRef& gw, const cuda::WeightRef& uw,
                                 const cuda::WeightRef& dw, int64_t n_ff, int n_expert, const Tensor& ids,
                                 const Tensor& weights, const Tensor& out, const MoeLora& lora) {
    const int64_t n_tokens = x.rows(), n_embd = x.ne[0];
    const int k = int(ids.ne[0]);
    const int64_t n_slots = n_tokens * k;
    float* g = static_cast<float*>(scratch(kMoeG, size_t(n_slots * n_ff) * sizeof(float)));
    float* u = static_cast<float*>(scratch(kMoeU, size_t(n_slots * n_ff) * sizeof(float)));
    float* y = static_cast<float*>(scratch(kMoeY, size_t(n_slots * n_embd) * sizeof(float)));
    // Batches: the slots grouped by expert (moe.cu), so that each expert's weights are read once
    // per call, for the block-quantized matrices; decode (one token) and float weights keep one
    // GEMV slot per (token, expert).
    const bool grouped = n_tokens > 1 && sw_.moe_grouped &&
                         (cuda::moe_grouped_supported(gw.type, n_embd, n_expert) ||
                          cuda::moe_grouped_supported(uw.type, n_embd, n_expert) ||
                          cuda::moe_grouped_supported(dw.type, n_ff, n_expert));
    int32_t* route = nullptr;
    if (grouped) {
        route = static_cast<int32_t*>(scratch(kMoeR, cuda::moe_group_ints(n_expert, n_slots) * sizeof(int32_t)));
        cuda::moe_group(ids.as<const int32_t>(), n_slots, n_expert, route, stream_);
    }
    // x quantized once for gate and up (kMoeXa), the activations for down (kMoeXb).
    const float* quantized = nullptr;
    auto run = [&](const cuda::WeightRef& w, int64_t rows, const float* in, int64_t n_in, int x_div, Slot slot, float* o) {
        cuda::GemvArgs a;
        a.w = w, a.rows = rows, a.n_y = int(n_slots), a.ids = ids.as<const int32_t>(), a.x_div = x_div;
        a.x = in, a.ldx = w.k;
        if (!cuda::is_float_type(w.type)) {
            void* xq = scratch(slot, size_t(n_in * cuda::q8_row_bytes(w.k)));
            if (quantized != in) cuda::quantize_q8(in, n_in, w.k, w.k, xq, stream_);
            quantized = in, a.xq = xq;
        }
        a.y = o, a.ldy = rows;
        if (route && cuda::moe_grouped_supported(w.type, w.k, n_expert)) {
            cuda::MoeGemvArgs m;
            m.w = w, m.rows = rows, m.n_expert = n_expert, m.route = route, m.n_slots = n_slots;
            m.xq = a.xq, m.x_div = x_div, m.y = o, m.ldy = rows, m.tile_rows = sw_.moe_tile_rows;
            cuda::moe_gemv_grouped(m, stream_);
            return;
        }
        cuda::gemv(a, stream_);
    };
    // Product p's LoRA deltas on its slot rows o, from in (n_slots / x_div rows of k_in).
    auto deltas = [&](int p, const float* in, int64_t k_in, int x_div, float* o, int64_t n_out) {
        if (lora.segs[p].empty()) return;
        float* t = static_cast<float*>(scratch(kLora, size_t(lora.t_floats[p]) * sizeof(float)));
        const cuda::LoraExperts ex{ids.as<const int32_t>(), n_expert, x_div};
        cuda::lora_segments(in, o, t, k_in, n_out, n_slots, lora.segs[p].data(), int(lora.segs[p].size()), stream_,
                            &ex);
    };
    run(gw, n_ff, x.as<const float>(), n_tokens, k, kMoeXa, g);
    deltas(0, x.as<const float>(), n_embd, k, g, n_ff);
    run(uw, n_ff, x.as<const float>(), n_tokens, k, kMoeXa, u);
    deltas(1, x.as<const float>(), n_embd, k, u, n_ff);
    cuda::swiglu(g, u, n_slots * n_ff, g, stream_);
    run(dw, n_embd, g, n_slots, 1, kMoeXb, y);
    deltas(2, g, n_ff, 1, y, n_embd);
    cuda::moe_combine(y, weights.as<const float>(), n_tokens, k, n_embd, out.as<float>(), stream_);
}

}  // namespace cera::cuda
