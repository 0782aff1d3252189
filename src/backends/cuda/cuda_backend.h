// The CUDA backend's class (backend.h's interface on one device and stream): its memory, transfers
// and graphs are defined in cuda_backend.cpp, its ops (recorded into a step, fused and launched) in
// cuda_backend_ops.cpp.
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/backend_switches.h"
#include "backends/cuda/cublas_api.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/pick_mail.h"
#include "backends/cuda/pinned_staging.h"
#include "backends/cuda/replay_profile.h"
#include "backends/cuda/rope_tables.h"
#include "backends/cuda/step.h"
#include "backends/cuda/weight_registry.h"
#include "core/check.h"

namespace cera::cuda {

constexpr size_t kCublasWorkspace = 32u << 20;
constexpr size_t kScratchRound = 1u << 20;  // scratch grows in whole MiB, to what the largest use needs

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
    void kv_store(const Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& k_cache, const Tensor& v_cache,
                  const Tensor& k_open = {}) override;
    void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                   const AttentionParams& p, const Tensor& out) override;
    void short_conv(const Tensor& bcx, const Tensor& w, const Tensor& state, const Tensor& out,
                    const Tensor& state_prev) override;
    void lora_segments(const Tensor& x, std::span<const LoraSegment> segs, const Tensor& y) override;
    void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out) override;
    void gelu(const Tensor& x, GeluKind kind, const Tensor& out) override;
    void attention_full(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int head_dim, float scale,
                        const Tensor& out) override;
    void short_conv_segments(const Tensor& bcx, const Tensor& w, const Tensor& states, const Tensor& out,
                             const Tensor& segs, const Tensor& snaps, const Tensor& snapshots) override;
    void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override;
    void add(const Tensor& a, const Tensor& b, float scale, const Tensor& out) override;
    void scale(const Tensor& x, float s) override;
    void rotate_heads(const Tensor& x, int head_dim, bool inverse) override;
    void warm_up_products(std::span<const int64_t> token_counts) override;
    void top_logits(const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) override;
    void argmax(const Tensor& x, const Tensor& out) override;
    void argmax_feed(const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos) override;
    void moe_route(const Tensor& logits, const Tensor& bias, const MoeParams& p, const Tensor& ids,
                   const Tensor& weights) override;
    void moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                 const Tensor& ids, const Tensor& weights, const Tensor& out) override;
    void moe_ffn_lora(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                      const Tensor& ids, const Tensor& weights, std::span<const MoeLoraSegment> segs,
                      const Tensor& out) override;

    // ------------------------------------------------------ collectives
    // A tensor-parallel collective (collectives.cpp): fn runs on the backend's stream in the order of
    // the recorded ops, when the step runs, on the thread that runs it.
    void enqueue(std::function<void(cudaStream_t)> fn) {
        record(OtherNode{[this, fn = std::move(fn)] { fn(stream_); }});
    }
    int device() const { return device_; }
    bool graphs() const { return sw_.graphs; }

   private:
    // A step key: how often it was seen, and once recorded its graph.
    struct Graph {
        int seen = 0;
        cudaGraphExec_t exec = nullptr;
        const void* feed_out = nullptr;  // the out tensor of its argmax_feed (the mailbox's count)
    };
    struct Scratch {
        void* ptr = nullptr;
        size_t bytes = 0;
    };

    template <class N>
    void record(N&& node) {
        step_.nodes.emplace_back(std::forward<N>(node));
    }
    // Fuses the recorded nodes and launches them (cuda_backend_ops.cpp); every call that needs the
    // results on the host, or changes memory the nodes point to, runs it first.
    void run_step();
    void launch(std::monostate&, const GemvArgs*);
    void launch(GemvNode& n, const GemvArgs*);
    void launch(GemmNode& n, const GemvArgs*);
    void launch(NormNode& n, const GemvArgs*);
    void launch(RopeNode& n, const GemvArgs*);
    void launch(KvStoreNode& n, const GemvArgs*);
    void launch(QkvRopeNode& n, const GemvArgs*);
    void launch(ConvNode& n, const GemvArgs*);
    void launch(SwigluNode& n, const GemvArgs*);
    void launch(GluNode& n, const GemvArgs* next);
    void launch(AddNode& n, const GemvArgs*);
    void launch(AttentionNode& n, const GemvArgs*);
    void launch(PickNode& n, const GemvArgs*);
    void launch(QuantizeNode& n, const GemvArgs*);
    void launch(RotateNode& n, const GemvArgs*);
    void launch(LoraNode& n, const GemvArgs*);
    void launch(OtherNode& n, const GemvArgs*);
    // The LoRA segments of an MoE call's gate, up and down products, in (token, expert) slot rows.
    struct MoeLora {
        std::vector<LoraSegDev> segs[3];
        int64_t t_floats[3] = {0, 0, 0};
    };
    void record_moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                        const Tensor& ids, const Tensor& weights, const Tensor& out, MoeLora lora);
    void launch_moe_ffn(const Tensor& x, const cuda::WeightRef& gate, const cuda::WeightRef& up,
                        const cuda::WeightRef& down, int64_t n_ff, int n_expert, const Tensor& ids,
                        const Tensor& weights, const Tensor& out, const MoeLora& lora);
    void attach_rope_table(cuda::RopeArgs& r, int64_t rows);

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


    // Batched products of block types read their weight expanded to F16, into one of two buffers the
    // size of the step's largest: expand() queues the expansion on side_ once the product that last
    // read that buffer is done, so the next product's expansion runs beside the current product.
    void expand(GemmNode& n);
    std::vector<GemmNode*> expansions_;  // the step's products that need one, in order
    // {rows, k} of every F16 cuBLAS product run since the last warm_up_products (a model's handful).
    std::vector<std::pair<int64_t, int64_t>> gemm_shapes_;
    size_t expanded_ = 0;               // how many of them are queued
    cudaStream_t side_ = nullptr;
    cudaEvent_t expand_done_[2] = {}, expand_free_[2] = {}, step_start_ = nullptr;
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
    cuda::FusionRules rules_;
    cuda::Step step_;               // the ops recorded since the last run_step()
    cuda::WeightRegistry weights_;  // uploaded weights (weight_registry.h)
    std::unordered_map<void*, size_t> buffers_;  // alloc()'s buffers and their bytes
    Scratch scratch_[kSlots];
    std::unique_ptr<cuda::PinnedStaging> pin_;  // small host transfers (pinned_staging.h)
    cuda::RopeTables rope_tables_;  // the decode RoPE's (cos, sin) tables (rope_tables.h)
    static constexpr size_t kMaxGraphs = 512;
    std::unordered_map<uint64_t, Graph> graphs_;
    bool capturing_ = false;
    std::unique_ptr<cuda::ReplayProfile> replay_prof_;  // with sw_.profile
    uint64_t capture_key_ = 0;
};

}  // namespace cera::cuda
