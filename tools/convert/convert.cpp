#include "convert/convert.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "convert/arch.h"
#include "convert/hf_config.h"
#include "convert/tokenizer_writer.h"
#include "core/check.h"
#include "gguf/keys.h"
#include "gguf/safetensors.h"
#include "gguf/writer.h"

namespace cera::convert {
namespace {

namespace fs = std::filesystem;

// config.json model_type -> the converter that writes its GGUF architecture.
struct Entry {
    const char* model_type;
    void (*convert)(Conversion&);
    // Vision-language checkpoints: the text model's config is text_config and its tensors are under
    // model.language_model.; this writes the vision side's mmproj file.
    bool vision = false;
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
    {"lfm2_vl",  convert_lfm2, true},
};
// clang-format on

std::string model_name(const fs::path& dir) {
    return dir.filename().empty() ? dir.parent_path().filename().string() : dir.filename().string();
}

// model.safetensors, or the shards that model.safetensors.index.json's weight_map names, which must
// hold exactly the tensors the map lists (a shard missing or left over would convert part of a model).
SafeTensors open_checkpoint(const fs::path& dir) {
    const fs::path single = dir / "model.safetensors";
    if (fs::exists(single)) return SafeTensors(single.string());
    const fs::path index = dir / "model.safetensors.index.json";
    if (!fs::exists(index))
        throw_error(ErrorCode::kIo, "%s has neither model.safetensors nor model.safetensors.index.json", dir.c_str());
    const nlohmann::json j = HfConfig::read(index).raw();
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
        throw_error(ErrorCode::kInvalidFile, "%s: no weight_map object", index.c_str());
    std::map<std::string, std::string> where;  // tensor -> shard file name
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
        if (!file.is_string())
            throw_error(ErrorCode::kInvalidFile, "%s: weight_map['%s'] is not a file name", index.c_str(),
                        name.c_str());
        const std::string f = file.get<std::string>();
        if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
            throw_error(ErrorCode::kInvalidFile, "%s: shard '%s' is not a file name in the folder", index.c_str(),
                        f.c_str());
        where[name] = f;
        shards.insert(f);
    }
    if (shards.empty()) throw_error(ErrorCode::kInvalidFile, "%s: weight_map is empty", index.c_str());
    std::vector<std::string> paths;
    for (const std::string& f : shards) {
        if (!fs::exists(dir / f))
            throw_error(ErrorCode::kIo, "%s: shard %s is missing", index.c_str(), (dir / f).c_str());
        paths.push_back((dir / f).string());
    }
    SafeTensors st(paths, index.string());
    for (const auto& [name, f] : where) {
        if (!st.find(name))
            throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' is not in its shard %s", index.c_str(), name.c_str(),
                        f.c_str());
        if (fs::path(st.file_of(name)).filename() != f)
            throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' is in %s, the map says %s", index.c_str(),
                        name.c_str(), st.file_of(name).c_str(), f.c_str());
    }
    for (const auto& [name, t] : st.tensors())
        if (!where.count(name))
            throw_error(ErrorCode::kInvalidFile, "%s: tensor '%s' of %s is not in the weight_map", index.c_str(),
                        name.c_str(), st.file_of(name).c_str());
    return st;
}

}  // namespace

const char* supported_model_types() {
    static const std::string names = [] {
        std::string s;
        for (const Entry& e : kEntries) s += (s.empty() ? "" : ", ") + std::string(e.model_type);
        return s;
    }();
    return names.c_str();
}

ConvertSummary convert_hf(const ConvertOptions& o) {
    if (!fs::is_directory(o.hf_dir)) throw_error(ErrorCode::kIo, "%s is not a directory", o.hf_dir.c_str());
    const HfConfig cfg = HfConfig::read(o.hf_dir / "config.json");
    const std::string model_type = cfg.str("model_type", "");
    const Entry* entry = nullptr;
    for (const Entry& e : kEntries)
        if (model_type == e.model_type) entry = &e;
    if (!entry) refuse("model_type '%s' (supported: %s)", model_type.c_str(), supported_model_types());
    if (entry->vision && o.mmproj_out.empty())
        throw_error(ErrorCode::kInvalidArgument,
                    "%s is a vision-language checkpoint (%s): give --mmproj OUT.gguf for its vision projector",
                    o.hf_dir.c_str(), model_type.c_str());
    if (!entry->vision && !o.mmproj_out.empty())
        throw_error(ErrorCode::kInvalidArgument, "%s (%s) has no vision tower to write to %s", o.hf_dir.c_str(),
                    model_type.c_str(), o.mmproj_out.c_str());

    const SafeTensors st = open_checkpoint(o.hf_dir);

    namespace k = gguf::keys;
    // The general keys come first in a file; the converter fills in the architecture's name.
    auto general = [&](gguf::Writer& w, const char* type) {
        w.set_string(k::kArchitecture, "");
        w.set_string("general.type", type);
        w.set_string(k::kName, model_name(o.hf_dir));
    };
    auto finish = [&](gguf::Writer& w) {
        w.set_u32(k::kFileType, k::file_type_of(o.type, /*k_medium=*/false));
        w.set_u32(k::kQuantVersion, 2);
    };

    const HfConfig text_cfg = entry->vision ? lfm2vl_text_config(cfg) : cfg;
    gguf::Writer w;
    general(w, "model");
    Conversion c(text_cfg, st, w, o.type);
    if (entry->vision) {
        c.hf_model = "model.language_model.";
        leave_lfm2vl_vision(c);
    }
    entry->convert(c);  // general.architecture, the <arch>.* keys, the tensors
    CERA_CHECK(!c.arch().empty() && c.dims.n_vocab > 0, "the converter set no architecture or vocabulary");
    c.check_all_used();
    finish(w);
    write_tokenizer(o.hf_dir, text_cfg, c.dims.n_vocab, w);

    // Both files are checked before either is written.
    gguf::Writer wm;
    if (entry->vision) {
        general(wm, "mmproj");
        Conversion cm(cfg, st, wm, o.type);
        convert_lfm2vl_mmproj(cm, o.hf_dir);
        cm.check_all_used();
        finish(wm);
    }
    // One progress count over both files.
    const uint64_t first = w.tensor_bytes(), all = first + wm.tensor_bytes();
    auto progress = [&](uint64_t base) -> gguf::Writer::ProgressFn {
        if (!o.on_progress) return {};
        return [&o, base, all](uint64_t done, uint64_t) { o.on_progress(base + done, all); };
    };
    ConvertSummary s;
    w.write(o.out, progress(0));
    s.n_tensors = w.n_tensors();
    if (entry->vision) {
        wm.write(o.mmproj_out, progress(first));
        s.n_mmproj_tensors = wm.n_tensors();
    }
    return s;
}

}  // namespace cera::convert
