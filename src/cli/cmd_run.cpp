// `cera run [-m FILE] -p PROMPT [-n N] [sampling options] [--lookup-ngram N | --draft-model M ...]`: generate a
// continuation of a prompt, streaming only the generated text to stdout (flushed per piece) and the timings to stderr.
// Without -m it runs the bundled default model.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/grammar_flags.h"
#include "cli/image_prompt.h"
#include "cli/model_path.h"
#include "cli/parse_args.h"
#include "cli/spec_flags.h"

namespace cera::cli {
namespace {

[[noreturn]] void fail(ErrorCode code, const std::string& msg) { throw Error(code, msg); }

class StdoutSink : public Sink {
 public:
    void on_text(std::string_view text) override {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
        last_ = text.back();
    }
    char last() const { return last_; }

 private:
    char last_ = '\n';
};

Session* g_session = nullptr;
void on_sigint(int) {
    if (g_session) g_session->cancel();  // an atomic store: safe in a signal handler
    std::signal(SIGINT, SIG_DFL);        // a second Ctrl-C ends the process
}

// The prompt's ids (BOS as asked), queued; one line naming the problem when it is empty or too long.
void queue_text(Session& session, const Engine& engine, const std::string& prompt, bool add_bos, bool special) {
    std::vector<int32_t> ids;
    if (add_bos && engine.bos_token() >= 0) ids.push_back(engine.bos_token());
    const std::vector<int32_t> body = engine.tokenize(prompt, false, special);
    ids.insert(ids.end(), body.begin(), body.end());
    if (ids.empty()) fail(ErrorCode::kInvalidArgument, "the prompt is empty (and no BOS token is added)");
    if (int64_t(ids.size()) > session.n_ctx())
        fail(ErrorCode::kOutOfRange, "the prompt is " + std::to_string(ids.size()) +
                                         " tokens, longer than the context of " + std::to_string(session.n_ctx()) +
                                         " tokens (see --ctx)");
    session.append_tokens(ids);
}

int run_run(const std::vector<std::string>& args) {
    CLI::App app{
        "Generates a continuation of a prompt. The generated text goes to stdout as it decodes;\n"
        "timings go to stderr.",
        "cera run"};
    std::string model, prompt;
    int32_t n_predict = 256;
    EngineFlags ef;
    GenerateOptions g;
    g.sampling.seed = 0;
    int64_t seed = -1;
    bool no_bos = false, no_special = false, verbose = false;
    app.add_option("-m,--model", model, "GGUF model (default: the bundled models/tiny-lfm2-Q8_0.gguf)");
    app.add_option("-p,--prompt", prompt, "the prompt")->required();
    app.add_option("-n,--n-predict", n_predict, "tokens to generate at most (-1: until EOS or a full context)")
        ->capture_default_str();
    app.add_option("--temp", g.sampling.temperature, "temperature (0: greedy)")->capture_default_str();
    app.add_option("--top-k", g.sampling.top_k, "top-k (0: off)")->capture_default_str();
    app.add_option("--top-p", g.sampling.top_p, "top-p (1: off)")->capture_default_str();
    app.add_option("--min-p", g.sampling.min_p, "min-p (0: off)")->capture_default_str();
    app.add_option("--repeat-penalty", g.sampling.repeat_penalty, "repetition penalty (1: off)")->capture_default_str();
    app.add_option("--repeat-last-n", g.sampling.penalty_last_n, "tokens the penalties look back over")
        ->capture_default_str();
    app.add_option("--presence-penalty", g.sampling.presence_penalty, "presence penalty (0: off)");
    app.add_option("--frequency-penalty", g.sampling.frequency_penalty, "frequency penalty (0: off)");
    app.add_option("--seed", seed, "random seed (default: a random one)");
    app.add_option("--stop", g.stop, "stop string (repeatable)");
    ef.add(app, EngineFlags::kCtx | EngineFlags::kKvType | EngineFlags::kBatch | EngineFlags::kPrefixCache |
                    EngineFlags::kLora | EngineFlags::kVision);
    app.add_flag("--no-bos", no_bos, "do not add the BOS token");
    app.add_flag("--no-special", no_special, "tokenize special-token text in the prompt as plain text");
    app.add_flag("--ignore-eos", g.ignore_eos, "keep generating past end-of-generation tokens");
    app.add_flag("-v,--verbose", verbose, "print the model and sampling settings to stderr");
    app.add_option("--n-keep", g.n_keep,
                   "when the context fills, keep the first N tokens and drop half of the rest (-1: stop instead)")
        ->capture_default_str();
    GrammarFlags gf;
    gf.add(app);
    SpecFlags sf;
    sf.add(app);
    if (int rc = parse_args(app, args, "run"); rc >= 0) return rc;
    g.grammar = gf.build();
    const EngineOptions eo = ef.options();
    g.speculative = sf.build(eo);
    g.max_tokens = n_predict < 0 ? -1 : n_predict;
    g.sampling.seed = seed >= 0 ? uint64_t(seed) : uint64_t(std::random_device{}()) << 32 | std::random_device{}();
    if (model.empty()) model = find_default_model();

    auto engine = Engine::load(model, eo);
    const EngineInfo& info = engine->info();
    if (verbose)
        std::fprintf(stderr, "cera run: %s (%s, %s, %.2f M params), %s, context %d, seed %llu\n", model.c_str(),
                     info.architecture.c_str(), info.weight_type.c_str(), double(info.n_params) / 1e6,
                     info.device.c_str(), info.n_ctx, (unsigned long long)g.sampling.seed);

    Session session(engine);
    const bool add_bos = !no_bos && engine->add_bos();
    if (!ef.images.empty()) {
        queue_prompt(session, prompt, ef.images, add_bos, !no_special);
    } else {
        queue_text(session, *engine, prompt, add_bos, !no_special);
    }

    StdoutSink sink;
    g_session = &session;
    auto old_handler = std::signal(SIGINT, on_sigint);
    GenerationResult r;
    try {
        r = session.generate(g, sink);
    } catch (...) {
        std::signal(SIGINT, old_handler);
        g_session = nullptr;
        throw;
    }
    std::signal(SIGINT, old_handler);
    g_session = nullptr;

    if (!r.text.empty() && sink.last() != '\n' && isatty(STDOUT_FILENO) && isatty(STDERR_FILENO))
        std::fputc('\n', stderr);
    std::fprintf(stderr,
                 "cera run: prompt %d tokens, prefill %.1f tok/s (%.1f ms); generated %d tokens, decode %.1f tok/s "
                 "(%.1f ms); finish: %s\n",
                 r.prompt_tokens, r.prefill_tokens_per_second(), r.prefill_seconds * 1e3, r.generated_tokens,
                 r.decode_tokens_per_second(), r.decode_seconds * 1e3, finish_reason_name(r.finish));
    if (verbose && g.speculative.enabled())
        std::fprintf(
            stderr, "cera run: speculative: %d drafted, %d accepted (%.1f%%), %d target passes, %.2f tokens a pass\n",
            r.drafted_tokens, r.accepted_tokens, 100 * r.acceptance_rate(), r.decode_steps, r.tokens_per_pass());
    if (r.cached_tokens > 0 || r.context_shifts > 0)
        std::fprintf(stderr, "cera run: %d prompt tokens restored from the prefix cache; %d context shifts\n",
                     r.cached_tokens, r.context_shifts);
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(run, "run", "generate text from a prompt (streams to stdout)", run_run);

}  // namespace cera::cli
