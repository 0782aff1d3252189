// llama-quantize's tensor-type rules for the file types cera writes (no importance
// matrix). The rules are a chain of special cases keyed on a tensor's role (attn_v,
// ffn_down, the LM head, ...), its layer, and a few facts about the model; they are
// kept in the order llama-quantize tests them, because the first match wins.
#include "quantize/mixture.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <numeric>

#include "cera/error.h"
#include "core/check.h"
#include "core/quant/quant.h"

namespace cera::quantize {
namespace {

enum class Role { kOutput, kTokenEmbd, kAttnV, kAttnK, kAttnQ, kAttnOutput, kFfnUp, kFfnGate, kFfnDown, kOther };

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }
bool ends_with(std::string_view s, std::string_view tail) {
    return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

// The role llama-quantize gives a tensor by its name. attn_qkv and attn_kv_b count as attn_v:
// they hold the values too, and the rules treat all three alike.
Role role_of(std::string_view name) {
    if (name == "output.weight") return Role::kOutput;
    if (name == "token_embd.weight" || name == "per_layer_token_embd.weight") return Role::kTokenEmbd;
    if (contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight") || contains(name, "attn_v.weight"))
        return Role::kAttnV;
    if (contains(name, "attn_k.weight")) return Role::kAttnK;
    if (contains(name, "attn_q.weight")) return Role::kAttnQ;
    if (contains(name, "attn_output.weight")) return Role::kAttnOutput;
    if (contains(name, "ffn_up")) return Role::kFfnUp;
    if (contains(name, "ffn_gate")) return Role::kFfnGate;
    if (contains(name, "ffn_down")) return Role::kFfnDown;
    return Role::kOther;
}

// The layer index of "blk.N.<...>", or -1.
int layer_of(std::string_view name) {
    if (name.rfind("blk.", 0) != 0) return -1;
    const std::string rest(name.substr(4));
    char* end = nullptr;
    const long v = std::strtol(rest.c_str(), &end, 10);
    return end == rest.c_str() ? -1 : int(v);
}

// The first and last eighth of the layers and every third one between get more bits.
bool use_more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

int64_t block_of(GgmlType t) { return type_info(t).block_size; }

struct Counters {
    int64_t n_attn_v = 0, i_attn_v = 0;
    int64_t n_ffn = 0, i_ffn_down = 0, i_ffn_gate = 0, i_ffn_up = 0;
    bool tied = true;  // no output.weight: token_embd is the LM head too
};

// The layer an FFN tensor belongs to. Dense models count FFN tensors in order; expert
// models read it from the name, because their expert tensors need not come in layer order.
int64_t ffn_layer(const TensorDesc& t, int64_t counter, const Counters& c, const ModelFacts& m) {
    if (m.n_expert <= 1) return counter;
    const int il = layer_of(t.name);
    if (il < 0 || il >= c.n_ffn)
        throw_error(ErrorCode::kUnsupported, "tensor '%s': cannot tell its layer in [0, %lld)", t.name.c_str(),
                    (long long)c.n_ffn);
    return il;
}

// The mixture's choice for a quantized tensor, before the rows are fitted.
GgmlType mixture_type(FileType ft, GgmlType type, const TensorDesc& t, const ModelFacts& m, const MixtureOptions& o,
                      Counters& c) {
    const Role role = role_of(t.name);
    const bool falcon = m.arch == "falcon";
    const bool k_m = ft == FileType::kQ4_K_M || ft == FileType::kQ5_K_M;
    const bool q2 = ft == FileType::kQ2_K, q3m = ft == FileType::kQ3_K_M, q3l = ft == FileType::kQ3_K_L;
    const bool iq4 = ft == FileType::kIQ4_NL || ft == FileType::kIQ4_XS;
    if (role == Role::kOutput || (c.tied && role == Role::kTokenEmbd)) {
        if (o.output_tensor_type) return *o.output_tensor_type;
        const int64_t ne0 = t.ne[0];
        if (falcon || ne0 % block_of(type) != 0) return GgmlType::kQ8_0;
        return type == GgmlType::kQ8_0 ? type : GgmlType::kQ6_K;
    }
    if (role == Role::kTokenEmbd) return o.token_embedding_type.value_or(type);
    switch (role) {
        case Role::kAttnV:
            if (q2)
                type = m.n_gqa >= 4 ? GgmlType::kQ4_K : GgmlType::kQ3_K;
            else if (ft == FileType::kQ2_K_S && m.n_gqa >= 4)
                type = GgmlType::kQ4_K;
            else if (q3m)
                type = c.i_attn_v < 2 ? GgmlType::kQ5_K : GgmlType::kQ4_K;
            else if (q3l)
                type = GgmlType::kQ5_K;
            else if (iq4 && m.n_gqa >= 4)
                type = GgmlType::kQ5_K;
            else if (k_m && use_more_bits(c.i_attn_v, c.n_attn_v))
                type = GgmlType::kQ6_K;
            else if (ft == FileType::kQ4_K_S && c.i_attn_v < 4)
                type = GgmlType::kQ5_K;
            if (m.is_70b && (type == GgmlType::kQ3_K || type == GgmlType::kQ4_K)) type = GgmlType::kQ5_K;
            if (m.n_expert == 8) type = GgmlType::kQ8_0;  // a few MB more for the values of 8-expert models
            ++c.i_attn_v;
            break;
        case Role::kAttnK:
            if (m.n_expert == 8) type = GgmlType::kQ8_0;
            break;
        case Role::kFfnDown: {
            const int64_t il = ffn_layer(t, c.i_ffn_down, c, m), n = c.n_ffn;
            if (q2) {
                type = GgmlType::kQ3_K;
            } else if (ft == FileType::kQ2_K_S) {
                if (il < n / 8) type = GgmlType::kQ4_K;
            } else if (q3m) {
                type = il < n / 16                          ? GgmlType::kQ5_K
                       : !falcon || use_more_bits(il, n) ? GgmlType::kQ4_K
                                                           : GgmlType::kQ3_K;
            } else if (q3l) {
                type = falcon ? GgmlType::kQ4_K : GgmlType::kQ5_K;
            } else if (ft == FileType::kQ4_K_M) {
                if (falcon)
                    type = il < n / 16 ? GgmlType::kQ6_K : use_more_bits(il, n) ? GgmlType::kQ5_K : GgmlType::kQ4_K;
                else if (use_more_bits(il, n))
                    type = GgmlType::kQ6_K;
            } else if (iq4 && il < n / 8 && !o.has_imatrix) {
                type = GgmlType::kQ5_K;
            } else if (ft == FileType::kQ5_K_M && use_more_bits(il, n)) {
                type = GgmlType::kQ6_K;
            } else if (ft == FileType::kQ4_K_S && !falcon && il < n / 8) {
                type = GgmlType::kQ5_K;
            } else if ((ft == FileType::kQ4_0 || ft == FileType::kQ5_0) && o.has_imatrix && il < n / 8) {
                // The first eighth of ffn_down gets the type with a minimum under an importance matrix.
                type = ft == FileType::kQ4_0 ? GgmlType::kQ4_1 : GgmlType::kQ5_1;
            }
            ++c.i_ffn_down;
            break;
        }
        case Role::kAttnOutput:
            if (falcon) {
                if (q3l) type = GgmlType::kQ4_K;
            } else if (m.n_expert == 8) {
                if (q2 || ft == FileType::kQ3_K_S || q3m || ft == FileType::kQ4_K_S || ft == FileType::kQ4_K_M || iq4)
                    type = GgmlType::kQ5_K;
            } else if (q2) {
                type = GgmlType::kQ3_K;
            } else if (q3m) {
                type = GgmlType::kQ4_K;
            } else if (q3l) {
                type = GgmlType::kQ5_K;
            }
            break;
        case Role::kFfnGate:
            ffn_layer(t, c.i_ffn_gate++, c, m);  // only checks the name, as llama-quantize does
            break;
        case Role::kFfnUp:
            ffn_layer(t, c.i_ffn_up++, c, m);
            break;
        default:
            break;
    }
    return type;
}

const std::vector<FileTypeName> kNames = {
    {FileType::kAllF32, "F32"},    {FileType::kF16, "F16"},       {FileType::kBF16, "BF16"},
    {FileType::kQ8_0, "Q8_0"},     {FileType::kQ6_K, "Q6_K"},     {FileType::kQ5_K_M, "Q5_K_M"},
    {FileType::kQ5_K_S, "Q5_K_S"}, {FileType::kQ5_K_M, "Q5_K"},   {FileType::kQ5_1, "Q5_1"},
    {FileType::kQ5_0, "Q5_0"},     {FileType::kQ4_K_M, "Q4_K_M"}, {FileType::kQ4_K_S, "Q4_K_S"},
    {FileType::kQ4_K_M, "Q4_K"},   {FileType::kQ4_1, "Q4_1"},     {FileType::kQ4_0, "Q4_0"},
    {FileType::kQ3_K_L, "Q3_K_L"}, {FileType::kQ3_K_M, "Q3_K_M"}, {FileType::kQ3_K_M, "Q3_K"},
    {FileType::kQ3_K_S, "Q3_K_S"}, {FileType::kQ2_K, "Q2_K"},     {FileType::kIQ4_NL, "IQ4_NL"},
    {FileType::kIQ4_XS, "IQ4_XS"},
};

std::string upper(std::string_view s) {
    std::string u(s);
    for (char& ch : u) ch = char(std::toupper(static_cast<unsigned char>(ch)));
    return u;
}

}  // namespace

std::optional<GgmlType> fallback_for(GgmlType type, int64_t ne0) {
    if (ne0 % block_of(type) == 0) return type;
    GgmlType fallback;
    switch (type) {
        case GgmlType::kQ2_K:
        case GgmlType::kQ3_K:
        case GgmlType::kTQ1_0:
        case GgmlType::kTQ2_0:
            fallback = GgmlType::kQ4_0;
            break;
        case GgmlType::kQ4_K:
            fallback = GgmlType::kQ5_0;
            break;
        case GgmlType::kQ5_K:
            fallback = GgmlType::kQ5_1;
            break;
        case GgmlType::kQ6_K:
            fallback = GgmlType::kQ8_0;
            break;
        case GgmlType::kIQ4_XS:
            fallback = GgmlType::kIQ4_NL;
            break;
        default:
            return std::nullopt;
    }
    return ne0 % block_of(fallback) == 0 ? fallback : GgmlType::kF16;
}

GgmlType fallback_type(const TensorDesc& t, GgmlType type) {
    const int64_t ne0 = t.ne.empty() ? 1 : t.ne[0];
    if (auto f = fallback_for(type, ne0)) return *f;
    throw_error(ErrorCode::kUnsupported,
                "tensor '%s': a row of %lld elements is not a multiple of the %lld-element blocks of %s, and %s has "
                "no fallback type",
                t.name.c_str(), (long long)ne0, (long long)block_of(type), type_name(type), type_name(type));
}

const std::vector<FileTypeName>& file_type_names() { return kNames; }

const char* file_type_name(FileType ft) {
    for (const auto& n : kNames)
        if (n.type == ft) return n.name;
    switch (ft) {
        case FileType::kQ2_K:
            return "Q2_K";
        case FileType::kQ2_K_S:
            return "Q2_K_S";
        case FileType::kQ3_K_S:
            return "Q3_K_S";
        case FileType::kQ3_K_M:
            return "Q3_K_M";
        case FileType::kQ3_K_L:
            return "Q3_K_L";
        default:
            return "?";
    }
}

GgmlType default_type(FileType ft) {
    switch (ft) {
        case FileType::kAllF32:
            return GgmlType::kF32;
        case FileType::kF16:
            return GgmlType::kF16;
        case FileType::kBF16:
            return GgmlType::kBF16;
        case FileType::kQ4_0:
            return GgmlType::kQ4_0;
        case FileType::kQ4_1:
            return GgmlType::kQ4_1;
        case FileType::kQ5_0:
            return GgmlType::kQ5_0;
        case FileType::kQ5_1:
            return GgmlType::kQ5_1;
        case FileType::kQ8_0:
            return GgmlType::kQ8_0;
        case FileType::kQ2_K:
        case FileType::kQ2_K_S:
            return GgmlType::kQ2_K;
        case FileType::kQ3_K_S:
        case FileType::kQ3_K_M:
        case FileType::kQ3_K_L:
            return GgmlType::kQ3_K;
        case FileType::kQ4_K_S:
        case FileType::kQ4_K_M:
            return GgmlType::kQ4_K;
        case FileType::kQ5_K_S:
        case FileType::kQ5_K_M:
            return GgmlType::kQ5_K;
        case FileType::kQ6_K:
            return GgmlType::kQ6_K;
        case FileType::kIQ4_NL:
            return GgmlType::kIQ4_NL;
        case FileType::kIQ4_XS:
            return GgmlType::kIQ4_XS;
    }
    CERA_CHECK(false, "file type %u", unsigned(ft));
    return GgmlType::kF32;
}

FileType parse_file_type(std::string_view name) {
    const std::string u = upper(name);
    for (const auto& n : kNames) {
        if (u != n.name) continue;
        // The mixtures also write Q6_K, Q5_K, Q8_0 and the fallbacks Q5_0, Q5_1, F16.
        CERA_CHECK(can_quantize(default_type(n.type)), "no quantizer for %s", type_name(default_type(n.type)));
        return n.type;
    }
    if (u == "Q2_K_S")
        throw_error(ErrorCode::kUnsupported, "Q2_K_S needs an importance matrix, which cera quantize does not take yet");
    if (u == "Q8_1" || u == "Q8_K")
        throw_error(ErrorCode::kUnsupported, "%s is a format for activations, not a weight type llama.cpp reads",
                    u.c_str());
    if (u == "COPY" || u == "MXFP4_MOE" || u == "Q1_0" || u == "Q2_0" || u.rfind("IQ", 0) == 0 || u.rfind("TQ", 0) == 0)
        throw_error(ErrorCode::kUnsupported, "%s: cera has no quantizer for it", u.c_str());
    std::string list;
    for (const auto& n : kNames) list += std::string(list.empty() ? "" : ", ") + n.name;
    throw_error(ErrorCode::kInvalidArgument, "unknown type '%.*s' (expected one of %s)", int(name.size()), name.data(),
                list.c_str());
}

bool allows_quantization(const TensorDesc& t) {
    size_t dims = t.ne.size();
    while (dims > 1 && t.ne[dims - 1] == 1) --dims;  // trailing ones do not count, as in ggml_n_dims
    if (dims < 2) return false;
    const std::string_view n = t.name;
    if (!ends_with(n, "weight")) return false;
    if (n == "position_embd.weight" || n == "token_types.weight") return false;
    // Small or sensitive 2-D tensors llama-quantize leaves as they are.
    static const char* const kKept[] = {"_norm.weight",
                                        "ffn_gate_inp.weight",
                                        "ffn_gate_tid2eid.weight",
                                        "altup",
                                        "laurel",
                                        "per_layer_model_proj",
                                        "ssm_conv1d",
                                        "shortconv.conv.weight",
                                        "indexer.k_proj.weight",
                                        "indexer.q_proj.weight",
                                        "time_mix_first.weight",
                                        "time_mix_w0.weight",
                                        "time_mix_w1.weight",
                                        "time_mix_w2.weight",
                                        "time_mix_v0.weight",
                                        "time_mix_v1.weight",
                                        "time_mix_v2.weight",
                                        "time_mix_a0.weight",
                                        "time_mix_a1.weight",
                                        "time_mix_a2.weight",
                                        "time_mix_g1.weight",
                                        "time_mix_g2.weight",
                                        "time_mix_decay_w1.weight",
                                        "time_mix_decay_w2.weight",
                                        "time_mix_lerp_fused.weight",
                                        "attn_rel_b.weight",
                                        ".position_embd",
                                        "sam.pos_embd",
                                        "sam.neck.",
                                        "sam.net_",
                                        ".rel_pos",
                                        ".patch_embd",
                                        ".patch_merger",
                                        "a.rvq.codebook",
                                        "mm.a.code_embd"};
    for (const char* k : kKept)
        if (contains(n, k)) return false;
    return true;
}

std::vector<size_t> quantize_order(const std::vector<std::string>& names) {
    std::vector<size_t> idx(names.size());
    std::iota(idx.begin(), idx.end(), size_t(0));
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
        const int la = layer_of(names[a]), lb = layer_of(names[b]);
        return la != lb ? la < lb : names[a] < names[b];
    });
    return idx;
}

std::vector<GgmlType> choose_types(const MixtureOptions& o, const ModelFacts& m,
                                   const std::vector<TensorDesc>& tensors) {
    Counters c;
    c.n_ffn = m.n_layer;
    std::vector<std::string> names;
    names.reserve(tensors.size());
    for (const auto& t : tensors) {
        names.push_back(t.name);
        const Role r = role_of(t.name);
        if (r == Role::kAttnV) ++c.n_attn_v;
        if (r == Role::kOutput) c.tied = false;
    }
    const GgmlType base = default_type(o.file_type);
    const bool quantized = type_info(base).quantized;
    std::vector<GgmlType> out(tensors.size());
    for (size_t i : quantize_order(names)) {
        const TensorDesc& t = tensors[i];
        if (!allows_quantization(t)) {
            out[i] = t.type;
            continue;
        }
        const Role r = role_of(t.name);
        GgmlType type = base;
        if (o.token_embedding_type && r == Role::kTokenEmbd)
            type = *o.token_embedding_type;
        else if (o.output_tensor_type && r == Role::kOutput)
            type = *o.output_tensor_type;
        else if (quantized && !o.pure)
            type = mixture_type(o.file_type, base, t, m, o, c);
        // An override may not fit the rows either; it falls back like the mixture's choices.
        if (quantized || type_info(type).quantized) type = fallback_type(t, type);
        out[i] = type;
    }
    return out;
}

}  // namespace cera::quantize
