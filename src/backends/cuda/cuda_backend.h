// The CUDA backend's class (backend.h's interface on one device and stream): its memory, transfers
// and recorded steps are defined in cuda_backend.cpp, the decode fusion that holds ops back to launch
// them together in cuda_backend_fusion.cpp.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <memory>
#include <string>
#include <unordered_map>

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

namespace cera::cuda {

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
    CudaBackend(int device, const CudaOptions& options);
    ~CudaBackend() override;
    DeviceKind kind() const override { return DeviceKind::kCuda; }
    MemoryUse memory_use() const override;
    std::string description() const override {
        return "cuda:" + std::to_string(device_) + " " + props_.name + " (sm_" + std::to_string(props_.major) +
               std::to_string(props_.minor) + ", " + std::to_string(props_.multiProcessorCount) + " SMs)";
    }

    // ------------------------------------------------------------ memory
    Tensor upload_weight(GgmlType type, std::span<const int64_t> ne, const void* host) override;
    Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne) override;
    void free(Tensor& t) override;

    // Small transfers go through pinned host memory (pinned_staging.h); larger ones, and writes while a
    // step is being captured, take the pageable path, which stages the bytes before returning. Either
    // way the caller may reuse its memory on return.
    void write(const Tensor& dst, const void* host, size_t n_bytes, size_t offset) override;
    void read(void* host, const Tensor& src, size_t n_bytes, size_t offset) override;
    int read_async(const Tensor& src, size_t n_bytes) override;
    int read_fed_async(const Tensor& out) override;
    void read_wait(int ticket, void* host) override;
    bool asynchronous() const override { return true; }

    void copy(const Tensor& dst, const Tensor& src) override;
    void zero(const Tensor& t) override;
    void synchronize() override;

    // ------------------------------------------------------------ graphs
    bool step_begin(uint64_t key) override;
    void step_end() override;

    // --------------------------------------------------------------- ops
    void embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) override;
    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override;
    void matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) override;
    void norm_rope(const Tensor& x, int n_head, int head_dim, const Tensor& norm_w, float eps, const Tensor& pos,
                   const RopeParams& rope) override;
    void kv_store(const Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& k_cache,
                  const Tensor& v_cache) override;
    void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                   const AttentionParams& p, const Tensor& out) override;
    void short_conv(const Tensor& bcx, const Tensor& w, const Tensor& state, const Tensor& out,
                    const Tensor& state_prev) override;
    void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
    void add(const Tensor& a, const Tensor& b, float scale, const Tensor& out) override;
    void scale(const Tensor& x, float s) override;
    void top_logits(const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) override;
    void argmax(const Tensor& x, const Tensor& out) override;
    void argmax_feed(const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos) override;
    void moe_route(const Tensor& logits, const Tensor& bias, const MoeParams& p, const Tensor& ids,
                   const Tensor& weights) override;
    void moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                 const Tensor& ids, const Tensor& weights, const Tensor& out) override;

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

    void attach_rope_table(cuda::RopeArgs& r, int64_t rows);
    static cuda::RopeArgs rope_args(const RopeParams& rope);
    void launch_rope(const PendingRope& p);

    // Whether products of `type` are fused with their consumer: the short conv (conv) or q/k RoPE.
    bool fuses_product(GgmlType type, bool conv) const;
    // The pending products as a's q, k and v in that order, when they can go out with its RoPEs and
    // KV store as one launch (gemv_fused.cu).
    bool pending_qkv(const cuda::QkvRopeArgs& a, cuda::GemvArgs (&qkv)[3]) const;

    // Whether product a (w, rows, n_y set) may read x (k floats, one token) through an RMSNorm prologue
    // (GemvArgs::pro_x): x is the norm the held residual product would make (then held in res_ until a
    // launch reading x chooses, launch_res), or the prologue of the products a joins. a keeps xq too.
    bool take_prologue(cuda::GemvArgs& a, const float* x, int64_t k);
    // Launches the held residual product (res_) before the launch of the products reading its norm:
    // without the norm when they take their prologue (`use`, a mask of ProKind bits: the
    // launch kind), else with it; a (n products) are set up for the choice.
    void launch_res(cuda::GemvArgs* a, int n, int use);
    void launch_norm();
    // The held norm (rms_norm), if any, leaves: made in the prologue of the launch reading it (its 8-bit
    // rows then never written), or launched now.
    void release_norm(bool in_prologue);
    void launch_glu();

    // Launches the held SwiGLU pair (telling it the product after it), then the products waiting to
    // be grouped or fused (one launch).
    void flush_mm();
    void flush_rope();
    // Everything deferred goes to the stream, in order (at most one kind is pending at a time).
    void flush();
    void invalidate_q8();

    // The buffer for the 8-bit rows of `src` ([rows, k] f32) that the op about to be queued writes
    // beside it, recorded as the cached quantization of src; null when not worth it (prefill) or
    // not possible. `avoid`: a buffer the op reads.
    void* q8_sidecar(const float* src, int64_t rows, int64_t k, const void* avoid);

    // Ends the step's capture: its graph, instantiated (not launched yet).
    cudaGraphExec_t end_capture();
    // Ends the capture of the current step without keeping its graph: what was captured is launched
    // once (it has not run yet), and the rest of the step runs eagerly (step_end sees no capture).
    void abandon_capture();

    // Forgets the recorded graphs (their buffers moved); keys keep their counts, so a key seen
    // before is recorded again at its next step.
    void drop_graphs();

    // A grow-only scratch buffer. Growing frees the old one, so recorded graphs are dropped. Inside a
    // recorded step the capture ends there: the ops captured so far run as a graph of their own, the
    // rest of the step eagerly, and the step's key is recorded again at its next step.
    void* scratch(Slot slot, size_t bytes);

    // The activations a GEMV reads: f32 for float weights, 8-bit rows for block types. The 8-bit
    // rows of the last quantized input are kept until an op may have changed it, so matmuls that
    // share an input (q/k/v, gate/up) quantize it once.
    void prepare_x(cuda::GemvArgs& a, GgmlType type, const float* x, int64_t n_rows, int64_t k, Slot slot);
    // Queues what waits, then forgets the cached 8-bit inputs (any op but a matmul may write them);
    // a matmul forgets only when its output overlaps a cached input.
    void touch();
    void touch_out(const Tensor& out);

    // out[t] = W x[t] for a batch: cuBLAS on F16 (or F32) operands, f32 accumulation.
    void gemm(const cuda::WeightRef& w, int64_t rows, const float* x, int64_t n_tokens, float* out);
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

}  // namespace cera::cuda
