// Synthetic models: the layout tables for each architecture and the seeded
// weight generator.
//
// Each tensor row is generated from its own random stream (seeded from the seed,
// the tensor's name and the row index), so the bytes do not depend on the thread
// count. Weights are ~N(0, 0.02) from an Irwin-Hall sum of four 16-bit uniforms
// (one 64-bit draw per element); norms are 1 + N(0, 0.02). Rows are quantized with
// the reference quantizers in parallel; the bottleneck is the quantizer (Q4_K and
// friends search for scales), then the disk.
#include "synth/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/check.h"
#include "core/quant/quant.h"
#include "core/threadpool.h"
#include "gguf/keys.h"
#include "gguf/writer.h"
#include "quantize/mixture.h"

namespace cera::gguf {
namespace {

constexpr int64_t kMaxDim = 1 << 20;  // bound on any one width, so products stay far from overflow

bool is_lfm2(const std::string& arch) { return arch == "lfm2" || arch == "lfm2moe"; }

// ---- random numbers ----

uint64_t splitmix64(uint64_t& s) {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (char c : s) h = (h ^ uint8_t(c)) * 0x100000001B3ull;
    return h;
}

// xorshift64* stream; one draw gives an approximately normal value.
class Rng {
   public:
    explicit Rng(uint64_t seed) {
        state_ = splitmix64(seed);
        if (state_ == 0) state_ = 1;
    }
    uint64_t next() {
        state_ ^= state_ >> 12;
        state_ ^= state_ << 25;
        state_ ^= state_ >> 27;
        return state_ * 0x2545F4914F6CDD1Dull;
    }
    // Sum of four uniform 16-bit values, centred and scaled to unit variance.
    float normal() {
        const uint64_t r = next();
        const int64_t s = int64_t(r & 0xFFFF) + int64_t((r >> 16) & 0xFFFF) + int64_t((r >> 32) & 0xFFFF) +
                          int64_t(r >> 48);
        constexpr float kScale = 1.0f / 37837.23f;  // 1 / sqrt(4 * 65536^2 / 12)
        return float(s - 131070) * kScale;
    }

   private:
    uint64_t state_;
};

// ---- the layout ----

enum class Init { kWeight, kNorm, kSmall };

struct TensorSpec {
    std::string name;
    std::vector<int64_t> ne;
    Init init = Init::kWeight;
    bool embedding = false;
};

std::vector<TensorSpec> layout(const SynthConfig& c, int64_t n_vocab) {
    const int64_t E = c.n_embd, F = c.n_ff, hd = c.head_dim > 0 ? c.head_dim : c.n_embd / c.n_head;
    const int64_t q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
    std::vector<TensorSpec> t;
    // The last argument of the norms, biases, conv kernels and the router says what they are;
    // which tensors stay F32 is llama-quantize's rule (quantize/mixture.h), not a flag here.
    auto add = [&](std::string name, std::vector<int64_t> ne, Init init = Init::kWeight, bool /*stays_f32*/ = false) {
        t.push_back({std::move(name), std::move(ne), init, false});
    };
    t.push_back({"token_embd.weight", {E, n_vocab}, Init::kWeight, true});
    if (is_lfm2(c.arch))
        add("token_embd_norm.weight", {E}, Init::kNorm, true);  // lfm2's final norm
    else
        add("output_norm.weight", {E}, Init::kNorm, true);
    if (!c.tied) t.push_back({"output.weight", {E, n_vocab}, Init::kWeight, true});

    for (int64_t il = 0; il < c.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        const bool attn = !is_lfm2(c.arch) ||
                          std::find(c.attn_layers.begin(), c.attn_layers.end(), il) != c.attn_layers.end();
        add(p + "attn_norm.weight", {E}, Init::kNorm, true);
        if (attn) {
            add(p + "attn_q.weight", {E, q_dim});
            add(p + "attn_k.weight", {E, kv_dim});
            add(p + "attn_v.weight", {E, kv_dim});
            add(p + "attn_output.weight", {q_dim, E});
            if (c.arch == "qwen2") {
                add(p + "attn_q.bias", {q_dim}, Init::kSmall, true);
                add(p + "attn_k.bias", {kv_dim}, Init::kSmall, true);
                add(p + "attn_v.bias", {kv_dim}, Init::kSmall, true);
            }
            if (c.arch == "qwen3" || is_lfm2(c.arch)) {
                add(p + "attn_q_norm.weight", {hd}, Init::kNorm, true);
                add(p + "attn_k_norm.weight", {hd}, Init::kNorm, true);
            }
        } else {
            add(p + "shortconv.conv.weight", {c.l_cache, E}, Init::kSmall, true);
            add(p + "shortconv.in_proj.weight", {E, 3 * E});
            add(p + "shortconv.out_proj.weight", {E, E});
        }
        add(p + "ffn_norm.weight", {E}, Init::kNorm, true);
        if (c.arch == "lfm2moe" && il >= c.n_dense_lead) {
            const int64_t X = c.n_expert, Fx = c.n_ff_exp;
            add(p + "ffn_gate_inp.weight", {E, X}, Init::kWeight, true);
            add(p + "ffn_gate_exps.weight", {E, Fx, X});
            add(p + "ffn_up_exps.weight", {E, Fx, X});
            add(p + "ffn_down_exps.weight", {Fx, E, X});
            add(p + "exp_probs_b.bias", {X}, Init::kSmall, true);
        } else {
            add(p + "ffn_gate.weight", {E, F});
            add(p + "ffn_up.weight", {E, F});
            add(p + "ffn_down.weight", {F, E});
        }
    }
    return t;
}

// Each tensor's type: the mixture's rules, else `type` (the embeddings
// `embd_type`) for every tensor llama-quantize would quantize, rows fitted as it fits them.
std::vector<GgmlType> tensor_types(const SynthConfig& c, const std::vector<TensorSpec>& specs) {
    std::vector<quantize::TensorDesc> descs;
    for (const TensorSpec& s : specs) descs.push_back({s.name, s.ne, GgmlType::kF32});
    if (c.mixture) {
        quantize::MixtureOptions o;
        o.file_type = *c.mixture;
        o.token_embedding_type = c.embd_type;
        o.output_tensor_type = c.embd_type;
        quantize::ModelFacts m;
        m.arch = c.arch;
        m.n_layer = c.n_layer;
        m.n_expert = c.arch == "lfm2moe" && c.n_expert > 1 ? c.n_expert : 0;
        // query heads per KV head of layer 0, 0 where that layer has no attention (as llama-quantize reads it)
        const bool attn0 = !is_lfm2(c.arch) ||
                           std::find(c.attn_layers.begin(), c.attn_layers.end(), int64_t(0)) != c.attn_layers.end();
        m.n_gqa = attn0 && c.n_head_kv > 0 ? c.n_head / c.n_head_kv : 0;
        return quantize::choose_types(o, m, descs);
    }
    std::vector<GgmlType> types;
    for (size_t i = 0; i < specs.size(); ++i) {
        if (!quantize::allows_quantization(descs[i])) {
            types.push_back(GgmlType::kF32);
            continue;
        }
        const GgmlType t = specs[i].embedding ? c.embd_type.value_or(c.type) : c.type;
        // Where llama-quantize has no fallback (rows not a multiple of 32 in Q8_0, ...), F16.
        types.push_back(quantize::fallback_for(t, specs[i].ne[0]).value_or(GgmlType::kF16));
    }
    return types;
}

void metadata(const SynthConfig& c, const File* vocab, int64_t n_vocab, Writer& w) {
    const std::string& a = c.arch;
    auto k = [&](const char* suffix) { return keys::arch_key(a, suffix); };
    const int64_t hd = c.head_dim > 0 ? c.head_dim : c.n_embd / c.n_head;
    w.set_string(keys::kArchitecture, a);
    w.set_string("general.type", "model");
    w.set_string(keys::kName, c.name.empty() ? "synth-" + a : c.name);
    w.set_u32(k("block_count"), uint32_t(c.n_layer));
    w.set_u32(k("context_length"), uint32_t(c.n_ctx));
    w.set_u32(k("embedding_length"), uint32_t(c.n_embd));
    w.set_u32(k("feed_forward_length"), uint32_t(c.n_ff));
    w.set_u32(k("attention.head_count"), uint32_t(c.n_head));
    if (is_lfm2(a)) {
        std::vector<int32_t> kv(size_t(c.n_layer), 0);
        for (int64_t il : c.attn_layers) kv[size_t(il)] = int32_t(c.n_head_kv);
        w.set(k("attention.head_count_kv"), value_i32_array(kv));
    } else {
        w.set_u32(k("attention.head_count_kv"), uint32_t(c.n_head_kv));
    }
    w.set_f32(k("rope.freq_base"), c.rope_freq_base);
    w.set_f32(k("attention.layer_norm_rms_epsilon"), c.norm_eps);
    if (a == "lfm2moe") {
        w.set_u32(k("expert_count"), uint32_t(c.n_expert));
        w.set_u32(k("expert_used_count"), uint32_t(c.n_expert_used));
        w.set_u32(k("expert_feed_forward_length"), uint32_t(c.n_ff_exp));
        w.set_u32(k("leading_dense_block_count"), uint32_t(c.n_dense_lead));
        w.set_u32(k("expert_gating_func"), 2);  // sigmoid
    }
    if (is_lfm2(a)) w.set_u32(k("shortconv.l_cache"), uint32_t(c.l_cache));
    if (!is_lfm2(a)) {
        w.set_u32(k("rope.dimension_count"), uint32_t(hd));
        w.set_u32(k("attention.key_length"), uint32_t(hd));
        w.set_u32(k("attention.value_length"), uint32_t(hd));
    }
    if (a == "granite") {
        w.set_f32(k("attention.scale"), c.attention_scale > 0 ? c.attention_scale : 1.0f / float(hd));
        w.set_f32(k("embedding_scale"), c.embedding_scale);
        w.set_f32(k("residual_scale"), c.residual_scale);
        w.set_f32(k("logit_scale"), c.logit_scale);
    }
    w.set_u32(k("vocab_size"), uint32_t(n_vocab));
    w.set_u32(keys::kFileType, c.mixture ? uint32_t(*c.mixture) : keys::file_type_of(c.type, /*k_medium=*/true));
    w.set_u32(keys::kQuantVersion, 2);
    if (vocab)
        for (const auto& [key, v] : vocab->metadata())
            if (key.rfind("tokenizer.", 0) == 0) w.set(key, v);
}

}  // namespace

const std::vector<std::string>& synth_archs() {
    static const std::vector<std::string> v = {"lfm2", "lfm2moe", "llama", "qwen2", "qwen3", "granite"};
    return v;
}

const std::vector<std::string>& synth_presets() {
    static const std::vector<std::string> v = {"tiny", "lfm2-350m", "lfm2-1.2b", "llama-1b"};
    return v;
}

SynthConfig synth_preset(std::string_view arch, std::string_view preset) {
    const auto& archs = synth_archs();
    if (std::find(archs.begin(), archs.end(), arch) == archs.end())
        throw_error(ErrorCode::kInvalidArgument, "unknown architecture '%.*s' (expected lfm2, lfm2moe, llama, qwen2, "
                    "qwen3 or granite)", int(arch.size()), arch.data());
    SynthConfig c;
    c.arch = std::string(arch);
    const std::vector<int64_t> lfm2_pattern = {2, 5, 8, 10, 12, 14};  // the released LFM2 350M / 1.2B
    if (preset == "tiny") {
        c.n_embd = 256, c.n_layer = 4, c.n_head = 4, c.n_head_kv = 2, c.n_ff = 512, c.n_ctx = 2048;
        c.attn_layers = {1, 3};
        c.n_expert = 4, c.n_expert_used = 2, c.n_ff_exp = 256, c.n_dense_lead = 1;
    } else if (preset == "lfm2-350m") {
        c.n_embd = 1024, c.n_layer = 16, c.n_head = 16, c.n_head_kv = 8, c.n_ff = 4608, c.n_ctx = 128000;
        c.attn_layers = lfm2_pattern;
    } else if (preset == "lfm2-1.2b") {
        c.n_embd = 2048, c.n_layer = 16, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 8192, c.n_ctx = 128000;
        c.attn_layers = lfm2_pattern;
    } else if (preset == "llama-1b") {
        c.n_embd = 2048, c.n_layer = 16, c.n_head = 32, c.n_head_kv = 8, c.n_ff = 8192, c.n_ctx = 131072;
        c.attn_layers = lfm2_pattern;
    } else {
        throw_error(ErrorCode::kInvalidArgument, "unknown preset '%.*s' (expected tiny, lfm2-350m, lfm2-1.2b or "
                    "llama-1b)", int(preset.size()), preset.data());
    }
    if (preset != "tiny") {  // lfm2moe at a real width: LFM2-8B-A1B-like experts
        c.n_expert = 32, c.n_expert_used = 4, c.n_ff_exp = 1792, c.n_dense_lead = 2;
    }
    c.head_dim = 0;
    c.rope_freq_base = is_lfm2(c.arch) ? 1e6f : c.arch == "llama" ? 500000.0f : c.arch == "granite" ? 10000.0f : 1e6f;
    c.tied = true;
    return c;
}

void synth_validate(const SynthConfig& c) {
    const auto& archs = synth_archs();
    if (std::find(archs.begin(), archs.end(), c.arch) == archs.end())
        throw_error(ErrorCode::kInvalidArgument, "unknown architecture '%s'", c.arch.c_str());
    auto in_range = [&](int64_t v, const char* what, int64_t lo = 1, int64_t hi = kMaxDim) {
        if (v < lo || v > hi)
            throw_error(ErrorCode::kInvalidArgument, "%s = %lld is outside [%lld, %lld]", what, (long long)v,
                        (long long)lo, (long long)hi);
    };
    in_range(c.n_embd, "n_embd");
    in_range(c.n_layer, "n_layer", 1, 4096);
    in_range(c.n_head, "n_head", 1, 4096);
    in_range(c.n_head_kv, "n_head_kv", 1, 4096);
    in_range(c.n_ff, "n_ff");
    in_range(c.n_ctx, "n_ctx", 1, int64_t(1) << 31);
    in_range(c.head_dim, "head_dim", 0, 4096);
    if (c.n_vocab != 0) in_range(c.n_vocab, "n_vocab", 1, int64_t(1) << 24);
    if (c.head_dim == 0 && c.n_embd % c.n_head != 0)
        throw_error(ErrorCode::kInvalidArgument, "n_embd %lld is not a multiple of n_head %lld (give head_dim)",
                    (long long)c.n_embd, (long long)c.n_head);
    if (c.n_head % c.n_head_kv != 0)
        throw_error(ErrorCode::kInvalidArgument, "n_head %lld is not a multiple of n_head_kv %lld", (long long)c.n_head,
                    (long long)c.n_head_kv);
    if (is_lfm2(c.arch)) {
        in_range(c.l_cache, "l_cache", 1, 64);
        if (c.attn_layers.empty())
            throw_error(ErrorCode::kInvalidArgument, "%s needs at least one attention layer", c.arch.c_str());
        for (int64_t il : c.attn_layers) in_range(il, "attention layer index", 0, c.n_layer - 1);
    }
    if (c.arch == "lfm2moe") {
        in_range(c.n_expert, "n_expert", 1, 1024);
        in_range(c.n_expert_used, "n_expert_used", 1, c.n_expert);
        in_range(c.n_ff_exp, "n_ff_exp");
        in_range(c.n_dense_lead, "n_dense_lead", 0, c.n_layer);
    }
    if (c.mixture && c.type != quantize::default_type(*c.mixture))
        throw_error(ErrorCode::kInvalidArgument, "the %s mixture is of %s, not %s",
                    quantize::file_type_name(*c.mixture), type_name(quantize::default_type(*c.mixture)),
                    type_name(c.type));
    for (GgmlType t : {c.type, c.embd_type.value_or(c.type)}) {
        if (!can_quantize(t))
            throw_error(ErrorCode::kUnsupported, "cannot write tensor type %s (no quantizer)", type_name(t));
    }
}

void synthesize(const SynthConfig& cfg, const File* vocab, const std::string& path, int n_threads) {
    SynthConfig c = cfg;
    if (is_lfm2(c.arch) && c.attn_layers.empty())
        for (int64_t il = 2; il < c.n_layer; il += 3) c.attn_layers.push_back(il);
    std::sort(c.attn_layers.begin(), c.attn_layers.end());
    c.attn_layers.erase(std::unique(c.attn_layers.begin(), c.attn_layers.end()), c.attn_layers.end());
    synth_validate(c);

    int64_t n_vocab = c.n_vocab;
    if (vocab) {
        const Value* tokens = vocab->find(keys::kTokTokens);
        if (!tokens || tokens->type != ValueType::kArray)
            throw_error(ErrorCode::kMissing, "%s: no tokenizer.ggml.tokens array to copy the vocabulary from",
                        vocab->path().c_str());
        const int64_t n = int64_t(tokens->as_array().items.size());
        if (n_vocab != 0 && n_vocab != n)
            throw_error(ErrorCode::kInvalidArgument, "n_vocab %lld disagrees with the %lld tokens of %s",
                        (long long)n_vocab, (long long)n, vocab->path().c_str());
        n_vocab = n;
    }
    if (n_vocab <= 0) throw_error(ErrorCode::kInvalidArgument, "n_vocab is unknown: give a vocabulary file or n_vocab");

    if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
    ThreadPool pool(n_threads);

    Writer w;
    metadata(c, vocab, n_vocab, w);
    const std::vector<TensorSpec> specs = layout(c, n_vocab);
    const std::vector<GgmlType> types = tensor_types(c, specs);
    for (size_t i = 0; i < specs.size(); ++i) {
        const TensorSpec& spec = specs[i];
        const GgmlType type = types[i];
        const uint64_t name_seed = c.seed ^ fnv1a(spec.name);
        const int64_t ne0 = spec.ne[0];
        const Init init = spec.init;
        const size_t row_bytes = row_size(type, ne0);
        w.add_tensor(spec.name, type, spec.ne, [&pool, type, ne0, init, row_bytes, name_seed](uint8_t* dst, size_t n) {
            const int64_t rows = int64_t(n / row_bytes);
            pool.parallel_for(
                rows,
                [&](int64_t begin, int64_t end, int) {
                    std::vector<float> row(static_cast<size_t>(ne0));
                    for (int64_t r = begin; r < end; ++r) {
                        Rng rng(name_seed + 0x9E3779B97F4A7C15ull * uint64_t(r + 1));
                        for (float& x : row) {
                            const float z = rng.normal();
                            x = init == Init::kNorm ? 1.0f + 0.02f * z : init == Init::kSmall ? 0.1f * z : 0.02f * z;
                        }
                        if (type == GgmlType::kF32)
                            std::memcpy(dst + size_t(r) * row_bytes, row.data(), row_bytes);
                        else
                            quantize_row_ref(type, row.data(), dst + size_t(r) * row_bytes, ne0);
                    }
                },
                std::max<int64_t>(1, 4096 / ne0));
        });
    }
    w.write(path);
}

}  // namespace cera::gguf
