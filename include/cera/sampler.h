// cera::Sampler: turns a row of logits into the next token id.
//
// The chain runs in llama.cpp's default order:
//   logit bias (added to the raw logits of chosen ids) ->
//   penalties (repetition / frequency / presence over the last `penalty_last_n` accepted tokens)
//   -> top-k -> top-p -> min-p -> temperature -> draw (seeded)
// so top-p and min-p look at the temperature-1 distribution of the penalised logits,
// and temperature only reshapes the survivors. temperature <= 0 is greedy: the
// arg-max of the penalised logits (ties -> the lowest id), no random draw.
//
// One Sampler per sequence. It allocates its buffers once (at construction, for
// n_vocab candidates); sample() and accept() never allocate and never throw. The
// buffers are fresh anonymous pages, which the kernel zero-fills as they are first
// touched: constructing a sampler (every request a server takes) costs no pass over
// the vocabulary, and a greedy or top-k request never touches most of them.
// Not thread-safe: use one Sampler from one thread at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace cera {

// Sampling settings. The defaults match llama.cpp's CLI defaults.
struct SamplerParams {
    float temperature = 0.8f;        // <= 0: greedy
    int32_t top_k = 40;              // keep the k most likely; <= 0 or >= n_vocab: off
    float top_p = 0.95f;             // keep the smallest prefix with mass >= top_p; >= 1: off
    float min_p = 0.05f;             // keep p >= min_p * p_max; <= 0: off
    float repeat_penalty = 1.0f;     // logit > 0: logit / r, else logit * r; 1: off
    float frequency_penalty = 0.0f;  // logit -= count * f
    float presence_penalty = 0.0f;   // logit -= (count > 0) * p
    int32_t penalty_last_n = 64;     // window of recent tokens the penalties count; 0: penalties off
    uint64_t seed = 0;               // same seed, same logits -> same tokens
    // Added to the raw logit of each id before everything else (OpenAI's logit_bias: -100 all but bans
    // a token, +100 all but forces it). Ids must be in the vocabulary and biases finite.
    std::vector<std::pair<int32_t, float>> logit_bias;
};

// A token id with its log-probability (Sampler::log_probs).
struct TokenLogprob {
    int32_t id = -1;
    float logprob = 0.0f;
};

// One candidate of the distribution that sample() draws from.
struct TokenProb {
    int32_t id;
    float logit;  // after penalties and temperature
    float p;      // normalised over the kept candidates
};

class Sampler {
 public:
    // Validates params (throws cera::Error kInvalidArgument on NaN or negative values
    // where they make no sense) and allocates buffers for n_vocab candidates.
    Sampler(const SamplerParams& params, int32_t n_vocab);

    // The next token for one row of n_vocab logits (not modified). Never allocates or throws.
    // Does not add the token to the penalty window: call accept() for that.
    int32_t sample(const float* logits);
    // sample() among the allowed tokens only (structured output): token id is in the running when bit
    // id % 64 of allowed[id / 64] is set; the others are out before the chain starts, as if their logit
    // were -inf, so penalties, top-k, top-p, min-p and temperature all see the allowed ones alone. With
    // no token allowed, the mask is ignored. null: sample(logits). Never allocates or throws.
    int32_t sample(const float* logits, const uint64_t* allowed);

    // The kept candidates with their probabilities, most likely first, exactly as the
    // next sample() on the same logits would draw from them (greedy: the single arg-max
    // with p = 1). The span stays valid until the next call on this Sampler.
    std::span<const TokenProb> distribution(const float* logits);
    // distribution() among the allowed tokens only (see sample(logits, allowed)).
    std::span<const TokenProb> distribution(const float* logits, const uint64_t* allowed);

    // Sampling from the best logits only (a device backend selects them, Backend::top_logits, and
    // copies back those instead of the whole row). top_needed(): how many of the best logits
    // sample_top() needs: k + the penalty window's capacity, when top-k is on and that is small next
    // to the vocabulary (then every other token is out of the running); 0 when sample() needs the
    // whole row (greedy, top-k off, or a large k).
    int32_t top_needed() const;
    // The penalty window's tokens, oldest first: sample_top() wants their raw logits in this order.
    // The span stays valid until the next call on this Sampler. Never allocates.
    std::span<const int32_t> window();
    // sample() for a row whose best entries above -inf, ordered by logit descending then id ascending,
    // are ids[0, n) with logits[0, n) (n >= 1; at least top_needed() of them, or every one above -inf),
    // with window_logits[i] the raw logit of window()[i]. Draws the token sample() would draw from
    // the whole row, and advances the random stream the same way. Never allocates or throws.
    int32_t sample_top(const int32_t* ids, const float* logits, int32_t n, const float* window_logits);

    // Log-probabilities for reporting (OpenAI's logprobs): the log-softmax over all n_vocab logits after
    // the logit bias and the penalties, before top-k, top-p, min-p and temperature; that is, the model's
    // distribution as the request shaped it, whatever the truncation settings. Returns the log-probability
    // of `token` and writes the n_top most likely ids (most likely first, ties: the lowest id) to top.
    // Call it before accept() of the token, with the row it was sampled from. Does not touch the random
    // stream; never allocates or throws (n_top is cut to n_vocab).
    float log_probs(const float* logits, int32_t token, int32_t n_top, TokenLogprob* top);

    // A draw from [0, 1) of this sampler's random stream (speculative sampling's acceptance tests and
    // residual draws take theirs from here, so that one seed gives one generation).
    double uniform() { return next_uniform(); }

    // Adds a token (prompt or generated) to the penalty window. Never allocates.
    void accept(int32_t token);
    // Empties the penalty window and re-seeds the generator with params().seed.
    void reset();
    // Empties the penalty window only; the random stream continues.
    void clear_history();

    const SamplerParams& params() const { return params_; }
    // True when sample(logits) is exactly the arg-max of the raw logits (the lowest id among the largest,
    // NaN never chosen; 0 when every logit is NaN): greedy with no penalty in effect. The arg-max may
    // then be taken where the logits are (on the device) and give the same token.
    bool picks_argmax() const { return greedy_ && !penalties_on_ && params_.logit_bias.empty(); }
    int32_t n_vocab() const { return n_vocab_; }
    // The tokens currently in the penalty window, oldest first (copies; for tests and tools).
    std::vector<int32_t> history() const;

 private:
    void apply_penalties();
    void load_all(const float* logits);  // every id, biased and penalised: cand_[id].id == id
    void next_epoch();
    float penalize(float logit, int32_t count) const;
    void load(const float* logits, int32_t k);
    // The penalty window's tokens that are not candidates yet join them (with their raw logit from
    // `logits`, or window_logits[ring position]), then every window token's logit is penalised.
    void add_window(const float* logits, const float* window_logits);
    int32_t draw();
    void filter(bool sort_kept);  // sort_kept: leave the survivors most likely first
    int32_t greedy_pick() const;
    bool allowed(int32_t id) const { return !allowed_ || ((allowed_[id >> 6] >> (id & 63)) & 1); }
    uint64_t next_u64();
    double next_uniform();  // [0, 1)

    struct Unmap {
        size_t bytes;
        void operator()(void* p) const noexcept;
    };
    template <class T>
    using Buffer = std::unique_ptr<T[], Unmap>;
    template <class T>
    static Buffer<T> zeroed(size_t n);

    SamplerParams params_;
    int32_t n_vocab_;
    bool greedy_;
    bool penalties_on_;
    Buffer<TokenProb> cand_;  // [n_vocab] working set; the first n_cand_ are live
    int32_t n_cand_ = 0;
    bool sorted_ = false;        // cand_[0, n_cand_) sorted by logit, descending
    std::vector<int32_t> ring_;  // [penalty_last_n] recent tokens
    int32_t ring_head_ = 0, ring_size_ = 0;
    Buffer<int32_t> count_;        // [n_vocab] occurrences of each id in the window
    Buffer<uint32_t> stamp_;       // [n_vocab] last penalty pass that touched an id
    std::vector<int32_t> window_;  // [penalty_last_n] window() output
    uint32_t epoch_ = 0;
    uint64_t rng_[4];                    // xoshiro256** state
    const uint64_t* allowed_ = nullptr;  // the mask of the sample() in progress, or null
};

}  // namespace cera
