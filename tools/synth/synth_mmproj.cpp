// Random LFM2-VL vision projectors (`cera synth --mmproj PRESET`): llama.cpp's mmproj layout (clip
// architecture, lfm2 projector) at the SigLIP2 shapes of the LFM2-VL models, for encode benchmarks.
#include <cmath>
#include <cstring>
#include <random>

#include "core/check.h"
#include "core/fp16.h"
#include "gguf/writer.h"
#include "synth/synth.h"

namespace cera::gguf {

MmprojShape mmproj_preset(std::string_view preset) {
    // SigLIP2 NaFlex base (LFM2-VL-450M) and shape-optimised 400M (LFM2-VL-1.6B, last layer dropped).
    if (preset == "lfm2-vl-450m") return {768, 12, 12, 3072, 2560, 1024};
    if (preset == "lfm2-vl-1.6b") return {1152, 26, 16, 4304, 2560, 2048};
    if (preset == "tiny") return {64, 2, 2, 256, 128, 64};
    throw_error(ErrorCode::kInvalidArgument, "--mmproj %.*s: unknown preset (tiny, lfm2-vl-450m, lfm2-vl-1.6b)",
                int(preset.size()), preset.data());
}

void synthesize_mmproj(const MmprojShape& s, GgmlType type, uint64_t seed, const std::string& path) {
    if (type != GgmlType::kF32 && type != GgmlType::kF16)
        throw_error(ErrorCode::kUnsupported, "--mmproj: --type %s; the projector is written in F32 or F16",
                    type_name(type));
    constexpr int64_t kPatch = 16, kSide = 16, kFactor = 2;
    Writer w;
    w.set_string("general.architecture", "clip");
    w.set_string("general.type", "mmproj");
    w.set_string("general.name", "synth-lfm2-vl-mmproj");
    w.set_bool("clip.has_vision_encoder", true);
    w.set_string("clip.projector_type", "lfm2");
    w.set_u32("clip.vision.image_size", uint32_t(kPatch * kSide));
    w.set_u32("clip.vision.patch_size", uint32_t(kPatch));
    w.set_u32("clip.vision.embedding_length", uint32_t(s.n_embd));
    w.set_u32("clip.vision.feed_forward_length", uint32_t(s.n_ff));
    w.set_u32("clip.vision.block_count", uint32_t(s.n_layer));
    w.set_u32("clip.vision.attention.head_count", uint32_t(s.n_head));
    w.set_u32("clip.vision.projection_dim", uint32_t(s.n_embd_text));
    w.set_f32("clip.vision.attention.layer_norm_epsilon", 1e-6f);
    w.set_u32("clip.vision.projector.scale_factor", uint32_t(kFactor));
    const float half[3] = {0.5f, 0.5f, 0.5f};
    w.set("clip.vision.image_mean", value_f32_array(half));
    w.set("clip.vision.image_std", value_f32_array(half));
    w.set_bool("clip.use_gelu", true);
    std::mt19937_64 rng(seed);
    // Matrices (and the patch kernel) in `type`, N(0, 1/sqrt(k)) so activations keep their scale;
    // norms 1 and biases small, in F32.
    auto tensor = [&](const std::string& name, std::vector<int64_t> ne, GgmlType t, double mean, double sd) {
        int64_t n = 1;
        for (int64_t d : ne) n *= d;
        std::normal_distribution<double> d(mean, sd);
        std::vector<uint8_t> bytes(size_t(n) * (t == GgmlType::kF16 ? 2 : 4));
        for (int64_t i = 0; i < n; ++i) {
            const float v = float(d(rng));
            if (t == GgmlType::kF16) {
                const uint16_t h = fp32_to_fp16(v);
                std::memcpy(bytes.data() + 2 * i, &h, 2);
            } else {
                std::memcpy(bytes.data() + 4 * i, &v, 4);
            }
        }
        w.add_tensor(name, t, std::move(ne), bytes);
    };
    auto matrix = [&](const std::string& name, int64_t k, int64_t rows) {
        tensor(name, {k, rows}, type, 0.0, 1.0 / std::sqrt(double(k)));
    };
    auto vec = [&](const std::string& name, int64_t n, double mean) { tensor(name, {n}, GgmlType::kF32, mean, 0.02); };
    const int64_t n = s.n_embd;
    tensor("v.patch_embd.weight", {kPatch, kPatch, 3, n}, type, 0.0, 1.0 / std::sqrt(double(3 * kPatch * kPatch)));
    vec("v.patch_embd.bias", n, 0.0);
    // The position table stays F32, as llama.cpp needs it for its resize (ggml_interpolate).
    tensor("v.position_embd.weight", {n, kSide * kSide}, GgmlType::kF32, 0.0, 0.02);
    for (int64_t il = 0; il < s.n_layer; ++il) {
        const std::string p = "v.blk." + std::to_string(il) + ".";
        for (const char* ln : {"ln1", "ln2"}) {
            vec(p + ln + ".weight", n, 1.0);
            vec(p + ln + ".bias", n, 0.0);
        }
        for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_out"}) {
            matrix(p + m + ".weight", n, n);
            vec(p + m + ".bias", n, 0.0);
        }
        matrix(p + "ffn_up.weight", n, s.n_ff);
        vec(p + "ffn_up.bias", s.n_ff, 0.0);
        matrix(p + "ffn_down.weight", s.n_ff, n);
        vec(p + "ffn_down.bias", n, 0.0);
    }
    vec("v.post_ln.weight", n, 1.0);
    vec("v.post_ln.bias", n, 0.0);
    const int64_t in = n * kFactor * kFactor;
    vec("mm.input_norm.weight", in, 1.0);
    vec("mm.input_norm.bias", in, 0.0);
    matrix("mm.1.weight", in, s.proj_hidden);
    vec("mm.1.bias", s.proj_hidden, 0.0);
    matrix("mm.2.weight", s.proj_hidden, s.n_embd_text);
    vec("mm.2.bias", s.n_embd_text, 0.0);
    w.write(path);
}

}  // namespace cera::gguf
