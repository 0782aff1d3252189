// `cera convert --hf DIR -o OUT.gguf [--type T]`: a Hugging Face Llama checkpoint
// (model.safetensors + config.json + tokenizer.json) to a GGUF `llama` model with
// llama.cpp's tensor names.
//
// - safetensors: an 8-byte little-endian header length, a JSON header
//   {name: {dtype, shape, data_offsets: [begin, end)}} (offsets relative to the end of
//   the header), then the data. F32, F16 and BF16 are read; everything goes through f32.
// - HF applies rotary embeddings with rotate-half (pairs (i, i + d/2)); GGUF `llama`
//   uses NORM RoPE (adjacent pairs). The rows of attn_q (n_head heads) and attn_k
//   (n_head_kv heads) are permuted per head: new row 2j + s <- old row s * d/2 + j.
// - A tied embedding stored only as lm_head.weight becomes token_embd.weight, and no
//   output.weight is written (the model then reuses token_embd, as llama.cpp does).
// - The tokenizer goes through the HF tokenizer reader (which refuses what it cannot reproduce):
//   byte-level BPE becomes llama.cpp's `gpt2` model with the `tokenizer.ggml.pre` that names its split
//   regex and flags; '▁'-style BPE with byte fallback becomes a SentencePiece-style `llama` vocabulary.
// - RoPE: rope_parameters (transformers 5) or rope_theta / rope_scaling; linear scaling as GGUF keys,
//   Llama 3.1 scaling as rope_freqs.weight. Anything the GGUF form cannot express is refused.
#include <nlohmann/json.hpp>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "cli/command.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "core/mmap.h"
#include "core/quant/quant.h"
#include "gguf/keys.h"
#include "gguf/writer.h"
#include "tokenizer/vocab_io.h"

namespace cera::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// ------------------------------------------------------------------ safetensors

struct StTensor {
    std::string dtype;           // "F32", "F16", "BF16"
    std::vector<int64_t> shape;  // outermost first (PyTorch order)
    const uint8_t* data = nullptr;
    size_t n_bytes = 0;

    int64_t n_elements() const {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        return n;
    }
};

class SafeTensors {
   public:
    explicit SafeTensors(const std::string& path) : map_(path) {
        const uint8_t* p = map_.data();
        const size_t size = map_.size();
        if (size < 8) throw_error(ErrorCode::kInvalidFile, "%s: too small for a safetensors file", path.c_str());
        uint64_t header_len = 0;
        for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | p[i];
        if (header_len > size - 8)
            throw_error(ErrorCode::kInvalidFile, "%s: header length %llu exceeds the file size %zu", path.c_str(),
                        (unsigned long long)header_len, size);
        json header;
        try {
            header = json::parse(p + 8, p + 8 + header_len);
        } catch (const json::exception& e) {
            throw_error(ErrorCode::kInvalidFile, "%s: header is not JSON: %s", path.c_str(), e.what());
        }
        if (!header.is_object()) throw_error(ErrorCode::kInvalidFile, "%s: header is not a JSON object", path.c_str());
        const uint8_t* base = p + 8 + header_len;
        const size_t data_size = size - 8 - header_len;
        for (const auto& [name, info] : header.items()) {
            if (name == "__metadata__") continue;
            StTensor t;
            try {
                t.dtype = info.at("dtype").get<std::string>();
                t.shape = info.at("shape").get<std::vector<int64_t>>();
                const auto off = info.at("data_offsets").get<std::vector<uint64_t>>();
                if (off.size() != 2 || off[0] > off[1] || off[1] > data_size)
                    throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' has data offsets outside the file",
                                path.c_str(), name.c_str());
                t.data = base + off[0];
                t.n_bytes = size_t(off[1] - off[0]);
            } catch (const json::exception& e) {
                throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s': %s", path.c_str(), name.c_str(), e.what());
            }
            size_t elem = 0;
            if (t.dtype == "F32") elem = 4;
            else if (t.dtype == "F16" || t.dtype == "BF16") elem = 2;
            else
                throw_error(ErrorCode::kUnsupported, "%s: tensor '%s' has dtype %s (supported: F32, F16, BF16)",
                            path.c_str(), name.c_str(), t.dtype.c_str());
            for (int64_t d : t.shape)
                if (d < 0) throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' has a negative dimension",
                                       path.c_str(), name.c_str());
            if (size_t(t.n_elements()) * elem != t.n_bytes)
                throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' holds %zu bytes, its shape needs %zu",
                            path.c_str(), name.c_str(), t.n_bytes, size_t(t.n_elements()) * elem);
            tensors_.emplace(name, std::move(t));
        }
    }

    const StTensor* find(const std::string& name) const {
        auto it = tensors_.find(name);
        return it == tensors_.end() ? nullptr : &it->second;
    }
    const std::map<std::string, StTensor>& tensors() const { return tensors_; }

   private:
    MappedFile map_;
    std::map<std::string, StTensor> tensors_;
};

std::vector<float> to_f32(const StTensor& t) {
    const size_t n = size_t(t.n_elements());
    std::vector<float> out(n);
    if (t.dtype == "F32") {
        std::memcpy(out.data(), t.data, n * 4);
    } else {
        for (size_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, t.data + 2 * i, 2);
            out[i] = t.dtype == "F16" ? fp16_to_fp32(h) : bf16_to_fp32(h);
        }
    }
    return out;
}

// HF rotate-half rows -> NORM-RoPE rows, per head: new[h][2j + s] = old[h][s * d/2 + j].
//   w: [n_head * head_dim, n_cols] row-major
std::vector<float> permute_rope_rows(const std::vector<float>& w, int64_t n_head, int64_t head_dim, int64_t n_cols) {
    std::vector<float> out(w.size());
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n_head; ++h)
        for (int64_t j = 0; j < half; ++j)
            for (int64_t s = 0; s < 2; ++s) {
                const float* src = w.data() + ((h * head_dim) + s * half + j) * n_cols;
                float* dst = out.data() + ((h * head_dim) + 2 * j + s) * n_cols;
                std::memcpy(dst, src, size_t(n_cols) * sizeof(float));
            }
    return out;
}

// ------------------------------------------------------------------ config

json read_json(const fs::path& path) {
    std::ifstream f(path);
    if (!f) throw_error(ErrorCode::kIo, "cannot open %s", path.c_str());
    try {
        return json::parse(f);
    } catch (const json::exception& e) {
        throw_error(ErrorCode::kInvalidFile, "%s: %s", path.c_str(), e.what());
    }
}

int64_t cfg_int(const json& cfg, const char* key) {
    auto it = cfg.find(key);
    if (it == cfg.end() || !it->is_number_integer())
        throw_error(ErrorCode::kMissing, "config.json: '%s' is missing or not an integer", key);
    return it->get<int64_t>();
}

// RoPE from config.json: transformers 5 nests it as rope_parameters {rope_theta, rope_type, ...};
// older files have rope_theta and rope_scaling {type|rope_type, factor, ...} at the top level.
struct Rope {
    float theta = 10000.0f;
    std::string type = "default";  // default | linear | llama3
    float factor = 1.0f;
    // llama3 only: the band between these wavelengths is interpolated.
    float low_freq_factor = 1.0f, high_freq_factor = 4.0f;
    int64_t original_context = 8192;
};

float cfg_f32(const json& j, const char* where, const char* key) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number())
        throw_error(ErrorCode::kMissing, "config.json: '%s%s' is missing or not a number", where, key);
    return it->get<float>();
}

Rope read_rope(const json& cfg) {
    Rope r;
    json params = json::object();
    const char* where = "";
    if (cfg.contains("rope_parameters") && cfg["rope_parameters"].is_object()) {
        params = cfg["rope_parameters"];
        where = "rope_parameters.";
        // One set of parameters per attention kind (e.g. full and sliding) has no GGUF llama form.
        if (!params.contains("rope_theta") && !params.contains("rope_type"))
            throw_error(ErrorCode::kUnsupported, "config.json: rope_parameters per attention type are not supported");
    } else if (cfg.contains("rope_scaling") && cfg["rope_scaling"].is_object()) {
        params = cfg["rope_scaling"];
        where = "rope_scaling.";
    }
    if (params.contains("rope_theta")) r.theta = cfg_f32(params, where, "rope_theta");
    else if (cfg.contains("rope_theta")) r.theta = cfg_f32(cfg, "", "rope_theta");
    if (!(r.theta > 0.0f)) throw_error(ErrorCode::kInvalidFile, "config.json: rope_theta %g is not positive", r.theta);
    r.type = params.value("rope_type", params.value("type", std::string("default")));
    if (r.type == "default") return r;
    r.factor = cfg_f32(params, where, "factor");
    if (!(r.factor > 0.0f)) throw_error(ErrorCode::kInvalidFile, "config.json: %sfactor %g is not positive", where, r.factor);
    if (r.type == "linear") return r;
    if (r.type == "llama3") {
        r.low_freq_factor = cfg_f32(params, where, "low_freq_factor");
        r.high_freq_factor = cfg_f32(params, where, "high_freq_factor");
        r.original_context = int64_t(cfg_f32(params, where, "original_max_position_embeddings"));
        if (!(r.high_freq_factor > r.low_freq_factor) || r.original_context <= 0)
            throw_error(ErrorCode::kInvalidFile, "config.json: llama3 rope needs high_freq_factor > low_freq_factor");
        return r;
    }
    throw_error(ErrorCode::kUnsupported, "config.json: rope type '%s' (supported: default, linear, llama3)",
                r.type.c_str());
}

// Llama 3.1's frequency-dependent scaling as per-frequency divisors (GGUF rope_freqs.weight, one per
// rotated pair): wavelengths shorter than original_context / high_freq_factor keep their frequency,
// longer than original_context / low_freq_factor are divided by `factor`, and the band between is
// interpolated smoothly in 1 / wavelength.
std::vector<float> llama3_rope_factors(const Rope& r, int64_t n_rot) {
    std::vector<float> out(size_t(n_rot / 2));
    const double low_wavelen = double(r.original_context) / r.low_freq_factor;
    const double high_wavelen = double(r.original_context) / r.high_freq_factor;
    for (int64_t i = 0; i < n_rot / 2; ++i) {
        const double freq = std::pow(double(r.theta), -2.0 * double(i) / double(n_rot));
        const double wavelen = 2.0 * M_PI / freq;
        double f = 1.0;
        if (wavelen > low_wavelen) {
            f = r.factor;
        } else if (wavelen >= high_wavelen) {
            const double smooth = (double(r.original_context) / wavelen - r.low_freq_factor) /
                                  (r.high_freq_factor - r.low_freq_factor);
            f = 1.0 / ((1.0 - smooth) / r.factor + smooth);
        }
        out[size_t(i)] = float(f);
    }
    return out;
}

// ------------------------------------------------------------------ tokenizer

// The tokenizer is read by the same reader that runs HF tokenizers (vocab_data_from_hf_json), which
// refuses what it cannot reproduce; here it is written in the GGUF form that tokenizes the same way,
// or refused when GGUF has no such form.
void write_tokenizer(const fs::path& dir, const json& config, int64_t n_vocab, gguf::Writer& w) {
    const fs::path tok_path = dir / "tokenizer.json";
    if (!fs::exists(tok_path)) throw_error(ErrorCode::kMissing, "%s not found", tok_path.c_str());
    const fs::path cfg_path = dir / "tokenizer_config.json";
    VocabData d = vocab_data_from_hf_json(tok_path.string(), fs::exists(cfg_path) ? cfg_path.string() : "");
    auto refuse = [&](const char* what) {
        throw_error(ErrorCode::kUnsupported, "%s: %s; a GGUF tokenizer cannot reproduce it", tok_path.c_str(), what);
    };
    if (d.nfc) refuse("the NFC normalizer");
    if (!d.lstrip.empty() || !d.rstrip.empty()) refuse("added tokens with lstrip/rstrip");
    if (d.add_eos && d.eos == kNoToken) refuse("add_eos_token without an EOS token");
    if (int64_t(d.tokens.size()) > n_vocab)
        throw_error(ErrorCode::kInvalidFile, "%s: %zu tokens, but config.json's vocab_size is %lld", tok_path.c_str(),
                    d.tokens.size(), (long long)n_vocab);

    // Ids that no token uses (holes, or a vocab_size larger than the tokenizer) are padding tokens.
    std::vector<std::string> tokens = std::move(d.tokens);
    std::vector<int32_t> types(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        types[i] = int32_t(d.types[i]);
        if (d.types[i] == TokenType::kUnused) tokens[i] = "[PAD" + std::to_string(i) + "]";
    }
    for (int64_t i = int64_t(tokens.size()); i < n_vocab; ++i) {
        tokens.push_back("[PAD" + std::to_string(i) + "]");
        types.push_back(int32_t(TokenType::kUnused));
    }
    if (d.unk != kNoToken) types[size_t(d.unk)] = int32_t(TokenType::kUnknown);
    std::unordered_map<std::string, int64_t> id_of;
    for (size_t i = 0; i < tokens.size(); ++i) id_of.emplace(tokens[i], int64_t(i));
    std::vector<std::string> merges;
    merges.reserve(d.merges.size());
    for (const auto& [a, b] : d.merges) merges.push_back(a + " " + b);

    namespace k = gguf::keys;
    if (d.byte_encode) {
        // Byte-level BPE: llama.cpp's gpt2 model, the pre-tokenizer named by its rules and flags.
        if (d.byte_fallback) refuse("byte-level BPE with byte_fallback");
        if (d.pre == PreTokenizer::kNone) refuse("byte-level BPE without a split regex");
        const char* pre = pre_tokenizer_gguf_name(d.pre, d.ignore_merges, d.clean_spaces);
        if (!pre) refuse("this split regex with these ignore_merges / clean_up_tokenization_spaces flags");
        w.set_string(k::kTokModel, "gpt2");
        w.set_string(k::kTokPre, pre);
        w.set(k::kTokTokens, gguf::value_string_array(tokens));
        w.set(k::kTokTypes, gguf::value_i32_array(types));
        w.set(k::kTokMerges, gguf::value_string_array(merges));
    } else {
        // BPE over '▁'-escaped text with byte fallback: a SentencePiece-style vocabulary (llama.cpp's
        // `llama` model). llama.cpp writes every score as -1000, which loses the merge order; here a token
        // made by merge rank r scores -(r + 1) (base symbols 0), so an SPM encoder that merges the
        // highest-scoring pair first follows the BPE merge order. The merges are written too.
        if (!d.escape_whitespace) refuse("BPE over unescaped text without byte-level encoding");
        if (!d.byte_fallback) refuse("'\xE2\x96\x81'-style BPE without byte_fallback");
        if (d.ignore_merges) refuse("'\xE2\x96\x81'-style BPE with ignore_merges");
        std::vector<float> scores(tokens.size(), 0.0f);
        for (size_t r = 0; r < merges.size(); ++r) {
            auto it = id_of.find(d.merges[r].first + d.merges[r].second);
            if (it != id_of.end() && scores[size_t(it->second)] == 0.0f) scores[size_t(it->second)] = -float(r + 1);
        }
        for (size_t i = 0; i < tokens.size(); ++i) {
            const std::string& t = tokens[i];
            if (types[i] == int32_t(TokenType::kNormal) && t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' &&
                std::isxdigit((unsigned char)t[3]) && std::isxdigit((unsigned char)t[4]))
                types[i] = int32_t(TokenType::kByte);
        }
        w.set_string(k::kTokModel, "llama");
        w.set_string(k::kTokPre, "default");
        w.set(k::kTokTokens, gguf::value_string_array(tokens));
        w.set(k::kTokScores, gguf::value_f32_array(scores));
        w.set(k::kTokTypes, gguf::value_i32_array(types));
        if (!merges.empty()) w.set(k::kTokMerges, gguf::value_string_array(merges));
        w.set_bool(k::kTokAddSpacePrefix, d.add_space_prefix);
    }

    // Special ids: the tokenizer's, else config.json's.
    auto special = [&](int32_t id, const char* cfg_key) -> std::optional<int64_t> {
        if (id != kNoToken) return id;
        if (config.contains(cfg_key) && config[cfg_key].is_number_integer()) {
            const int64_t v = config[cfg_key].get<int64_t>();
            if (v >= 0 && v < n_vocab) return v;
        }
        return std::nullopt;
    };
    if (auto id = special(d.bos, "bos_token_id")) w.set_u32(k::kTokBos, uint32_t(*id));
    if (auto id = special(d.eos, "eos_token_id")) w.set_u32(k::kTokEos, uint32_t(*id));
    if (d.unk != kNoToken) w.set_u32(k::kTokUnk, uint32_t(d.unk));
    if (auto id = special(d.pad, "pad_token_id")) w.set_u32(k::kTokPad, uint32_t(*id));
    w.set_bool(k::kTokAddBos, d.add_bos);
    w.set_bool(k::kTokAddSep, false);
    w.set_bool(k::kTokAddEos, d.add_eos);
    if (!d.chat_template.empty()) w.set_string(k::kChatTemplate, d.chat_template);
}

// ------------------------------------------------------------------ conversion

std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s;
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s.push_back('x');
        s.append(std::to_string(shape[i]));
    }
    return s;
}

struct Options {
    fs::path hf_dir;
    std::string out;
    GgmlType type = GgmlType::kF32;
};

// Adds one tensor, choosing its type: 1-D tensors stay F32; a matrix whose rows do not
// fill whole blocks of the requested type falls back to F32.
void add_tensor(gguf::Writer& w, const std::string& name, std::vector<float> data, std::vector<int64_t> hf_shape,
                GgmlType want) {
    std::vector<int64_t> ne(hf_shape.rbegin(), hf_shape.rend());  // GGUF order: innermost first
    GgmlType type = GgmlType::kF32;
    if (ne.size() >= 2 && want != GgmlType::kF32) {
        const QuantTraits* q = quant_traits(want);
        if (q && q->quantize && ne[0] % q->block_size == 0)
            type = want;
        else
            std::fprintf(stderr, "cera convert: %s: rows of %lld do not fit %s blocks, kept as F32\n", name.c_str(),
                         (long long)ne[0], type_name(want));
    }
    const int64_t rows = int64_t(data.size()) / ne[0];
    const size_t row_bytes = row_size(type, ne[0]);
    std::vector<uint8_t> bytes(row_bytes * size_t(rows));
    for (int64_t r = 0; r < rows; ++r)
        quantize_row_ref(type, data.data() + r * ne[0], bytes.data() + size_t(r) * row_bytes, ne[0]);
    w.add_tensor(name, type, std::move(ne), bytes);
}

void convert(const Options& o) {
    if (!fs::is_directory(o.hf_dir)) throw_error(ErrorCode::kIo, "%s is not a directory", o.hf_dir.c_str());
    const json cfg = read_json(o.hf_dir / "config.json");
    const std::string model_type = cfg.value("model_type", "");
    if (model_type != "llama" && model_type != "mistral")
        throw_error(ErrorCode::kUnsupported, "config.json: model_type '%s' (supported: llama, mistral)",
                    model_type.c_str());
    const int64_t n_embd = cfg_int(cfg, "hidden_size");
    const int64_t n_ff = cfg_int(cfg, "intermediate_size");
    const int64_t n_layer = cfg_int(cfg, "num_hidden_layers");
    const int64_t n_head = cfg_int(cfg, "num_attention_heads");
    const int64_t n_head_kv = cfg.contains("num_key_value_heads") ? cfg_int(cfg, "num_key_value_heads") : n_head;
    const int64_t n_vocab = cfg_int(cfg, "vocab_size");
    const int64_t n_ctx = cfg.contains("max_position_embeddings") ? cfg_int(cfg, "max_position_embeddings") : 2048;
    const int64_t head_dim =
        cfg.contains("head_dim") && cfg["head_dim"].is_number_integer() ? cfg_int(cfg, "head_dim") : n_embd / n_head;
    if (n_head <= 0 || n_head_kv <= 0 || n_head % n_head_kv != 0 || head_dim <= 0 || head_dim % 2 != 0)
        throw_error(ErrorCode::kInvalidFile, "config.json: bad head counts (%lld heads, %lld kv heads, head_dim %lld)",
                    (long long)n_head, (long long)n_head_kv, (long long)head_dim);
    const bool tied = cfg.value("tie_word_embeddings", false);
    // Settings that change the arithmetic and have no GGUF llama form are refused, not dropped.
    const std::string act = cfg.value("hidden_act", cfg.value("hidden_activation", std::string("silu")));
    if (act != "silu")
        throw_error(ErrorCode::kUnsupported, "config.json: hidden_act '%s' (supported: silu)", act.c_str());
    if (cfg.contains("sliding_window") && cfg["sliding_window"].is_number_integer() &&
        cfg["sliding_window"].get<int64_t>() < n_ctx)
        throw_error(ErrorCode::kUnsupported, "config.json: sliding_window %lld below the context of %lld",
                    (long long)cfg["sliding_window"].get<int64_t>(), (long long)n_ctx);
    if (cfg.value("attention_bias", false) || cfg.value("mlp_bias", false))
        throw_error(ErrorCode::kUnsupported, "config.json: attention_bias / mlp_bias are not supported");

    const fs::path st_path = o.hf_dir / "model.safetensors";
    if (!fs::exists(st_path))
        throw_error(ErrorCode::kIo, "%s not found (sharded checkpoints are not supported)", st_path.c_str());
    SafeTensors st(st_path.string());

    gguf::Writer w;
    namespace k = gguf::keys;
    const std::string arch = "llama";
    auto ak = [&](const char* s) { return k::arch_key(arch, s); };
    w.set_string(k::kArchitecture, arch);
    w.set_string("general.type", "model");
    w.set_string(k::kName, o.hf_dir.filename().empty() ? o.hf_dir.parent_path().filename().string()
                                                       : o.hf_dir.filename().string());
    w.set_u32(ak("context_length"), uint32_t(n_ctx));
    w.set_u32(ak("embedding_length"), uint32_t(n_embd));
    w.set_u32(ak("block_count"), uint32_t(n_layer));
    w.set_u32(ak("feed_forward_length"), uint32_t(n_ff));
    w.set_u32(ak("attention.head_count"), uint32_t(n_head));
    w.set_u32(ak("attention.head_count_kv"), uint32_t(n_head_kv));
    w.set_f32(ak("attention.layer_norm_rms_epsilon"), cfg.value("rms_norm_eps", 1e-5f));
    w.set_u32(ak("rope.dimension_count"), uint32_t(head_dim));
    w.set_u32(ak("attention.key_length"), uint32_t(head_dim));
    w.set_u32(ak("attention.value_length"), uint32_t(head_dim));
    w.set_u32(ak("vocab_size"), uint32_t(n_vocab));
    const Rope rope = read_rope(cfg);
    w.set_f32(ak("rope.freq_base"), rope.theta);
    if (rope.type == "linear") {
        w.set_string(ak("rope.scaling.type"), "linear");
        w.set_f32(ak("rope.scaling.factor"), rope.factor);
    }
    w.set_u32(k::kFileType, k::file_type_of(o.type, /*k_medium=*/false));
    w.set_u32(k::kQuantVersion, 2);

    write_tokenizer(o.hf_dir, cfg, n_vocab, w);

    auto need = [&](const std::string& name) -> const StTensor& {
        const StTensor* t = st.find(name);
        if (!t) throw_error(ErrorCode::kMissing, "%s: tensor '%s' is missing", st_path.c_str(), name.c_str());
        return *t;
    };
    auto check_shape = [&](const std::string& name, const StTensor& t, std::vector<int64_t> want) {
        if (t.shape != want)
            throw_error(ErrorCode::kInvalidFile, "tensor '%s' has shape [%s], expected [%s]", name.c_str(),
                        shape_str(t.shape).c_str(), shape_str(want).c_str());
    };
    std::set<std::string> used;
    auto put = [&](const std::string& hf, const std::string& gg, std::vector<int64_t> shape, int64_t permute_heads) {
        const StTensor& t = need(hf);
        used.insert(hf);
        check_shape(hf, t, shape);
        std::vector<float> data = to_f32(t);
        if (permute_heads > 0) data = permute_rope_rows(data, permute_heads, head_dim, shape[1]);
        add_tensor(w, gg, std::move(data), shape, o.type);
    };

    // The embedding: model.embed_tokens.weight, or lm_head.weight when tied and stored only there.
    const bool has_embed = st.find("model.embed_tokens.weight") != nullptr;
    put(has_embed ? "model.embed_tokens.weight" : "lm_head.weight", "token_embd.weight", {n_vocab, n_embd}, 0);
    for (int64_t i = 0; i < n_layer; ++i) {
        const std::string p = "model.layers." + std::to_string(i) + ".";
        const std::string b = "blk." + std::to_string(i) + ".";
        put(p + "input_layernorm.weight", b + "attn_norm.weight", {n_embd}, 0);
        put(p + "self_attn.q_proj.weight", b + "attn_q.weight", {n_head * head_dim, n_embd}, n_head);
        put(p + "self_attn.k_proj.weight", b + "attn_k.weight", {n_head_kv * head_dim, n_embd}, n_head_kv);
        put(p + "self_attn.v_proj.weight", b + "attn_v.weight", {n_head_kv * head_dim, n_embd}, 0);
        put(p + "self_attn.o_proj.weight", b + "attn_output.weight", {n_embd, n_head * head_dim}, 0);
        put(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", {n_embd}, 0);
        put(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", {n_ff, n_embd}, 0);
        put(p + "mlp.up_proj.weight", b + "ffn_up.weight", {n_ff, n_embd}, 0);
        put(p + "mlp.down_proj.weight", b + "ffn_down.weight", {n_embd, n_ff}, 0);
        for (const char* bias : {"q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"})
            if (st.find(p + "self_attn." + bias))
                throw_error(ErrorCode::kUnsupported, "tensor '%s': attention biases are not supported",
                            (p + "self_attn." + bias).c_str());
    }
    put("model.norm.weight", "output_norm.weight", {n_embd}, 0);
    if (rope.type == "llama3") {
        std::vector<float> f = llama3_rope_factors(rope, head_dim);
        const int64_t n = int64_t(f.size());
        w.add_tensor("rope_freqs.weight", GgmlType::kF32, {n},
                     std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(f.data()),
                                          reinterpret_cast<const uint8_t*>(f.data() + n)));
    }
    if (!tied) {
        if (!st.find("lm_head.weight"))
            throw_error(ErrorCode::kMissing, "lm_head.weight is missing and tie_word_embeddings is false");
        put("lm_head.weight", "output.weight", {n_vocab, n_embd}, 0);
    }
    // A tensor left behind would be a part of the model the file does not run.
    for (const auto& [name, t] : st.tensors()) {
        const bool rope_cache = name.size() >= 19 && name.compare(name.size() - 19, 19, "rotary_emb.inv_freq") == 0;
        const bool tied_head = tied && name == "lm_head.weight";
        if (!used.count(name) && !rope_cache && !tied_head)
            throw_error(ErrorCode::kUnsupported, "%s: tensor '%s' has no place in a GGUF llama model", st_path.c_str(),
                        name.c_str());
    }
    w.write(o.out);
    std::fprintf(stderr, "cera convert: wrote %s (%zu tensors, %s)\n", o.out.c_str(), w.n_tensors(),
                 type_name(o.type));
}

int run_convert(const std::vector<std::string>& args) {
    Options o;
    auto usage = [](FILE* f) {
        std::fprintf(f,
                     "usage: cera convert --hf DIR -o OUT.gguf [--type F32|F16|BF16|Q8_0|Q4_0|...]\n\n"
                     "Converts a Hugging Face Llama checkpoint (model.safetensors, config.json, tokenizer.json)\n"
                     "to a GGUF `llama` model. Matrices get --type (default F32); norms stay F32.\n");
    };
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> const std::string& {
            if (i + 1 >= args.size()) throw_error(ErrorCode::kInvalidArgument, "%s needs a value", a.c_str());
            return args[++i];
        };
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "--hf") {
            o.hf_dir = value();
        } else if (a == "-o" || a == "--out") {
            o.out = value();
        } else if (a == "--type" || a == "--outtype") {
            const std::string& t = value();
            auto type = type_from_name(t);
            if (!type || !can_quantize(*type) || *type == GgmlType::kQ8_1 || *type == GgmlType::kQ8_K)
                throw_error(ErrorCode::kInvalidArgument, "--type %s is not a weight type this converter can write",
                            t.c_str());
            o.type = *type;
        } else {
            throw_error(ErrorCode::kInvalidArgument, "unknown option '%s' (see --help)", a.c_str());
        }
    }
    if (o.hf_dir.empty() || o.out.empty()) {
        usage(stderr);
        return 2;
    }
    convert(o);
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(convert, "convert", "convert a Hugging Face Llama checkpoint to GGUF", run_convert);

}  // namespace cera::cli
