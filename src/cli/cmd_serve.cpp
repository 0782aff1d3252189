// `cera serve -m MODEL [--host H] [--port P] [--api-key KEY] [--alias NAME] [--chat-template FILE]
//              [--max-seqs N] [--kv-size TOKENS] [--max-body BYTES] [--http-threads N] [--lora NAME=PATH[:SCALE]]...
//              [--mmproj FILE [--allow-local-images DIR]] [--reasoning-format F] [engine flags]`: an
// OpenAI-compatible HTTP server on the batched engine (server/server.h, docs/serving.md). SIGINT / SIGTERM
// stop it: running requests are cancelled, exit 0.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cera/error.h"
#include "chat/reasoning.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/model_path.h"
#include "cli/parse_args.h"
#include "cli/spec_flags.h"
#include "server/server.h"

namespace cera::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

int run_serve(const std::vector<std::string>& args) {
    CLI::App app{
        "Serves the model over an OpenAI-compatible HTTP API (chat and text completions, streamed; "
        "embeddings; Prometheus metrics).",
        "cera serve"};
    std::string model, template_file;
    ServeOptions so;
    EngineFlags ef;
    int max_seqs = 8;
    int64_t kv_size = 0;
    app.add_option("-m,--model", model, "GGUF model (default: the bundled one)");
    app.add_option("--host", so.host, "address to listen on")->capture_default_str();
    app.add_option("--port", so.port, "port to listen on (0: any free one)")->capture_default_str();
    app.add_option("--api-key", so.api_key, "require 'Authorization: Bearer KEY' (default: $CERA_API_KEY)");
    app.add_option("--alias", so.alias, "the model's name in the API (default: the file name)");
    app.add_option("--chat-template", template_file, "a Jinja chat template file replacing the model's");
    app.add_option("--max-seqs", max_seqs, "sequences generated at once")->capture_default_str();
    app.add_option("--kv-size", kv_size, "KV cache pool in tokens, all sequences together (0: max-seqs full contexts)")
        ->capture_default_str();
    app.add_option("--max-body", so.max_body_bytes, "largest request body in bytes (413 above)")->capture_default_str();
    app.add_option("--http-threads", so.http_threads,
                   "threads answering requests (0: 8 per sequence slot and 16 more, at least 64)")
        ->capture_default_str();
    std::string reasoning_format = "auto";
    app.add_option("--reasoning-format", reasoning_format,
                   "auto (or deepseek): a chat reply's <think> block as the message's reasoning_content; none: left "
                   "in the content (a request's reasoning_format chooses for itself)")
        ->capture_default_str();
    ef.add(app, EngineFlags::kCtx | EngineFlags::kKvType | EngineFlags::kBatch);
    app.add_option("--mmproj", ef.mmproj,
                   "vision projector GGUF (llama.cpp mmproj) of an LFM2-VL model: chat requests then take image_url "
                   "content parts (data: URLs)");
    app.add_option("--allow-local-images", so.allow_local_images,
                   "with --mmproj: image_url parts may also name files inside this folder (file:// URLs or absolute "
                   "paths)");
    ef.add_image_split(app);
    std::vector<std::string> loras;
    double lora_cache_mib = 0;
    app.add_option("--lora", loras,
                   "NAME=PATH[:SCALE]: a LoRA adapter (GGUF LoRA file or PEFT folder) that requests select with "
                   "\"model\": \"NAME\" (\"base\": none); repeatable. POST /lora and DELETE /lora/NAME change them "
                   "while serving");
    app.add_option("--lora-cache-mib", lora_cache_mib,
                   "device memory for adapters not in use, in MiB (least recently used go first; 0: no bound)")
        ->capture_default_str();
    SpecFlags sf;
    sf.add(app);
    if (int rc = parse_args(app, args, "serve"); rc >= 0) return rc;
    if (so.port < 0 || so.port > 65535) throw Error(ErrorCode::kInvalidArgument, "--port must be in 0..65535");
    if (so.http_threads < 0) throw Error(ErrorCode::kInvalidArgument, "--http-threads must be >= 0");
    if (!parse_reasoning_format(reasoning_format, so.split_reasoning))
        throw Error(ErrorCode::kInvalidArgument, "--reasoning-format must be none, auto or deepseek");
    if (!so.allow_local_images.empty()) {
        if (ef.mmproj.empty()) throw Error(ErrorCode::kInvalidArgument, "--allow-local-images needs --mmproj");
        if (!std::filesystem::is_directory(so.allow_local_images))
            throw Error(ErrorCode::kInvalidArgument, "--allow-local-images " + so.allow_local_images + ": not a folder");
    }
    if (so.api_key.empty())
        if (const char* k = std::getenv("CERA_API_KEY")) so.api_key = k;
    if (!template_file.empty()) {
        std::ifstream f(template_file);
        if (!f) throw Error(ErrorCode::kIo, "cannot open chat template " + template_file);
        std::stringstream ss;
        ss << f.rdbuf();
        so.chat_template = ss.str();
    }
    EngineOptions eo = ef.options();
    // A server's prompts come in every length: the first of each length pays no library set-up.
    if (eo.warmup != EngineOptions::Warmup::kNone) eo.warmup = EngineOptions::Warmup::kEverySize;
    if (!(lora_cache_mib >= 0)) throw Error(ErrorCode::kInvalidArgument, "--lora-cache-mib must be >= 0");
    eo.lora_cache_bytes = size_t(lora_cache_mib * 1024 * 1024);
    std::vector<std::pair<std::string, LoraOptions>> named;
    for (const std::string& l : loras) {
        const size_t eq = l.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == l.size())
            throw Error(ErrorCode::kInvalidArgument, "--lora " + l + ": expected NAME=PATH[:SCALE]");
        named.emplace_back(l.substr(0, eq), parse_lora_flag(l.substr(eq + 1)));
    }
    so.batch.parallel = max_seqs;
    so.batch.kv_tokens = kv_size;
    so.batch.step_tokens = eo.n_batch;
    if (model.empty()) model = find_default_model();
    so.batch.speculative = sf.build(eo);  // flags checked (and the draft model loaded) before the model
    auto engine = Engine::load(model, eo);
    for (const auto& [name, lo] : named) engine->load_adapter(name, lo.path, lo.scale);
    Server server(engine, so);
    std::string why;
    if (!server.bind(&why)) throw Error(ErrorCode::kIo, why);
    std::fprintf(stderr, "cera serve: %s (%s) on %s, listening on http://%s:%d\n", model.c_str(),
                 engine->info().weight_type.c_str(), engine->info().device.c_str(), so.host.c_str(), server.port());
    std::signal(SIGINT, on_signal);
    std::signal(SIGTERM, on_signal);
    std::thread watch([&] {
        while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        server.stop();
    });
    server.run();
    g_stop = 1;
    watch.join();
    std::fprintf(stderr, "cera serve: stopped\n");
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(serve, "serve", "an OpenAI-compatible HTTP server (continuous batching)", run_serve);

}  // namespace cera::cli
