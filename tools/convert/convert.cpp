#include "convert/convert.h"

#include <string>

#include "convert/arch.h"
#include "convert/hf_config.h"
#include "gguf/safetensors.h"
#include "convert/tokenizer_writer.h"
#include "core/check.h"
#include "gguf/keys.h"
#include "gguf/writer.h"

namespace cera::convert {
namespace {

namespace fs = std::filesystem;

// config.json model_type -> the converter that writes its GGUF architecture.
struct Entry {
    const char* model_type;
    void (*convert)(Conversion&);
};
// clang-format off
constexpr Entry kEntries[] = {
    {"llama",    convert_llama},
    {"mistral",  convert_llama},
    {"qwen2",    convert_qwen2},
    {"qwen3",    convert_qwen3},
    {"granite",  convert_granite},
    {"lfm2",     convert_lfm2},
    {"lfm2_moe", convert_lfm2moe},
};
// clang-format on

}  // namespace

const char* supported_model_types() {
    static const std::string names = [] {
        std::string s;
        for (const Entry& e : kEntries) s += (s.empty() ? "" : ", ") + std::string(e.model_type);
        return s;
    }();
    return names.c_str();
}

size_t convert_hf(const ConvertOptions& o) {
    if (!fs::is_directory(o.hf_dir)) throw_error(ErrorCode::kIo, "%s is not a directory", o.hf_dir.c_str());
    const HfConfig cfg = HfConfig::read(o.hf_dir / "config.json");
    const std::string model_type = cfg.str("model_type", "");
    const Entry* entry = nullptr;
    for (const Entry& e : kEntries)
        if (model_type == e.model_type) entry = &e;
    if (!entry) refuse("model_type '%s' (supported: %s)", model_type.c_str(), supported_model_types());

    const fs::path st_path = o.hf_dir / "model.safetensors";
    if (!fs::exists(st_path))
        throw_error(ErrorCode::kIo, "%s not found (sharded checkpoints are not supported)", st_path.c_str());
    const SafeTensors st(st_path.string());

    namespace k = gguf::keys;
    gguf::Writer w;
    // The general keys come first in the file; the converter fills in the architecture's name.
    w.set_string(k::kArchitecture, "");
    w.set_string("general.type", "model");
    w.set_string(k::kName, o.hf_dir.filename().empty() ? o.hf_dir.parent_path().filename().string()
                                                       : o.hf_dir.filename().string());
    Conversion c(cfg, st, w, o.type);
    entry->convert(c);  // general.architecture, the <arch>.* keys, the tensors
    CERA_CHECK(!c.arch().empty() && c.dims.n_vocab > 0, "the converter set no architecture or vocabulary");
    c.check_all_used();

    w.set_u32(k::kFileType, k::file_type_of(o.type, /*k_medium=*/false));
    w.set_u32(k::kQuantVersion, 2);
    write_tokenizer(o.hf_dir, cfg, c.dims.n_vocab, w);
    w.write(o.out, o.on_progress);
    return w.n_tensors();
}

}  // namespace cera::convert
