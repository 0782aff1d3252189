// Speculative decoding for Session::generate() (SpeculativeOptions in session.h): draft a continuation by
// prompt lookup or with a draft model, verify it in one forward pass of the target (logits at every
// drafted position), keep what speculative sampling accepts, and take the target's state back to the last
// kept token (ModelState::truncate over the conv states kept by EvalRequest::keep_states).
//
// Works on the sequence's tokens and a ModelState only, so that the batched engine can drive it too.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cera/sampler.h"
#include "cera/session.h"
#include "models/model.h"

namespace cera {

// A draft model's own sequence, kept by a session across generate() calls: what it evaluated is
// reused when the next sequence starts with the same tokens.
struct DraftSlot {
    std::shared_ptr<Engine> engine;
    std::unique_ptr<ModelState> state;
    std::vector<int32_t> tokens;  // the tokens `state` evaluated
};

// The draft of prompt lookup: the tokens that followed the latest earlier occurrence of the last n tokens
// of `tokens`, n from ngram_max down to 1, at most k of them; empty when none occurs.
std::vector<int32_t> lookup_draft(std::span<const int32_t> tokens, int32_t ngram_max, int32_t k);

// Checks that the draft engine's vocabulary is the target's (same size, same text for every id). Throws
// kInvalidArgument naming the first difference.
void check_same_vocabulary(const Engine& target, const Engine& draft);

class Speculator {
 public:
    // target, state and sampler: the target model and sequence; slot: the session's draft slot (used when
    // options.draft; its vocabulary is checked against the target's when it changes); max_tokens_pass: the
    // most tokens one verification may carry. Throws kInvalidArgument for bad options.
    Speculator(const SpeculativeOptions& options, const Engine& target, ModelState& state, Sampler& sampler,
               DraftSlot& slot, int32_t max_tokens_pass);

    // One step. `tokens` is the whole sequence; its last token is not evaluated yet (state.position() ==
    // tokens.size() - 1). Drafts up to max_draft tokens; when the draft has at least max(1, draft_min), verifies
    // it and appends to `out` the kept draft tokens and the token the target sampled after them (each added to
    // the sampler's window), leaving the state at the sequence plus the kept tokens, and returns true. Returns
    // false, having changed nothing, when there is no such draft (the caller decodes one token plainly).
    bool step(std::span<const int32_t> tokens, int32_t max_draft, std::vector<int32_t>& out);

    // The target's logits after the first n tokens of the sequence, when the latest step evaluated that
    // position: copies them to logits (f32 [n_vocab]) and returns true.
    bool logits_after(int32_t n, float* logits) const;
    // The latest step's logits no longer describe the state (a plain decode step ran since).
    void forget() { verified_ = 0; }

    int32_t drafted() const { return drafted_; }
    int32_t accepted() const { return accepted_; }

 private:
    // Drafts with the draft model (its sequence brought to tokens[0, n - 1) first) into draft_, q_.
    void draft_with_model(std::span<const int32_t> tokens, int32_t k);
    // Speculative sampling of row i against draft token d with proposal q; returns the kept token, and
    // whether it is d.
    int32_t verify_one(const float* row, int32_t d, std::span<const TokenProb> q, bool& kept);

    const SpeculativeOptions& opts_;
    ModelState& state_;
    Sampler& sampler_;
    int32_t n_vocab_;
    DraftSlot& slot_;
    int32_t max_pass_;
    std::unique_ptr<Sampler> draft_sampler_;
    std::vector<int32_t> draft_;             // the current draft
    std::vector<std::vector<TokenProb>> q_;  // the proposal of each draft token (a point for lookup)
    std::vector<float> logits_;              // f32 [max_pass, n_vocab]: the verification's rows
    std::vector<float> draft_logits_;        // f32 [n_vocab]
    std::vector<float> q_dense_;             // f32 [n_vocab]: the proposal being tested, zero elsewhere
    std::vector<int32_t> batch_;             // the verification's tokens
    int32_t verified_ = 0, first_pos_ = 0;   // rows of logits_ valid, and the position of row 0's token
    int32_t drafted_ = 0, accepted_ = 0;
};

}  // namespace cera
