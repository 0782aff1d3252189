// `cera logits -m FILE (-p TEXT | --tokens "ID ID ...") [--no-bos] [--all] [--top K] [--out FILE]
//               [--device cpu|auto|cuda|cuda:N] [--threads N] [--ctx N] [--batch N] [--kv-type f32|f16]`
// Runs a prompt through the model and prints the top K (id, logit, piece) of the next-token logits at
// the last position (every position with --all), or writes the raw little-endian float32 logits,
// row-major [n_positions, n_vocab], to --out. The engine flags are those of every model-running
// command (engine_flags.h); the device defaults to the CPU, the reference that others are checked
// against.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/image_prompt.h"
#include "cli/parse_args.h"
#include "core/check.h"
#include "gguf/gguf.h"
#include "gguf/keys.h"
#include "models/lora.h"
#include "models/model.h"
#include "runtime/engine_impl.h"
#include "tokenizer/tokenizer.h"
#include "vision/encoder.h"

namespace cera::cli {
namespace {

std::vector<int32_t> parse_ids(const std::string& s) {
    std::vector<int32_t> ids;
    std::string tok;
    std::istringstream in(s);
    while (in >> tok) {
        for (char& c : tok)
            if (c == ',') c = ' ';
        std::istringstream parts(tok);
        std::string p;
        while (parts >> p) {
            char* end = nullptr;
            const long v = std::strtol(p.c_str(), &end, 10);
            if (*end != '\0' || v < 0 || v > INT32_MAX)
                throw_error(ErrorCode::kInvalidArgument, "--tokens: '%s' is not a token id", p.c_str());
            ids.push_back(int32_t(v));
        }
    }
    return ids;
}

// Printable form of a vocabulary entry: control characters escaped.
std::string printable(const std::string& s) {
    std::string out;
    for (unsigned char c : s) {
        if (c == '\n')
            out += "\\n";
        else if (c == '\t')
            out += "\\t";
        else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else
            out += char(c);
    }
    return out;
}

int run_logits(const std::vector<std::string>& args) {
    CLI::App app{"Prints the next-token logits of a prompt (top K per position) or writes them as raw f32.",
                 "cera logits"};
    std::string model_path, prompt, tokens_arg, out_path;
    bool no_bos = false, all = false;
    int top = 5;
    EngineFlags ef;
    ef.device = "cpu";
    app.add_option("-m,--model", model_path, "GGUF model file")->required();
    app.add_option("-p,--prompt", prompt, "prompt text (tokenized with the model's tokenizer)");
    app.add_option("--tokens", tokens_arg, "prompt as token ids, separated by spaces or commas");
    app.add_flag("--no-bos", no_bos, "do not prepend BOS to -p text");
    app.add_flag("--all", all, "logits at every position, not only the last");
    app.add_option("--top", top, "entries to print per position (default 5)");
    app.add_option("--out", out_path, "write raw little-endian f32 logits [n_positions, n_vocab] here");
    ef.add(app,
           EngineFlags::kCtx | EngineFlags::kKvType | EngineFlags::kBatch | EngineFlags::kLora | EngineFlags::kVision);
    app.get_option("--ctx")->description("context length (0: the prompt length)");
    if (int rc = parse_args(app, args, "logits",
                            [&] {
                                if (prompt.empty() == tokens_arg.empty())
                                    throw CLI::ValidationError("give exactly one of -p TEXT or --tokens IDS");
                                if (top < 1) throw CLI::ValidationError("--top must be at least 1");
                            });
        rc >= 0)
        return rc;

    const EngineOptions eo = ef.options();
    auto model = load_engine_model(model_path, eo);
    const gguf::File& file = model->file();
    std::unique_ptr<Tokenizer> tok;
    if (file.has(gguf::keys::kTokTokens)) tok = Tokenizer::from_gguf(file);

    std::vector<int32_t> ids;
    std::vector<EncodedImage> images;  // --image: each image's tokens and embeddings
    std::vector<EmbdRun> runs;
    if (!ef.images.empty()) {
        if (!tok || prompt.empty()) throw_error(ErrorCode::kInvalidArgument, "--image needs -p and a tokenizer");
        auto enc = vision::VisionEncoder::load(eo.mmproj, model->backend(), model->info().n_embd);
        const std::vector<std::string> pieces = split_image_prompt(prompt, ef.images.size());
        images.reserve(ef.images.size());
        for (size_t i = 0; i < pieces.size(); ++i) {
            const std::vector<int32_t> t = tok->encode(pieces[i], i == 0 && !no_bos, true);
            ids.insert(ids.end(), t.begin(), t.end());
            if (i == ef.images.size()) break;
            images.push_back(encode_image(*enc, *tok, model->info().n_embd, read_image_file(ef.images[i])));
            for (const EmbdRun& r : image_runs(images.back(), int64_t(ids.size()), model->info().n_embd))
                runs.push_back(r);
            ids.insert(ids.end(), images.back().ids.begin(), images.back().ids.end());
        }
    } else if (!tokens_arg.empty()) {
        ids = parse_ids(tokens_arg);
    } else {
        if (!tok)
            throw_error(ErrorCode::kMissing, "-p needs a tokenizer: %s has no tokenizer.ggml.tokens",
                        model_path.c_str());
        ids = tok->encode(prompt, !no_bos, true);
    }
    if (ids.empty()) throw_error(ErrorCode::kInvalidArgument, "the prompt has no tokens");

    const int64_t n_vocab = model->info().n_vocab;
    const int ctx = eo.n_ctx > 0 ? eo.n_ctx : int(ids.size());
    auto state = model->create_state(ctx);
    LoraSet lora;
    for (const LoraOptions& lo : eo.lora) lora.push_back({load_lora(lo.path, *model), lo.scale});
    state->set_lora(lora);
    const size_t n_rows = all ? ids.size() : 1;
    std::vector<float> logits(n_rows * size_t(n_vocab));
    state->eval({.tokens = ids, .embd = runs, .all_logits = all, .logits = logits.data()});

    if (!out_path.empty()) {
        FILE* f = std::fopen(out_path.c_str(), "wb");
        if (!f) throw_error(ErrorCode::kIo, "cannot open %s for writing", out_path.c_str());
        const size_t wrote = std::fwrite(logits.data(), sizeof(float), logits.size(), f);
        const bool ok = wrote == logits.size() && std::fclose(f) == 0;
        if (!ok) throw_error(ErrorCode::kIo, "cannot write %s", out_path.c_str());
        std::fprintf(stderr, "cera logits: wrote %zu x %lld float32 logits to %s\n", n_rows, (long long)n_vocab,
                     out_path.c_str());
        return 0;
    }

    auto piece = [&](int32_t id) -> std::string {
        if (!tok || id < 0 || id >= tok->n_vocab()) return "";
        return printable(tok->token_piece(id));
    };
    std::vector<int32_t> order(static_cast<size_t>(n_vocab));
    const int k = int(std::min<int64_t>(top, n_vocab));
    for (size_t r = 0; r < n_rows; ++r) {
        const size_t t = all ? r : ids.size() - 1;
        const float* row = logits.data() + r * size_t(n_vocab);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(),
                          [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        std::printf("position %zu (token %d '%s'):\n", t, ids[t], piece(ids[t]).c_str());
        for (int j = 0; j < k; ++j)
            std::printf("  %6d %12.6f  '%s'\n", order[size_t(j)], double(row[order[size_t(j)]]),
                        piece(order[size_t(j)]).c_str());
    }
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(logits, "logits", "next-token logits of a prompt (top K, or raw f32 to a file)", run_logits);

}  // namespace cera::cli
