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
#include "backends/cuda/cuda_backend.h"

#include <cuda_fp16.h>

#include <cstring>
#include <vector>

#include "core/quant/quant.h"

namespace cera {
namespace cuda {

CudaBackend::CudaBackend(int device, const CudaOptions& options) : sw_(cuda::backend_switches(options)), device_(device) {
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

CudaBackend::~CudaBackend() {
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

MemoryUse CudaBackend::memory_use() const {
    MemoryUse m;
    m.weights = weights_.bytes();
    for (const auto& [p, bytes] : buffers_) m.buffers += bytes;
    m.scratch = kCublasWorkspace + 64 * sizeof(unsigned) + rope_tables_.bytes() + w16_.bytes();
    for (const Scratch& s : scratch_) m.scratch += s.bytes;
    return m;
}

Tensor CudaBackend::upload_weight(GgmlType type, std::span<const int64_t> ne, const void* host) {
    CERA_CHECK(ne.size() >= 1 && ne.size() <= 4);
    Tensor t;
    t.device = DeviceKind::kCuda;
    for (size_t i = 0; i < 4; ++i) t.ne[i] = i < ne.size() ? ne[i] : 1;
    t.data = weights_.upload(type, t.rows(), t.ne[0], host);
    t.type = type;  // kF16 when expanded (no kernel for the type)
    return t;
}

Tensor CudaBackend::alloc(GgmlType type, std::initializer_list<int64_t> ne) {
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

void CudaBackend::free(Tensor& t) {
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

void CudaBackend::write(const Tensor& dst, const void* host, size_t n_bytes, size_t offset) {
    touch();
    if (n_bytes == 0) return;
    uint8_t* d = static_cast<uint8_t*>(dst.data) + offset;
    if (!pin_->write(d, host, n_bytes, stream_, capturing_))
        CUDA_CHECK(cudaMemcpyAsync(d, host, n_bytes, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::read(void* host, const Tensor& src, size_t n_bytes, size_t offset) {
    flush();
    if (n_bytes == 0) return;
    const uint8_t* s = static_cast<const uint8_t*>(src.data) + offset;
    if (pin_->read(host, s, n_bytes, stream_, capturing_)) return;
    CUDA_CHECK(cudaMemcpyAsync(host, s, n_bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

int CudaBackend::read_async(const Tensor& src, size_t n_bytes) {
    if (!pin_->available()) return Backend::read_async(src, n_bytes);  // (then read_wait() is the base's too)
    CERA_CHECK(!capturing_ && n_bytes <= kAsyncReadMax, "read_async: %zu bytes (at most %zu), outside steps",
               n_bytes, kAsyncReadMax);
    flush();
    return pin_->read_async(src.data, n_bytes, stream_);
}

int CudaBackend::read_fed_async(const Tensor& out) {
    const int t = mail_ok_ && !capturing_ ? mail_.ticket(out.data) : -1;
    if (t < 0) return read_async(out, sizeof(int32_t));
    flush();
    return t;
}

void CudaBackend::read_wait(int ticket, void* host) {
    if (mail_ok_ && mail_.owns(ticket)) {
        const int32_t pick = mail_.wait(ticket, stream_);
        std::memcpy(host, &pick, sizeof pick);
        return;
    }
    if (!pin_->available()) return Backend::read_wait(ticket, host);
    pin_->read_wait(ticket, host);
}

void CudaBackend::copy(const Tensor& dst, const Tensor& src) {
    touch();
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.n_bytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::zero(const Tensor& t) {
    touch();
    CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.n_bytes(), stream_));
}

void CudaBackend::synchronize() {
    flush();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool CudaBackend::step_begin(uint64_t key) {
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

void CudaBackend::step_end() {
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

void CudaBackend::embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) {
    touch();
    const cuda::WeightRef w = weights_.ref(table);
    cuda::dequantize_rows(w, ids.as<const int32_t>(), ids.ne[0], scale, out.data, false, stream_);
}

void CudaBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
               const AttentionParams& p, const Tensor& out) {
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

void CudaBackend::scale(const Tensor& x, float s) {
    touch();
    cuda::scale(x.as<float>(), s, x.n_elements(), stream_);
}

void CudaBackend::top_logits(const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) {
    const int64_t n_g = top_logits_checked(x, m, gather, out);
    if (m > cuda::kTopLogitsMax || x.n_elements() >= INT32_MAX || n_g >= INT32_MAX) {  // beyond the kernel
        top_logits_via_host(*this, x, m, gather, out);
        return;
    }
    touch();
    cuda::top_logits(x.as<const float>(), x.n_elements(), m, n_g ? gather.as<const int32_t>() : nullptr, int(n_g),
                     out.as<int32_t>(), stream_);
}

void CudaBackend::argmax(const Tensor& x, const Tensor& out) {
    touch();
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kI32 && out.n_elements() >= x.rows(),
               "argmax: f32 rows in, one i32 per row out");
    cuda::argmax_rows(x.as<const float>(), x.rows(), x.ne[0], out.as<int32_t>(), stream_,
                      x.rows() == 1 ? scratch(kArgmax, cuda::kArgmaxScratchBytes) : nullptr);
}

void CudaBackend::moe_route(const Tensor& logits, const Tensor& bias, const MoeParams& p, const Tensor& ids,
               const Tensor& weights) {
    touch();
    cuda::moe_route(logits.as<const float>(), bias ? bias.as<const float>() : nullptr, logits.rows(),
                    int(logits.ne[0]), p.n_expert_used, p.gating == MoeGating::kSigmoid, p.normalize_weights,
                    p.weights_scale, ids.as<int32_t>(), weights.as<float>(), stream_);
}

void CudaBackend::moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
             const Tensor& ids, const Tensor& weights, const Tensor& out) {
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

cudaGraphExec_t CudaBackend::end_capture() {
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    cudaGraphExec_t exec = nullptr;
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return exec;
}

void CudaBackend::abandon_capture() {
    cudaGraphExec_t exec = end_capture();
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    if (mail_ok_ && capture_feed_out_) mail_.queued(capture_feed_out_);
    capture_feed_out_ = nullptr;
    cuda::pdl_skip_next();  // the next kernel waits for the whole graph
}

void CudaBackend::drop_graphs() {
    for (auto& [key, g] : graphs_)
        if (g.exec) cudaGraphExecDestroy(g.exec), g.exec = nullptr;
}

void* CudaBackend::scratch(Slot slot, size_t bytes) {
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

void CudaBackend::gemm(const cuda::WeightRef& w, int64_t rows, const float* x, int64_t n_tokens, float* out) {
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

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int gpu_index, const CudaOptions& options) {
    return std::make_unique<cuda::CudaBackend>(gpu_index, options);
}

}  // namespace cera
