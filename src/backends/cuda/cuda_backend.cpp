// The CUDA implementation of the backend interface (backend.h).
//  - Weights are uploaded once into device images (kernels.h): float types as they are, block
//    types split into aligned quant and scale streams; types without a kernel are expanded to F16
//    on the host. A registry (weight_registry.h) maps any pointer inside a weight (row slices,
//    experts) to its image.
//  - Every op is queued on one stream; nothing in an op waits for the host.
//  - Decode steps become CUDA graphs: the first step with a key runs eagerly (scratch buffers grow
//    to their size there), the second is captured, later ones replay. Growing a scratch buffer
//    drops every recorded graph, since they hold its old address.
//  - Matmuls of up to kGemvMaxTokens tokens use the GEMV kernels (8-bit activations for block
//    types); larger batches expand the weight to F16 and call cuBLAS (F32 weights: SGEMM).
//  - Decode fusion (CudaOptions::fuse = false turns it off), with the backend interface unchanged: a GEMV is
//    held back until the next call, so products that share an input go out as one launch (q/k/v,
//    gate/up), gate/up followed by swiglu() become one kernel with a SwiGLU epilogue, and a GEMV
//    followed by add() of its output takes the residual add in its epilogue, and stays held: an
//    rms_norm() of the sum is made by that launch's last block, or (one token) in the prologue of the
//    staged SwiGLU pair or q/k/v launch reading it. A SwiGLU pair is held until the next product,
//    whose weights it prefetches into L2. norm_rope() of q and k followed by kv_store() is one launch,
//    with the q/k/v products when still held (gemv_fused.cu), and so is a one-token in_proj followed
//    by short_conv() (K-quants). rms_norm, swiglu, the decode short conv and attention also write
//    their output's 8-bit rows, recorded as the cached quantization of that tensor, so the next GEMV
//    needs no quantize launch. Every other call (and read, write, sync) first queues whatever is held
//    back, in order. lfm2-1.2b Q4_0: 274 -> 84 kernels per decoded token.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/backend_switches.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/pick_mail.h"
#include "backends/cuda/pinned_staging.h"
#include "backends/cuda/replay_profile.h"
#include "backends/cuda/rope_tables.h"
#include "backends/cuda/w16_cache.h"
#include "backends/cuda/weight_registry.h"
#include "core/check.h"
#include "core/quant/quant.h"


namespace cera {
namespace {

constexpr int64_t kGemvMaxTokens = 8;
constexpr size_t kCublasWorkspace = 32u << 20;
constexpr size_t kScratchRound = 1u << 20;  // scratch grows in whole MiB, to what the largest use needs

// Scratch buffers. kXq / kXq2: 8-bit activations quantized for a GEMV; kXqA / kXqB: 8-bit rows
// written by the op that produces a GEMV's input (alternating, so a kernel never writes the rows
// it reads).
enum Slot { kXq, kXq2, kXqA, kXqB, kW16, kX16, kAttn, kMoeG, kMoeU, kMoeY, kMoeR, kArgmax, kSlots };
constexpr int kQ8Slots = 4;  // kXq .. kXqB

class CudaBackend final : public Backend {
   public:
    CudaBackend(int device, const CudaOptions& options) : sw_(cuda::backend_switches(options)), device_(device) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess || device < 0 || device >= n) {
            cudaGetLastError();
            throw_error(ErrorCode::kDevice, "device cuda:%d: not present (%d CUDA devices)", device, n);
        }
        CUDA_CHECK(cudaSetDevice(device));
        CUDA_CHECK(cudaGetDeviceProperties(&props_, device));
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        CUBLAS_CHECK(cublasCreate(&cublas_));
        CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
        CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspace));
        CUDA_CHECK(cudaMalloc(&norm_ctr_, 64 * sizeof(unsigned)));
        CUDA_CHECK(cudaMemset(norm_ctr_, 0, 64 * sizeof(unsigned)));
        pin_ = std::make_unique<cuda::PinnedStaging>();  // on this device (its events)
        CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspace));
        if (sw_.profile) replay_prof_ = std::make_unique<cuda::ReplayProfile>();
        mail_ok_ = mail_.init();
        cuda::trace_start();
    }

    ~CudaBackend() override {
        cudaSetDevice(device_);
        cudaStreamSynchronize(stream_);
        cuda::trace_finish();
        if (replay_prof_) replay_prof_->print(stream_);
        drop_graphs();
        for (auto& [p, bytes] : buffers_) cudaFree(p);
        for (auto& s : scratch_) cudaFree(s.ptr);
        cublasDestroy(cublas_);
        cudaFree(cublas_ws_);
        cudaFree(norm_ctr_);
        pin_.reset();
        cudaStreamDestroy(stream_);
    }

    DeviceKind kind() const override { return DeviceKind::kCuda; }
    MemoryUse memory_use() const override {
        MemoryUse m;
        m.weights = weights_.bytes();
        for (const auto& [p, bytes] : buffers_) m.buffers += bytes;
        m.scratch = kCublasWorkspace + 64 * sizeof(unsigned) + rope_tables_.bytes() + w16_.bytes();
        for (const Scratch& s : scratch_) m.scratch += s.bytes;
        return m;
    }
    std::string description() const override {
        return "cuda:" + std::to_string(device_) + " " + props_.name + " (sm_" + std::to_string(props_.major) +
               std::to_string(props_.minor) + ", " + std::to_string(props_.multiProcessorCount) + " SMs)";
    }

    // ------------------------------------------------------------ memory
    Tensor upload_weight(GgmlType type, std::span<const int64_t> ne, const void* host) override {
        CERA_CHECK(ne.size() >= 1 && ne.size() <= 4);
        Tensor t;
        t.device = DeviceKind::kCuda;
        for (size_t i = 0; i < 4; ++i) t.ne[i] = i < ne.size() ? ne[i] : 1;
        t.data = weights_.upload(type, t.rows(), t.ne[0], host);
        t.type = type;  // kF16 when expanded (no kernel for the type)
        return t;
    }

    Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne) override {
        CERA_CHECK(ne.size() >= 1 && ne.size() <= 4);
        CERA_CHECK(!capturing_, "alloc inside a recorded step");
        touch();  // a new buffer may reuse a cached input's address
        Tensor t;
        t.type = type;
        t.device = DeviceKind::kCuda;
        size_t i = 0;
        for (int64_t n : ne) t.ne[i++] = n;
        for (; i < 4; ++i) t.ne[i] = 1;
        const size_t bytes = std::max<size_t>(256, t.n_bytes());
        void* p = nullptr;
        CUDA_CHECK(cudaMalloc(&p, bytes));
        CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
        buffers_.emplace(p, bytes);
        t.data = p;
        return t;
    }

    void free(Tensor& t) override {
        touch();
        if (t.data) {
            auto it = buffers_.find(t.data);
            const cuda::WeightInfo* wt = weights_.at(t.data);
            if (it != buffers_.end() || wt) {
                CUDA_CHECK(cudaStreamSynchronize(stream_));
                drop_graphs();  // a graph may hold the address
                if (it != buffers_.end()) {
                    CUDA_CHECK(cudaFree(t.data));
                    buffers_.erase(it);
                } else {
                    w16_.drop(wt->image, wt->rows, wt->k);
                    weights_.erase(t.data);
                }
            }
        }
        t = Tensor{};
    }

    // Small transfers go through pinned host memory (pinned_staging.h); larger ones, and writes while a
    // step is being captured, take the pageable path, which stages the bytes before returning. Either
    // way the caller may reuse its memory on return.
    void write(const Tensor& dst, const void* host, size_t n_bytes, size_t offset) override {
        touch();
        if (n_bytes == 0) return;
        uint8_t* d = static_cast<uint8_t*>(dst.data) + offset;
        if (!pin_->write(d, host, n_bytes, stream_, capturing_))
            CUDA_CHECK(cudaMemcpyAsync(d, host, n_bytes, cudaMemcpyHostToDevice, stream_));
    }
    void read(void* host, const Tensor& src, size_t n_bytes, size_t offset) override {
        flush();
        if (n_bytes == 0) return;
        const uint8_t* s = static_cast<const uint8_t*>(src.data) + offset;
        if (pin_->read(host, s, n_bytes, stream_, capturing_)) return;
        CUDA_CHECK(cudaMemcpyAsync(host, s, n_bytes, cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    int read_async(const Tensor& src, size_t n_bytes) override {
        if (!pin_->available()) return Backend::read_async(src, n_bytes);  // (then read_wait() is the base's too)
        CERA_CHECK(!capturing_ && n_bytes <= kAsyncReadMax, "read_async: %zu bytes (at most %zu), outside steps",
                   n_bytes, kAsyncReadMax);
        flush();
        return pin_->read_async(src.data, n_bytes, stream_);
    }
    int read_fed_async(const Tensor& out) override {
        const int t = mail_ok_ && !capturing_ ? mail_.ticket(out.data) : -1;
        if (t < 0) return read_async(out, sizeof(int32_t));
        flush();
        return t;
    }
    void read_wait(int ticket, void* host) override {
        if (mail_ok_ && mail_.owns(ticket)) {
            const int32_t pick = mail_.wait(ticket, stream_);
            std::memcpy(host, &pick, sizeof pick);
            return;
        }
        if (!pin_->available()) return Backend::read_wait(ticket, host);
        pin_->read_wait(ticket, host);
    }
    bool asynchronous() const override { return true; }

    void copy(const Tensor& dst, const Tensor& src) override {
        touch();
        CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.n_bytes(), cudaMemcpyDeviceToDevice, stream_));
    }
    void zero(const Tensor& t) override {
        touch();
        CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.n_bytes(), stream_));
    }
    void synchronize() override {
        flush();
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    // ------------------------------------------------------------ graphs
    bool step_begin(uint64_t key) override {
        touch();
        next_side_ = false;  // every step with a key uses the same side buffers
        CERA_CHECK(!capturing_, "step_begin inside a step");
        // The step's first kernel (eager or captured) waits for all the work queued before it.
        if (!sw_.graphs) return cuda::pdl_skip_next(), false;
        Graph& g = graphs_[key];
        if (g.exec) {
            if (replay_prof_) replay_prof_->begin(stream_);
            CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
            if (mail_ok_ && g.feed_out) mail_.queued(g.feed_out);
            if (replay_prof_) replay_prof_->end(stream_);
            return true;
        }
        cuda::pdl_skip_next();
        if (++g.seen >= 2) {
            CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
            capturing_ = true;
            capture_feed_out_ = nullptr;
            capture_key_ = key;
        }
        return false;
    }

    void step_end() override {
        touch();
        if (!capturing_) return;
        cudaGraphExec_t exec = end_capture();
        Graph& g = graphs_[capture_key_];
        g.exec = exec;
        g.feed_out = capture_feed_out_;
        // The captured ops have not run yet.
        CUDA_CHECK(cudaGraphLaunch(exec, stream_));
        if (mail_ok_ && g.feed_out) mail_.queued(g.feed_out);
    }

    // --------------------------------------------------------------- ops
    void embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) override {
        touch();
        const cuda::WeightRef w = weights_.ref(table);
        cuda::dequantize_rows(w, ids.as<const int32_t>(), ids.ne[0], scale, out.data, false, stream_);
    }

    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
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

    void matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) override {
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

    void norm_rope(const Tensor& x, int n_head, int head_dim, const Tensor& norm_w, float eps, const Tensor& pos,
                   const RopeParams& rope) override {
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

    void kv_store(const Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& k_cache,
                  const Tensor& v_cache) override {
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

    void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                   const AttentionParams& p, const Tensor& out) override {
        touch();
        CERA_CHECK(k_cache.type == v_cache.type && (k_cache.type == GgmlType::kF16 || k_cache.type == GgmlType::kF32));
        cuda::AttentionArgs a;
        a.q = q.as<const float>(), a.k_cache = k_cache.data, a.v_cache = v_cache.data;
        a.f16 = k_cache.type == GgmlType::kF16;
        a.pos = pos.as<const int32_t>();
        a.n_tokens = q.rows(), a.n_ctx = k_cache.ne[1];
        a.n_head = p.n_head, a.n_head_kv = p.n_head_kv, a.head_dim = p.head_dim;
        a.scale = p.scale, a.sliding_window = p.sliding_window;
        a.out = out.as<float>();
        const size_t n = cuda::attention_scratch_floats(a);
        a.partial = n ? static_cast<float*>(scratch(kAttn, n * sizeof(float))) : nullptr;
        if (p.head_dim % 32 == 0 && p.head_dim <= 128)
            a.out_xq = q8_sidecar(out.as<const float>(), a.n_tokens, int64_t(p.n_head) * p.head_dim, nullptr);
        cuda::attention(a, stream_);
    }

    void short_conv(const Tensor& bcx, const Tensor& w, const Tensor& state, const Tensor& out,
                    const Tensor& state_prev) override {
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

    void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override {
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
    void add(const Tensor& a, const Tensor& b, float scale, const Tensor& out) override {
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
    void scale(const Tensor& x, float s) override {
        touch();
        cuda::scale(x.as<float>(), s, x.n_elements(), stream_);
    }

    void top_logits(const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) override {
        const int64_t n_g = top_logits_checked(x, m, gather, out);
        if (m > cuda::kTopLogitsMax || x.n_elements() >= INT32_MAX || n_g >= INT32_MAX) {  // beyond the kernel
            top_logits_via_host(*this, x, m, gather, out);
            return;
        }
        touch();
        cuda::top_logits(x.as<const float>(), x.n_elements(), m, n_g ? gather.as<const int32_t>() : nullptr, int(n_g),
                         out.as<int32_t>(), stream_);
    }

    void argmax(const Tensor& x, const Tensor& out) override {
        touch();
        CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kI32 && out.n_elements() >= x.rows(),
                   "argmax: f32 rows in, one i32 per row out");
        cuda::argmax_rows(x.as<const float>(), x.rows(), x.ne[0], out.as<int32_t>(), stream_,
                          x.rows() == 1 ? scratch(kArgmax, cuda::kArgmaxScratchBytes) : nullptr);
    }

    void argmax_feed(const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos) override {
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

    void moe_route(const Tensor& logits, const Tensor& bias, const MoeParams& p, const Tensor& ids,
                   const Tensor& weights) override {
        touch();
        cuda::moe_route(logits.as<const float>(), bias ? bias.as<const float>() : nullptr, logits.rows(),
                        int(logits.ne[0]), p.n_expert_used, p.gating == MoeGating::kSigmoid, p.normalize_weights,
                        p.weights_scale, ids.as<int32_t>(), weights.as<float>(), stream_);
    }

    void moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                 const Tensor& ids, const Tensor& weights, const Tensor& out) override {
        const int64_t n_tokens = x.rows(), n_embd = x.ne[0], n_ff = gate_exps.ne[1];
        const int k = int(ids.ne[0]);
        const int64_t n_slots = n_tokens * k;
        CERA_CHECK(n_slots <= 65535, "moe_ffn: %lld (token, expert) slots in one call", (long long)n_slots);
        touch();
        float* g = static_cast<float*>(scratch(kMoeG, size_t(n_slots * n_ff) * sizeof(float)));
        float* u = static_cast<float*>(scratch(kMoeU, size_t(n_slots * n_ff) * sizeof(float)));
        float* y = static_cast<float*>(scratch(kMoeY, size_t(n_slots * n_embd) * sizeof(float)));
        // Batches: the slots grouped by expert (moe.cu), so that each expert's weights are read once
        // per call, for the block-quantized matrices; decode (one token) and float weights keep one
        // GEMV slot per (token, expert).
        const int n_expert = int(gate_exps.ne[2]);
        const bool grouped = n_tokens > 1 && sw_.moe_grouped &&
                             (cuda::moe_grouped_supported(gate_exps.type, n_embd, n_expert) ||
                              cuda::moe_grouped_supported(up_exps.type, n_embd, n_expert) ||
                              cuda::moe_grouped_supported(down_exps.type, n_ff, n_expert));
        int32_t* route = nullptr;
        if (grouped) {
            CERA_CHECK(up_exps.ne[2] == n_expert && down_exps.ne[2] == n_expert);
            route = static_cast<int32_t*>(scratch(kMoeR, cuda::moe_group_ints(n_expert, n_slots) * sizeof(int32_t)));
            cuda::moe_group(ids.as<const int32_t>(), n_slots, n_expert, route, stream_);
        }
        auto run = [&](const Tensor& w, int64_t rows, const float* in, int64_t n_in, int x_div, Slot slot, float* o) {
            cuda::GemvArgs a;
            a.w = weights_.ref(w), a.rows = rows, a.n_y = int(n_slots), a.ids = ids.as<const int32_t>();
            a.x_div = x_div;
            prepare_x(a, a.w.type, in, n_in, a.w.k, slot);
            a.y = o, a.ldy = rows;
            if (route && cuda::moe_grouped_supported(a.w.type, a.w.k, n_expert)) {
                cuda::MoeGemvArgs m;
                m.w = a.w, m.rows = rows, m.n_expert = n_expert, m.route = route, m.n_slots = n_slots;
                m.xq = a.xq, m.x_div = x_div, m.y = o, m.ldy = rows, m.tile_rows = sw_.moe_tile_rows;
                cuda::moe_gemv_grouped(m, stream_);
                return;
            }
            cuda::gemv(a, stream_);
        };
        run(gate_exps, n_ff, x.as<const float>(), n_tokens, k, kXq, g);
        run(up_exps, n_ff, x.as<const float>(), n_tokens, k, kXq, u);
        cuda::swiglu(g, u, n_slots * n_ff, g, stream_);
        run(down_exps, n_embd, g, n_slots, 1, kXq2, y);
        cuda::moe_combine(y, weights.as<const float>(), n_tokens, k, n_embd, out.as<float>(), stream_);
        touch();
    }

   private:
    // A step key: how often it was seen, and once recorded its graph.
    struct Graph {
        int seen = 0;
        cudaGraphExec_t exec = nullptr;
        const void* feed_out = nullptr;  // the out tensor of its argmax_feed (the mailbox's count)
    };
    struct Q8Cache {
        bool valid = false;
        const float* src = nullptr;
        int64_t rows = 0, k = 0;
        void* buf = nullptr;
    };
    struct Scratch {
        void* ptr = nullptr;
        size_t bytes = 0;
    };
    struct PendingMm {
        cuda::GemvArgs a;
        Tensor out;
    };
    struct PendingRope {
        Tensor x;
        int n_head = 0, head_dim = 0;
        Tensor norm_w;
        float eps = 0.0f;
        Tensor pos;
        RopeParams rope;
    };

    void attach_rope_table(cuda::RopeArgs& r, int64_t rows) {
        rope_tables_.attach(r, rows, capturing_, stream_, [&] {
            CUDA_CHECK(cudaStreamSynchronize(stream_));
            drop_graphs();
        });
    }

    static cuda::RopeArgs rope_args(const RopeParams& rope) {
        cuda::RopeArgs r;
        r.mode = rope.mode == RopeMode::kNone ? 0 : rope.mode == RopeMode::kNorm ? 1 : 2;
        r.n_rot = rope.n_rot, r.freq_base = rope.freq_base, r.freq_scale = rope.freq_scale;
        r.freq_factors = rope.freq_factors ? rope.freq_factors.as<const float>() : nullptr;
        return r;
    }
    void launch_rope(const PendingRope& p) {
        cuda::norm_rope(p.x.as<float>(), p.x.rows(), p.n_head, p.head_dim,
                        p.norm_w ? p.norm_w.as<const float>() : nullptr, p.eps, p.pos.as<const int32_t>(),
                        rope_args(p.rope), stream_);
    }

    // Whether products of `type` are fused with their consumer: the short conv (conv) or q/k RoPE.
    bool fuses_product(GgmlType type, bool conv) const {
        const int block = cuda::quant_layout(type).block_elems;
        return sw_.fuse_products == 2 || (sw_.fuse_products == 1 && (conv ? cuda::heavy_scales(type) : block > 0));
    }
    // The pending products as a's q, k and v in that order, when they can go out with its RoPEs and
    // KV store as one launch (gemv_fused.cu).
    bool pending_qkv(const cuda::QkvRopeArgs& a, cuda::GemvArgs (&qkv)[3]) const {
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

    // Whether product a (w, rows, n_y set) may read x (k floats, one token) through an RMSNorm prologue
    // (GemvArgs::pro_x): x is the norm the held residual product would make (then held in res_ until a
    // launch reading x chooses, launch_res), or the prologue of the products a joins. a keeps xq too.
    bool take_prologue(cuda::GemvArgs& a, const float* x, int64_t k) {
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
    // Launches the held residual product (res_) before the launch of the products reading its norm:
    // without the norm when they take their prologue (`use`, a mask of ProKind bits: the
    // launch kind), else with it; a (n products) are set up for the choice.
    void launch_res(cuda::GemvArgs* a, int n, int use) {
        const bool pro = n > 0 && a[0].pro_x && (sw_.pro_mask & use);
        for (int i = 0; i < n && !pro; ++i) a[i].pro_x = nullptr;
        release_norm(pro);
        if (!res_held_) return;
        res_held_ = false;
        for (Q8Cache& c : q8_) c.valid &= !(pro && c.buf == res_.norm_xq);  // then never written
        if (pro) res_.norm_out = nullptr, res_.norm_xq = nullptr;
        cuda::gemv(res_, stream_);
    }
    void launch_norm() {
        cuda::rms_norm(norm_.x, norm_.w, norm_.eps, norm_.rows, norm_.k, norm_.out, stream_, norm_.xq);
    }
    // The held norm (rms_norm), if any, leaves: made in the prologue of the launch reading it (its 8-bit
    // rows then never written), or launched now.
    void release_norm(bool in_prologue) {
        if (!norm_.held) return;
        norm_.held = false;
        if (!in_prologue) return launch_norm();
        for (Q8Cache& c : q8_) c.valid &= c.buf != norm_.xq;
    }
    void launch_glu() {
        glu_.held = false;
        cuda::GemvArgs gu[2] = {glu_.g, glu_.u};
        launch_res(gu, 2, cuda::gemv_glu_staged(gu[0], gu[1]) ? cuda::kProGluStaged : cuda::kProGluWave);
        cuda::gemv_glu(gu[0], gu[1], glu_.act, glu_.xq, stream_, n_mm_ == 1 ? &mm_[0].a : nullptr);
    }

    // Launches the held SwiGLU pair (telling it the product after it), then the products waiting to
    // be grouped or fused (one launch).
    void flush_mm() {
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
    void flush_rope() {
        if (n_rope_ > 0) flush_mm();  // products pending beside RoPEs were queued before them
        const int n = n_rope_;
        n_rope_ = 0;
        for (int i = 0; i < n; ++i) launch_rope(rope_[i]);
    }
    // Everything deferred goes to the stream, in order (at most one kind is pending at a time).
    void flush() {
        flush_mm();
        flush_rope();
    }
    void invalidate_q8() {
        for (Q8Cache& c : q8_) c.valid = false;
    }

    // The buffer for the 8-bit rows of `src` ([rows, k] f32) that the op about to be queued writes
    // beside it, recorded as the cached quantization of src; null when not worth it (prefill) or
    // not possible. `avoid`: a buffer the op reads.
    void* q8_sidecar(const float* src, int64_t rows, int64_t k, const void* avoid) {
        if (!sw_.fuse || rows > kGemvMaxTokens || k % 32 != 0 || rows == 0) return nullptr;
        Slot slot = next_side_ ? kXqB : kXqA;
        if (scratch_[slot].ptr && scratch_[slot].ptr == avoid) slot = slot == kXqA ? kXqB : kXqA;
        next_side_ = slot == kXqA;
        void* buf = scratch(slot, size_t(rows * cuda::q8_row_bytes(k)));
        q8_[slot] = {true, src, rows, k, buf};
        return buf;
    }

    // Ends the step's capture: its graph, instantiated (not launched yet).
    cudaGraphExec_t end_capture() {
        capturing_ = false;
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
        cudaGraphExec_t exec = nullptr;
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
        return exec;
    }
    // Ends the capture of the current step without keeping its graph: what was captured is launched
    // once (it has not run yet), and the rest of the step runs eagerly (step_end sees no capture).
    void abandon_capture() {
        cudaGraphExec_t exec = end_capture();
        CUDA_CHECK(cudaGraphLaunch(exec, stream_));
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        if (mail_ok_ && capture_feed_out_) mail_.queued(capture_feed_out_);
        capture_feed_out_ = nullptr;
        cuda::pdl_skip_next();  // the next kernel waits for the whole graph
    }

    // Forgets the recorded graphs (their buffers moved); keys keep their counts, so a key seen
    // before is recorded again at its next step.
    void drop_graphs() {
        for (auto& [key, g] : graphs_)
            if (g.exec) cudaGraphExecDestroy(g.exec), g.exec = nullptr;
    }

    // A grow-only scratch buffer. Growing frees the old one, so recorded graphs are dropped. Inside a
    // recorded step the capture ends there: the ops captured so far run as a graph of their own, the
    // rest of the step eagerly, and the step's key is recorded again at its next step.
    void* scratch(Slot slot, size_t bytes) {
        Scratch& s = scratch_[slot];
        if (s.bytes >= bytes) return s.ptr;
        if (capturing_) abandon_capture();
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        drop_graphs();
        if (s.ptr) CUDA_CHECK(cudaFree(s.ptr));
        touch();
        s.bytes = (bytes + kScratchRound - 1) / kScratchRound * kScratchRound;
        CUDA_CHECK(cudaMalloc(&s.ptr, s.bytes));
        CUDA_CHECK(cudaMemsetAsync(s.ptr, 0, s.bytes, stream_));  // attention's counters start at zero
        return s.ptr;
    }

    // The activations a GEMV reads: f32 for float weights, 8-bit rows for block types. The 8-bit
    // rows of the last quantized input are kept until an op may have changed it, so matmuls that
    // share an input (q/k/v, gate/up) quantize it once.
    void prepare_x(cuda::GemvArgs& a, GgmlType type, const float* x, int64_t n_rows, int64_t k, Slot slot) {
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
    // Queues what waits, then forgets the cached 8-bit inputs (any op but a matmul may write them);
    // a matmul forgets only when its output overlaps a cached input.
    void touch() {
        flush();
        invalidate_q8();
    }
    void touch_out(const Tensor& out) {
        const auto* lo = static_cast<const uint8_t*>(out.data);
        const auto* hi = lo + out.n_bytes();
        for (Q8Cache& c : q8_) {
            const auto* s = reinterpret_cast<const uint8_t*>(c.src);
            if (c.valid && s < hi && s + size_t(c.rows * c.k) * 4 > lo) c.valid = false;
        }
    }

    // out[t] = W x[t] for a batch: cuBLAS on F16 (or F32) operands, f32 accumulation.
    void gemm(const cuda::WeightRef& w, int64_t rows, const float* x, int64_t n_tokens, float* out) {
        const int64_t k = w.k;
        const float one = 1.0f, zero = 0.0f;
        if (w.type == GgmlType::kF32) {
            const float* wp = static_cast<const float*>(w.image) + w.row0 * k;
            CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n_tokens), int(k), &one, wp,
                                     int(k), x, int(k), &zero, out, int(rows)));
            return;
        }
        const void* w16;
        if (w.type == GgmlType::kF16) {
            w16 = static_cast<const uint16_t*>(w.image) + w.row0 * k;
        } else if (const void* c = w16_.get(w, capturing_, stream_)) {
            w16 = static_cast<const uint16_t*>(c) + w.row0 * k;
        } else {
            void* buf = scratch(kW16, size_t(rows * k) * 2);
            cuda::dequantize_rows(w, nullptr, rows, 1.0f, buf, true, stream_);
            w16 = buf;
        }
        void* x16 = scratch(kX16, size_t(n_tokens * k) * 2);
        cuda::convert_f32_to_f16(x, n_tokens * k, x16, stream_);
        CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), int(n_tokens), int(k), &one, w16,
                                  CUDA_R_16F, int(k), x16, CUDA_R_16F, int(k), &zero, out, CUDA_R_32F, int(rows),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }

    const cuda::BackendSwitches sw_;
    int device_;
    cudaDeviceProp props_{};
    cudaStream_t stream_ = nullptr;
    cuda::PickMailbox mail_;  // the greedy pick without a copy (pick_mail.h)
    bool mail_ok_ = false;
    const void* capture_feed_out_ = nullptr;  // the step being captured feeds this tensor
    cublasHandle_t cublas_ = nullptr;
    void* cublas_ws_ = nullptr;
    unsigned* norm_ctr_ = nullptr;  // the residual GEMV's RMSNorm tickets (GemvArgs::norm_ctr), zero between launches
    cuda::WeightRegistry weights_;  // uploaded weights (weight_registry.h)
    cuda::W16Cache w16_;            // F16 expansions for the cuBLAS path
    std::unordered_map<void*, size_t> buffers_;  // alloc()'s buffers and their bytes
    Scratch scratch_[kSlots];
    Q8Cache q8_[kQ8Slots];  // indexed by Slot kXq .. kXqB
    bool next_side_ = false;
    std::unique_ptr<cuda::PinnedStaging> pin_;  // small host transfers (pinned_staging.h)
    cuda::GemvArgs res_;  // the held residual product (take_prologue)
    bool res_held_ = false;
    struct Norm {  // a one-token RMSNorm held for the prologue of the products reading it (rms_norm)
        const float* x;
        const float* w;
        float eps;
        int64_t rows, k;
        float* out;
        void* xq;
        bool held;
    } norm_ = {};
    PendingMm mm_[cuda::kMaxSegs];
    int n_mm_ = 0;
    PendingRope rope_[2];
    int n_rope_ = 0;
    struct PendingGlu {
        cuda::GemvArgs g, u;
        float* act = nullptr;
        void* xq = nullptr;
        bool held = false;
    } glu_;  // a SwiGLU pair (swiglu) held until the next op
    cuda::RopeTables rope_tables_;  // the decode RoPE's (cos, sin) tables (rope_tables.h)
    std::unordered_map<uint64_t, Graph> graphs_;
    bool capturing_ = false;
    std::unique_ptr<cuda::ReplayProfile> replay_prof_;  // with sw_.profile
    uint64_t capture_key_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int gpu_index, const CudaOptions& options) {
    return std::make_unique<CudaBackend>(gpu_index, options);
}

}  // namespace cera
