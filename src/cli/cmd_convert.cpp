// `cera convert --hf DIR -o OUT.gguf [--type T]`: a Hugging Face checkpoint (model.safetensors,
// config.json, tokenizer.json) to GGUF, through the converter library in tools/convert.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command.h"
#include "convert/convert.h"
#include "core/check.h"
#include "core/quant/quant.h"

namespace cera::cli {
namespace {

int run_convert(const std::vector<std::string>& args) {
    convert::ConvertOptions o;
    auto usage = [](FILE* f) {
        std::fprintf(f,
                     "usage: cera convert --hf DIR -o OUT.gguf [--type F32|F16|BF16|Q8_0|Q4_0|...]\n\n"
                     "Converts a Hugging Face checkpoint (model.safetensors, config.json, tokenizer.json)\n"
                     "to GGUF with llama.cpp's names and layout. model_type: %s.\n"
                     "Matrices get --type (default F32); norms, biases, routers and conv kernels stay F32.\n",
                     convert::supported_model_types());
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
    const size_t n = convert::convert_hf(o);
    std::fprintf(stderr, "cera convert: wrote %s (%zu tensors, %s)\n", o.out.c_str(), n, type_name(o.type));
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(convert, "convert", "convert a Hugging Face checkpoint to GGUF", run_convert);

}  // namespace cera::cli
