// LFM2-VL's vision side, written as llama.cpp's mmproj file (general.architecture "clip",
// projector_type "lfm2"): a SigLIP2 NaFlex tower (pre-norm blocks, tanh GELU, a linear patch
// embedding and a square position table that is resized to each image's grid) and a projector that
// folds each 2x2 (downsample_factor) block of patch features into one token, then layer norm,
// linear, GELU, linear into the text model's width. The text model is an LFM2 under text_config;
// convert.cpp writes it with convert_lfm2.
#include <cmath>

#include "convert/arch.h"
#include "core/check.h"

namespace cera::convert {
namespace {

namespace fs = std::filesystem;

// clang-format off
// Per tower layer, under <tower>encoder.layers.<i>. / v.blk.<i>.
const TensorRow kVisionLayer[] = {
    {"layer_norm1.weight",      "ln1.weight",      {Dim::kVEmbd}},
    {"layer_norm1.bias",        "ln1.bias",        {Dim::kVEmbd}},
    {"self_attn.q_proj.weight", "attn_q.weight",   {Dim::kVEmbd, Dim::kVEmbd}},
    {"self_attn.q_proj.bias",   "attn_q.bias",     {Dim::kVEmbd}},
    {"self_attn.k_proj.weight", "attn_k.weight",   {Dim::kVEmbd, Dim::kVEmbd}},
    {"self_attn.k_proj.bias",   "attn_k.bias",     {Dim::kVEmbd}},
    {"self_attn.v_proj.weight", "attn_v.weight",   {Dim::kVEmbd, Dim::kVEmbd}},
    {"self_attn.v_proj.bias",   "attn_v.bias",     {Dim::kVEmbd}},
    {"self_attn.out_proj.weight", "attn_out.weight", {Dim::kVEmbd, Dim::kVEmbd}},
    {"self_attn.out_proj.bias", "attn_out.bias",   {Dim::kVEmbd}},
    {"layer_norm2.weight",      "ln2.weight",      {Dim::kVEmbd}},
    {"layer_norm2.bias",        "ln2.bias",        {Dim::kVEmbd}},
    {"mlp.fc1.weight",          "ffn_up.weight",   {Dim::kVFf, Dim::kVEmbd}},
    {"mlp.fc1.bias",            "ffn_up.bias",     {Dim::kVFf}},
    {"mlp.fc2.weight",          "ffn_down.weight", {Dim::kVEmbd, Dim::kVFf}},
    {"mlp.fc2.bias",            "ffn_down.bias",   {Dim::kVEmbd}},
};
// Under <tower> / v.
const TensorRow kEmbeddings[] = {
    {"embeddings.patch_embedding.weight",    "patch_embd.weight",    {Dim::kVEmbd, Dim::kVPatchIn}, Op::kPatchEmbd},
    {"embeddings.patch_embedding.bias",      "patch_embd.bias",      {Dim::kVEmbd}},
    {"embeddings.position_embedding.weight", "position_embd.weight", {Dim::kVPos, Dim::kVEmbd}, Op::kCopy, true},
};
const TensorRow kPostNorm[] = {
    {"post_layernorm.weight", "post_ln.weight", {Dim::kVEmbd}},
    {"post_layernorm.bias",   "post_ln.bias",   {Dim::kVEmbd}},
};
// Under model.multi_modal_projector. / mm.
const TensorRow kProjectorNorm[] = {
    {"layer_norm.weight", "input_norm.weight", {Dim::kProjIn}},
    {"layer_norm.bias",   "input_norm.bias",   {Dim::kProjIn}},
};
const TensorRow kProjector[] = {
    {"linear_1.weight", "1.weight", {Dim::kProjHidden, Dim::kProjIn}},
    {"linear_1.bias",   "1.bias",   {Dim::kProjHidden}},
    {"linear_2.weight", "2.weight", {Dim::kEmbd, Dim::kProjHidden}},
    {"linear_2.bias",   "2.bias",   {Dim::kEmbd}},
};
// clang-format on

constexpr const char* kProjectorPrefix = "model.multi_modal_projector.";

HfConfig sub_config(const HfConfig& cfg, const char* key) {
    if (!cfg.raw().contains(key) || !cfg.raw()[key].is_object())
        throw_error(ErrorCode::kInvalidFile, "config.json: %s is missing or not an object", key);
    return HfConfig(cfg.raw()[key]);
}

// The image processor's settings: preprocessor_config.json, overridden by processor_config.json's
// image_processor where both are present (as llama.cpp's converter merges them).
nlohmann::json image_processor(const fs::path& dir) {
    nlohmann::json merged = nlohmann::json::object();
    auto merge = [&](const fs::path& p, const char* nested) {
        if (!fs::exists(p)) return;
        nlohmann::json j = HfConfig::read(p).raw();
        if (nested && j.contains(nested) && j[nested].is_object()) j = j[nested];
        for (auto& [k, v] : j.items()) merged[k] = v;
    };
    merge(dir / "preprocessor_config.json", nullptr);
    merge(dir / "processor_config.json", "image_processor");
    return merged;
}

std::vector<float> three_channels(const nlohmann::json& proc, const char* key) {
    if (!proc.contains(key))
        throw_error(ErrorCode::kMissing, "preprocessor_config.json: %s is missing (the image normalisation)", key);
    const nlohmann::json& v = proc[key];
    std::vector<float> out;
    if (v.is_array())
        for (const auto& x : v)
            if (x.is_number()) out.push_back(x.get<float>());
    if (out.size() != 3 || !v.is_array() || v.size() != 3)
        throw_error(ErrorCode::kInvalidFile, "preprocessor_config.json: %s must be 3 numbers", key);
    return out;
}

}  // namespace

HfConfig lfm2vl_text_config(const HfConfig& cfg) {
    HfConfig text = sub_config(cfg, "text_config");
    const std::string t = text.str("model_type", "lfm2");
    if (t != "lfm2") refuse("text_config.model_type '%s' in an LFM2-VL checkpoint (supported: lfm2)", t.c_str());
    return text;
}

void convert_lfm2vl_mmproj(Conversion& c, const fs::path& hf_dir) {
    const HfConfig& cfg = c.cfg();
    const HfConfig vision = sub_config(cfg, "vision_config");
    const HfConfig text = lfm2vl_text_config(cfg);

    const std::string tower_type = vision.str("model_type", "siglip2_vision_model");
    if (tower_type != "siglip2_vision_model")
        refuse("vision_config.model_type '%s' (supported: siglip2_vision_model)", tower_type.c_str());
    if (vision.str("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh")
        refuse("vision_config.hidden_act '%s' (supported: gelu_pytorch_tanh)", vision.str("hidden_act", "").c_str());
    if (cfg.str("projector_hidden_act", "gelu") != "gelu")
        refuse("projector_hidden_act '%s' (supported: gelu)", cfg.str("projector_hidden_act", "").c_str());
    if (!cfg.flag("projector_bias", true)) refuse("projector_bias false has no GGUF clip form");
    if (vision.i64("num_channels", 3) != 3) refuse("vision_config.num_channels must be 3");

    Dims& d = c.dims;
    d.n_embd = text.i64("hidden_size");
    d.v_embd = vision.i64("hidden_size");
    d.v_ff = vision.i64("intermediate_size");
    d.patch = vision.i64("patch_size");
    d.v_pos = vision.i64("num_patches");
    const int64_t n_head = vision.i64("num_attention_heads");
    const int64_t n_layer = vision.i64("num_hidden_layers");
    const int64_t factor = cfg.i64("downsample_factor", 2);
    d.proj_hidden = cfg.i64("projector_hidden_size");
    d.proj_in = d.v_embd * factor * factor;
    const int64_t side = int64_t(std::llround(std::sqrt(double(d.v_pos))));
    if (d.n_embd <= 0 || d.v_embd <= 0 || d.v_ff <= 0 || d.proj_hidden <= 0 || n_head <= 0 || d.v_embd % n_head != 0)
        throw_error(ErrorCode::kInvalidFile, "config.json: bad vision widths (hidden %lld, %lld heads, ffn %lld)",
                    (long long)d.v_embd, (long long)n_head, (long long)d.v_ff);
    if (d.patch <= 0 || d.patch > 64 || side <= 0 || side * side != d.v_pos)
        throw_error(ErrorCode::kInvalidFile,
                    "config.json: vision_config needs patch_size 1..64 and a square num_patches (%lld, %lld)",
                    (long long)d.patch, (long long)d.v_pos);
    if (factor < 1 || factor > 8)
        throw_error(ErrorCode::kInvalidFile, "config.json: downsample_factor %lld, expected 1..8", (long long)factor);
    // vision_feature_layer -1 takes the last layer's features; -2 the one before, and so on.
    const int64_t n_used = n_layer + cfg.i64("vision_feature_layer", -1) + 1;
    if (n_used < 1 || n_used > n_layer)
        throw_error(ErrorCode::kInvalidFile, "config.json: vision_feature_layer %lld for a tower of %lld layers",
                    (long long)cfg.i64("vision_feature_layer", -1), (long long)n_layer);

    const nlohmann::json proc = image_processor(hf_dir);
    c.set_arch("clip");
    c.flag("has_vision_encoder", true);
    c.u32("vision.projection_dim", d.n_embd);
    // The position table is a square grid of patches: the image size it was trained at.
    c.u32("vision.image_size", side * d.patch);
    c.u32("vision.patch_size", d.patch);
    c.u32("vision.embedding_length", d.v_embd);
    c.u32("vision.feed_forward_length", d.v_ff);
    c.u32("vision.block_count", n_used);
    c.u32("vision.attention.head_count", n_head);
    c.f32s("vision.image_mean", three_channels(proc, "image_mean"));
    c.f32s("vision.image_std", three_channels(proc, "image_std"));
    c.str("projector_type", "lfm2");
    c.f32("vision.attention.layer_norm_epsilon", vision.f32("layer_norm_eps", 1e-6f));
    c.u32("vision.projector.scale_factor", factor);
    c.flag("use_gelu", true);

    // transformers 4 saved the tower as model.vision_tower.vision_model.*, transformers 5 without it.
    const std::string tower = c.has("model.vision_tower.vision_model.embeddings.patch_embedding.weight")
                                  ? "model.vision_tower.vision_model."
                                  : "model.vision_tower.";
    c.put_under(kEmbeddings, tower, "v.");
    for (int64_t il = 0; il < n_used; ++il) {
        const std::string n = std::to_string(il);
        c.put_under(kVisionLayer, tower + "encoder.layers." + n + ".", "v.blk." + n + ".");
    }
    for (int64_t il = n_used; il < n_layer; ++il) c.leave(tower + "encoder.layers." + std::to_string(il) + ".");
    if (c.has(tower + "post_layernorm.weight")) c.put_under(kPostNorm, tower, "v.");
    // The pooling head of a SigLIP tower is not part of LFM2-VL.
    c.leave(tower + "head.");
    if (cfg.flag("projector_use_layernorm", true)) c.put_under(kProjectorNorm, kProjectorPrefix, "mm.");
    c.put_under(kProjector, kProjectorPrefix, "mm.");
    c.leave("model.language_model.");
    c.leave("lm_head.");
}

void leave_lfm2vl_vision(Conversion& c) {
    c.leave("model.vision_tower.");
    c.leave(kProjectorPrefix);
}

}  // namespace cera::convert
