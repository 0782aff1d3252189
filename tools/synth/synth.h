// Synthetic models: random weights (seeded, deterministic) in the exact GGUF
// layout of a real architecture (keys and tensor names as llama.cpp reads them),
// with the tokenizer copied from another GGUF. Used for benchmarks at real
// shapes (`cera synth`) and for tests of every architecture.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "gguf/gguf.h"
#include "quantize/mixture.h"

namespace cera::gguf {

struct SynthConfig {
    std::string arch = "lfm2";  // lfm2 | lfm2moe | llama | qwen2 | qwen3 | granite
    std::string name;           // general.name; "" -> "synth-<arch>"
    int64_t n_embd = 256;
    int64_t n_layer = 4;
    int64_t n_head = 4;
    int64_t n_head_kv = 2;
    int64_t head_dim = 0;  // 0 -> n_embd / n_head
    int64_t n_ff = 512;
    int64_t n_ctx = 2048;
    int64_t n_vocab = 0;  // 0 -> the vocabulary file's token count (required without one)
    // lfm2 / lfm2moe: which layers are attention layers (the others are short-conv).
    std::vector<int64_t> attn_layers;  // empty -> every third layer from 2: 2, 5, 8, ...
    int64_t l_cache = 3;               // short-conv kernel length
    // lfm2moe
    int64_t n_expert = 8;
    int64_t n_expert_used = 2;
    int64_t n_ff_exp = 256;
    int64_t n_dense_lead = 1;  // leading dense (non-MoE) layers
    float rope_freq_base = 10000.0f;
    float norm_eps = 1e-5f;
    bool tied = true;  // no output.weight: the LM head is token_embd
    // granite's scalars
    float embedding_scale = 12.0f;
    float residual_scale = 0.22f;
    float attention_scale = 0.0f;  // 0 -> 1 / head_dim
    float logit_scale = 8.0f;
    GgmlType type = GgmlType::kF32;     // 2-D and 3-D weights
    std::optional<GgmlType> embd_type;  // token_embd / output; unset -> `type`
    // A llama-quantize mixture (quantize/mixture.h) instead of `type` everywhere: each tensor gets the
    // type llama-quantize would give it for this file type (Q4_K_M: attn_v and ffn_down in Q6_K on the
    // first and last eighth of their layers and every third layer between, the LM head in Q6_K unless
    // embd_type is set, ...). `type` must be the file type's default type.
    std::optional<quantize::FileType> mixture;
    uint64_t seed = 42;
};

// The architectures and presets this knows.
const std::vector<std::string>& synth_archs();
const std::vector<std::string>& synth_presets();  // tiny, lfm2-350m, lfm2-1.2b, llama-1b
// The shape of a preset for an architecture (with that architecture's usual rope base
// and attention pattern). Throws kInvalidArgument for an unknown arch or preset.
SynthConfig synth_preset(std::string_view arch, std::string_view preset);

// Checks a configuration; throws kInvalidArgument naming the bad field.
void synth_validate(const SynthConfig& c);

// Writes the model to `path`. `vocab` (may be null) supplies every tokenizer.* key and
// the vocabulary size. Weights whose ne[0] is not a multiple of the type's block size
// fall back the way llama-quantize does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then
// F16; F16 also where llama-quantize has no fallback). n_threads 0 = all cores.
// Throws kInvalidArgument / kUnsupported / kIo.
void synthesize(const SynthConfig& c, const File* vocab, const std::string& path, int n_threads = 0);

// Writes a LoRA adapter for `base` in llama.cpp's GGUF LoRA layout (general.type = adapter, adapter.type =
// lora, adapter.lora.alpha = rank, so its scale is 1): a rank-`rank` pair of random F32 tensors
// (W.lora_a ne {k, rank}, W.lora_b ne {rank, n_out}) for every projection of every layer (attention
// q/k/v/output, short-conv in_proj/out_proj, FFN gate/up/down). For benchmarks of adapters at real
// shapes. Throws kInvalidArgument / kIo.
void synthesize_lora(const File& base, int64_t rank, uint64_t seed, const std::string& path);

// The shapes of an LFM2-VL vision projector (SigLIP2 tower and the lfm2 projector).
struct MmprojShape {
    int64_t n_embd = 0, n_layer = 0, n_head = 0, n_ff = 0;
    int64_t proj_hidden = 0;  // mm.1 rows
    int64_t n_embd_text = 0;  // mm.2 rows: the text model's n_embd
};
// tiny (the test fixture's), lfm2-vl-450m, lfm2-vl-1.6b. Throws kInvalidArgument for another name.
MmprojShape mmproj_preset(std::string_view preset);
// Writes a random mmproj GGUF (llama.cpp's layout: clip architecture, clip.projector_type lfm2, 16 px
// patches on a 16 x 16 position table, downsample 2) with its matrices in `type` (F32 or F16), for
// encode benchmarks. Throws kUnsupported / kIo.
void synthesize_mmproj(const MmprojShape& shape, GgmlType type, uint64_t seed, const std::string& path);

}  // namespace cera::gguf
