// What an architecture file provides to the generic runner (model.cpp): its
// dimensions, the per-sequence state each layer needs, the output head, and a
// forward pass over the layers for one batch of tokens of one sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "models/loader.h"
#include "models/lora.h"
#include "models/model.h"

namespace cera {

// The per-sequence state of one layer.
struct LayerStateSpec {
    int64_t kv_width = 0;       // n_head_kv * head_dim of an attention layer; 0 = no KV cache
    int64_t conv_channels = 0;  // n_embd of a short-conv layer; 0 = no conv state
    int64_t conv_rows = 0;      // L - 1 rows of conv state
    int64_t head_dim = 0;       // attention layers: head size (kv_width / head_dim KV heads), for context shift
    RopeParams rope;            // attention layers: the RoPE applied to the cached keys, for context shift
};

// Per-token widths of the scratch activations an architecture uses (max over layers).
struct ScratchSpec {
    int64_t q_width = 0;        // n_head * head_dim
    int64_t kv_width = 0;       // n_head_kv * head_dim
    int64_t wide = 0;           // widest intermediate: max(n_ff, 3 * n_embd)
    int64_t n_expert = 0;       // MoE router width
    int64_t n_expert_used = 0;  // k
};

// The caches of one layer of one sequence.
struct LayerCache {
    Tensor k, v;  // [n_ctx, n_head_kv * head_dim] of the KV type; empty for layers without attention
    // Q4_CH keys (coded per channel over groups of 64 rows, core/quant/kv_groups.h): the open groups (the
    // rows of the groups being filled), f16 [n_head_kv * head_dim, 65 * slots]; empty for the other types.
    Tensor k_open;
    // The rows of k / v are stored rotated (core/rotation.h, the tq4 and tq3 cache types).
    bool rotated_k = false, rotated_v = false;
    Tensor conv;  // f32 [L - 1, n_embd]; empty for layers without a short conv
    Tensor conv_prev;  // like conv: its content before the latest step (that step's undo)
};

// Device buffers of one forward pass, each viewed with n_tokens rows.
struct Step {
    Backend* be = nullptr;
    int64_t n_tokens = 0;
    Tensor ids, pos;              // i32 [n_tokens]: token ids, positions
    Tensor x;                     // f32 [n_tokens, n_embd] residual stream
    Tensor h;                     // f32 [n_tokens, n_embd] normed input of a block
    Tensor y;                     // f32 [n_tokens, n_embd] block output
    Tensor q;                     // f32 [n_tokens, n_head * head_dim]
    Tensor k, v;                  // f32 [n_tokens, n_head_kv * head_dim]
    Tensor attn;                  // f32 [n_tokens, n_head * head_dim]
    Tensor wide0, wide1;          // f32 [n_tokens, wide]
    Tensor router;                // f32 [n_tokens, n_expert]
    Tensor moe_ids, moe_w;        // i32 / f32 [n_tokens, n_expert_used]
    std::span<LayerCache> cache;  // [n_layer]: the attention layers' K/V caches (pools when paged)
    // Several sequences (the batched engine): the short-conv layers run every sequence's rows in one
    // Backend::short_conv_segments call with these descriptors, layer il's sequence states being
    // conv_states[il] and its kept snapshots cache[il].conv. Empty: one sequence, its state cache[il].conv.
    Tensor conv_segs, conv_snaps;         // i32 [n_seg, kConvSegInts], [n_snaps, 2]
    std::span<const Tensor> conv_states;  // [n_layer]: f32 [n_slots, (L - 1) * n_embd] (short-conv layers)
    Tensor kv_rows;    // i32 [n_tokens]: the cache row that receives each token's K and V
    KvPaging paging;   // how attention finds a sequence's rows (backend.h); empty: one sequence, row = position
    // The rows whose outputs are wanted: [out_begin, out_begin + out_count) (out_count may be 0), or
    // with several sequences the rows out_rows (increasing).
    int64_t out_begin = 0, out_count = 0;
    std::span<const int64_t> out_rows;
    // LoRA adapters: the adapters of each group of rows (empty: none), and of the output rows that
    // keep_output_rows() keeps (their groups after the move). lora_segs: the step's scratch list.
    std::span<const LoraRows> lora, lora_out;
    std::vector<LoraSegment>* lora_segs = nullptr;
    // Tensor parallelism (models/shard.h): the group this rank's pass belongs to, or null; its ranks are
    // pipeline stages (Shard::pipeline) or split every layer.
    Communicator* comm = nullptr;
    int rank = 0;
    bool pipeline = false;

    // Takes the group of `model`'s rank (none for a model on one backend).
    void join(const Model& model) { comm = model.comm(), rank = model.rank(), pipeline = model.pipeline(); }

    // x becomes the sum of every rank's x (the partial outputs of a block whose products' inputs are
    // split); nothing without a group, or between pipeline stages.
    void all_reduce(const Tensor& x) const {
        if (comm && !pipeline) comm->all_reduce(rank, *be, x);
    }
    // A pipeline stage's residual stream: from the stage before (all but the first), to the stage after
    // (all but the last). Nothing otherwise.
    void stage_in() const {
        if (comm && pipeline && rank > 0) comm->recv(rank, *be, x);
    }
    void stage_out() const {
        if (comm && pipeline && rank + 1 < comm->world()) comm->send(rank, *be, x);
    }

    // out = w · x (+ bias), plus the LoRA deltas of w for the rows whose adapters adapt it. Every
    // projection an adapter may target goes through here.
    //   w: [rows, k]; x: f32 [n_tokens, k]; bias: f32 [rows] or empty; out: f32 [n_tokens, rows]
    void linear(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) const;
    // The MoE experts' mixture (Backend::moe_ffn) of x routed by ids and weights, plus the LoRA deltas of
    // the experts' products for the rows whose adapters adapt them (Backend::moe_ffn_lora).
    void experts(const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps, const Tensor& x,
                 const Tensor& ids, const Tensor& weights, const Tensor& out) const;

    // A wide buffer seen as [n_tokens, width].
    static Tensor cols(const Tensor& wide, int64_t width) { return wide.reshaped(width, wide.ne[1]); }

    // Called by an architecture after the last layer's mixer (attention / conv), when the caches
    // are up to date: keeps only the output rows (moved to the front, in order) for the rest of the
    // pass, so the last FFN runs on them alone. Returns false when no row is wanted (skip the rest).
    bool keep_output_rows();
};

// The output head shared by every architecture:
//   x = token_embd[ids] * embedding_scale;  ...layers...;  logits = output · (RMSNorm(x) * output_norm) / logit_scale
struct HeadWeights {
    Tensor token_embd;   // [n_vocab, n_embd]
    Tensor output_norm;  // f32 [n_embd]
    Tensor output;       // [n_vocab, n_embd]; token_embd when tied; a tensor-parallel rank's rows of it
    int64_t vocab_begin = 0;  // the vocabulary row that output's first row is
    float norm_eps = 1e-5f;
    float embedding_scale = 1.0f;
    float logit_scale = 1.0f;
};

class Architecture {
 public:
    virtual ~Architecture() = default;
    // Runs every layer over s.x (the embedded tokens), leaving the residual stream in s.x.
    virtual void forward(Step& s) const = 0;

    ModelInfo info;
    HeadWeights head;
    std::vector<LayerStateSpec> state;  // [n_layer] (empty specs for a pipeline stage's other layers)
    ScratchSpec scratch;
    // The layers this rank runs (a pipeline stage's range; all of them otherwise).
    int64_t layer_begin = 0, layer_end = 0;
};

// Everything an architecture factory reads from.
struct LoadContext {
    const gguf::File& file;
    Backend& be;
    HParams hp;
    WeightLoader wl;
};

using ArchFactory = std::unique_ptr<Architecture> (*)(LoadContext& ctx);

// nullptr when `arch` is not supported.
ArchFactory find_architecture(const std::string& arch);

// Fills info.{arch,name,n_vocab,n_embd,n_layer,n_ctx_train} and head from the common keys and tensors:
// token_embd.weight, output.weight (tied to token_embd when absent), and the final norm `norm_name`.
void load_common(LoadContext& ctx, Architecture& a, int64_t n_embd, int64_t n_layer, const std::string& norm_name,
                 float norm_eps);

// The activation buffers of passes of up to `rows` tokens (Step's x .. moe_w), made on a backend.
struct StepBuffers {
    Tensor x, h, y, q, k, v, attn, wide0, wide1, router, moe_ids, moe_w;
    void alloc(Backend& be, const Architecture& arch, int64_t rows);
    void free(Backend& be);
    // Points s's activations at the first n rows of these buffers.
    void view(Step& s, int64_t n) const;
};

// Recorded-step keys (Backend::step_begin) in a process: (serial << kStepKeyBits) | a part below
// 2^kStepKeyBits that the state chooses, each state (sequence or batch) taking a serial of its own.
constexpr int kStepKeyBits = 24;
uint64_t new_step_serial();

// logits = output · hidden / logit_scale:  hidden f32 [m, n_embd], logits f32 [m, n_vocab]. A rank of a
// tensor-parallel model (comm) computes its rows of the vocabulary into `local` (f32 [m, rows], at least)
// and gathers every rank's into logits.
void lm_head(Backend& be, const HeadWeights& head, const Tensor& hidden, const Tensor& logits,
             Communicator* comm = nullptr, int rank = 0, const Tensor& local = {});
// Whether a rank computes only its rows of the LM head (and needs lm_head's `local`).
inline bool head_split(const HeadWeights& head, int64_t n_vocab) { return head.output.ne[1] != n_vocab; }

}  // namespace cera
