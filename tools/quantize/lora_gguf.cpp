// PEFT to GGUF LoRA (see lora_gguf.h): the pairs as the runtime reads them, written in the adapter's
// module order with the alpha that gives back their factor (llama.cpp scales by alpha / r).
#include "quantize/lora_gguf.h"

#include <cmath>
#include <filesystem>

#include "core/check.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "models/lora.h"
#include "models/lora_read.h"

namespace cera::quantize {

size_t convert_peft_lora(const PeftConvertOptions& o) {
    namespace fs = std::filesystem;
    if (!fs::is_directory(o.peft_dir)) throw_error(ErrorCode::kIo, "%s: not a PEFT adapter folder", o.peft_dir.c_str());
    auto base = gguf::File::open(o.base);
    const std::string arch = base->architecture();
    // The checks against the base (every target a weight of it, of matching shapes) ...
    read_lora(o.peft_dir, *base);
    // ... and the pairs in the adapter's module order, as llama.cpp's converter writes them.
    const LoraRead rd = read_peft_lora(o.peft_dir, arch, lora_heads(*base, arch));

    // One alpha for the file: alpha / r must give every module's factor back.
    const float alpha = rd.tensors.front().factor * float(rd.tensors.front().r);
    for (const LoraTensor& t : rd.tensors)
        if (std::fabs(t.factor * float(t.r) - alpha) > 1e-6f * std::fabs(alpha))
            throw_error(ErrorCode::kUnsupported,
                        "%s: %s has alpha / r = %g, another module %g: a GGUF LoRA file holds one alpha",
                        o.peft_dir.c_str(), t.target.c_str(), double(t.factor), double(rd.tensors.front().factor));

    gguf::Writer w;
    w.set_string("general.architecture", arch);
    w.set_string("general.type", "adapter");
    w.set_string("adapter.type", "lora");
    // llama.cpp names the adapter after its folder ("peft" -> "Peft").
    std::string name = fs::path(o.peft_dir).lexically_normal().filename().string();
    if (name.empty()) name = fs::path(o.peft_dir).lexically_normal().parent_path().filename().string();
    if (!name.empty() && name[0] >= 'a' && name[0] <= 'z') name[0] = char(name[0] - 'a' + 'A');
    w.set_string("general.name", name);
    w.set_f32("adapter.lora.alpha", alpha);
    w.set_u32("general.quantization_version", 2);
    for (const LoraTensor& t : rd.tensors) {
        const auto* a = reinterpret_cast<const uint8_t*>(t.a.data());
        const auto* b = reinterpret_cast<const uint8_t*>(t.b.data());
        // Stacked experts as llama.cpp's converter stacks them: a third dimension, the expert.
        const std::vector<int64_t> ne_a =
            t.n_expert > 1 ? std::vector<int64_t>{t.k, t.r, t.n_expert} : std::vector<int64_t>{t.k, t.r};
        const std::vector<int64_t> ne_b =
            t.n_expert > 1 ? std::vector<int64_t>{t.r, t.n_out, t.n_expert} : std::vector<int64_t>{t.r, t.n_out};
        w.add_tensor(t.target + ".lora_a", GgmlType::kF32, ne_a, {a, t.a.size() * sizeof(float)});
        w.add_tensor(t.target + ".lora_b", GgmlType::kF32, ne_b, {b, t.b.size() * sizeof(float)});
    }
    w.write(o.output);
    return rd.tensors.size();
}

}  // namespace cera::quantize
