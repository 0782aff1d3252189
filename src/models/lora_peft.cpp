// Hugging Face PEFT LoRA folders: adapter_config.json (r, lora_alpha, rank_pattern, alpha_pattern,
// use_rslora) and adapter_model.safetensors, whose tensors are named
//   base_model.model.model.layers.<i>.<module>.lora_A.weight   [r, k]
//   base_model.model.model.layers.<i>.<module>.lora_B.weight   [n_out, r]
// (<module> of an MoE layer's experts: feed_forward.experts.<e>.w1, w3, w2, one pair per expert).
// The module names map to the GGUF weights as the converter maps the base model's (tools/convert).
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "core/check.h"
#include "gguf/safetensors.h"
#include "models/lora_read.h"

namespace cera {
namespace {

using nlohmann::json;

// Hugging Face module (under model.layers.<i>.) -> GGUF weight (under blk.<i>.).
struct ModuleName {
    const char* hf;
    const char* gguf;
    bool rope_q = false, rope_k = false;  // rows permuted for RoPE NORM architectures
};
constexpr ModuleName kModules[] = {
    // attention (llama, qwen2, qwen3, granite: o_proj; lfm2: out_proj)
    {"self_attn.q_proj", "attn_q.weight", true, false},
    {"self_attn.k_proj", "attn_k.weight", false, true},
    {"self_attn.v_proj", "attn_v.weight"},
    {"self_attn.o_proj", "attn_output.weight"},
    {"self_attn.out_proj", "attn_output.weight"},
    // LFM2 short conv
    {"conv.in_proj", "shortconv.in_proj.weight"},
    {"conv.out_proj", "shortconv.out_proj.weight"},
    // FFN: LFM2's w1/w3/w2, the others' gate/up/down
    {"feed_forward.w1", "ffn_gate.weight"},
    {"feed_forward.w3", "ffn_up.weight"},
    {"feed_forward.w2", "ffn_down.weight"},
    {"mlp.gate_proj", "ffn_gate.weight"},
    {"mlp.up_proj", "ffn_up.weight"},
    {"mlp.down_proj", "ffn_down.weight"},
};

// Architectures whose converted q/k rows are permuted to adjacent RoPE pairs.
bool rope_norm_arch(const std::string& arch) { return arch == "llama" || arch == "granite"; }

void permute_rows(std::vector<float>& w, int64_t n_head, int64_t head_dim, int64_t row_len) {
    std::vector<float> out(w.size());
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n_head; ++h)
        for (int64_t j = 0; j < half; ++j)
            for (int64_t s = 0; s < 2; ++s)
                std::copy_n(w.data() + (h * head_dim + s * half + j) * row_len, row_len,
                            out.data() + (h * head_dim + 2 * j + s) * row_len);
    w.swap(out);
}

// PEFT's rank_pattern / alpha_pattern: a key applies to a module whose name ends with it (after a dot).
const json* pattern_value(const json& cfg, const char* field, const std::string& module) {
    auto it = cfg.find(field);
    if (it == cfg.end() || !it->is_object()) return nullptr;
    for (auto p = it->begin(); p != it->end(); ++p) {
        try {
            if (std::regex_match(module, std::regex("(.*\\.)?(" + p.key() + ")"))) return &p.value();
        } catch (const std::regex_error&) {
            if (module == p.key() || (module.size() > p.key().size() &&
                                      module.compare(module.size() - p.key().size() - 1, std::string::npos,
                                                     "." + p.key()) == 0))
                return &p.value();
        }
    }
    return nullptr;
}

json read_config(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw_error(ErrorCode::kIo, "%s: cannot open", path.c_str());
    std::stringstream ss;
    ss << in.rdbuf();
    try {
        json j = json::parse(ss.str());
        if (!j.is_object()) throw_error(ErrorCode::kInvalidFile, "%s: not a JSON object", path.c_str());
        return j;
    } catch (const json::exception& e) {
        throw_error(ErrorCode::kParse, "%s: %s", path.c_str(), e.what());
    }
}

double number(const json& cfg, const char* key, double fallback, const std::string& path) {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return fallback;
    if (!it->is_number()) throw_error(ErrorCode::kInvalidFile, "%s: %s must be a number", path.c_str(), key);
    return it->get<double>();
}

}  // namespace

LoraRead read_peft_lora(const std::string& dir, const std::string& arch, const LoraHeads& heads) {
    const std::string cfg_path = dir + "/adapter_config.json";
    const json cfg = read_config(cfg_path);
    const std::string type = cfg.value("peft_type", std::string("LORA"));
    if (type != "LORA")
        throw_error(ErrorCode::kUnsupported, "%s: peft_type '%s', only LORA is supported", cfg_path.c_str(), type.c_str());
    auto flag = [&](const char* key) {
        auto it = cfg.find(key);
        return it != cfg.end() && it->is_boolean() && it->get<bool>();
    };
    if (flag("use_dora")) throw_error(ErrorCode::kUnsupported, "%s: DoRA adapters are not supported", cfg_path.c_str());
    if (flag("fan_in_fan_out"))
        throw_error(ErrorCode::kUnsupported, "%s: fan_in_fan_out adapters are not supported", cfg_path.c_str());
    if (auto it = cfg.find("modules_to_save"); it != cfg.end() && it->is_array() && !it->empty())
        throw_error(ErrorCode::kUnsupported, "%s: modules_to_save (whole trained modules) is not supported",
                    cfg_path.c_str());
    if (auto it = cfg.find("bias"); it != cfg.end() && it->is_string() && it->get<std::string>() != "none")
        throw_error(ErrorCode::kUnsupported, "%s: bias '%s' is not supported", cfg_path.c_str(),
                    it->get<std::string>().c_str());
    const double r_default = number(cfg, "r", 8, cfg_path);
    const double alpha_default = number(cfg, "lora_alpha", r_default, cfg_path);
    const bool rslora = flag("use_rslora");

    const SafeTensors st(dir + "/adapter_model.safetensors");
    // module name (model.layers.<i>.<module>) -> its A and B
    std::map<std::string, std::pair<const StTensor*, const StTensor*>> pairs;
    for (const auto& [name, t] : st.tensors()) {
        std::string n = name;
        for (const char* prefix : {"base_model.model.", "base_model."})
            if (n.rfind(prefix, 0) == 0) {
                n = n.substr(std::string(prefix).size());
                break;
            }
        bool is_a = false;
        if (n.size() > 14 && n.compare(n.size() - 14, 14, ".lora_A.weight") == 0)
            is_a = true;
        else if (!(n.size() > 14 && n.compare(n.size() - 14, 14, ".lora_B.weight") == 0))
            throw_error(ErrorCode::kUnsupported, "%s: tensor %s is not a LoRA A or B weight", st.path().c_str(),
                        name.c_str());
        auto& p = pairs[n.substr(0, n.size() - 14)];
        (is_a ? p.first : p.second) = &t;
    }
    LoraRead out;
    out.arch = arch;  // PEFT names no GGUF architecture; the module names are checked instead
    const std::regex layer_re("(?:model\\.)?layers\\.([0-9]+)\\.(.+)");
    const std::regex expert_re("feed_forward\\.experts\\.([0-9]+)\\.(w1|w2|w3)");
    // target -> (expert, its pair): stacked after every module is read
    std::map<std::string, std::vector<std::pair<int64_t, LoraTensor>>> experts;
    for (const auto& [module, ab] : pairs) {
        if (!ab.first || !ab.second)
            throw_error(ErrorCode::kMissing, "%s: %s has no lora_%s", st.path().c_str(), module.c_str(),
                        ab.first ? "B" : "A");
        std::smatch m;
        if (!std::regex_match(module, m, layer_re))
            throw_error(ErrorCode::kUnsupported, "%s: LoRA on %s (not a layer projection) is not supported",
                        st.path().c_str(), module.c_str());
        const std::string layer = m[1].str(), sub = m[2].str();
        const ModuleName* mn = nullptr;
        const char* gguf_name = nullptr;
        int64_t expert = -1;
        std::smatch em;
        if (std::regex_match(sub, em, expert_re)) {
            expert = em[1].length() > 9 ? INT64_MAX : std::stoll(em[1].str());  // past any expert count
            gguf_name = em[2] == "w1"   ? "ffn_gate_exps.weight"
                        : em[2] == "w3" ? "ffn_up_exps.weight"
                                        : "ffn_down_exps.weight";
        } else {
            for (const ModuleName& e : kModules)
                if (sub == e.hf) mn = &e;
            if (!mn)
                throw_error(ErrorCode::kUnsupported, "%s: LoRA on %s: no %s projection '%s' is known",
                            st.path().c_str(), module.c_str(), arch.c_str(), sub.c_str());
            gguf_name = mn->gguf;
        }
        const StTensor& a = *ab.first;
        const StTensor& b = *ab.second;
        if (a.shape.size() != 2 || b.shape.size() != 2 || a.shape[0] != b.shape[1])
            throw_error(ErrorCode::kInvalidFile, "%s: %s has lora_A %s and lora_B %s: not a rank-r pair",
                        st.path().c_str(), module.c_str(), shape_str(a.shape).c_str(),
                        shape_str(b.shape).c_str());
        LoraTensor t;
        t.target = "blk." + layer + "." + gguf_name;
        t.r = a.shape[0];
        t.k = a.shape[1];
        t.n_out = b.shape[0];
        const json* pr = pattern_value(cfg, "rank_pattern", module);
        const json* pa = pattern_value(cfg, "alpha_pattern", module);
        const double r = pr && pr->is_number() ? pr->get<double>() : r_default;
        const double alpha = pa && pa->is_number() ? pa->get<double>() : alpha_default;
        if (int64_t(r) != t.r)
            throw_error(ErrorCode::kInvalidFile, "%s: %s has rank %lld, the config says %g", st.path().c_str(),
                        module.c_str(), (long long)t.r, r);
        t.factor = float(rslora ? alpha / std::sqrt(r) : alpha / r);
        t.a.resize(size_t(a.n_elements()));
        t.b.resize(size_t(b.n_elements()));
        a.to_f32(t.a.data());
        b.to_f32(t.b.data());
        if (mn && rope_norm_arch(arch) && (mn->rope_q || mn->rope_k)) {
            const int64_t n_heads = mn->rope_q ? heads.n_head : heads.n_head_kv;
            if (n_heads <= 0 || t.n_out % n_heads != 0 || (t.n_out / n_heads) % 2 != 0)
                throw_error(ErrorCode::kInvalidFile, "%s: %s has %lld rows for %lld heads", st.path().c_str(),
                            module.c_str(), (long long)t.n_out, (long long)n_heads);
            permute_rows(t.b, n_heads, t.n_out / n_heads, t.r);
        }
        if (expert < 0)
            out.tensors.push_back(std::move(t));
        else
            experts[t.target].emplace_back(expert, std::move(t));
    }
    for (auto& [target, parts] : experts) {
        const LoraTensor& first = parts.front().second;
        if (heads.n_expert < 1)
            throw_error(ErrorCode::kInvalidFile,
                        "%s: the adapter has MoE expert modules for %s, the model has no experts", st.path().c_str(),
                        target.c_str());
        LoraTensor s;
        s.target = target;
        s.r = first.r, s.k = first.k, s.n_out = first.n_out, s.factor = first.factor;
        s.n_expert = heads.n_expert;
        const size_t na = size_t(s.r * s.k), nb = size_t(s.n_out * s.r);
        s.a.assign(na * size_t(s.n_expert), 0.0f);
        s.b.assign(nb * size_t(s.n_expert), 0.0f);
        for (const auto& [e, t] : parts) {
            if (e >= s.n_expert)
                throw_error(ErrorCode::kInvalidFile,
                            "%s: the adapter has expert %lld of %s, the model has %lld experts", st.path().c_str(),
                            (long long)e, target.c_str(), (long long)s.n_expert);
            if (t.r != s.r || t.k != s.k || t.n_out != s.n_out)
                throw_error(
                    ErrorCode::kInvalidFile,
                    "%s: the experts of %s differ: lora_A [%lld, %lld] and [%lld, %lld], lora_B rows %lld and %lld",
                    st.path().c_str(), target.c_str(), (long long)s.r, (long long)s.k, (long long)t.r, (long long)t.k,
                    (long long)s.n_out, (long long)t.n_out);
            if (t.factor != s.factor)
                throw_error(ErrorCode::kUnsupported, "%s: the experts of %s have different alpha / r (%g and %g)",
                            st.path().c_str(), target.c_str(), double(s.factor), double(t.factor));
            std::copy(t.a.begin(), t.a.end(), s.a.begin() + int64_t(na) * e);
            std::copy(t.b.begin(), t.b.end(), s.b.begin() + int64_t(nb) * e);
        }
        out.tensors.push_back(std::move(s));
    }
    if (out.tensors.empty()) throw_error(ErrorCode::kInvalidFile, "%s: no LoRA tensors", st.path().c_str());
    return out;
}

}  // namespace cera
