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

// Checks the options' ranges (the n-gram, draft max in 1..ModelState::kKeptStates - 1, draft min). Throws
// kInvalidArgument naming the bad one.
void check_speculative_options(const SpeculativeOptions& options);

// Checks that the draft engine's vocabulary is the target's (same size, same text for every id). Throws
// kInvalidArgument naming the first difference.
void check_same_vocabulary(const Engine& target, const Engine& draft);

// The target's choice after each position of a verification: rows of logits (f32 [n_vocab] each), or,
// for a sampler that picks the arg-max (Sampler::picks_argmax()), only the arg-max ids.
struct VerifyRows {
    const float* logits = nullptr;    // f32 [n, n_vocab], or null
    const int32_t* argmax = nullptr;  // i32 [n] when logits is null
    int32_t n_vocab = 0;
};

// A draft model's next token: the draft sampler's distribution of `logits` into q (the proposal), and a draw
// from it (none when it has a single candidate).
int32_t draw_draft(Sampler& draft_sampler, const float* logits, std::vector<TokenProb>& q);

// The draft sampler of a request sampled with `params`: the same settings, a random stream apart.
SamplerParams draft_sampler_params(SamplerParams params);

// Speculative sampling of a draft: row i is the target's next-token choice after the sequence and
// draft[0, i), for i in 0..draft.size(); q[i] is the proposal draft[i] was drawn from (a point mass for
// prompt lookup). Keeps draft[i] with probability min(1, p(d) / q(d)) (p: the sampler's distribution of
// row i); at the first rejection appends a draw from the residual max(0, p - q), normalised, and stops;
// after a fully kept draft appends the sampler's own draw from the last row. Every token appended goes
// into the sampler's window. Returns the draft tokens kept. q_dense: scratch, n_vocab zeros (left so).
int32_t accept_draft(Sampler& sampler, std::span<const int32_t> draft, std::span<const std::vector<TokenProb>> q,
                     const VerifyRows& rows, std::vector<float>& q_dense, std::vector<int32_t>& out);

class Speculator {
 public:
    // target, state and sampler: the target model and sequence; slot: the session's draft slot (used when
    // options.draft; its vocabulary is checked against the target's when it changes); max_tokens_pass: the
    // most tokens one verification may carry; decode_ahead: GenerateOptions::decode_ahead, which a greedy
    // draft without recurrent state follows too. Throws kInvalidArgument for bad options.
    Speculator(const SpeculativeOptions& options, const Engine& target, ModelState& state, Sampler& sampler,
               DraftSlot& slot, int32_t max_tokens_pass, int decode_ahead);

    // One step. `tokens` is the whole sequence; its last token is not evaluated yet (state.position() ==
    // tokens.size() - 1). Drafts up to max_draft tokens; when the draft has at least max(1, draft_min), verifies
    // it and appends to `out` the kept draft tokens and the token the target sampled after them (each added to
    // the sampler's window), leaving the state at the sequence plus the kept tokens, and returns true. Returns
    // false, having changed nothing, when there is no such draft (the caller decodes one token plainly).
    bool step(std::span<const int32_t> tokens, int32_t max_draft, std::vector<int32_t>& out);

    // The target's logits after the first n tokens of the sequence, when the latest step evaluated that
    // position and brought its logits back (not for a greedy sampler, whose steps take the arg-max ids
    // only): copies them to logits (f32 [n_vocab]) and returns true.
    bool logits_after(int32_t n, float* logits) const;
    // The latest step's logits no longer describe the state (a plain decode step ran since).
    void forget() { verified_ = 0; }

    int32_t drafted() const { return drafted_; }
    int32_t accepted() const { return accepted_; }

 private:
    // Drafts with the draft model (its sequence brought to tokens[0, n - 1) first) into draft_, q_.
    void draft_with_model(std::span<const int32_t> tokens, int32_t k);
    const SpeculativeOptions& opts_;
    ModelState& state_;
    Sampler& sampler_;
    int32_t n_vocab_;
    DraftSlot& slot_;
    int32_t max_pass_;
    int decode_ahead_;
    std::unique_ptr<Sampler> draft_sampler_;
    std::vector<int32_t> draft_;             // the current draft
    std::vector<int32_t> step_;              // draft_with_model(): its first step's tokens
    std::vector<std::vector<TokenProb>> q_;  // the proposal of each draft token (a point for lookup)
    std::vector<float> logits_;              // f32 [max_pass, n_vocab]: the verification's rows
    std::vector<float> draft_logits_;        // f32 [n_vocab]
    std::vector<float> q_dense_;             // f32 [n_vocab]: the proposal being tested, zero elsewhere
    std::vector<int32_t> batch_;             // the verification's tokens
    std::vector<int32_t> picks_;             // the verification's arg-max ids (a greedy sampler)
    bool ids_only_ = false;                  // the latest step brought back picks_, not logits_
    int32_t verified_ = 0, first_pos_ = 0;   // rows of logits_ valid, and the position of row 0's token
    int32_t drafted_ = 0, accepted_ = 0;
};

}  // namespace cera
