#include "cli/spec_flags.h"

#include "cera/error.h"

namespace cera::cli {

void SpecFlags::add(CLI::App& app) {
    app.add_option("--lookup-ngram", lookup_ngram,
                   "speculative decoding by prompt lookup: draft what followed the last N tokens (N down to 1) "
                   "earlier in the text (0: off)")
        ->capture_default_str();
    app.add_option("--draft-model", draft_model,
                   "speculative decoding with a draft model (GGUF) of the same vocabulary");
    app.add_option("--draft-max", draft_max, "tokens drafted a step at most (1..63)")->capture_default_str();
    app.add_option("--draft-min", draft_min, "shorter drafts are not verified (a plain step runs)")
        ->capture_default_str();
}

SpeculativeOptions SpecFlags::build(const EngineOptions& engine) const {
    if (lookup_ngram < 0) throw Error(ErrorCode::kInvalidArgument, "--lookup-ngram must be >= 0");
    if (draft_max < 1 || draft_max > 63) throw Error(ErrorCode::kInvalidArgument, "--draft-max must be in 1..63");
    if (draft_min < 0 || draft_min > draft_max)
        throw Error(ErrorCode::kInvalidArgument, "--draft-min must be in 0..--draft-max");
    SpeculativeOptions so;
    so.lookup_ngram = lookup_ngram;
    so.draft_max = draft_max;
    so.draft_min = draft_min;
    if (!draft_model.empty()) {
        EngineOptions eo;
        eo.device = engine.device;
        eo.threads = engine.threads;
        eo.n_ctx = engine.n_ctx;
        eo.kv_type_k = engine.kv_type_k;
        eo.kv_type_v = engine.kv_type_v;
        eo.n_batch = engine.n_batch;
        so.draft = Engine::load(draft_model, eo);
    }
    return so;
}

}  // namespace cera::cli
