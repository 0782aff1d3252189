// `cera perplexity -m FILE -f TEXT [-c N] [-b N] [--chunks N] [--json]
//                  [--kl-divergence-base FILE [--kl-divergence]]`
// Perplexity over a text in windows of -c tokens, each scored on its second half, printed as llama.cpp's
// perplexity tool prints it: the running estimate after each window, then the final estimate with its
// standard error. --kl-divergence-base FILE alone saves the run's log-probabilities to FILE; with
// --kl-divergence it compares this run against the saved ones instead (the tokens come from FILE; -f is
// optional and must then tokenize to the same tokens).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/perplexity.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/model_path.h"
#include "cli/parse_args.h"
#include "cli/progress.h"

namespace cera::cli {
namespace {

std::string read_text_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(ErrorCode::kIo, "-f " + path + ": cannot open the file");
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void print_kl(const PerplexityResult& r) {
    const KlStats& s = r.kl;
    std::printf("====== Perplexity statistics ======\n");
    std::printf("Mean PPL(Q)                   : %10.6f +/- %10.6f\n", r.ppl, r.ppl_err);
    std::printf("Mean PPL(base)                : %10.6f\n", s.ppl_base);
    std::printf("Mean ln(PPL(Q)/PPL(base))     : %10.6f +/- %10.6f\n", s.ln_ratio, s.ln_ratio_err);
    std::printf("Mean PPL(Q)/PPL(base)         : %10.6f +/- %10.6f\n", s.ppl_ratio, s.ppl_ratio_err);
    std::printf("\n====== KL divergence statistics ======\n");
    std::printf("Mean    KLD: %10.6f +/- %10.6f\n", s.kld, s.kld_err);
    std::printf("Maximum KLD: %10.6f\n", s.kld_max);
    std::printf("99.0%%   KLD: %10.6f\n", s.kld_p99);
    std::printf("Median  KLD: %10.6f\n", s.kld_median);
    std::printf("Minimum KLD: %10.6f\n", s.kld_min);
    std::printf("\n====== Token probability statistics ======\n");
    std::printf("RMS Δp    : %6.3f +/- %5.3f %%\n", 100 * s.rms_dp, 100 * s.rms_dp_err);
    std::printf("Same top p: %6.3f +/- %5.3f %%\n", 100 * s.same_top, 100 * s.same_top_err);
}

nlohmann::json to_json(const PerplexityResult& r) {
    nlohmann::json j = {{"n_ctx", r.n_ctx},     {"chunks", r.n_chunks}, {"tokens_scored", r.n_scored}, {"ppl", r.ppl},
                        {"ppl_err", r.ppl_err}, {"running", r.running}, {"seconds", r.seconds}};
    if (r.has_kl) {
        const KlStats& s = r.kl;
        j["kl"] = {{"ppl_base", s.ppl_base},
                   {"ln_ppl_ratio", s.ln_ratio},
                   {"ln_ppl_ratio_err", s.ln_ratio_err},
                   {"ppl_ratio", s.ppl_ratio},
                   {"ppl_ratio_err", s.ppl_ratio_err},
                   {"kld", s.kld},
                   {"kld_err", s.kld_err},
                   {"kld_max", s.kld_max},
                   {"kld_p99", s.kld_p99},
                   {"kld_median", s.kld_median},
                   {"kld_min", s.kld_min},
                   {"same_top", s.same_top},
                   {"same_top_err", s.same_top_err},
                   {"rms_dp", s.rms_dp},
                   {"rms_dp_err", s.rms_dp_err},
                   {"chunk_kld", r.chunk_kld},
                   {"chunk_same_top", r.chunk_same_top}};
    }
    return j;
}

int run_perplexity(const std::vector<std::string>& args) {
    CLI::App app{
        "Perplexity of a model over a text (windows of -c tokens, the second half of each scored), and\n"
        "the KL divergence against the saved log-probabilities of another run.",
        "cera perplexity"};
    std::string model, text_file, base_file;
    bool kl = false, json = false;
    PerplexityOptions po;
    EngineFlags ef;
    app.add_option("-m,--model", model, "GGUF model (default: the bundled model)");
    app.add_option("-f,--file", text_file, "the text file");
    app.add_option("--chunks", po.n_chunks, "windows to score at most (-1: all)")->capture_default_str();
    app.add_option("--kl-divergence-base", base_file,
                   "file of saved log-probabilities: written by this run, or read with --kl-divergence");
    app.add_flag("--kl-divergence", kl, "compare this run against --kl-divergence-base");
    app.add_flag("--json", json, "print the result as one JSON object instead");
    ef.n_ctx = 512;
    ef.add(app, EngineFlags::kCtx | EngineFlags::kKvType | EngineFlags::kBatch | EngineFlags::kLora);
    if (int rc = parse_args(app, args, "perplexity",
                            [&] {
                                if (kl && base_file.empty())
                                    throw CLI::ValidationError("--kl-divergence needs --kl-divergence-base FILE");
                                if (!kl && text_file.empty()) throw CLI::ValidationError("-f TEXT is required");
                            });
        rc >= 0)
        return rc;
    EngineOptions eo = ef.options();
    po.n_ctx = ef.n_ctx;
    if (po.n_ctx < 4) throw Error(ErrorCode::kInvalidArgument, "--ctx must be at least 4 for perplexity");
    eo.n_ctx = po.n_ctx;
    (kl ? po.compare_base : po.save_base) = base_file;
    if (model.empty()) model = find_default_model();
    auto engine = Engine::load(model, eo);

    std::vector<int32_t> tokens;
    if (!text_file.empty()) tokens = engine->tokenize(read_text_file(text_file), /*add_bos=*/true);
    if (!json) {
        if (kl)
            std::printf("chunk             PPL          ln(PPL(Q)/PPL(base))          KL Divergence      Same top p\n");
    }
    // Progress over the windows on stderr; on a terminal shared with stdout the bar stands in for the
    // per-window figures, which would tear it.
    Progress bar("perplexity", 0, stderr, "windows");
    const bool shared_terminal = bar.terminal() && isatty(fileno(stdout));
    const PerplexityResult r = perplexity(*engine, tokens, po, [&](int32_t c, const PerplexityResult& now) {
        bar.update(uint64_t(c + 1), uint64_t(now.n_chunks_total));
        if (json || shared_terminal) return;
        if (kl)
            std::printf("%4d %10.4f %18s %24.5f %18.3f%%\n", c + 1, now.running.back(), "", now.chunk_kld.back(),
                        100 * now.chunk_same_top.back());
        else
            std::printf("[%d]%.4f,", c + 1, now.running.back());
        std::fflush(stdout);
    });
    if (json) {
        std::printf("%s\n", to_json(r).dump().c_str());
        return 0;
    }
    if (!kl) std::printf("\n");
    std::printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_err);
    if (r.has_kl) {
        std::printf("\n");
        print_kl(r);
    }
    std::fprintf(stderr, "perplexity: %s (%s, %s): %d windows of %d tokens, %lld tokens scored, %.2f s\n",
                 model.c_str(), engine->info().architecture.c_str(), engine->info().device.c_str(), r.n_chunks, r.n_ctx,
                 (long long)r.n_scored, r.seconds);
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(perplexity, "perplexity", "perplexity of a model over a text, and KL divergence between runs",
                 run_perplexity);

}  // namespace cera::cli
