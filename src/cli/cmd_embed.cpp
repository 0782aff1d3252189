// `cera embed [-m FILE] (-p TEXT | --tokens IDS) [--per-token] [--no-bos] [--out FILE] [--json]`:
// the last layer's hidden states after the final norm, pooled as the model was made to be (the mean
// over every token, BOS included, unless the file names the last token's), or one row per token. Text goes to stdout
// (one row per line, or JSON); --out writes the raw float32 rows (little-endian, row-major) instead.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/image_prompt.h"
#include "cli/model_path.h"
#include "cli/parse_args.h"

namespace cera::cli {
namespace {

// "1 2 3", "1,2,3" or "[1, 2, 3]" -> ids.
std::vector<int32_t> parse_ids(const std::string& text) {
    std::vector<int32_t> ids;
    std::string cur;
    auto flush = [&] {
        if (cur.empty()) return;
        size_t used = 0;
        long long v = 0;
        try {
            v = std::stoll(cur, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != cur.size() || v < 0 || v > INT32_MAX)
            throw Error(ErrorCode::kInvalidArgument, "--tokens: '" + cur + "' is not a token id");
        ids.push_back(int32_t(v));
        cur.clear();
    };
    for (char c : text) {
        if (c == ' ' || c == ',' || c == '\t' || c == '\n' || c == '[' || c == ']')
            flush();
        else
            cur.push_back(c);
    }
    flush();
    return ids;
}

int run_embed(const std::vector<std::string>& args) {
    CLI::App app{
        "Prints the final-norm hidden states of a text: pooled as the model asks (the mean, BOS included, "
        "by default) or per token.",
        "cera embed"};
    std::string model, prompt, tokens_text, out_path;
    EngineFlags ef;
    bool per_token = false, no_bos = false, json = false, no_special = false;
    app.add_option("-m,--model", model, "GGUF model (default: the bundled models/tiny-lfm2-Q8_0.gguf)");
    auto* p_opt = app.add_option("-p,--prompt", prompt, "the text");
    auto* t_opt = app.add_option("--tokens", tokens_text, "token ids instead of text, used as given: \"1 2 3\"");
    p_opt->excludes(t_opt);
    app.add_flag("--per-token", per_token, "one row per token instead of the mean");
    app.add_flag("--no-bos", no_bos, "do not add the BOS (and EOS) tokens the model asks for to the text");
    app.add_flag("--no-special", no_special, "tokenize special-token text as plain text");
    app.add_option("--out", out_path, "write raw float32 rows to FILE instead of text");
    app.add_flag("--json", json, "print JSON: {n_tokens, n_embd, tokens, embedding | embeddings}");
    ef.add(app,
           EngineFlags::kCtx | EngineFlags::kKvType | EngineFlags::kBatch | EngineFlags::kLora | EngineFlags::kVision);
    if (int rc = parse_args(app, args, "embed"); rc >= 0) return rc;
    if (p_opt->count() == 0 && t_opt->count() == 0)
        throw Error(ErrorCode::kInvalidArgument, "give the input with -p TEXT or --tokens IDS");
    const EngineOptions eo = ef.options();
    if (model.empty()) model = find_default_model();
    auto engine = Engine::load(model, eo);
    std::vector<int32_t> ids;
    std::unique_ptr<Session> image_session;  // --image: the prompt with its images, one row per position
    if (!ef.images.empty()) {
        if (t_opt->count() > 0) throw Error(ErrorCode::kInvalidArgument, "--image needs -p, not --tokens");
        image_session = std::make_unique<Session>(engine);
        queue_prompt(*image_session, prompt, ef.images, !no_bos && engine->add_bos(), !no_special);
        ids = image_session->tokens();
    } else if (t_opt->count() > 0) {
        ids = parse_ids(tokens_text);
    } else {
        ids = engine->tokenize(prompt, !no_bos, !no_special);
    }
    if (ids.empty()) throw Error(ErrorCode::kInvalidArgument, "no tokens to embed");
    const EngineInfo& info = engine->info();
    if (!per_token && !info.pooling_unsupported.empty())
        throw Error(ErrorCode::kUnsupported, "the model pools its embeddings by " + info.pooling_unsupported +
                                                 ", which is not supported (--per-token gives every token's)");
    const Pooling pooling = per_token ? Pooling::kNone : info.pooling;
    std::vector<float> v;
    if (image_session) {
        v = image_session->embed_sequence(pooling);
    } else {
        Session session(engine, std::max<int32_t>(int32_t(ids.size()), 1));
        v = session.embed(ids, pooling);
    }
    const size_t n_embd = size_t(engine->info().n_embd);
    const size_t rows = v.size() / n_embd;

    if (!out_path.empty()) {
        std::ofstream f(out_path, std::ios::binary);
        f.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(float)));
        if (!f) throw Error(ErrorCode::kIo, "cannot write " + out_path);
        std::fprintf(stderr, "cera embed: %zu tokens, wrote %zu x %zu float32 to %s\n", ids.size(), rows, n_embd,
                     out_path.c_str());
        return 0;
    }
    if (json) {
        nlohmann::json j;
        j["n_tokens"] = ids.size();
        j["n_embd"] = n_embd;
        j["tokens"] = ids;
        j["pooling"] = per_token ? "none" : pooling == Pooling::kLast ? "last" : "mean";
        if (per_token) {
            nlohmann::json a = nlohmann::json::array();
            for (size_t r = 0; r < rows; ++r)
                a.push_back(std::vector<float>(v.begin() + std::ptrdiff_t(r * n_embd),
                                               v.begin() + std::ptrdiff_t((r + 1) * n_embd)));
            j["embeddings"] = std::move(a);
        } else {
            j["embedding"] = v;
        }
        std::printf("%s\n", j.dump().c_str());
        return 0;
    }
    for (size_t r = 0; r < rows; ++r) {
        std::string line;
        char buf[32];
        for (size_t i = 0; i < n_embd; ++i) {
            std::snprintf(buf, sizeof buf, i ? " %.9g" : "%.9g", double(v[r * n_embd + i]));
            line += buf;
        }
        std::printf("%s\n", line.c_str());
    }
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(embed, "embed", "hidden-state embeddings of a text (pooled or per token)", run_embed);

}  // namespace cera::cli
