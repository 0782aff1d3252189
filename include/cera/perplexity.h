// Perplexity of a model over a text, measured as llama.cpp's perplexity tool measures it, and the KL
// divergence of a model (or a setting) against the saved log-probabilities of another run.
//
//   auto engine = cera::Engine::load("model.gguf");
//   std::vector<int32_t> ids = engine->tokenize(text, true);
//   cera::PerplexityResult r = cera::perplexity(*engine, ids, {.n_ctx = 512});
//   // r.ppl, r.ppl_err
//
// The tokens are cut into windows of n_ctx; each window is evaluated from an empty cache (its first token
// replaced by BOS when the model wants one) and only its second half is scored: the positions
// n_ctx / 2 .. n_ctx - 2 predict the tokens after them, so every scored token sees at least n_ctx / 2
// tokens of context.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cera/engine.h"

namespace cera {

struct PerplexityOptions {
    int32_t n_ctx = 512;    // window length in tokens, >= 4
    int32_t n_chunks = -1;  // windows to score at most; < 0: all that fit
    // Replace the first token of every window with BOS when the model wants BOS (Engine::add_bos()).
    bool bos_per_window = true;
    // Writes the log-probabilities of every scored position to this file (a KL base), or "" for none.
    std::string save_base;
    // Compares against a KL base file written by save_base: the tokens come from the file (the `tokens`
    // argument must be empty or equal to them), and the result carries the KL statistics. "" for none.
    std::string compare_base;
};

// The KL statistics of a run against a base (PerplexityOptions::compare_base), over every scored token.
struct KlStats {
    double ppl_base = 0;                      // the base run's perplexity
    double ln_ratio = 0, ln_ratio_err = 0;    // mean ln(PPL(Q) / PPL(base)) = mean(nll_q - nll_base)
    double ppl_ratio = 0, ppl_ratio_err = 0;  // exp(ln_ratio)
    double kld = 0, kld_err = 0;              // mean KL(base || Q) per token, in nats
    double kld_max = 0, kld_p99 = 0, kld_median = 0, kld_min = 0;
    double same_top = 0, same_top_err = 0;  // fraction of tokens whose arg-max agrees
    double rms_dp = 0, rms_dp_err = 0;      // RMS of p_Q(token) - p_base(token), as a fraction
};

struct PerplexityResult {
    int32_t n_ctx = 0;
    int32_t n_chunks = 0;         // windows scored
    int32_t n_chunks_total = 0;   // windows the run scores in all (set before the first window)
    int64_t n_scored = 0;         // tokens scored
    double ppl = 0, ppl_err = 0;  // exp(mean nll) and its standard error
    std::vector<double> running;  // the estimate after each window
    bool has_kl = false;
    KlStats kl;                          // when compare_base was given
    std::vector<double> chunk_kld;       // mean KL divergence of each window (compare_base)
    std::vector<double> chunk_same_top;  // same-top fraction of each window (compare_base)
    double seconds = 0;
};

// Runs the windows on a fresh sequence of `engine` (its own context of n_ctx tokens). on_chunk (optional)
// is called after each window with its index and the running result. Throws cera::Error: kInvalidArgument
// for bad options or fewer than 2 * n_ctx tokens; kIo / kInvalidFile for base files that cannot be read,
// are malformed, or were made by another vocabulary or from other tokens.
PerplexityResult perplexity(Engine& engine, std::span<const int32_t> tokens, const PerplexityOptions& options,
                            const std::function<void(int32_t chunk, const PerplexityResult&)>& on_chunk = {});

}  // namespace cera
