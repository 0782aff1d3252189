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
//    types); larger batches expand the weight to F16 (a scratch buffer) and call cuBLAS (F32 weights: SGEMM).
//  - Ops are recorded into a step (step.h) and launched when the host needs their results (read,
//    write, synchronize, step_end). Between, the fusion passes (step_fusion.cpp; CudaOptions::fuse =
//    false turns them off) rewrite the step: products that share an input go out as one launch
//    (q/k/v, gate/up); gate/up and their SwiGLU are one kernel, which prefetches the next product's
//    weights into L2; a residual add and the RMSNorm of the sum run in the epilogue of the product
//    before them, or (one token) the norm in the prologue of the SwiGLU pair, q/k/v or in_proj launch
//    reading it; q/k RoPE + KV store are one launch, with the q/k/v products; in_proj + short conv
//    (K-quants) and LM head + greedy pick too. Ops that make a product's input also write its 8-bit
//    rows, so the product needs no quantize launch.
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
    CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&step_start_, cudaEventDisableTiming));
    for (int i = 0; i < 2; ++i) {
        CUDA_CHECK(cudaEventCreateWithFlags(&expand_done_[i], cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&expand_free_[i], cudaEventDisableTiming));
    }
    CUBLAS_CHECK(cuda::cublas().create(&cublas_));
    CUBLAS_CHECK(cuda::cublas().set_stream(cublas_, stream_));
    CUDA_CHECK(cudaMalloc(&cublas_ws_, kCublasWorkspace));
    CUDA_CHECK(cudaMalloc(&norm_ctr_, 64 * sizeof(unsigned)));
    CUDA_CHECK(cudaMemset(norm_ctr_, 0, 64 * sizeof(unsigned)));
    rules_.fuse = sw_.fuse, rules_.fuse_products = sw_.fuse_products, rules_.pro_mask = sw_.pro_mask;
    rules_.glu_stage = sw_.glu_stage, rules_.glu_wide = sw_.glu_wide, rules_.pro_xreg = sw_.pro_xreg;
    rules_.qkv_rows = sw_.qkv_rows, rules_.norm_ctr = norm_ctr_;
    rules_.caps = {cuda::gemv_norm_prologue_supported, cuda::gemv_norm_supported, cuda::gemv_glu_supported,
                   cuda::gemv_glu_staged, cuda::gemv_qkv_rope_supported, cuda::gemv_qkv_v_fits,
                   cuda::gemv_conv_supported, cuda::heavy_scales};
    pin_ = std::make_unique<cuda::PinnedStaging>();  // on this device (its events)
    CUBLAS_CHECK(cuda::cublas().set_workspace(cublas_, cublas_ws_, kCublasWorkspace));
    if (sw_.profile) replay_prof_ = std::make_unique<cuda::ReplayProfile>();
    mail_ok_ = mail_.init();
    cuda::trace_start();
}

CudaBackend::~CudaBackend() {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamSynchronize(side_);
    cuda::trace_finish();
    if (replay_prof_) replay_prof_->print(stream_);
    drop_graphs();
    for (auto& [p, bytes] : buffers_) cudaFree(p);
    for (auto& s : scratch_) cudaFree(s.ptr);
    if (cublas_) cuda::cublas().destroy(cublas_);
    cudaFree(cublas_ws_);
    cudaFree(norm_ctr_);
    pin_.reset();
    for (int i = 0; i < 2; ++i) cudaEventDestroy(expand_done_[i]), cudaEventDestroy(expand_free_[i]);
    cudaEventDestroy(step_start_);
    cudaStreamDestroy(side_);
    cudaStreamDestroy(stream_);
}

MemoryUse CudaBackend::memory_use() const {
    MemoryUse m;
    m.weights = weights_.bytes();
    for (const auto& [p, bytes] : buffers_) m.buffers += bytes;
    m.scratch = kCublasWorkspace + 64 * sizeof(unsigned) + rope_tables_.bytes();
    for (const Scratch& s : scratch_) m.scratch += s.bytes;
    return m;
}

Tensor CudaBackend::upload_weight(GgmlType type, std::span<const int64_t> ne, const void* host) {
    CERA_CHECK(ne.size() >= 1 && ne.size() <= 4);
    Tensor t;
    t.device = DeviceKind::kCuda;
    for (size_t i = 0; i < 4; ++i) t.ne[i] = i < ne.size() ? ne[i] : 1;
    CUDA_CHECK(cudaSetDevice(device_));
    t.data = weights_.upload(type, t.rows(), t.ne[0], host);
    t.type = type;  // kF16 when expanded (no kernel for the type)
    return t;
}

Tensor CudaBackend::alloc(GgmlType type, std::initializer_list<int64_t> ne) {
    CERA_CHECK(ne.size() >= 1 && ne.size() <= 4);
    CERA_CHECK(!capturing_, "alloc inside a recorded step");
    run_step();
    CUDA_CHECK(cudaSetDevice(device_));
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
    run_step();
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
                weights_.erase(t.data);
            }
        }
    }
    t = Tensor{};
}

void CudaBackend::write(const Tensor& dst, const void* host, size_t n_bytes, size_t offset) {
    run_step();
    if (n_bytes == 0) return;
    uint8_t* d = static_cast<uint8_t*>(dst.data) + offset;
    if (!pin_->write(d, host, n_bytes, stream_, capturing_))
        CUDA_CHECK(cudaMemcpyAsync(d, host, n_bytes, cudaMemcpyHostToDevice, stream_));
}

void CudaBackend::read(void* host, const Tensor& src, size_t n_bytes, size_t offset) {
    run_step();
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
    run_step();
    return pin_->read_async(src.data, n_bytes, stream_);
}

int CudaBackend::read_fed_async(const Tensor& out) {
    run_step();  // its pick is queued on the mailbox when launched
    const int t = mail_ok_ && !capturing_ ? mail_.ticket(out.data) : -1;
    if (t < 0) return read_async(out, sizeof(int32_t));
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
    run_step();
    CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.n_bytes(), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::zero(const Tensor& t) {
    run_step();
    CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.n_bytes(), stream_));
}

void CudaBackend::synchronize() {
    run_step();
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

bool CudaBackend::step_begin(uint64_t key) {
    run_step();
    CUDA_CHECK(cudaSetDevice(device_));
    CERA_CHECK(!capturing_, "step_begin inside a step");
    // The step's first kernel (eager or captured) waits for all the work queued before it.
    if (!sw_.graphs) return cuda::pdl_skip_next(), false;
    // Keys are bounded in number for a session (step kinds x batch sizes) but not across the adapter
    // groupings of a batch, so past kMaxGraphs keys the recordings start over.
    if (graphs_.size() >= kMaxGraphs && !graphs_.count(key)) {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        drop_graphs();
        graphs_.clear();
    }
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
    run_step();
    if (!capturing_) return;
    cudaGraphExec_t exec = end_capture();
    Graph& g = graphs_[capture_key_];
    g.exec = exec;
    g.feed_out = capture_feed_out_;
    // The captured ops have not run yet.
    CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    if (mail_ok_ && g.feed_out) mail_.queued(g.feed_out);
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
    CUDA_CHECK(cudaStreamSynchronize(side_));
    drop_graphs();
    if (s.ptr) CUDA_CHECK(cudaFree(s.ptr));
    s.bytes = (bytes + kScratchRound - 1) / kScratchRound * kScratchRound;
    CUDA_CHECK(cudaMalloc(&s.ptr, s.bytes));
    CUDA_CHECK(cudaMemsetAsync(s.ptr, 0, s.bytes, stream_));  // attention's counters start at zero
    return s.ptr;
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(int gpu_index, const CudaOptions& options) {
    return std::make_unique<cuda::CudaBackend>(gpu_index, options);
}

}  // namespace cera
