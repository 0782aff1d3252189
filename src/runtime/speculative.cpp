// Speculative decoding: prompt-lookup and draft-model drafts, one verification pass, speculative sampling.
#include "runtime/speculative.h"

#include <algorithm>

#include "cera/error.h"
#include "core/check.h"
#include "runtime/decode_strategy.h"
#include "runtime/engine_impl.h"

namespace cera {
namespace {

// A draw from candidates with probabilities p (summing to about 1), with u in [0, 1).
int32_t draw(std::span<const TokenProb> c, double u) {
    if (c.size() == 1) return c[0].id;
    double total = 0;
    for (const TokenProb& t : c) total += t.p;
    double acc = 0;
    const double x = u * total;
    for (const TokenProb& t : c) {
        acc += t.p;
        if (x < acc) return t.id;
    }
    return c.back().id;
}

}  // namespace

std::vector<int32_t> lookup_draft(std::span<const int32_t> tokens, int32_t ngram_max, int32_t k) {
    const int64_t T = int64_t(tokens.size());
    for (int64_t n = std::min<int64_t>(ngram_max, T - 1); n >= 1; --n) {
        const int32_t* pat = tokens.data() + (T - n);
        for (int64_t s = T - n - 1; s >= 0; --s) {
            if (!std::equal(pat, pat + n, tokens.data() + s)) continue;
            const int64_t from = s + n, to = std::min(T, from + k);
            return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);  // from < T: s + n <= T - 1
        }
    }
    return {};
}

int32_t draw_draft(Sampler& draft_sampler, const float* logits, std::vector<TokenProb>& q) {
    const std::span<const TokenProb> d = draft_sampler.distribution(logits);
    q.assign(d.begin(), d.end());
    return draw(q, q.size() > 1 ? draft_sampler.uniform() : 0.0);
}

SamplerParams draft_sampler_params(SamplerParams params) {
    params.seed = params.seed * 6364136223846793005ull + 1442695040888963407ull;  // a stream apart from the target's
    return params;
}

void check_speculative_options(const SpeculativeOptions& options) {
    if (options.lookup_ngram < 0)
        throw_error(ErrorCode::kInvalidArgument, "speculative: lookup n-gram %d must be >= 0", options.lookup_ngram);
    if (options.draft_max < 1 || options.draft_max >= ModelState::kKeptStates)
        throw_error(ErrorCode::kInvalidArgument, "speculative: draft max %d must be in 1..%d", options.draft_max,
                    ModelState::kKeptStates - 1);
    if (options.draft_min < 0 || options.draft_min > options.draft_max)
        throw_error(ErrorCode::kInvalidArgument, "speculative: draft min %d must be in 0..%d (draft max)",
                    options.draft_min, options.draft_max);
}

void check_same_vocabulary(const Engine& target, const Engine& draft) {
    const int32_t n = target.info().n_vocab;
    if (draft.info().n_vocab != n)
        throw_error(ErrorCode::kInvalidArgument, "draft model: its vocabulary has %d tokens, the model's has %d",
                    draft.info().n_vocab, n);
    for (int32_t t = 0; t < n; ++t)
        if (draft.token_text(t) != target.token_text(t))
            throw_error(ErrorCode::kInvalidArgument, "draft model: token %d is '%s', the model's is '%s'", t,
                        draft.token_text(t).c_str(), target.token_text(t).c_str());
}

namespace {

// Speculative sampling of row `row` against draft token d with proposal q; returns the kept token, and
// whether it is d.
int32_t verify_one(Sampler& sampler, const float* row, int32_t d, std::span<const TokenProb> q,
                   std::vector<float>& q_dense, bool& kept) {
    const std::span<const TokenProb> p = sampler.distribution(row);
    double pd = 0;
    for (const TokenProb& c : p)
        if (c.id == d) {
            pd = c.p;
            break;
        }
    for (const TokenProb& c : q) q_dense[size_t(c.id)] = c.p;
    const double qd = q_dense[size_t(d)];
    // Keep d with probability min(1, p(d) / q(d)); the test draws only when that is strictly between 0 and 1.
    kept = pd >= qd || (pd > 0 && sampler.uniform() * qd < pd);
    int32_t t = d;
    if (!kept) {
        // The residual max(0, p - q), normalised: only p's candidates can have mass there.
        double total = 0;
        int32_t n_pos = 0, only = p[0].id;
        for (const TokenProb& c : p) {
            const double r = double(c.p) - q_dense[size_t(c.id)];
            if (r > 0) total += r, ++n_pos, only = c.id;
        }
        if (n_pos <= 1) {
            t = only;  // greedy, or a single candidate left: no draw
        } else {
            const double x = sampler.uniform() * total;
            double acc = 0;
            t = only;
            for (const TokenProb& c : p) {
                const double r = double(c.p) - q_dense[size_t(c.id)];
                if (r <= 0) continue;
                acc += r;
                if (x < acc) {
                    t = c.id;
                    break;
                }
            }
        }
    }
    for (const TokenProb& c : q) q_dense[size_t(c.id)] = 0.0f;
    return t;
}

}  // namespace

int32_t accept_draft(Sampler& sampler, std::span<const int32_t> draft, std::span<const std::vector<TokenProb>> q,
                     const VerifyRows& rows, std::vector<float>& q_dense, std::vector<int32_t>& out) {
    CERA_CHECK(rows.logits || rows.argmax, "accept_draft: no rows");
    size_t i = 0;
    for (; i < draft.size(); ++i) {
        bool kept = false;
        int32_t t;
        if (rows.logits) {
            t = verify_one(sampler, rows.logits + i * size_t(rows.n_vocab), draft[i], q[i], q_dense, kept);
        } else {  // an arg-max sampler: its distribution is the arg-max alone, so the test is equality
            t = rows.argmax[i];
            kept = t == draft[i];
        }
        sampler.accept(t);
        out.push_back(t);
        if (!kept) return int32_t(i);
    }
    // Every draft token kept: the target's own next token comes free.
    const int32_t t = rows.logits ? sampler.sample(rows.logits + i * size_t(rows.n_vocab)) : rows.argmax[i];
    sampler.accept(t);
    out.push_back(t);
    return int32_t(i);
}

Speculator::Speculator(const SpeculativeOptions& options, const Engine& target, ModelState& state, Sampler& sampler,
                       DraftSlot& slot, int32_t max_tokens_pass, int decode_ahead)
    : opts_(options),
      state_(state),
      sampler_(sampler),
      n_vocab_(target.info().n_vocab),
      slot_(slot),
      decode_ahead_(decode_ahead) {
    const int32_t n_vocab = n_vocab_;
    check_speculative_options(options);
    max_pass_ = std::min({max_tokens_pass, options.draft_max + 1, ModelState::kKeptStates});
    logits_.resize(size_t(max_pass_) * size_t(n_vocab));
    q_.resize(size_t(max_pass_));
    q_dense_.assign(size_t(n_vocab), 0.0f);
    if (options.draft) {
        if (slot.engine != options.draft) {
            slot.state.reset();
            slot.tokens.clear();
            slot.engine = nullptr;
            check_same_vocabulary(target, *options.draft);
            slot.state = options.draft->impl().model->create_state(state.n_ctx());
            slot.engine = options.draft;
        }
        draft_sampler_ = std::make_unique<Sampler>(draft_sampler_params(sampler.params()), n_vocab);
        draft_logits_.resize(size_t(n_vocab));
    }
}

void Speculator::draft_with_model(std::span<const int32_t> tokens, int32_t k) {
    DraftSlot& s = slot_;
    const size_t T = tokens.size();
    // Bring the draft's sequence to tokens[0, T - 1): keep the common prefix, evaluate the rest.
    size_t common = 0;
    const size_t lim = std::min(s.tokens.size(), T - 1);
    while (common < lim && s.tokens[common] == tokens[common]) ++common;
    if (common < s.tokens.size()) {
        if (int32_t(common) >= s.state->rewind_floor()) {
            s.state->truncate(int32_t(common));
        } else {
            s.state->reset();
            common = 0;
        }
        s.tokens.resize(common);
    }
    // The tokens the draft has not evaluated, before the last one: after a pass that kept every draft,
    // the last draft (its pick was never evaluated). Up to kCatchUpInStep of them go into the first draft
    // step, which then evaluates several tokens in about the time of one where a step's latency, not its
    // arithmetic, sets its time. A longer run (the prompt, or the tokens of passes that prompt lookup
    // drafted) is evaluated alone first, and so is any run for a recurrent draft, whose steps keep their
    // tokens' states (at most its batch's rows of them).
    constexpr size_t kCatchUpInStep = 8;
    std::span<const int32_t> catch_up = tokens.subspan(common, T - 1 - common);
    if (catch_up.size() > kCatchUpInStep || (!catch_up.empty() && s.state->has_recurrent_state())) {
        s.state->eval({.tokens = catch_up});
        s.tokens.insert(s.tokens.end(), catch_up.begin(), catch_up.end());
        catch_up = {};
    }
    int32_t cur = tokens[T - 1];
    step_.assign(catch_up.begin(), catch_up.end());
    step_.push_back(cur);
    // A greedy draft sampler proposes each row's arg-max: only that id comes back from the draft model.
    const bool ids_only = draft_sampler_->picks_argmax();
    // As greedy decoding does (GenerateOptions::decode_ahead; by default on a device that runs behind the
    // host), a draft without recurrent state to keep chains its steps: each queues the step that evaluates
    // its pick before the host reads the pick (EvalRequest::ahead), so the device drafts on while the host
    // waits; the last queues nothing. A recurrent draft (LFM2) keeps the conv states of every step for the
    // rollback instead, one step at a time.
    const bool chain = ids_only && !s.state->has_recurrent_state() &&
                       decodes_ahead(decode_ahead_, s.engine->impl().model->backend().asynchronous());
    for (int32_t i = 0; i < k; ++i) {
        // Step 0 evaluates step_ (the catch-up and cur), the later ones cur alone.
        const std::span<const int32_t> in =
            i == 0 ? std::span<const int32_t>(step_) : std::span<const int32_t>(&cur, 1);
        if (s.state->position() + int32_t(in.size()) > s.state->n_ctx()) break;
        if (ids_only) {
            int32_t id = 0;
            if (chain)
                id = s.state->eval({.tokens = in, .head = HeadOutput::kGreedy, .ahead = i + 1 < k}).token;
            else
                s.state->eval({.tokens = in, .argmax = &id, .keep_states = true});
            q_[size_t(i)].assign(1, TokenProb{id, 0.0f, 1.0f});
            s.tokens.insert(s.tokens.end(), in.begin(), in.end());
            cur = id;
        } else {
            s.state->eval({.tokens = in, .logits = draft_logits_.data(), .keep_states = true});
            s.tokens.insert(s.tokens.end(), in.begin(), in.end());
            cur = draw_draft(*draft_sampler_, draft_logits_.data(), q_[size_t(i)]);
        }
        draft_.push_back(cur);
    }
}

bool Speculator::step(std::span<const int32_t> tokens, int32_t max_draft, std::vector<int32_t>& out) {
    CERA_CHECK(!tokens.empty() && size_t(state_.position()) + 1 == tokens.size(),
               "speculative step: the sequence's last token must be the only one not evaluated");
    const int32_t k = std::min(max_draft, max_pass_ - 1);
    const size_t need = size_t(std::max(1, opts_.draft_min));
    if (k < int32_t(need)) return false;
    draft_.clear();
    if (opts_.lookup_ngram > 0) {
        draft_ = lookup_draft(tokens, opts_.lookup_ngram, k);
        for (size_t i = 0; i < draft_.size(); ++i) q_[i].assign(1, TokenProb{draft_[i], 0.0f, 1.0f});
    }
    if (draft_.size() < need && opts_.draft) {
        draft_.clear();
        draft_with_model(tokens, k);
    }
    if (draft_.size() < need) return false;

    batch_.assign(1, tokens.back());
    batch_.insert(batch_.end(), draft_.begin(), draft_.end());
    first_pos_ = state_.position();
    // A greedy sampler needs only each row's arg-max: the ids come back, not the rows of logits.
    ids_only_ = sampler_.picks_argmax();
    picks_.resize(batch_.size());
    if (ids_only_)
        state_.eval({.tokens = batch_, .all_logits = true, .argmax = picks_.data(), .keep_states = true});
    else
        state_.eval({.tokens = batch_, .all_logits = true, .logits = logits_.data(), .keep_states = true});
    const VerifyRows rows = ids_only_ ? VerifyRows{.argmax = picks_.data(), .n_vocab = n_vocab_}
                                      : VerifyRows{.logits = logits_.data(), .n_vocab = n_vocab_};
    const size_t i = size_t(accept_draft(sampler_, draft_, q_, rows, q_dense_, out));
    drafted_ += int32_t(draft_.size());
    accepted_ += int32_t(i);
    state_.truncate(first_pos_ + 1 + int32_t(i));
    verified_ = 1 + int32_t(i);
    return true;
}

bool Speculator::logits_after(int32_t n, float* logits) const {
    const int32_t row = n - 1 - first_pos_;
    if (ids_only_ || row < 0 || row >= verified_) return false;
    std::copy_n(logits_.data() + size_t(row) * size_t(n_vocab_), size_t(n_vocab_), logits);
    return true;
}

}  // namespace cera
