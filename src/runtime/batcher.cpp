// Batcher: the continuous-batching scheduler over a BatchState (models/batch_state.h). One thread
// owns the state and the scheduling; submit() and cancel() only hand requests and flags to it.
//
// Each step: cancelled requests leave; waiting requests are admitted in arrival order while a
// sequence slot is free, each taking the longest cached prefix of its tokens; the step takes the next token of every
// running sequence that is decoding, then prompt chunks in admission order up to the token budget. When the pool lacks
// the blocks the step needs, the most recently admitted sequence is preempted: it gives its blocks back and waits at
// the front of the queue, to evaluate its tokens (prompt and generated so far) again when it returns;
// its sampler, stop matcher and detokenizer carry on, so its output does not change (and its full
// blocks, still cached, usually come back with it).
//
// Speculative decoding: a decoding sequence whose request speculates drafts up to k tokens (within the
// step's budget, its max_tokens and its context) and enters the step as a verify entry: its pending token
// and the draft, with outputs at each. accept_draft() (shared with Session's Speculator) keeps a prefix of
// the draft plus one token of the model's, BatchState::keep() takes the sequence back to the kept tokens,
// and the tokens are then handed out one by one as plain decoding hands out its one (EOS, stop strings,
// max_tokens and the context end it the same way; the rest are dropped).
#include "cera/batcher.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "cera/sampler.h"
#include "chat/grammar/grammar_impl.h"
#include "core/check.h"
#include "models/batch_state.h"
#include "runtime/batch_draft.h"
#include "runtime/engine_impl.h"
#include "runtime/session_stop.h"
#include "runtime/speculative.h"

namespace cera {
namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

class Req final : public Request {
   public:
    Req(std::span<const int32_t> prompt, const GenerateOptions& o, std::shared_ptr<Sink> s, const Tokenizer& tok,
        int32_t n_vocab, uint64_t order, std::unique_ptr<grammar::Matcher> m)
        : tokens(prompt.begin(), prompt.end()),
          n_prompt(prompt.size()),
          opts(o),
          sink(std::move(s)),
          sampler(o.sampling, n_vocab),
          stopper(o.stop),
          detok(tok, false, o.rendered_tokens),
          matcher(std::move(m)),
          arrival(order) {
        const size_t window = size_t(std::max(0, o.sampling.penalty_last_n));
        for (size_t i = tokens.size() > window ? tokens.size() - window : 0; i < tokens.size(); ++i)
            sampler.accept(tokens[i]);
        (void)detok.push(tokens.back());  // as Session: a space prefix is stripped only at a text's start
    }

    void cancel() override { cancelled.store(true); }
    bool done() const override {
        std::lock_guard<std::mutex> lk(mu);
        return finished;
    }
    GenerationResult wait() override {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return finished; });
        if (error) std::rethrow_exception(error);
        return result;
    }

    // The end, with the text held back released (a Sink's throw fails the request instead).
    void finish(FinishReason why, std::exception_ptr e = nullptr) {
        result.finish = why;
        if (started) result.decode_seconds = seconds(first_sample, Clock::now());
        if (!e) {
            try {
                if (why != FinishReason::kStop || result.stop_string.empty()) {  // a stop string drops the rest
                    if (stopper.end(detok.flush(), out)) {
                        result.finish = FinishReason::kStop;
                        result.stop_string = stopper.matched();
                    }
                    emit();
                }
                if (sink) sink->on_done(result);
            } catch (...) {
                e = std::current_exception();
            }
        }
        std::lock_guard<std::mutex> lk(mu);
        finished = true;
        error = e;
        cv.notify_all();
    }
    void emit() {
        if (out.empty()) return;
        if (sink) sink->on_text(out);
        result.text += out;
        out.clear();
    }

    // Fixed at submit.
    std::vector<int32_t> tokens;  // the prompt, then each sampled token once it is to be evaluated
    const size_t n_prompt;
    const GenerateOptions opts;
    const std::shared_ptr<Sink> sink;
    Sampler sampler;
    StopMatcher stopper;
    StreamingDetokenizer detok;
    const std::unique_ptr<grammar::Matcher> matcher;  // this sequence's grammar state, or null
    const uint64_t arrival;
    LoraSet lora;           // the adapters its steps apply (set at submit)
    uint64_t lora_key = 0;  // lora_set_key(lora)
    // Its images (set at submit): held while it runs; their embedding runs over `tokens`, and the content
    // keys of those runs for the prefix blocks.
    std::vector<PromptImage> images;
    std::vector<EmbdRun> runs;
    std::vector<BatchState::ContentKey> content;
    std::vector<EmbdRun> step_runs;  // the runs of the tokens of its entry in the step being planned
    SpeculativeOptions spec;         // its speculative decoding (enabled() false: none)
    std::vector<int32_t> verify;     // its verify entry's tokens: the pending one, then the draft
    std::vector<std::vector<TokenProb>> q;   // the proposal of each draft token
    std::unique_ptr<Sampler> draft_sampler;  // the draft model's (when spec.draft)
    int32_t model_k = 0;                     // the step being planned: tokens the draft model is to draft
    std::vector<int32_t> drafted;            // the draft model's draft
    // The batcher thread's.
    int seq = -1;           // BatchState slot while admitted
    size_t evaluated = 0;   // tokens of `tokens` in the sequence's cache
    uint64_t admitted = 0;  // admission order (preemption takes the largest)
    bool started = false;   // a token has been sampled
    Clock::time_point t_admit, first_sample;
    GenerationResult result;
    std::string out;
    std::atomic<bool> cancelled{false};
    // Completion.
    mutable std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    std::exception_ptr error;
};

class BatcherImpl final : public Batcher {
   public:
    BatcherImpl(std::shared_ptr<Engine> engine, const BatcherOptions& o)
        : engine_(std::move(engine)), im_(engine_->impl()), o_(o), n_vocab_(im_.info.n_vocab) {
        n_ctx_ = o.n_ctx > 0 ? o.n_ctx : im_.model->default_n_ctx();
        if (o.parallel < 1 || o.step_tokens < 1 || o.max_queue < 0 || o.kv_tokens < 0 || n_ctx_ < 2)
            throw_error(ErrorCode::kInvalidArgument, "batcher: parallel %d, step tokens %d, queue %d, pool %" PRId64,
                        o.parallel, o.step_tokens, o.max_queue, o.kv_tokens);
        BatchStateOptions bo;
        bo.max_seqs = o.parallel;
        bo.kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : int64_t(o.parallel) * n_ctx_;
        if (bo.kv_tokens < n_ctx_)
            throw_error(ErrorCode::kInvalidArgument, "batcher: a KV pool of %" PRId64 " tokens holds no %d-token sequence",
                        bo.kv_tokens, n_ctx_);
        bo.block_size = o.block_size;
        bo.max_step_tokens = std::max(o.step_tokens, o.parallel);  // every running sequence's next token fits
        bo.max_seq_tokens = n_ctx_;
        if (o.max_draft < -1 || o.max_draft >= ModelState::kKeptStates)
            throw_error(ErrorCode::kInvalidArgument, "batcher: max draft %d must be in -1..%d", o.max_draft,
                        ModelState::kKeptStates - 1);
        max_draft_ = o.max_draft >= 0 ? o.max_draft : o.speculative.enabled() ? o.speculative.draft_max : 0;
        if (o.speculative.enabled()) {
            check_speculative_options(o.speculative);
            if (o.speculative.draft) check_same_vocabulary(*engine_, *o.speculative.draft);
        }
        bo.max_draft = max_draft_;
        state_ = std::make_unique<BatchState>(*im_.model, bo);
        if (o.speculative.draft && max_draft_ > 0)
            drafter_ = std::make_unique<BatchDrafter>(*engine_, o.speculative.draft, bo);
        q_dense_.assign(size_t(n_vocab_), 0.0f);
        step_tokens_ = bo.max_step_tokens;
        thread_ = std::thread([this] { loop(); });
    }

    ~BatcherImpl() override {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }

    std::shared_ptr<Request> submit(std::span<const int32_t> prompt, const GenerateOptions& options,
                                    std::shared_ptr<Sink> sink, std::span<const PromptImage> images) override {
        if (prompt.empty()) throw_error(ErrorCode::kInvalidArgument, "submit: an empty prompt");
        for (int32_t id : prompt)
            if (id < 0 || id >= n_vocab_)
                throw_error(ErrorCode::kInvalidArgument, "submit: token id %d outside [0, %d)", id, n_vocab_);
        if (int64_t(prompt.size()) >= n_ctx_)
            throw_error(ErrorCode::kOutOfRange, "submit: a %zu-token prompt leaves no room in a %d-token sequence",
                        prompt.size(), n_ctx_);
        const SpeculativeOptions& spec = options.speculative.enabled() ? options.speculative : o_.speculative;
        if (spec.enabled()) {
            check_speculative_options(spec);
            if (spec.draft && spec.draft != o_.speculative.draft)
                throw_error(ErrorCode::kInvalidArgument,
                            "draft model: a batcher drafts only with its own (BatcherOptions::speculative.draft)");
        }
        LoraSet lora = im_.resolve_lora(options.adapter);  // held by the request while it runs
        auto m = options.grammar ? make_matcher(*options.grammar, im_.token_trie()) : nullptr;
        auto r = std::make_shared<Req>(prompt, options, std::move(sink), *im_.tokenizer, n_vocab_, next_arrival_++,
                                       std::move(m));
        r->lora = std::move(lora);
        r->lora_key = lora_set_key(r->lora);
        // As in Session: a grammar's mask and logprobs' rows are per token, so those requests decode plainly.
        if (spec.enabled() && !r->matcher && options.logprobs < 0 && max_draft_ > 0) {
            r->spec = spec;
            r->spec.draft_max = std::min(spec.draft_max, max_draft_);
            r->spec.draft_min = std::min(spec.draft_min, r->spec.draft_max);
            if (r->spec.draft)
                r->draft_sampler = std::make_unique<Sampler>(draft_sampler_params(options.sampling), n_vocab_);
        }
        size_t end = 0;
        for (const PromptImage& pi : images) {
            if (!pi.image) throw_error(ErrorCode::kInvalidArgument, "submit: an empty image");
            const std::vector<int32_t>& ids = pi.image->ids;
            if (pi.begin < end || pi.begin + ids.size() > prompt.size() ||
                !std::equal(ids.begin(), ids.end(), prompt.begin() + std::ptrdiff_t(pi.begin)))
                throw_error(ErrorCode::kInvalidArgument,
                            "submit: the image at %zu: its tokens are not there in the prompt, or it overlaps another",
                            pi.begin);
            end = pi.begin + ids.size();
            for (const EmbdRun& run : image_runs(*pi.image, int64_t(pi.begin), im_.info.n_embd)) r->runs.push_back(run);
            r->content.push_back({int64_t(pi.begin), int64_t(end), pi.image->hash});
        }
        r->images.assign(images.begin(), images.end());
        {
            std::lock_guard<std::mutex> lk(mu_);
            if (stop_) throw_error(ErrorCode::kCancelled, "submit: the batcher is stopping");
            if (int64_t(inbox_.size()) + waiting_count_.load() >= o_.max_queue)
                throw_error(ErrorCode::kOverCapacity, "over capacity: %d requests are waiting", o_.max_queue);
            inbox_.push_back(r);
        }
        cv_.notify_all();
        return r;
    }

    int32_t n_ctx() const override { return n_ctx_; }

    BatcherStats stats() const override {
        std::lock_guard<std::mutex> lk(stats_mu_);
        return stats_;
    }

   private:
    void loop() {
        std::vector<BatchState::Entry> entries;
        std::vector<Req*> owners;
        StepOutput out;
        for (;;) {
            {
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait(lk, [&] { return stop_ || !inbox_.empty() || !running_.empty() || !waiting_.empty(); });
                if (stop_) break;
                for (auto& r : inbox_) waiting_.push_back(std::move(r));
                inbox_.clear();
            }
            drop_cancelled();
            admit();
            plan(entries, owners);
            publish_stats();
            if (entries.empty()) continue;
            int64_t evaluated = 0;
            try {
                draft_with_model(entries, owners);
                // The grammars' masks for the sequences' next tokens are computed while the device computes
                // the logits (into each matcher's cache, where sample() finds them again).
                state_->step(entries, out, [&] {
                    for (size_t i = 0; i < entries.size(); ++i)
                        if (owners[i]->matcher && entries[i].pick != Pick::kNone && !entries[i].verify)
                            owners[i]->matcher->mask();
                });
                for (size_t i = 0; i < entries.size(); ++i) {
                    Req& r = *owners[i];
                    evaluated += int64_t(entries[i].tokens.size());
                    if (!entries[i].verify) r.evaluated += entries[i].tokens.size();
                    try {  // a Sink that throws fails its own request only
                        if (entries[i].verify)
                            after_verify(r, entries[i], out, i);
                        else if (entries[i].pick != Pick::kNone)
                            after_pick(r, entries[i], out, i);
                        else if (r.evaluated == r.tokens.size() && r.opts.max_tokens == 0) leave(r, FinishReason::kLength);
                    } catch (...) {
                        leave(r, FinishReason::kNone, std::current_exception());
                    }
                }
            } catch (...) {  // the step changed nothing: its requests fail, the others go on
                const std::exception_ptr e = std::current_exception();
                for (Req* r : owners) leave(*r, FinishReason::kNone, e);
            }
            std::erase_if(running_, [](const std::shared_ptr<Req>& r) { return r->seq < 0; });
            publish_stats();
            std::lock_guard<std::mutex> lk(stats_mu_);
            ++stats_.steps;
            stats_.tokens_evaluated += evaluated;
        }
        // Stopping: everything unfinished is cancelled.
        for (auto& r : running_) leave(*r, FinishReason::kCancelled);
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& r : waiting_) r->finish(FinishReason::kCancelled);
        for (auto& r : inbox_) r->finish(FinishReason::kCancelled);
    }

    void drop_cancelled() {
        for (auto& r : running_)
            if (r->cancelled.load()) leave(*r, FinishReason::kCancelled);
        std::erase_if(running_, [](const std::shared_ptr<Req>& r) { return r->seq < 0; });
        std::erase_if(waiting_, [](const std::shared_ptr<Req>& r) {
            if (!r->cancelled.load()) return false;
            r->finish(FinishReason::kCancelled);
            return true;
        });
    }

    // In arrival order, while a slot is free and the pool has room for the request's tokens.
    void admit() {
        while (!waiting_.empty() &&
               state_->free_blocks() * state_->block_size() >= int64_t(waiting_.front()->tokens.size())) {
            const int seq = state_->add_sequence();
            if (seq < 0) break;
            std::shared_ptr<Req> r = std::move(waiting_.front());
            waiting_.pop_front();
            r->seq = seq;
            if (r->draft_sampler) drafter_->add(seq, r->tokens);
            state_->set_lora(seq, r->lora);
            state_->set_content_keys(seq, r->content);
            // The longest cached prefix of its tokens (a shared prompt, or its own blocks after a preemption).
            r->evaluated = size_t(state_->attach_prefix(seq, r->tokens));
            r->admitted = next_admission_++;
            if (!r->started) {
                r->t_admit = Clock::now();
                r->result.cached_tokens = int32_t(r->evaluated);
            }
            running_.push_back(std::move(r));
        }
        waiting_count_.store(int64_t(waiting_.size()));
    }

    // The step's entries: decode tokens first, then prompt chunks within the budget; preempts while the
    // pool lacks the blocks.
    void plan(std::vector<BatchState::Entry>& entries, std::vector<Req*>& owners) {
        bool speculate = true;  // drafts go before sequences: a step short of blocks drops them first
        for (;;) {
            entries.clear(), owners.clear();
            bool drafted = false;
            int64_t budget = step_tokens_, blocks = 0;
            std::vector<Req*> order;
            int64_t decoding = 0;  // decoding sequences not planned yet: each needs a token of the budget
            for (auto& r : running_) {
                order.push_back(r.get());
                decoding += r->tokens.size() - r->evaluated == 1 ? 1 : 0;
            }
            // Decoding sequences (one token left) first, those of one adapter set side by side (their rows
            // make one segment of each adapter product), then the rest by admission.
            std::stable_sort(order.begin(), order.end(), [](const Req* a, const Req* b) {
                const bool da = a->tokens.size() - a->evaluated == 1, db = b->tokens.size() - b->evaluated == 1;
                if (da != db) return da;
                if (da && a->lora_key != b->lora_key) return a->lora_key < b->lora_key;
                return a->admitted < b->admitted;
            });
            for (Req* r : order) {
                const int64_t left = int64_t(r->tokens.size() - r->evaluated);
                if (left == 1) --decoding;
                r->model_k = 0;
                if (speculate && left == 1 && r->started && r->spec.enabled() && r->opts.max_tokens != 0 &&
                    plan_draft(*r, budget - 1 - decoding)) {
                    drafted = true;
                    BatchState::Entry e;
                    e.seq = r->seq;
                    e.tokens = r->verify;
                    e.verify = true;
                    e.pick = r->sampler.picks_argmax() ? Pick::kArgmax : Pick::kLogits;
                    budget -= int64_t(r->verify.size());
                    blocks += state_->blocks_needed(r->seq, int64_t(r->verify.size()));
                    entries.push_back(e);
                    owners.push_back(r);
                    continue;
                }
                const int64_t n = std::min(left, budget);
                if (n <= 0) continue;
                budget -= n;
                blocks += state_->blocks_needed(r->seq, n);
                const bool last = n == left;
                BatchState::Entry e;
                e.seq = r->seq;
                e.tokens = std::span<const int32_t>(r->tokens).subspan(r->evaluated, size_t(n));
                e.embd = chunk_runs(*r, int64_t(r->evaluated), n);
                if (last && r->opts.max_tokens != 0) choose_pick(*r, e);
                entries.push_back(e);
                owners.push_back(r);
            }
            if (blocks <= state_->free_blocks()) return;
            if (drafted) {
                speculate = false;
                continue;
            }
            if (running_.size() <= 1) return;
            preempt();
        }
    }

    // A draft for a decoding sequence of the request, of at most `room` tokens (the step's budget left)
    // and what its max_tokens and context leave (the verification adds one token of the model's): into
    // r.verify after its pending token, with its proposals in r.q. False when there is no draft of at
    // least max(1, draft_min) tokens (the sequence decodes plainly).
    bool plan_draft(Req& r, int64_t room) {
        r.model_k = 0;
        int64_t k = std::min<int64_t>(r.spec.draft_max, room);
        if (r.opts.max_tokens >= 0) k = std::min<int64_t>(k, r.opts.max_tokens - r.result.generated_tokens - 1);
        k = std::min<int64_t>(k, n_ctx_ - int64_t(r.tokens.size()));
        const int64_t need = std::max(1, r.spec.draft_min);
        if (k < need) return false;
        std::vector<int32_t> draft;
        if (r.spec.lookup_ngram > 0) draft = lookup_draft(r.tokens, r.spec.lookup_ngram, int32_t(k));
        r.verify.assign(1, r.tokens.back());
        if (int64_t(draft.size()) < need && r.spec.draft) {  // the draft model drafts k tokens before the step
            r.model_k = int32_t(k);
            r.verify.resize(size_t(1 + k), r.tokens.back());  // stand-ins, for the step's plan
            return true;
        }
        if (int64_t(draft.size()) < need) return false;
        r.verify.insert(r.verify.end(), draft.begin(), draft.end());
        r.q.resize(draft.size());
        for (size_t i = 0; i < draft.size(); ++i) r.q[i].assign(1, TokenProb{draft[i], 0.0f, 1.0f});  // a point mass
        return true;
    }

    // The draft model drafts for the planned verify entries that wait for it, all together, and their
    // entries take the drafts (an entry whose draft did not fit the draft's pool decodes plainly).
    void draft_with_model(std::vector<BatchState::Entry>& entries, const std::vector<Req*>& owners) {
        std::vector<BatchDrafter::Job> jobs;
        for (Req* r : owners)
            if (r->model_k > 0)
                jobs.push_back({.seq = r->seq,
                                .tokens = r->tokens,
                                .k = r->model_k,
                                .sampler = r->draft_sampler.get(),
                                .draft = &r->drafted,
                                .q = &r->q});
        if (jobs.empty()) return;
        drafter_->draft(jobs);
        for (size_t i = 0; i < entries.size(); ++i) {
            Req& r = *owners[i];
            if (r.model_k == 0) continue;
            r.model_k = 0;
            r.verify.assign(1, r.tokens.back());
            r.verify.insert(r.verify.end(), r.drafted.begin(), r.drafted.end());
            entries[i].tokens = r.verify;
            if (r.drafted.size() < size_t(std::max(1, r.spec.draft_min))) {
                entries[i].tokens = entries[i].tokens.first(1);
                entries[i].verify = false;
                choose_pick(r, entries[i]);
            }
        }
    }

    // A verify entry came back: keep what speculative sampling accepts, take the sequence back to it and
    // hand the tokens out.
    void after_verify(Req& r, const BatchState::Entry& e, const StepOutput& out, size_t i) {
        const std::span<const int32_t> draft = e.tokens.subspan(1);
        VerifyRows rows{.n_vocab = n_vocab_};
        if (e.pick == Pick::kArgmax)
            rows.argmax = out.words.data() + out.at[i];
        else
            rows.logits = out.logits.data() + out.row_at[i];
        picks_.clear();
        const int32_t kept = accept_draft(r.sampler, draft, r.q, rows, q_dense_, picks_);
        state_->keep(r.seq, 1 + kept);
        r.evaluated += size_t(1 + kept);
        ++r.result.decode_steps;
        r.result.decode_tokens += int32_t(picks_.size());
        r.result.drafted_tokens += int32_t(draft.size());
        r.result.accepted_tokens += kept;
        {
            std::lock_guard<std::mutex> lk(stats_mu_);
            stats_.drafted_tokens += int64_t(draft.size());
            stats_.accepted_tokens += kept;
            ++stats_.verify_passes;
        }
        for (const int32_t t : picks_)  // each already in the sampler's window
            if (!deliver(r, t, nullptr)) break;
    }

    // The request's embedding runs inside its tokens [begin, begin + n), relative to begin.
    std::span<const EmbdRun> chunk_runs(Req& r, int64_t begin, int64_t n) const {
        r.step_runs.clear();
        const int64_t n_embd = im_.info.n_embd;
        for (const EmbdRun& run : r.runs) {
            const int64_t b = std::max(run.begin, begin), e = std::min(run.begin + run.n, begin + n);
            if (b < e) r.step_runs.push_back({b - begin, e - b, run.rows + (b - run.begin) * n_embd});
        }
        return r.step_runs;
    }

    void preempt() {
        auto newest = std::max_element(running_.begin(), running_.end(),
                                       [](const auto& a, const auto& b) { return a->admitted < b->admitted; });
        std::shared_ptr<Req> r = *newest;
        running_.erase(newest);
        state_->remove_sequence(r->seq);
        if (drafter_) drafter_->remove(r->seq);
        r->seq = -1;
        r->evaluated = 0;
        waiting_.push_front(std::move(r));
        waiting_count_.store(int64_t(waiting_.size()));
        std::lock_guard<std::mutex> lk(stats_mu_);
        ++stats_.preemptions;
    }

    // What the step brings back for a sequence's next token: the whole row when log-probabilities are
    // asked for or a grammar masks the candidates (the mask needs every allowed token's logit), the
    // arg-max for a greedy sampler, the best logits for a top-k chain, else the whole row; each gives the
    // token the Sampler would draw from the row.
    static void choose_pick(Req& r, BatchState::Entry& e) {
        if (r.opts.logprobs >= 0 || r.matcher) {
            e.pick = Pick::kLogits;
        } else if (r.sampler.picks_argmax()) {
            e.pick = Pick::kArgmax;
        } else if (const int32_t m = r.sampler.top_needed(); m > 0) {
            e.pick = Pick::kTop, e.top = m, e.gather = r.sampler.window();
        } else {
            e.pick = Pick::kLogits;
        }
    }

    static int32_t sample(Req& r, const BatchState::Entry& e, const StepOutput& out, size_t i) {
        // The mask depends on this sequence's text alone, so the pick does not depend on the batch.
        if (out.row_at[i] != StepOutput::kNoRow)
            return r.sampler.sample(out.logits.data() + out.row_at[i], r.matcher ? r.matcher->mask() : nullptr);
        CERA_CHECK(!r.matcher, "batch: a grammar's entry came back without its logits");
        switch (e.pick) {
            case Pick::kArgmax: return out.words[out.at[i]];
            case Pick::kTop: {
                const int32_t* w = out.words.data() + out.at[i];
                const auto* logits = reinterpret_cast<const float*>(w + 1 + e.top);
                const auto* window = reinterpret_cast<const float*>(w + 1 + 2 * size_t(e.top));
                return r.sampler.sample_top(w + 1, logits, w[0], window);
            }
            default: break;
        }
        CERA_CHECK(false, "batch: entry %zu has no output", i);
        return -1;
    }

    // A sequence's last token was evaluated: sample the next one, stream it, finish or go on.
    void after_pick(Req& r, const BatchState::Entry& e, const StepOutput& out, size_t i) {
        const auto now = Clock::now();
        if (!r.started) {
            r.started = true;
            r.first_sample = now;
            r.result.prompt_tokens = int32_t(r.n_prompt) - r.result.cached_tokens;
            r.result.prefill_seconds = seconds(r.t_admit, now);
        } else {
            ++r.result.decode_steps;
            ++r.result.decode_tokens;
        }
        const int32_t t = sample(r, e, out, i);
        if (r.matcher && !r.matcher->accept_token(t)) return leave(r, FinishReason::kStop);  // nothing can continue
        SampledLogprobs lp;
        if (r.opts.logprobs >= 0) {  // choose_pick() asked for the whole row
            CERA_CHECK(out.row_at[i] != StepOutput::kNoRow, "batch: entry %zu has no logits row", i);
            lp.top.resize(size_t(std::min(r.opts.logprobs, n_vocab_)));
            lp.token = {t, r.sampler.log_probs(out.logits.data() + out.row_at[i], t, int32_t(lp.top.size()),
                                               lp.top.data())};
        }
        r.sampler.accept(t);
        deliver(r, t, r.opts.logprobs >= 0 ? &lp : nullptr);
    }

    // A sampled token (in the sampler's window already) reaches the request: streamed, then the request
    // finishes or goes on. Returns whether it goes on.
    bool deliver(Req& r, int32_t t, SampledLogprobs* lp) {
        ++r.result.generated_tokens;
        if (r.sink) r.sink->on_token(t);
        if (lp) {
            if (r.sink) r.sink->on_logprobs(*lp);
            r.result.logprobs.push_back(std::move(*lp));
        }
        auto end = [&](FinishReason why) {
            leave(r, why);
            return false;
        };
        if (!r.opts.ignore_eos && im_.tokenizer->is_eog(t)) return end(FinishReason::kEos);
        r.tokens.push_back(t);
        if (r.stopper.feed(r.detok.push(t), r.out)) {
            r.emit();
            r.result.stop_string = r.stopper.matched();
            return end(FinishReason::kStop);
        }
        r.emit();
        if (r.matcher && r.matcher->is_complete()) return end(FinishReason::kStop);  // only an end could follow
        if (r.opts.max_tokens >= 0 && r.result.generated_tokens >= r.opts.max_tokens) return end(FinishReason::kLength);
        if (int64_t(r.tokens.size()) >= n_ctx_) return end(FinishReason::kContextFull);
        return true;
    }

    // The request finishes (why, or the error e): its sequence leaves the batch.
    void leave(Req& r, FinishReason why, std::exception_ptr e = nullptr) {
        if (r.seq >= 0) state_->remove_sequence(r.seq);
        if (r.seq >= 0 && drafter_) drafter_->remove(r.seq);
        r.seq = -1;
        r.finish(why, e);
    }

    void publish_stats() {
        std::lock_guard<std::mutex> lk(stats_mu_);
        stats_.kv_blocks_total = state_->total_blocks();
        stats_.kv_block_tokens = state_->block_size();
        stats_.kv_bytes = state_->pool_bytes();
        stats_.kv_blocks_free = state_->free_blocks();
        stats_.running = int32_t(running_.size());
        stats_.waiting = int32_t(waiting_.size());
    }

    std::shared_ptr<Engine> engine_;
    Engine::Impl& im_;
    const BatcherOptions o_;
    const int32_t n_vocab_;
    int32_t n_ctx_ = 0;
    int32_t max_draft_ = 0;  // BatcherOptions::max_draft, resolved
    int64_t step_tokens_ = 0;
    std::unique_ptr<BatchState> state_;
    std::unique_ptr<BatchDrafter> drafter_;  // BatcherOptions::speculative.draft's batch
    std::vector<float> q_dense_;             // accept_draft()'s scratch: n_vocab zeros
    std::vector<int32_t> picks_;             // a verification's tokens
    // Shared with submit().
    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::deque<std::shared_ptr<Req>> inbox_;
    std::atomic<int64_t> waiting_count_{0};
    std::atomic<uint64_t> next_arrival_{0};
    // The thread's.
    std::deque<std::shared_ptr<Req>> waiting_;
    std::vector<std::shared_ptr<Req>> running_;
    uint64_t next_admission_ = 0;
    mutable std::mutex stats_mu_;
    BatcherStats stats_;
    std::thread thread_;
};

}  // namespace

std::shared_ptr<Batcher> Batcher::create(std::shared_ptr<Engine> engine, const BatcherOptions& options) {
    CERA_CHECK(engine != nullptr, "Batcher::create: no engine");
    return std::make_shared<BatcherImpl>(std::move(engine), options);
}

}  // namespace cera
