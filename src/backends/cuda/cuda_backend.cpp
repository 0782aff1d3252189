// The CUDA implementation of the backend interface (backend.h).
//  - Weights are uploaded once into device images (kernels.h): float types as they are, block
//    types split into aligned quant and scale streams; types without a kernel are expanded to F16
//    on the host. A registry maps any pointer inside a weight (row slices, experts) to its image.
//  - Every op is queued on one stream; nothing in an op waits for the host.
//  - Decode steps become CUDA graphs: the first step with a key runs eagerly (scratch buffers grow
//    to their size there), the second is captured, later ones replay. Growing a scratch buffer
//    drops every recorded graph, since they hold its old address.
//  - Matmuls of up to kGemvMaxTokens tokens use the GEMV kernels (8-bit activations for block
//    types); larger batches expand the weight to F16 and call cuBLAS (F32 weights: SGEMM).
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/kernels.h"
#include "core/check.h"
#include "core/quant/quant.h"

#define CUDA_CHECK(call)                                                                       \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                             \
        CERA_CHECK(err_ == cudaSuccess, "CUDA error %s: %s", #call, cudaGetErrorString(err_)); \
    } while (0)
#define CUBLAS_CHECK(call)                                                          \
    do {                                                                            \
        cublasStatus_t st_ = (call);                                                \
        CERA_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error %d: %s", int(st_), #call); \
    } while (0)

namespace cera {
namespace {

constexpr int64_t kGemvMaxTokens = 8;
constexpr size_t kCublasWorkspace = 32u << 20;

struct WeightInfo {
    void* image = nullptr;
    size_t bytes = 0;       // image bytes
    size_t gguf_bytes = 0;  // rows * row_size(type, k): the span Tensor pointers move in
    GgmlType type = GgmlType::kF32;
    int64_t rows = 0, k = 0;
};

enum Slot { kXq, kXq2, kW16, kX16, kAttn, kMoeG, kMoeU, kMoeY, kSlots };

class CudaBackend final : public Backend {
   public:
    explicit CudaBackend(int device) : device_(device) {
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
        CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_ws_, kCublasWorkspace));
        const char* g = std::getenv("CERA_CUDA_GRAPHS");
        graphs_enabled_ = !(g && std::strcmp(g, "0") == 0);
    }

    ~CudaBackend() override {
        cudaSetDevice(device_);
        cudaStreamSynchronize(stream_);
        drop_graphs();
        for (auto& [p, w] : weights_) cudaFree(w.image);
        for (void* p : buffers_) cudaFree(p);
        for (auto& s : scratch_) cudaFree(s.ptr);
        cublasDestroy(cublas_);
        cudaFree(cublas_ws_);
        cudaStreamDestroy(stream_);
    }

    DeviceKind kind() const override { return DeviceKind::kCuda; }
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
        const int64_t k = t.ne[0], rows = t.rows();
        std::vector<uint8_t> expanded;
        if (!cuda::weight_type_supported(type)) {
            // No kernel for this type: expand to F16 once, on the host.
            if (!can_dequantize(type))
                throw_error(ErrorCode::kUnsupported, "CUDA backend: weight type %s is not supported", type_name(type));
            std::vector<float> row(static_cast<size_t>(k));
            expanded.resize(size_t(rows * k) * 2);
            const size_t rb = row_size(type, k);
            for (int64_t r = 0; r < rows; ++r) {
                dequantize_row_ref(type, static_cast<const uint8_t*>(host) + size_t(r) * rb, row.data(), k);
                uint16_t* d = reinterpret_cast<uint16_t*>(expanded.data()) + r * k;
                for (int64_t i = 0; i < k; ++i) d[i] = __half_as_ushort(__float2half_rn(row[size_t(i)]));
            }
            host = expanded.data();
            type = GgmlType::kF16;
        }
        t.type = type;
        WeightInfo w;
        w.type = type, w.rows = rows, w.k = k;
        w.bytes = cuda::weight_image_bytes(type, rows, k);
        w.gguf_bytes = row_size(type, k) * size_t(rows);
        CUDA_CHECK(cudaMalloc(&w.image, std::max<size_t>(w.bytes, 16)));
        if (cuda::quant_layout(type).block_elems > 0) {
            std::vector<uint8_t> img(w.bytes);
            cuda::make_weight_image(type, host, rows, k, img.data());
            CUDA_CHECK(cudaMemcpy(w.image, img.data(), w.bytes, cudaMemcpyHostToDevice));
        } else {
            CUDA_CHECK(cudaMemcpy(w.image, host, w.bytes, cudaMemcpyHostToDevice));
        }
        weights_[reinterpret_cast<uintptr_t>(w.image)] = w;
        t.data = w.image;
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
        buffers_.insert(p);
        t.data = p;
        return t;
    }

    void free(Tensor& t) override {
        touch();
        if (t.data) {
            auto it = buffers_.find(t.data);
            auto wt = weights_.find(reinterpret_cast<uintptr_t>(t.data));
            if (it != buffers_.end() || wt != weights_.end()) {
                CUDA_CHECK(cudaStreamSynchronize(stream_));
                drop_graphs();  // a graph may hold the address
                if (it != buffers_.end()) {
                    CUDA_CHECK(cudaFree(t.data));
                    buffers_.erase(it);
                } else {
                    CUDA_CHECK(cudaFree(wt->second.image));
                    weights_.erase(wt);
                }
            }
        }
        t = Tensor{};
    }

    void write(const Tensor& dst, const void* host, size_t n_bytes, size_t offset) override {
        touch();
        if (n_bytes == 0) return;
        // Pageable source: the copy is staged before the call returns, so the caller may reuse host.
        CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dst.data) + offset, host, n_bytes, cudaMemcpyHostToDevice,
                                   stream_));
    }
    void read(void* host, const Tensor& src, size_t n_bytes, size_t offset) override {
        if (n_bytes == 0) return;
        CUDA_CHECK(cudaMemcpyAsync(host, static_cast<const uint8_t*>(src.data) + offset, n_bytes,
                                   cudaMemcpyDeviceToHost, stream_));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    void copy(const Tensor& dst, const Tensor& src) override {
        touch();
        CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.n_bytes(), cudaMemcpyDeviceToDevice, stream_));
    }
    void zero(const Tensor& t) override {
        touch();
        CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.n_bytes(), stream_));
    }
    void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

    // ------------------------------------------------------------ graphs
    bool step_begin(uint64_t key) override {
        touch();
        CERA_CHECK(!capturing_, "step_begin inside a step");
        if (!graphs_enabled_) return false;
        Graph& g = graphs_[key];
        if (g.exec) {
            CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
            return true;
        }
        if (++g.seen >= 2) {
            CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
            capturing_ = true;
            capture_key_ = key;
        }
        return false;
    }

    void step_end() override {
        touch();
        if (!capturing_) return;
        capturing_ = false;
        cudaGraph_t graph = nullptr;
        CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
        cudaGraphExec_t exec = nullptr;
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CUDA_CHECK(cudaGraphDestroy(graph));
        graphs_[capture_key_].exec = exec;
        CUDA_CHECK(cudaGraphLaunch(exec, stream_));  // the captured ops have not run yet
    }

    // --------------------------------------------------------------- ops
    void embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) override {
        touch();
        const cuda::WeightRef w = weight_ref(table);
        cuda::dequantize_rows(w, ids.as<const int32_t>(), ids.ne[0], scale, out.data, false, stream_);
    }

    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
        touch();
        cuda::rms_norm(x.as<const float>(), w ? w.as<const float>() : nullptr, eps, x.rows(), x.ne[0],
                       out.as<float>(), stream_);
    }

    void matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) override {
        const int64_t k = w.ne[0], rows = w.rows(), n_tokens = x.rows();
        CERA_CHECK(x.ne[0] == k && out.ne[0] == rows, "matmul shapes: w {%lld, %lld}, x ne0 %lld, out ne0 %lld",
                   (long long)k, (long long)rows, (long long)x.ne[0], (long long)out.ne[0]);
        const cuda::WeightRef ref = weight_ref(w);
        const float* b = bias ? bias.as<const float>() : nullptr;
        if (n_tokens <= kGemvMaxTokens) {
            cuda::GemvArgs a;
            a.w = ref, a.rows = rows, a.n_y = int(n_tokens);
            prepare_x(a, ref.type, x.as<const float>(), n_tokens, k, kXq);
            a.bias = b, a.y = out.as<float>(), a.ldy = rows;
            cuda::gemv(a, stream_);
            touch_out(out);
            return;
        }
        touch_out(out);
        gemm(ref, rows, x.as<const float>(), n_tokens, out.as<float>());
        if (b) cuda::add_bias(out.as<float>(), b, n_tokens, rows, stream_);
    }

    void norm_rope(const Tensor& x, int n_head, int head_dim, const Tensor& norm_w, float eps, const Tensor& pos,
                   const RopeParams& rope) override {
        touch();
        cuda::RopeArgs r;
        r.mode = rope.mode == RopeMode::kNone ? 0 : rope.mode == RopeMode::kNorm ? 1 : 2;
        r.n_rot = rope.n_rot, r.freq_base = rope.freq_base, r.freq_scale = rope.freq_scale;
        r.freq_factors = rope.freq_factors ? rope.freq_factors.as<const float>() : nullptr;
        cuda::norm_rope(x.as<float>(), x.rows(), n_head, head_dim, norm_w ? norm_w.as<const float>() : nullptr, eps,
                        pos.as<const int32_t>(), r, stream_);
    }

    void kv_store(const Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& k_cache,
                  const Tensor& v_cache) override {
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
        const size_t n = cuda::attention_scratch_floats(a.n_tokens, a.n_ctx, p.n_head, p.head_dim);
        a.partial = n ? static_cast<float*>(scratch(kAttn, n * sizeof(float))) : nullptr;
        cuda::attention(a, stream_);
    }

    void short_conv(const Tensor& bcx, const Tensor& w, const Tensor& state, const Tensor& out) override {
        touch();
        const int64_t n_embd = out.ne[0];
        CERA_CHECK(w.type == GgmlType::kF32 && bcx.ne[0] == 3 * n_embd && state.ne[0] == n_embd);
        const cuda::WeightRef ref = weight_or_buffer(w);
        cuda::short_conv(bcx.as<const float>(), static_cast<const float*>(ref.image) + ref.row0 * ref.k, int(w.ne[0]),
                         state.as<float>(), bcx.rows(), n_embd, out.as<float>(), stream_);
    }

    void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override {
        touch();
        cuda::swiglu(gate.as<const float>(), up.as<const float>(), gate.n_elements(), out.as<float>(), stream_);
    }
    void add(const Tensor& a, const Tensor& b, float scale, const Tensor& out) override {
        touch();
        cuda::add(a.as<const float>(), b.as<const float>(), scale, a.n_elements(), out.as<float>(), stream_);
    }
    void scale(const Tensor& x, float s) override {
        touch();
        cuda::scale(x.as<float>(), s, x.n_elements(), stream_);
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
        float* g = static_cast<float*>(scratch(kMoeG, size_t(n_slots * n_ff) * sizeof(float)));
        float* u = static_cast<float*>(scratch(kMoeU, size_t(n_slots * n_ff) * sizeof(float)));
        float* y = static_cast<float*>(scratch(kMoeY, size_t(n_slots * n_embd) * sizeof(float)));
        auto run = [&](const Tensor& w, int64_t rows, const float* in, int64_t n_in, int x_div, Slot slot, float* o) {
            cuda::GemvArgs a;
            a.w = weight_ref(w), a.rows = rows, a.n_y = int(n_slots), a.ids = ids.as<const int32_t>();
            a.x_div = x_div;
            prepare_x(a, a.w.type, in, n_in, a.w.k, slot);
            a.y = o, a.ldy = rows;
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
    struct Graph {
        int seen = 0;
        cudaGraphExec_t exec = nullptr;
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

    // Forgets the recorded graphs (their buffers moved); keys keep their counts, so a key seen
    // before is recorded again at its next step.
    void drop_graphs() {
        for (auto& [key, g] : graphs_)
            if (g.exec) cudaGraphExecDestroy(g.exec), g.exec = nullptr;
    }

    // A grow-only scratch buffer. Growing frees the old one, so recorded graphs are dropped.
    void* scratch(Slot slot, size_t bytes) {
        Scratch& s = scratch_[slot];
        if (s.bytes >= bytes) return s.ptr;
        CERA_CHECK(!capturing_, "scratch buffer %d grew inside a recorded step", int(slot));
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        drop_graphs();
        if (s.ptr) CUDA_CHECK(cudaFree(s.ptr));
        touch();
        s.bytes = std::max(bytes, s.bytes * 2);
        CUDA_CHECK(cudaMalloc(&s.ptr, s.bytes));
        return s.ptr;
    }

    // The activations a GEMV reads: f32 for float weights, 8-bit rows for block types. The 8-bit
    // rows of the last quantized input are kept until an op may have changed it, so matmuls that
    // share an input (q/k/v, gate/up) quantize it once.
    void prepare_x(cuda::GemvArgs& a, GgmlType type, const float* x, int64_t n_rows, int64_t k, Slot slot) {
        a.x = x, a.ldx = k;
        if (cuda::is_float_type(type)) return;
        Q8Cache& c = q8_[slot == kXq ? 0 : 1];
        if (c.valid && c.src == x && c.rows == n_rows && c.k == k) {
            a.xq = c.buf;
            return;
        }
        void* xq = scratch(slot, size_t(n_rows * cuda::q8_row_bytes(k)));
        cuda::quantize_q8(x, n_rows, k, k, xq, stream_);
        c = {true, x, n_rows, k, xq};
        a.xq = xq;
    }
    // Forget the cached 8-bit inputs (any op but a matmul may write them); a matmul forgets only
    // when its output overlaps a cached input.
    void touch() { q8_[0].valid = q8_[1].valid = false; }
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

    const WeightInfo* find_weight(const void* p, int64_t* row0) const {
        const uintptr_t a = reinterpret_cast<uintptr_t>(p);
        auto it = weights_.upper_bound(a);
        if (it == weights_.begin()) return nullptr;
        --it;
        const WeightInfo& w = it->second;
        if (a >= it->first + std::max<size_t>(w.gguf_bytes, 1)) return nullptr;
        const size_t rb = row_size(w.type, w.k);
        CERA_CHECK((a - it->first) % rb == 0, "a weight view that does not start on a row");
        *row0 = int64_t((a - it->first) / rb);
        return &w;
    }

    cuda::WeightRef weight_ref(const Tensor& t) const {
        int64_t row0 = 0;
        const WeightInfo* w = find_weight(t.data, &row0);
        CERA_CHECK(w != nullptr, "CUDA backend: a matmul/embed weight that was not made by upload_weight");
        CERA_CHECK(w->k == t.ne[0] && w->type == t.type, "weight view shape or type differs from the upload");
        cuda::WeightRef r;
        r.type = w->type, r.image = w->image, r.image_rows = w->rows, r.k = w->k, r.row0 = row0;
        return r;
    }

    // A float tensor that may be an uploaded weight or a plain buffer.
    cuda::WeightRef weight_or_buffer(const Tensor& t) const {
        int64_t row0 = 0;
        if (find_weight(t.data, &row0)) return weight_ref(t);
        cuda::WeightRef r;
        r.type = t.type, r.image = t.data, r.image_rows = t.rows(), r.k = t.ne[0];
        return r;
    }

    int device_;
    cudaDeviceProp props_{};
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    void* cublas_ws_ = nullptr;
    std::map<uintptr_t, WeightInfo> weights_;
    std::unordered_set<void*> buffers_;
    Scratch scratch_[kSlots];
    Q8Cache q8_[2];
    std::unordered_map<uint64_t, Graph> graphs_;
    bool graphs_enabled_ = true;
    bool capturing_ = false;
    uint64_t capture_key_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int gpu_index) { return std::make_unique<CudaBackend>(gpu_index); }

}  // namespace cera
