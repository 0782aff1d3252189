// The model API: load a GGUF into a backend, then run sequences through it.
//
//   auto model = cera::load_model("model.gguf", {.n_threads = 2});
//   auto seq = model->create_state();                 // KV cache + conv state of one sequence
//   std::vector<float> logits(model->info().n_vocab);
//   seq->eval({.tokens = prompt_ids, .logits = logits.data()});   // prefill, in chunks of n_batch
//   seq->eval({.tokens = {&next, 1}, .logits = logits.data()});   // one decode step
//   next = seq->eval({.tokens = {&next, 1}, .head = HeadOutput::kGreedy}).token;  // only the id comes back
//
// A Model is immutable after loading and may serve many states; one state is used by one
// thread at a time. Bad input (unknown architecture, missing key or tensor, wrong shape or
// type, a prompt longer than the context, a token id out of range) throws cera::Error.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "core/dtype.h"
#include "models/shard.h"

namespace cera {

namespace gguf {
class File;
}

struct ModelOptions {
    DeviceKind device = DeviceKind::kCpu;
    int n_threads = 0;                  // CPU threads; 0 = physical cores
    int gpu_index = 0;                  // CUDA device
    int n_ctx = 0;                      // tokens per sequence; 0 = the model's context_length, at most kDefaultMaxCtx
    // KV cache storage of keys and values: kF32, kF16, kBF16, kQ8_0, kQ4_0 or kQ3_KV (the block types need
    // rows of K of a multiple of 32, and on CUDA heads of a multiple of 32); on the CPU also kQ4_KV, and for
    // keys kQ4_CH (rows of a multiple of 32; core/quant/kv_groups.h): kivi4.
    GgmlType kv_type_k = GgmlType::kF32, kv_type_v = GgmlType::kF32;
    // Rows stored rotated (core/rotation.h; EngineOptions' tq4 and tq3): heads of a power of two.
    bool kv_rotate_k = false, kv_rotate_v = false;
    int n_batch = 512;                  // prefill chunk: tokens per forward pass
    CudaOptions cuda;                   // the CUDA backend's options (graphs, fusion, profiling)
    size_t lora_cache_bytes = 0;        // device bytes of LoRA adapters kept while unused; 0 = no bound
    // How the device copies of LoRA adapters store A and B: kF16 (half the bytes a decode step reads; the
    // deltas' rounding stays far below the logits' tolerances) or kF32.
    GgmlType lora_type = GgmlType::kF16;
    // The tensor bytes loaded so far and in all, after each weight (the last call has them equal).
    std::function<void(uint64_t done, uint64_t total)> on_load_progress;
    // Sees the input of every product with a weight (CPU only; Model::weight_name() names the weight).
    MatmulObserver* observer = nullptr;
    // Ranks the model is split over (models/shard.h, docs/tensor-parallel.md): each a backend of its own
    // with a share of every layer; 1 = no split. CPU ranks share n_threads among them. CUDA rank r runs on
    // gpu_ranks[r] (empty: gpu_index + r): NCCL joins ranks on devices of their own; ranks that all name
    // one device (a split simulated on one GPU) meet through device copies, and run without graphs.
    int tensor_parallel = 1;
    std::vector<int> gpu_ranks;
    static constexpr int kDefaultMaxCtx = 4096;
};

struct ModelInfo {
    std::string arch;  // general.architecture
    std::string name;  // general.name, or ""
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_ctx_train = 0;    // <arch>.context_length
    int64_t n_attn_layers = 0;  // layers with a KV cache
    int64_t n_conv_layers = 0;  // LFM2 short-conv layers
};

class Architecture;
class ModelState;
class LoraCache;
struct LoraChoice;
using LoraSet = std::vector<LoraChoice>;

class Model {
 public:
    ~Model();
    const ModelInfo& info() const { return info_; }
    const ModelOptions& options() const { return opts_; }
    const gguf::File& file() const { return *file_; }
    Backend& backend() const { return *backend_; }
    const Architecture& arch() const { return *arch_; }
    // The device copies of the LoRA adapters loaded for this model (models/lora.h).
    LoraCache& lora_cache() const { return *lora_; }
    std::weak_ptr<LoraCache> lora_cache_ptr() const { return lora_; }

    // The GGUF name of a weight matrix as the model passes it to the backend ("" for no weight).
    const std::string& weight_name(const Tensor& w) const;

    // Tensor parallelism: the ranks (rank 0 is this model, the others hold the other shares of the
    // weights on backends of their own) and the group they run their passes in (null for one rank).
    int world() const { return 1 + int(ranks_.size()); }
    const Model& rank_model(int r) const { return r == 0 ? *this : *ranks_[size_t(r - 1)]; }
    int rank() const { return rank_; }
    Communicator* comm() const { return comm_.get(); }
    // The ranks are pipeline stages of whole layers (shapes that do not divide among them), the last
    // stage's outputs the model's; else they split every layer.
    bool pipeline() const { return pipeline_; }

    // A new sequence with an empty cache. n_ctx = 0 takes default_n_ctx().
    std::unique_ptr<ModelState> create_state(int n_ctx = 0) const;
    // The context a sequence gets by default: the options' n_ctx, else the trained context (2048 when
    // unknown) capped at ModelOptions::kDefaultMaxCtx.
    int default_n_ctx() const;

 private:
    friend std::unique_ptr<Model> load_model(const std::string& path, const ModelOptions& opts);
    friend std::unique_ptr<Model> load_rank(const std::string& path, const ModelOptions& opts, Shard shard);
    Model() = default;
    ModelOptions opts_;
    ModelInfo info_;
    std::unique_ptr<gguf::File> file_;  // keeps the mapping alive (CPU weights are views into it)
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<Architecture> arch_;
    std::shared_ptr<LoraCache> lora_;
    std::unordered_map<const void*, std::string> weight_names_;  // by device pointer
    std::vector<std::vector<uint8_t>> owned_;                    // split weights' host bytes (WeightLoader::take_owned)
    std::vector<std::unique_ptr<Model>> ranks_;                  // ranks 1 .. world - 1
    std::shared_ptr<Communicator> comm_;                         // shared by the ranks
    int rank_ = 0;
    bool pipeline_ = false;
};

// Opens `path`, reads and validates the hyperparameters and tensors of its architecture
// (general.architecture), and makes the weights resident on the chosen device.
std::unique_ptr<Model> load_model(const std::string& path, const ModelOptions& opts = {});

// The architectures this build can run (general.architecture values).
std::vector<std::string> supported_architectures();

// What the LM head of an evaluation hands back to the host.
enum class HeadOutput {
    kLogits,  // the logits (and hidden states) of the last token, or of every token, copied out
    kGreedy,  // only the arg-max id of the last token's logits; the logits stay on the device
    kTopK,    // only the top_k best of the last token's logits and the logits at the `gather` ids
};

// Runs EvalRequest::meanwhile (or BatchState::step's), if any, dropping what it throws: the caller does
// that work again.
inline void run_meanwhile(const std::function<void()>& f) noexcept {
    if (!f) return;
    try {
        f();
    } catch (...) {
    }
}

// Input rows that replace the token embeddings of a run of a request's tokens (an image's embeddings
// in place of its image tokens): tokens [begin, begin + n) of the request take rows [0, n) of `rows`.
struct EmbdRun {
    int64_t begin = 0, n = 0;
    const float* rows = nullptr;  // f32 [n, n_embd], the caller's
};

// One sequence's share of an evaluation: its tokens and what to return for them. Output pointers
// belong to the caller; n_out is n_tokens with all_logits, else 1.
struct EvalRequest {
    std::span<const int32_t> tokens{};  // run at positions position() .. position() + n_tokens - 1
    HeadOutput head = HeadOutput::kLogits;
    std::span<const EmbdRun> embd{};  // runs of tokens whose input is given as embeddings (in order, disjoint)
    // kLogits only:
    bool all_logits = false;  // output rows for every token, else for the last
    float* logits = nullptr;  // f32 [n_out, n_vocab], or null
    float* hidden = nullptr;  // f32 [n_out, n_embd], the hidden state after the final norm, or null
    // i32 [n_out]: each output row's arg-max (Backend::argmax, the pick of a greedy Sampler), taken where
    // the logits are; only these ids come back when logits is null. Or null.
    int32_t* argmax = nullptr;
    // Keep the recurrent state (LFM2 conv states) after each token, so that truncate() can go back to any
    // position this evaluation passed (speculative decoding's verification). Consecutive evaluations that
    // keep their states add to the kept ones while ModelState::kKeptStates rows last. At most
    // min(n_batch, kKeptStates) tokens (kInvalidArgument beyond). No effect on a state without recurrent parts.
    bool keep_states = false;
    // kGreedy only: queue the step that evaluates the pick before the host reads the pick (see eval()).
    bool ahead = false;
    // kLogits only: host work to do while the device computes, run once after the step is queued and
    // before its outputs are waited for (a backend that computes on the host has done the step by then).
    // It runs with the state busy and must not use it. What it throws is dropped: it is work its caller
    // can do again (a grammar's mask for the next token, computed into the matcher's cache).
    std::function<void()> meanwhile{};
    // kTopK only:
    int32_t top_k = 0;                  // candidates wanted, >= 1
    std::span<const int32_t> gather{};  // ids whose logits come back too
    int32_t* top_ids = nullptr;         // i32 [top_k]
    float* top_logits = nullptr;        // f32 [top_k]
    float* gathered = nullptr;          // f32 [gather.size()]
};

struct EvalResult {
    int32_t token = -1;  // kGreedy: the pick
    int32_t n_top = 0;   // kTopK: candidates written to top_ids / top_logits (<= top_k)
};

class ModelState {
 public:
    virtual ~ModelState() = default;

    // Runs the request's tokens at positions position() .. position() + n - 1 (in chunks of n_batch),
    // then advances the position. Throws kOutOfRange (state unchanged) when a token id is outside
    // [0, n_vocab) or the tokens do not fit in the context. What comes back depends on `head`:
    //
    // kLogits: logits and hidden rows (either may be null) for every token when all_logits, else for
    //   the last. No tokens: nothing runs.
    // kGreedy: the arg-max of the last token's logits (Backend::argmax: the lowest id among the largest,
    //   NaN never chosen), which is the token a greedy Sampler without penalties picks from them. Only
    //   that id is copied to the host; the logits stay in device memory until the next eval(), reset(),
    //   restore_state() or truncate(), and read_last_logits() fetches them while they are held. A single
    //   token is one recorded step (the arg-max inside it), keyed apart from kLogits'.
    //   With `ahead`, the step that evaluates the pick p is queued (when the context has room) before the
    //   host waits for p, so that the device runs it while the host looks at p. That step stays pending:
    //   a following kGreedy request (ahead or not) for exactly {p} takes it as its own (and only waits for
    //   its pick); any other call, or other tokens, first undoes it, so the state is always exactly what
    //   plain kGreedy requests would have made. position() counts no pending step.
    // kTopK: runs as kGreedy does (the logits stay in device memory), then selects the top_k best of the
    //   last token's logits and the logits at the `gather` ids (Backend::top_logits); only those are
    //   copied to the host: top_ids[0, c), top_logits[0, c) (best first: value descending, id ascending,
    //   values above -inf only) and gathered[0, gather.size()) (NaN for an id outside the vocabulary);
    //   n_top = c <= top_k.
    // kGreedy and kTopK throw kInvalidArgument when there are no tokens, kTopK also when top_k < 1.
    virtual EvalResult eval(const EvalRequest& request) = 0;
    // Copies the logits of the last token of the latest kGreedy or kTopK eval() (f32 [n_vocab]) and
    // returns true; false, leaving logits_out alone, when they are no longer held (see eval()).
    virtual bool read_last_logits(float* logits_out) = 0;

    virtual int32_t position() const = 0;  // tokens in the cache
    virtual int32_t n_ctx() const = 0;
    virtual void reset() = 0;  // empty cache, zero conv state, position 0

    // Snapshot of the sequence (KV rows 0..position()-1, conv states, position) for save/restore.
    virtual size_t state_size() const = 0;  // bytes save_state() writes now
    virtual void save_state(std::vector<uint8_t>& out) const = 0;
    // Throws kInvalidFile when the bytes were not saved by a state of the same model and n_ctx large enough.
    virtual void restore_state(std::span<const uint8_t> bytes) = 0;

    // Context shift: drops the n_discard tokens after the first n_keep, moving the later KV rows down and
    // re-rotating their keys' RoPE by -n_discard; conv states are untouched; position() drops by n_discard.
    // Throws kOutOfRange unless 0 <= n_keep, 0 <= n_discard and n_keep + n_discard <= position().
    virtual void shift(int32_t n_keep, int32_t n_discard) = 0;
    // True when the state has recurrent parts (LFM2 conv states) that cannot be rewound in general.
    virtual bool has_recurrent_state() const = 0;
    // The smallest n that truncate(n) accepts: 0 without recurrent parts; with them, the position before the
    // first of the latest run of evaluations that kept their states (EvalRequest::keep_states), or position()
    // when there is none.
    virtual int32_t rewind_floor() const = 0;
    // Recurrent states kept at most (EvalRequest::keep_states).
    static constexpr int32_t kKeptStates = 64;
    // Keeps the first n tokens (rewind_floor() <= n <= position()); the recurrent state goes back to the one
    // kept after token n. Throws kOutOfRange for n outside [0, position()] and kInvalidArgument for
    // n < rewind_floor() (reset() and re-evaluate, or restore a snapshot, instead).
    virtual void truncate(int32_t n) = 0;

    // The LoRA adapters every later evaluation applies, each with its scale (empty: the base model). What
    // the cache holds was computed under the earlier set: the caller resets or re-evaluates as it needs.
    virtual void set_lora(const LoraSet& set) = 0;
};

}  // namespace cera
