// `cera convert --hf DIR -o OUT.gguf [--type T]`: a Hugging Face checkpoint (model.safetensors,
// config.json, tokenizer.json) to GGUF, through the converter library in tools/convert.
// `cera convert --lora-merge -m BASE.gguf --lora PATH[:SCALE] ... -o OUT.gguf`: LoRA adapters folded into a
// copy of their base model (tools/quantize/lora_merge.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "cera/error.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/parse_args.h"
#include "cli/progress.h"
#include "convert/convert.h"
#include "core/quant/quant.h"
#include "quantize/lora_gguf.h"
#include "quantize/lora_merge.h"

namespace cera::cli {
namespace {

int run_convert(const std::vector<std::string>& args) {
    CLI::App app{std::string("Converts a Hugging Face checkpoint (model.safetensors or its shards and index, "
                             "config.json, tokenizer.json) to "
                             "GGUF with llama.cpp's names and layout (model_type: ") +
                     convert::supported_model_types() +
                     "); matrices get --type, norms, biases, routers and conv kernels stay F32. An LFM2-VL "
                     "checkpoint gives two files: the text model (-o) and its vision projector (--mmproj).\n"
                     "With --lora-merge: folds LoRA adapters (GGUF LoRA files or PEFT folders, each at its scale) "
                     "into a copy of the base model -m; adapted weights keep their type.\n"
                     "With --peft DIR: a PEFT LoRA adapter of the base model -m to a GGUF LoRA file, as llama.cpp's "
                     "convert_lora_to_gguf.py writes it.",
                 "cera convert"};
    std::string hf, out, type = "F32", base, peft, mmproj;
    std::vector<std::string> loras;
    bool merge = false;
    int threads = 0;
    app.add_option("--hf", hf, "a Hugging Face checkpoint folder");
    app.add_option("--peft", peft, "a PEFT LoRA adapter folder to convert to a GGUF LoRA file (with -m BASE.gguf)");
    app.add_option("-o,--out", out, "the GGUF file to write")->required();
    app.add_option("--mmproj", mmproj, "with --hf of a vision-language checkpoint: the vision projector's GGUF");
    app.add_option("--type,--outtype", type, "the matrices' type: F32, F16, BF16, Q8_0, Q4_0, ... (with --hf)")
        ->capture_default_str();
    app.add_flag("--lora-merge", merge, "merge LoRA adapters into -m instead of converting a checkpoint");
    app.add_option("-m,--model", base, "the base model's GGUF (with --lora-merge or --peft)");
    app.add_option("--lora", loras, "PATH[:SCALE]: a GGUF LoRA file or a PEFT folder, scale default 1 (repeatable)");
    app.add_option("--threads", threads, "threads of the merge (default: all cores); the output does not depend on it");

    convert::ConvertOptions co;
    quantize::LoraMergeOptions mo;
    const int rc = parse_args(app, args, "convert", [&] {
        if (!peft.empty()) {
            if (base.empty()) throw CLI::ValidationError("--peft needs -m BASE.gguf (the model the adapter is for)");
            if (merge || !hf.empty() || !loras.empty() || !mmproj.empty())
                throw CLI::ValidationError("--peft goes with -m and -o only");
            return;
        }
        if (merge) {
            if (base.empty() || loras.empty()) throw CLI::ValidationError("--lora-merge needs -m BASE.gguf and --lora");
            if (!hf.empty()) throw CLI::ValidationError("--hf and --lora-merge are two different jobs");
            if (!mmproj.empty()) throw CLI::ValidationError("--mmproj goes with --hf");
            if (threads < 0) throw CLI::ValidationError("--threads must be >= 0");
            try {
                for (const std::string& l : loras) {
                    const LoraOptions lo = parse_lora_flag(l);
                    mo.adapters.push_back({lo.path, lo.scale});
                }
            } catch (const Error& e) {
                throw CLI::ValidationError(e.what());
            }
            return;
        }
        if (hf.empty()) throw CLI::ValidationError("give --hf DIR (or --lora-merge -m BASE.gguf --lora PATH)");
        if (!base.empty() || !loras.empty()) throw CLI::ValidationError("-m and --lora go with --lora-merge");
        if (!mmproj.empty() && mmproj == out) throw CLI::ValidationError("--mmproj and -o name the same file");
        const auto t = type_from_name(type);
        if (!t || !can_quantize(*t) || *t == GgmlType::kQ8_1 || *t == GgmlType::kQ8_K)
            throw CLI::ValidationError("--type " + type + " is not a weight type this converter can write");
        co.type = *t;
    });
    if (rc >= 0) return rc;
    if (!peft.empty()) {
        const size_t n = quantize::convert_peft_lora({peft, base, out});
        std::fprintf(stderr, "cera convert: wrote %s (a LoRA adapter of %zu weights)\n", out.c_str(), n);
        return 0;
    }
    Progress bar(merge ? "merge" : "convert");
    const auto progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
    if (merge) {
        mo.base = base;
        mo.output = out;
        mo.n_threads = threads;
        mo.on_progress = progress;
        const quantize::LoraMergeSummary s = quantize::merge_lora(mo);
        bar.finish();
        std::fprintf(stderr, "cera convert: wrote %s (%zu tensors, %zu with the adapters merged)\n", out.c_str(),
                     s.n_tensors, s.n_merged);
        return 0;
    }
    co.hf_dir = hf;
    co.out = out;
    co.mmproj_out = mmproj;
    co.on_progress = progress;
    const convert::ConvertSummary s = convert::convert_hf(co);
    bar.finish();
    std::fprintf(stderr, "cera convert: wrote %s (%zu tensors, %s)\n", out.c_str(), s.n_tensors, type_name(co.type));
    if (!mmproj.empty())
        std::fprintf(stderr, "cera convert: wrote %s (the vision projector, %zu tensors)\n", mmproj.c_str(),
                     s.n_mmproj_tensors);
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(convert, "convert", "convert a Hugging Face checkpoint to GGUF, or merge LoRA adapters into a model",
                 run_convert);

}  // namespace cera::cli
