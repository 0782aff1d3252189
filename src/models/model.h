// The model API: load a GGUF into a backend, then run sequences through it.
//
//   auto model = cera::load_model("model.gguf", {.n_threads = 2});
//   auto seq = model->create_state();                 // KV cache + conv state of one sequence
//   std::vector<float> logits(model->info().n_vocab);
//   seq->eval(prompt_ids, logits.data(), /*all_logits=*/false);   // prefill, in chunks of n_batch
//   seq->eval({&next, 1}, logits.data(), false);                  // one decode step
//   next = seq->eval_greedy({&next, 1});                          // one greedy step: only the id comes back
//
// A Model is immutable after loading and may serve many states; one state is used by one
// thread at a time. Bad input (unknown architecture, missing key or tensor, wrong shape or
// type, a prompt longer than the context, a token id out of range) throws cera::Error.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "core/dtype.h"

namespace cera {

namespace gguf {
class File;
}

struct ModelOptions {
    DeviceKind device = DeviceKind::kCpu;
    int n_threads = 0;                  // CPU threads; 0 = physical cores
    int gpu_index = 0;                  // CUDA device
    int n_ctx = 0;                      // tokens per sequence; 0 = the model's context_length, at most kDefaultMaxCtx
    GgmlType kv_type = GgmlType::kF32;  // KV cache storage: kF32 or kF16
    int n_batch = 512;                  // prefill chunk: tokens per forward pass
    CudaOptions cuda;                   // the CUDA backend's options (graphs, fusion, profiling)
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

class Model {
 public:
    ~Model();
    const ModelInfo& info() const { return info_; }
    const ModelOptions& options() const { return opts_; }
    const gguf::File& file() const { return *file_; }
    Backend& backend() const { return *backend_; }
    const Architecture& arch() const { return *arch_; }

    // A new sequence with an empty cache. n_ctx = 0 takes default_n_ctx().
    std::unique_ptr<ModelState> create_state(int n_ctx = 0) const;
    // The context a sequence gets by default: the options' n_ctx, else the trained context (2048 when
    // unknown) capped at ModelOptions::kDefaultMaxCtx.
    int default_n_ctx() const;

 private:
    friend std::unique_ptr<Model> load_model(const std::string& path, const ModelOptions& opts);
    Model() = default;
    ModelOptions opts_;
    ModelInfo info_;
    std::unique_ptr<gguf::File> file_;  // keeps the mapping alive (CPU weights are views into it)
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<Architecture> arch_;
};

// Opens `path`, reads and validates the hyperparameters and tensors of its architecture
// (general.architecture), and makes the weights resident on the chosen device.
std::unique_ptr<Model> load_model(const std::string& path, const ModelOptions& opts = {});

// The architectures this build can run (general.architecture values).
std::vector<std::string> supported_architectures();

class ModelState {
 public:
    virtual ~ModelState() = default;

    // Runs `tokens` at positions position() .. position() + n - 1 (in chunks of n_batch), then
    // advances the position. Outputs rows are for every token when all_logits, else for the last:
    //   logits_out: f32 [n_out, n_vocab] (may be null); hidden_out: f32 [n_out, n_embd], the hidden
    //   state after the final norm (may be null). Throws kOutOfRange (state unchanged) when a token id
    //   is outside [0, n_vocab) or the tokens do not fit in the context.
    virtual void eval(std::span<const int32_t> tokens, float* logits_out, bool all_logits,
                      float* hidden_out = nullptr) = 0;

    // Greedy decoding on the device: runs `tokens` as eval() does and returns the arg-max of the last
    // token's logits (Backend::argmax: the lowest id among the largest, NaN never chosen), which is the
    // token a greedy Sampler without penalties picks from them. Only that id is copied to the host; the
    // logits stay in device memory until the next eval(), eval_greedy(), reset(), restore_state() or
    // truncate(), and read_last_logits() fetches them while they are held. A single token is one recorded
    // step (the arg-max inside it), keyed apart from eval()'s. Throws as eval() does.
    virtual int32_t eval_greedy(std::span<const int32_t> tokens) = 0;
    // Pipelined greedy decoding: runs `tokens` as eval_greedy() does and returns the pick p, but queues the
    // step that evaluates p (when the context has room) before waiting for p, so that the device runs it
    // while the host looks at p. That step stays pending: a following eval_greedy_ahead({p}) takes it as
    // its own (and only waits for its pick); any other call, or other tokens, first undoes it, so the
    // state is always exactly what eval_greedy() calls would have made. position() counts no pending step.
    virtual int32_t eval_greedy_ahead(std::span<const int32_t> tokens) = 0;
    // Sampling on the device: runs `tokens` as eval_greedy() does (the logits stay in device memory,
    // read_last_logits() fetches them), then selects the m best of the last token's logits and the
    // logits at the ids in `gather` (Backend::top_logits); only those are copied to the host:
    // ids[0, c), logits[0, c) (best first: value descending, id ascending, values above -inf only) and
    // gathered[0, gather.size()) (NaN for an id outside the vocabulary). Returns c <= m.
    // Throws as eval() does, and kInvalidArgument for m < 1.
    virtual int32_t eval_top(std::span<const int32_t> tokens, int32_t m, std::span<const int32_t> gather,
                             int32_t* ids, float* logits, float* gathered) = 0;
    // Copies the logits of the last token of the latest eval_greedy() or eval_top() (f32 [n_vocab]) and
    // returns true; false, leaving logits_out alone, when they are no longer held (see eval_greedy()).
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
    // True when the state has recurrent parts (LFM2 conv states) that cannot be rewound.
    virtual bool has_recurrent_state() const = 0;
    // Keeps the first n tokens (0 <= n <= position()). Throws kInvalidArgument when n < position() and the
    // state has recurrent parts (reset() and re-evaluate, or restore a snapshot, instead).
    virtual void truncate(int32_t n) = 0;
};

}  // namespace cera
