// Random LoRA adapters at a base model's shapes (`cera synth --lora-rank`).
#include <cmath>
#include <cstring>
#include <random>
#include <regex>
#include <tuple>

#include "core/check.h"
#include "gguf/writer.h"
#include "synth/synth.h"

namespace cera::gguf {

void synthesize_lora(const File& base, int64_t rank, uint64_t seed, const std::string& path) {
    if (rank < 1) throw_error(ErrorCode::kInvalidArgument, "--lora-rank %lld: must be at least 1", (long long)rank);
    static const std::regex kTargets(
        "blk\\.[0-9]+\\.(attn_q|attn_k|attn_v|attn_output|shortconv\\.in_proj|shortconv\\.out_proj|ffn_gate|ffn_up|"
        "ffn_down|ffn_gate_exps|ffn_up_exps|ffn_down_exps)\\.weight");
    Writer w;
    w.set_string("general.architecture", base.architecture());
    w.set_string("general.type", "adapter");
    w.set_string("adapter.type", "lora");
    w.set_f32("adapter.lora.alpha", float(rank));
    std::mt19937_64 rng(seed);
    int n = 0;
    for (const TensorInfo& t : base.tensors()) {
        if (t.ne.size() < 2 || t.ne.size() > 3 || !std::regex_match(t.name, kTargets)) continue;
        const int64_t k = t.ne[0], n_out = t.ne[1];
        // An MoE layer's stacked experts (ne[2]) get a pair per expert, stacked the same way.
        const int64_t n_expert = t.ne.size() == 3 ? t.ne[2] : 1;
        // A spreads the input over the rank like a trained down projection (unit gain); B keeps the delta
        // small next to the base product, as a fine-tune's is.
        for (auto [suffix, ne, sd] :
             {std::tuple{".lora_a", std::vector<int64_t>{k, rank}, 1.0 / std::sqrt(double(k))},
              std::tuple{".lora_b", std::vector<int64_t>{rank, n_out}, 0.02 / std::sqrt(double(rank))}}) {
            if (n_expert > 1) ne.push_back(n_expert);
            std::vector<float> v(size_t(ne[0] * ne[1] * n_expert));
            std::normal_distribution<double> d(0.0, sd);
            for (float& x : v) x = float(d(rng));
            std::vector<uint8_t> bytes(v.size() * sizeof(float));
            std::memcpy(bytes.data(), v.data(), bytes.size());
            w.add_tensor(t.name + suffix, GgmlType::kF32, ne, bytes);
        }
        ++n;
    }
    if (n == 0) throw_error(ErrorCode::kInvalidArgument, "%s has no projection a LoRA adapter can adapt", base.path().c_str());
    w.write(path);
}

}  // namespace cera::gguf
