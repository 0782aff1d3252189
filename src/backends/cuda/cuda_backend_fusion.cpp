// The CUDA backend's decode fusion (see cuda_backend.cpp's opening comment): ops whose products can
// go out together, or fold into the launch of a neighbour, are held back (mm_, glu_, norm_, res_,
// rope_) and launched when the next op shows what they fuse with; every other call flushes them.
#include <cstring>

#include "backends/cuda/cuda_backend.h"
#include "core/quant/quant.h"

namespace cera::cuda {

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) {
    if (n_mm_ == 1 && n_rope_ == 0 && mm_[0].a.res_out == x.as<const float>() && x.rows() == mm_[0].a.n_y &&
        x.ne[0] == mm_[0].a.rows && (!w || w.type == GgmlType::kF32) && out.n_elements() == x.n_elements()) {
        // The residual product that makes x is still held: its last block makes the norm too.
        void* xq = q8_sidecar(out.as<const float>(), x.rows(), x.ne[0], mm_[0].a.xq);  // may launch it
        cuda::GemvArgs& m = mm_[0].a;
        if (n_mm_ == 1) {
            m.norm_w = w ? w.as<const float>() : nullptr, m.norm_eps = eps, m.norm_out = out.as<float>();
            m.norm_xq = xq, m.norm_ctr = norm_ctr_;
            if (cuda::gemv_norm_supported(m)) {
                // One token: still held, so that the products reading out may make the norm in
                // their prologue instead (take_prologue); anything else launches it with the norm.
                if (x.rows() != 1 || !sw_.pro_mask) flush_mm();
                return;
            }
            m.norm_out = nullptr;
        }
    }
    touch();  // also forgets the 8-bit rows recorded for out above
    void* xq = q8_sidecar(out.as<const float>(), x.rows(), x.ne[0], nullptr);
    norm_ = {x.as<const float>(), w ? w.as<const float>() : nullptr, eps, x.rows(), x.ne[0], out.as<float>(), xq,
             false};
    if (x.rows() == 1 && sw_.pro_mask && (!w || w.type == GgmlType::kF32) &&
        out.n_elements() == x.n_elements() && reinterpret_cast<uintptr_t>(x.data) % 16 == 0) {
        // One token after no residual product (the first layer's, after the embedding): held, so
        // that the products reading out may make it in their prologue (take_prologue).
        norm_.held = true;
        return;
    }
    launch_norm();
}

void CudaBackend::matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) {
    const int64_t k = w.ne[0], rows = w.rows(), n_tokens = x.rows();
    CERA_CHECK(x.ne[0] == k && out.ne[0] == rows, "matmul shapes: w {%lld, %lld}, x ne0 %lld, out ne0 %lld",
               (long long)k, (long long)rows, (long long)x.ne[0], (long long)out.ne[0]);
    const cuda::WeightRef ref = weights_.ref(w);
    const float* b = bias ? bias.as<const float>() : nullptr;
    flush_rope();
    if (n_tokens <= kGemvMaxTokens) {
        cuda::GemvArgs a;
        a.w = ref, a.rows = rows, a.n_y = int(n_tokens), a.no_stream = !sw_.head_stream;
        // Products that share the input wait to be launched together (q/k/v, gate/up), or fused
        // with the op that follows (SwiGLU, the residual add).
        const bool pro = take_prologue(a, x.as<const float>(), k);
        if (!pro) release_norm(false);  // launched before anything that may read its output
        if (glu_.held && (n_mm_ > 0 || x.as<const float>() != glu_.act)) flush();
        if (n_mm_ > 0) {
            const cuda::GemvArgs& p = mm_[0].a;
            // A third product of another type may still be the v of a q/k/v launch (gemv_qkv_v_fits:
            // llama-quantize's mixtures); flush_mm launches each type apart if it is not.
            const bool v_type =
                n_mm_ == 2 && mm_[1].a.w.type == p.w.type && cuda::gemv_qkv_v_fits(p.w.type, ref.type);
            if (!sw_.fuse || n_mm_ == cuda::kMaxSegs || p.x != x.as<const float>() ||
                (p.w.type != ref.type && !v_type) || p.w.k != k || p.n_y != a.n_y || p.pro_x != a.pro_x)
                flush_mm();
        }
        if (!pro) prepare_x(a, ref.type, x.as<const float>(), n_tokens, k, kXq);
        a.bias = b, a.y = out.as<float>(), a.ldy = rows;
        touch_out(out);
        if (!sw_.fuse) {
            cuda::gemv(a, stream_);
            return;
        }
        mm_[n_mm_++] = {a, out};
        return;
    }
    flush();
    touch_out(out);
    gemm(ref, rows, x.as<const float>(), n_tokens, out.as<float>());
    if (b) cuda::add_bias(out.as<float>(), b, n_tokens, rows, stream_);
}

void CudaBackend::norm_rope(const Tensor& x, int n_head, int head_dim, const Tensor& norm_w, float eps, const Tensor& pos,
               const RopeParams& rope) {
    if (sw_.fuse && x.rows() <= kGemvMaxTokens &&
        (n_rope_ == 0 || (n_rope_ == 1 && rope_[0].pos.data == pos.data))) {
        // Decode: wait for the kv_store that usually follows (q, k, then the store: one launch, with
        // the q/k/v products when they are still pending and make x).
        bool makes_x = false;
        for (int i = 0; i < n_mm_; ++i) makes_x |= mm_[i].out.data == x.data;
        if (!makes_x || !fuses_product(mm_[0].a.w.type, false)) flush_mm();
        invalidate_q8();
        rope_[n_rope_++] = {x, n_head, head_dim, norm_w, eps, pos, rope};
        return;
    }
    touch();
    launch_rope({x, n_head, head_dim, norm_w, eps, pos, rope});
}

void CudaBackend::kv_store(const Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& k_cache,
              const Tensor& v_cache) {
    if (n_rope_ > 0 && k_cache.type == v_cache.type &&
        (k_cache.type == GgmlType::kF16 || k_cache.type == GgmlType::kF32)) {
        const PendingRope& kr = rope_[n_rope_ - 1];
        const PendingRope* qr = n_rope_ == 2 ? &rope_[0] : nullptr;
        if (kr.x.data == k.data && kr.pos.data == pos.data && kr.x.rows() == k.rows() &&
            int64_t(kr.n_head) * kr.head_dim == k.ne[0] && v.ne[0] == k.ne[0] && v.rows() == k.rows() &&
            (!qr || (qr->head_dim == kr.head_dim && qr->x.rows() == k.rows() &&
                     int64_t(qr->n_head) * qr->head_dim == qr->x.ne[0]))) {
            cuda::QkvRopeArgs a;
            a.k = k.as<float>(), a.v = v.as<const float>();
            a.n_tokens = k.rows(), a.n_head_kv = kr.n_head, a.head_dim = kr.head_dim;
            a.k_norm = kr.norm_w ? kr.norm_w.as<const float>() : nullptr, a.k_eps = kr.eps;
            a.k_rope = rope_args(kr.rope);
            if (qr) {
                a.q = qr->x.as<float>(), a.n_head = qr->n_head;
                a.q_norm = qr->norm_w ? qr->norm_w.as<const float>() : nullptr, a.q_eps = qr->eps;
                a.q_rope = rope_args(qr->rope);
            }
            a.pos = pos.as<const int32_t>();
            a.k_cache = k_cache.data, a.v_cache = v_cache.data;
            a.f16 = k_cache.type == GgmlType::kF16, a.n_ctx = k_cache.ne[1];
            a.rows_kernel = sw_.qkv_rows;
            attach_rope_table(a.k_rope, a.n_ctx);
            if (qr) attach_rope_table(a.q_rope, a.n_ctx);
            n_rope_ = 0;
            invalidate_q8();
            cuda::GemvArgs qkv[3];
            if (qr && !glu_.held && pending_qkv(a, qkv)) {  // the q/k/v products too (gemv_fused.cu)
                n_mm_ = 0;
                launch_res(qkv, 3, cuda::kProQkv);
                cuda::gemv_qkv_rope_store(qkv, a, stream_);
                return;
            }
            flush_mm();
            cuda::qkv_rope_store(a, stream_);
            return;
        }
    }
    touch();
    CERA_CHECK(k_cache.type == v_cache.type && (k_cache.type == GgmlType::kF16 || k_cache.type == GgmlType::kF32));
    cuda::kv_store(k.as<const float>(), v.as<const float>(), k.rows(), k.ne[0], pos.as<const int32_t>(),
                   k_cache.data, v_cache.data, k_cache.type == GgmlType::kF16, k_cache.ne[1], stream_);
}

void CudaBackend::short_conv(const Tensor& bcx, const Tensor& w, const Tensor& state, const Tensor& out,
                const Tensor& state_prev) {
    const int64_t n_embd = out.ne[0];
    CERA_CHECK(w.type == GgmlType::kF32 && bcx.ne[0] == 3 * n_embd && state.ne[0] == n_embd &&
               (!state_prev || state_prev.n_bytes() >= state.n_bytes()));
    const cuda::WeightRef ref = weights_.ref_or_buffer(w);
    const float* conv_w = static_cast<const float*>(ref.image) + ref.row0 * ref.k;
    if (n_mm_ == 1 && n_rope_ == 0 && !glu_.held && mm_[0].out.data == bcx.data && bcx.rows() == 1 &&
        out.rows() == 1 &&
        fuses_product(mm_[0].a.w.type, true) && cuda::gemv_conv_supported(mm_[0].a, int(w.ne[0]))) {
        // The in_proj product still waiting: one launch computes it and the conv.
        cuda::GemvArgs in = mm_[0].a;
        n_mm_ = 0;
        launch_res(&in, 1, cuda::kProConv);
        invalidate_q8();
        void* xq = q8_sidecar(out.as<const float>(), 1, n_embd, in.xq);
        cuda::gemv_conv(in, conv_w, int(w.ne[0]), state.as<float>(), state_prev ? state_prev.as<float>() : nullptr,
                        out.as<float>(), xq, stream_);
        return;
    }
    touch();
    void* xq = bcx.rows() <= 16 ? q8_sidecar(out.as<const float>(), bcx.rows(), n_embd, nullptr) : nullptr;
    cuda::short_conv(bcx.as<const float>(), conv_w, int(w.ne[0]), state.as<float>(), bcx.rows(), n_embd,
                     out.as<float>(), stream_, xq, state_prev ? state_prev.as<float>() : nullptr);
}

void CudaBackend::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
    if (n_mm_ == 2 && n_rope_ == 0 && !glu_.held) {
        // gate and up products still waiting: one launch computes both and the SwiGLU.
        const cuda::GemvArgs& g = mm_[0].out.data == gate.data ? mm_[0].a : mm_[1].a;
        const cuda::GemvArgs& u = mm_[0].out.data == gate.data ? mm_[1].a : mm_[0].a;
        const int64_t n = gate.n_elements();
        if (g.y == gate.as<const float>() && u.y == up.as<const float>() && g.rows * g.n_y == n &&
            u.rows == g.rows && up.n_elements() == n && out.n_elements() == n && g.ldy == g.rows &&
            u.ldy == u.rows && !g.res_out && !u.res_out && cuda::gemv_glu_supported(g.w.type, g.rows) &&
            g.w.type == u.w.type) {
            const cuda::GemvArgs gg = g, uu = u;
            n_mm_ = 0;
            invalidate_q8();
            void* xq = q8_sidecar(out.as<const float>(), gg.n_y, gg.rows, gg.xq);
            // Held until the next product is known (the down product: its weights go to L2
            // while the pair runs); anything else launches it first.
            glu_ = {gg, uu, out.as<float>(), xq, true};
            glu_.g.glu_stage = sw_.glu_stage, glu_.g.glu_wide = sw_.glu_wide;
            glu_.g.pro_xreg = sw_.pro_xreg;
            return;
        }
    }
    touch();
    const int64_t row = gate.ne[0];
    void* xq = q8_sidecar(out.as<const float>(), gate.rows(), row, nullptr);
    cuda::swiglu(gate.as<const float>(), up.as<const float>(), gate.n_elements(), out.as<float>(), stream_, xq,
                 row);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, float scale, const Tensor& out) {
    if (n_mm_ == 1 && n_rope_ == 0) {
        // The residual add folded into the epilogue of the product that made b.
        cuda::GemvArgs& m = mm_[0].a;
        const int64_t n = b.n_elements();
        const auto* lo = static_cast<const uint8_t*>(out.data);
        const auto* hi = lo + out.n_bytes();
        const auto* x_lo = reinterpret_cast<const uint8_t*>(m.x);
        const bool out_hits_x = m.x && x_lo < hi && x_lo + size_t(m.n_y) * size_t(m.ldx) * 4 > lo;
        const auto* b_lo = static_cast<const uint8_t*>(b.data);
        const bool out_hits_b = b_lo < hi && b_lo + b.n_bytes() > lo;
        const auto* a_lo = static_cast<const uint8_t*>(a.data);
        const bool a_hits_b = b_lo < a_lo + a.n_bytes() && b_lo + b.n_bytes() > a_lo;
        if (m.y == b.as<const float>() && m.ldy == m.rows && m.rows * m.n_y == n && a.n_elements() == n &&
            out.n_elements() == n && !out_hits_x && !out_hits_b && !a_hits_b) {
            m.res_a = a.as<const float>(), m.res_out = out.as<float>(), m.res_scale = scale;
            invalidate_q8();  // held: an rms_norm of out may join it (rms_norm), anything else launches it
            return;
        }
    }
    touch();
    cuda::add(a.as<const float>(), b.as<const float>(), scale, a.n_elements(), out.as<float>(), stream_);
}

void CudaBackend::argmax_feed(const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos) {
    CERA_CHECK(x.type == GgmlType::kF32 && x.rows() == 1 && out.type == GgmlType::kI32 &&
                   ids.type == GgmlType::kI32 && pos.type == GgmlType::kI32 && ids.n_elements() >= 1 &&
                   pos.n_elements() >= 1,
               "argmax_feed: one f32 row in; i32 out, ids and positions");
    const cuda::PickMail mail = mail_ok_ ? mail_.device() : cuda::PickMail{};
    void* const pick_scratch = scratch(kArgmax, cuda::kArgmaxScratchBytes);
    bool picked = false;
    // The LM head still held (its output is x): its launch makes the pick too (gemv_argmax_feed).
    if (n_mm_ == 1 && n_rope_ == 0 && !glu_.held && mm_[0].out.data == x.data && mm_[0].a.rows == x.ne[0]) {
        cuda::GemvArgs a = mm_[0].a;
        n_mm_ = 0;
        launch_res(&a, 1, 0);
        picked = cuda::gemv_argmax_feed(a, out.as<int32_t>(), ids.as<int32_t>(), pos.as<int32_t>(),
                                        pos.n_elements() - 1, stream_, pick_scratch, mail);
        if (!picked) cuda::gemv(a, stream_);
    }
    touch();
    if (!picked)
        cuda::argmax_feed(x.as<const float>(), x.ne[0], out.as<int32_t>(), ids.as<int32_t>(), pos.as<int32_t>(),
                          pos.n_elements() - 1, stream_, pick_scratch, mail);
    if (capturing_) {
        CERA_CHECK(!capture_feed_out_, "argmax_feed: one per recorded step");
        capture_feed_out_ = out.data;
    } else if (mail_ok_) {
        mail_.queued(out.data);
    }
}

void CudaBackend::attach_rope_table(cuda::RopeArgs& r, int64_t rows) {
    rope_tables_.attach(r, rows, capturing_, stream_, [&] {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        drop_graphs();
    });
}

cuda::RopeArgs CudaBackend::rope_args(const RopeParams& rope) {
    cuda::RopeArgs r;
    r.mode = rope.mode == RopeMode::kNone ? 0 : rope.mode == RopeMode::kNorm ? 1 : 2;
    r.n_rot = rope.n_rot, r.freq_base = rope.freq_base, r.freq_scale = rope.freq_scale;
    r.freq_factors = rope.freq_factors ? rope.freq_factors.as<const float>() : nullptr;
    return r;
}

void CudaBackend::launch_rope(const PendingRope& p) {
    cuda::norm_rope(p.x.as<float>(), p.x.rows(), p.n_head, p.head_dim,
                    p.norm_w ? p.norm_w.as<const float>() : nullptr, p.eps, p.pos.as<const int32_t>(),
                    rope_args(p.rope), stream_);
}

bool CudaBackend::fuses_product(GgmlType type, bool conv) const {
    const int block = cuda::quant_layout(type).block_elems;
    return sw_.fuse_products == 2 || (sw_.fuse_products == 1 && (conv ? cuda::heavy_scales(type) : block > 0));
}

bool CudaBackend::pending_qkv(const cuda::QkvRopeArgs& a, cuda::GemvArgs (&qkv)[3]) const {
    if (n_mm_ != 3 || !fuses_product(mm_[0].a.w.type, false)) return false;
    const void* outs[3] = {a.q, a.k, a.v};
    for (int j = 0; j < 3; ++j) {
        int found = -1;
        for (int i = 0; i < 3; ++i)
            if (mm_[i].out.data == outs[j]) found = i;
        if (found < 0) return false;
        qkv[j] = mm_[found].a;
    }
    return cuda::gemv_qkv_rope_supported(qkv, a);
}

bool CudaBackend::take_prologue(cuda::GemvArgs& a, const float* x, int64_t k) {
    if (!sw_.pro_mask || a.n_y != 1 || !cuda::gemv_norm_prologue_supported(a.w.type, k, 1)) return false;
    cuda::GemvArgs& m = mm_[0].a;
    if (n_mm_ > 0 && m.pro_x && m.x == x) {
        a.pro_x = m.pro_x, a.pro_w = m.pro_w, a.pro_eps = m.pro_eps, a.pro_out = m.pro_out, a.xq = m.xq;
    } else if (n_mm_ == 0 && norm_.held && norm_.out == x && norm_.k == k) {
        a.pro_x = norm_.x, a.pro_w = norm_.w, a.pro_eps = norm_.eps, a.pro_out = norm_.out, a.xq = norm_.xq;
    } else if (n_mm_ == 1 && m.norm_out == x && m.rows == k) {
        a.pro_x = m.res_out, a.pro_w = m.norm_w, a.pro_eps = m.norm_eps, a.pro_out = m.norm_out, a.xq = m.norm_xq;
        if (glu_.held) launch_glu();  // the SwiGLU pair before the residual product (its down product)
        launch_res(nullptr, 0, 0);    // an earlier residual product still held (not read since)
        res_ = m, res_held_ = true, n_mm_ = 0;
    } else {
        return false;
    }
    a.x = x, a.ldx = k;
    return true;
}

void CudaBackend::launch_res(cuda::GemvArgs* a, int n, int use) {
    const bool pro = n > 0 && a[0].pro_x && (sw_.pro_mask & use);
    for (int i = 0; i < n && !pro; ++i) a[i].pro_x = nullptr;
    release_norm(pro);
    if (!res_held_) return;
    res_held_ = false;
    for (Q8Cache& c : q8_) c.valid &= !(pro && c.buf == res_.norm_xq);  // then never written
    if (pro) res_.norm_out = nullptr, res_.norm_xq = nullptr;
    cuda::gemv(res_, stream_);
}

void CudaBackend::launch_norm() {
    cuda::rms_norm(norm_.x, norm_.w, norm_.eps, norm_.rows, norm_.k, norm_.out, stream_, norm_.xq);
}

void CudaBackend::release_norm(bool in_prologue) {
    if (!norm_.held) return;
    norm_.held = false;
    if (!in_prologue) return launch_norm();
    for (Q8Cache& c : q8_) c.valid &= c.buf != norm_.xq;
}

void CudaBackend::launch_glu() {
    glu_.held = false;
    cuda::GemvArgs gu[2] = {glu_.g, glu_.u};
    launch_res(gu, 2, cuda::gemv_glu_staged(gu[0], gu[1]) ? cuda::kProGluStaged : cuda::kProGluWave);
    cuda::gemv_glu(gu[0], gu[1], glu_.act, glu_.xq, stream_, n_mm_ == 1 ? &mm_[0].a : nullptr);
}

void CudaBackend::flush_mm() {
    if (glu_.held) launch_glu();
    if (n_mm_ == 0) {
        launch_res(nullptr, 0, 0);
        return;
    }
    cuda::GemvArgs a[cuda::kMaxSegs];
    for (int i = 0; i < n_mm_; ++i) a[i] = mm_[i].a;
    const int n = n_mm_;
    n_mm_ = 0;
    launch_res(a, n, 0);
    for (int i = 0, j; i < n; i = j) {  // one launch a run of one type (see matmul)
        for (j = i + 1; j < n && a[j].w.type == a[i].w.type;) ++j;
        cuda::gemv_multi(a + i, j - i, stream_);
    }
}

void CudaBackend::flush_rope() {
    if (n_rope_ > 0) flush_mm();  // products pending beside RoPEs were queued before them
    const int n = n_rope_;
    n_rope_ = 0;
    for (int i = 0; i < n; ++i) launch_rope(rope_[i]);
}

void CudaBackend::flush() {
    flush_mm();
    flush_rope();
}

void CudaBackend::invalidate_q8() {
    for (Q8Cache& c : q8_) c.valid = false;
}

void* CudaBackend::q8_sidecar(const float* src, int64_t rows, int64_t k, const void* avoid) {
    if (!sw_.fuse || rows > kGemvMaxTokens || k % 32 != 0 || rows == 0) return nullptr;
    Slot slot = next_side_ ? kXqB : kXqA;
    if (scratch_[slot].ptr && scratch_[slot].ptr == avoid) slot = slot == kXqA ? kXqB : kXqA;
    next_side_ = slot == kXqA;
    void* buf = scratch(slot, size_t(rows * cuda::q8_row_bytes(k)));
    q8_[slot] = {true, src, rows, k, buf};
    return buf;
}

void CudaBackend::prepare_x(cuda::GemvArgs& a, GgmlType type, const float* x, int64_t n_rows, int64_t k, Slot slot) {
    a.x = x, a.ldx = k;
    if (cuda::is_float_type(type)) return;
    for (const Q8Cache& c : q8_) {
        if (c.valid && c.src == x && c.rows == n_rows && c.k == k) {
            a.xq = c.buf;
            return;
        }
    }
    flush();  // the quantize below must follow whatever is waiting
    Q8Cache& c = q8_[slot];
    void* xq = scratch(slot, size_t(n_rows * cuda::q8_row_bytes(k)));
    cuda::quantize_q8(x, n_rows, k, k, xq, stream_);
    c = {true, x, n_rows, k, xq};
    a.xq = xq;
}

void CudaBackend::touch() {
    flush();
    invalidate_q8();
}

void CudaBackend::touch_out(const Tensor& out) {
    const auto* lo = static_cast<const uint8_t*>(out.data);
    const auto* hi = lo + out.n_bytes();
    for (Q8Cache& c : q8_) {
        const auto* s = reinterpret_cast<const uint8_t*>(c.src);
        if (c.valid && s < hi && s + size_t(c.rows * c.k) * 4 > lo) c.valid = false;
    }
}

}  // namespace cera::cuda
