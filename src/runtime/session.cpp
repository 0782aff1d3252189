// Session: queue tokens, prefill them in chunks, then sample, detokenize and stream
// text through the stop-string matcher until a finish condition.
#include "cera/session.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <utility>

#include "chat/grammar/grammar_impl.h"
#include "core/check.h"
#include "runtime/decode_strategy.h"
#include "runtime/engine_impl.h"
#include "runtime/session_stop.h"
#include "runtime/speculative.h"
#include "runtime/state_io.h"

namespace cera {

const char* finish_reason_name(FinishReason reason) {
    switch (reason) {
        case FinishReason::kNone:
            return "none";
        case FinishReason::kEos:
            return "eos";
        case FinishReason::kStop:
            return "stop";
        case FinishReason::kLength:
            return "length";
        case FinishReason::kContextFull:
            return "context";
        case FinishReason::kCancelled:
            return "cancelled";
    }
    return "?";
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

struct Session::Impl {
    std::shared_ptr<Engine> engine;
    Engine::Impl* eng = nullptr;
    std::unique_ptr<ModelState> state;
    std::vector<int32_t> tokens;    // the whole sequence; [0, state->position()) is evaluated
    std::vector<float> logits;      // [n_vocab] after the last evaluated token
    bool has_logits = false;        // `logits` holds them
    bool logits_on_device = false;  // !has_logits, but a device decode step left them in the model state
                                    // (ModelState::read_last_logits); ensure_logits() fetches them
    std::atomic<bool> cancel{false};
    size_t pending_store = 0;  // a prompt end whose prefix-cache entry is saved after the first token
    bool shifted = false;      // a context shift happened: the state is not that of a fresh evaluation, so
                               // it never goes into the prefix cache
    uint64_t lora_key = 0;     // lora_set_key() of the adapters the state was evaluated under
    bool lora_default = true;  // they are the engine's defaults (the prefix cache holds states of those only)
    DraftSlot draft;           // speculative decoding's draft model sequence (SpeculativeOptions::draft)
    // The images of the sequence, in order: the image's tokens start at tokens[begin]. The prefix cache
    // keys on token ids alone, so a sequence with images neither reads nor writes it.
    struct ImageSpan {
        size_t begin = 0;
        std::shared_ptr<const EncodedImage> image;
    };
    std::vector<ImageSpan> images;
    std::vector<EmbdRun> embd_runs;  // prefill's scratch

    PrefixCache* prefix_cache() const { return lora_default && images.empty() ? eng->prefix_cache.get() : nullptr; }

    // The embedding runs of tokens [begin, begin + n), relative to begin.
    std::span<const EmbdRun> runs_in(size_t begin, size_t n) {
        embd_runs.clear();
        const int64_t n_embd = eng->info.n_embd, lo = int64_t(begin), hi = int64_t(begin + n);
        for (const ImageSpan& sp : images)
            for (const EmbdRun& r : image_runs(*sp.image, int64_t(sp.begin), n_embd)) {
                const int64_t b = std::max(r.begin, lo), e = std::min(r.begin + r.n, hi);
                if (b < e) embd_runs.push_back({b - lo, e - b, r.rows + (b - r.begin) * n_embd});
            }
        return embd_runs;
    }

    // Keeps the images whose tokens start before n.
    void drop_images_from(size_t n) {
        std::erase_if(images, [&](const ImageSpan& sp) { return sp.begin >= n; });
    }

    // Selects GenerateOptions::adapter's set; a different set than the state's evaluates again.
    void use_lora(const std::string& name) {
        LoraSet set = eng->resolve_lora(name);
        const uint64_t key = lora_set_key(set);
        lora_default = name.empty() || key == lora_set_key(eng->default_lora);
        if (key == lora_key) return;
        state->set_lora(set);
        state->reset();
        drop_logits();
        pending_store = 0;
        lora_key = key;
    }

    int32_t n_evaluated() const { return state->position(); }

    // The logits after the last evaluated token into `logits`, fetched from the model state when a greedy
    // decode step left them there. False when there are none (nothing evaluated since a reset or truncate).
    bool ensure_logits() {
        if (has_logits) return true;
        if (logits_on_device) {
            logits_on_device = false;
            has_logits = state->read_last_logits(logits.data());
        }
        return has_logits;
    }
    // After an eval() that wrote `logits`.
    void logits_on_host() {
        has_logits = true;
        logits_on_device = false;
    }
    // After a decode step that left them in the model state.
    void logits_left_on_device() {
        has_logits = false;
        logits_on_device = true;
    }
    // None held (the state was reset, truncated or replaced).
    void drop_logits() {
        has_logits = false;
        logits_on_device = false;
    }

    void check_fit(size_t n_new) const {
        const size_t total = tokens.size() + n_new;
        if (total > size_t(state->n_ctx()))
            throw_error(ErrorCode::kOutOfRange,
                        "the input (%zu tokens) does not fit in the context: %zu of %d tokens are in use", n_new,
                        tokens.size(), state->n_ctx());
    }

    // Evaluates the queued tokens in chunks of n_batch, checking cancel between chunks.
    // Returns false when cancelled (the evaluated prefix stays in the cache). With a prefix cache,
    // first restores the longest cached prefix, then ends chunks at multiples of n_batch and stores
    // the state at each of those boundaries and at the end.
    bool prefill(int32_t* cached = nullptr) {
        const int32_t n_batch = std::max<int32_t>(1, eng->options.n_batch);
        PrefixCache* pc = prefix_cache();
        if (pc && size_t(n_evaluated()) < tokens.size()) {
            const int32_t before = n_evaluated();
            if (auto hit = pc->lookup(tokens, size_t(before)); hit && !hit->snapshot.logits.empty()) {
                try {
                    state->restore_state(hit->snapshot.model_state);
                    logits = std::move(hit->snapshot.logits);
                    logits_on_host();
                    shifted = false;
                    if (cached) *cached = n_evaluated() - before;
                } catch (const Error&) {
                    // a state that does not fit this session's context: prefill instead
                }
            }
        }
        while (size_t(n_evaluated()) < tokens.size()) {
            if (cancel.exchange(false)) return false;
            const size_t begin = size_t(n_evaluated());
            size_t n = std::min(tokens.size() - begin, size_t(n_batch));
            if (pc) n = std::min(n, (begin / size_t(n_batch) + 1) * size_t(n_batch) - begin);
            state->eval({.tokens = {tokens.data() + begin, n}, .embd = runs_in(begin, n), .logits = logits.data()});
            logits_on_host();
            const size_t end = begin + n;
            if (!pc || shifted) continue;
            if (end == tokens.size())
                pending_store = end;  // saved once the first token is out (time to first token)
            else if (end % size_t(n_batch) == 0 && !pc->contains(std::span<const int32_t>(tokens.data(), end)))
                pc->store(snapshot(end));
        }
        return true;
    }

    // Saves the deferred prompt-end entry while the state still holds exactly that prompt.
    void flush_store() {
        const size_t n = std::exchange(pending_store, 0);
        PrefixCache* pc = prefix_cache();
        if (!pc || n == 0 || shifted || size_t(n_evaluated()) != n || !ensure_logits()) return;
        if (!pc->contains(std::span<const int32_t>(tokens.data(), n))) pc->store(snapshot(n));
    }

    // The first n tokens with the model state (n >= n_evaluated(); the rest stay queued). Callers
    // ensure_logits() first, so that logits a greedy step left on the device are saved too.
    SessionSnapshot snapshot(size_t n) const {
        SessionSnapshot s;
        s.tokens.assign(tokens.begin(), tokens.begin() + std::ptrdiff_t(n));
        s.n_evaluated = n_evaluated();
        if (has_logits) s.logits = logits;
        state->save_state(s.model_state);
        return s;
    }

    void restore(SessionSnapshot&& s) {
        if (s.tokens.size() > size_t(state->n_ctx()))
            throw_error(ErrorCode::kOutOfRange, "saved state: %zu tokens do not fit in the context of %d",
                        s.tokens.size(), state->n_ctx());
        if (!s.logits.empty() && s.logits.size() != logits.size())
            throw_error(ErrorCode::kInvalidFile, "saved state: %zu logits, the model has %zu", s.logits.size(),
                        logits.size());
        state->restore_state(s.model_state);                                  // checks everything before it writes
        if (const int32_t held = state->position(); held != s.n_evaluated) {  // consistent checksums, bad content
            state->reset();
            tokens.clear();
            drop_logits();
            throw_error(ErrorCode::kInvalidFile, "saved state: %d evaluated tokens, the model state holds %d",
                        s.n_evaluated, held);
        }
        tokens = std::move(s.tokens);
        images.clear();
        shifted = false;
        drop_logits();
        if (!s.logits.empty()) {
            logits = std::move(s.logits);
            logits_on_host();
        }
    }

    // See Session::shift_context.
    int32_t shift(int32_t n_keep) {
        const int32_t n_past = n_evaluated();
        if (n_keep < 0 || n_keep >= n_past) return 0;
        const int32_t n_discard = (n_past - n_keep) / 2;
        if (n_discard <= 0) return 0;
        state->shift(n_keep, n_discard);
        shifted = true;
        pending_store = 0;
        tokens.erase(tokens.begin() + n_keep, tokens.begin() + n_keep + n_discard);
        // Images cut by the shift are gone from the cache's view of the sequence; later ones move down.
        const size_t lo = size_t(n_keep), hi = size_t(n_keep + n_discard);
        std::erase_if(images,
                      [&](const ImageSpan& sp) { return sp.begin + sp.image->ids.size() > lo && sp.begin < hi; });
        for (ImageSpan& sp : images)
            if (sp.begin >= hi) sp.begin -= size_t(n_discard);
        return n_discard;
    }
};

Session::Session(std::shared_ptr<Engine> engine, int32_t n_ctx) : impl_(std::make_unique<Impl>()) {
    if (!engine) throw_error(ErrorCode::kInvalidArgument, "session: no engine");
    if (n_ctx < 0) throw_error(ErrorCode::kInvalidArgument, "session: context = %d must be >= 0", n_ctx);
    impl_->eng = &engine->impl();
    impl_->state = impl_->eng->model->create_state(n_ctx);
    impl_->state->set_lora(impl_->eng->default_lora);
    impl_->lora_key = lora_set_key(impl_->eng->default_lora);
    impl_->logits.assign(size_t(engine->info().n_vocab), 0.0f);
    impl_->engine = std::move(engine);
}

Session::~Session() = default;

void Session::append_text(std::string_view text, bool parse_special) {
    const bool empty = impl_->tokens.empty();
    append_tokens(impl_->eng->tokenizer->encode(text, empty, parse_special));
}

void Session::append_text(std::string_view text, bool add_bos, bool parse_special) {
    const Tokenizer& tok = *impl_->eng->tokenizer;
    std::vector<int32_t> ids;
    if (add_bos && impl_->tokens.empty() && tok.bos() >= 0) ids.push_back(tok.bos());
    const std::vector<int32_t> body = tok.encode(text, false, parse_special);
    ids.insert(ids.end(), body.begin(), body.end());
    append_tokens(ids);
}

void Session::append_image(std::span<const uint8_t> file_bytes) {
    Impl& im = *impl_;
    std::shared_ptr<const EncodedImage> img = im.eng->encode_image(file_bytes);
    const Tokenizer& tok = *im.eng->tokenizer;
    const bool bos = im.tokens.empty() && im.engine->add_bos() && tok.bos() >= 0;
    im.check_fit(img->ids.size() + (bos ? 1 : 0));
    if (bos) im.tokens.push_back(tok.bos());
    im.images.push_back({im.tokens.size(), img});
    im.tokens.insert(im.tokens.end(), img->ids.begin(), img->ids.end());
}

void Session::append_image_file(const std::string& path) { append_image(read_image_file(path)); }

void Session::append_tokens(std::span<const int32_t> tokens) {
    const int32_t n_vocab = impl_->engine->info().n_vocab;
    for (int32_t t : tokens)
        if (t < 0 || t >= n_vocab)
            throw_error(ErrorCode::kOutOfRange, "token id %d is outside the vocabulary [0, %d)", t, n_vocab);
    impl_->check_fit(tokens.size());
    impl_->tokens.insert(impl_->tokens.end(), tokens.begin(), tokens.end());
}

GenerationResult Session::generate(const GenerateOptions& options, Sink& sink) {
    Impl& im = *impl_;
    const Tokenizer& tok = *im.eng->tokenizer;
    const int32_t n_vocab = im.engine->info().n_vocab;
    Sampler sampler(options.sampling, n_vocab);  // validates the sampling options
    GenerationResult r;

    if (im.tokens.empty())
        throw_error(ErrorCode::kInvalidArgument, "nothing to generate from: append text or tokens first");
    im.use_lora(options.adapter);
    if (size_t(im.n_evaluated()) == im.tokens.size() && !im.ensure_logits())
        throw_error(ErrorCode::kInvalidArgument, "nothing to generate from: the session has no logits");

    // The penalty window starts with the end of the sequence, as llama.cpp's does.
    {
        const size_t window = size_t(std::max(0, options.sampling.penalty_last_n));
        const size_t from = im.tokens.size() > window ? im.tokens.size() - window : 0;
        for (size_t i = from; i < im.tokens.size(); ++i) sampler.accept(im.tokens[i]);
    }

    // Prefill.
    const auto t_prefill = Clock::now();
    const int32_t queued = int32_t(im.tokens.size()) - im.n_evaluated();
    const bool prefilled = im.prefill(&r.cached_tokens);
    r.prompt_tokens = queued - r.cached_tokens;
    r.prefill_seconds = seconds_since(t_prefill);
    if (!prefilled) {
        im.pending_store = 0;
        r.finish = FinishReason::kCancelled;
        sink.on_done(r);
        return r;
    }

    // Decode.
    StopMatcher stopper(options.stop);
    StreamingDetokenizer detok(tok, false, options.rendered_tokens);
    // Prime the detokenizer with the token before the generated ones, so that a space-prefix
    // vocabulary strips the leading space only at the very start of a text (not after a prompt).
    if (!im.tokens.empty()) (void)detok.push(im.tokens.back());
    std::string out;
    out.reserve(256);
    auto emit = [&](std::string& text) {
        if (text.empty()) return;
        sink.on_text(text);
        r.text += text;
        text.clear();
    };
    const std::unique_ptr<grammar::Matcher> matcher =
        options.grammar ? make_matcher(*options.grammar, im.eng->token_trie()) : nullptr;
    const auto t_decode = Clock::now();
    const int32_t n_ctx = im.state->n_ctx();
    const std::unique_ptr<DecodeStrategy> decoder = choose_decode_strategy(
        options, sampler, *im.state, im.logits, im.eng->model->backend().asynchronous(), matcher.get());
    // Speculative decoding: each step yields several tokens, handed out one per turn of the loop below (each
    // already in the sampler's window). The state runs ahead of the sequence while some are left.
    std::unique_ptr<Speculator> spec;
    if (options.speculative.enabled() && !matcher && options.logprobs < 0)
        spec = std::make_unique<Speculator>(options.speculative, *im.engine, *im.state, sampler, im.draft,
                                            std::max<int32_t>(1, im.eng->options.n_batch), options.decode_ahead);
    std::vector<int32_t> queued_picks;
    size_t next_pick = 0;
    // A speculative step, drafting at most what max_tokens and the context leave room for (the step adds
    // one token beyond its draft). False when there was no draft: a plain step runs instead.
    auto speculate = [&] {
        const int64_t left = options.max_tokens >= 0 ? int64_t(options.max_tokens) - r.generated_tokens : INT32_MAX;
        const int64_t room = int64_t(n_ctx) - int64_t(im.tokens.size());
        queued_picks.clear();
        next_pick = 0;
        if (!spec->step(im.tokens, int32_t(std::min(left, room) - 1), queued_picks)) return false;
        im.drop_logits();
        ++r.decode_steps;
        r.decode_tokens += int32_t(queued_picks.size());
        return true;
    };
    for (;;) {
        if (options.max_tokens >= 0 && r.generated_tokens >= options.max_tokens) {
            r.finish = FinishReason::kLength;
            break;
        }
        if (im.cancel.exchange(false)) {
            r.finish = FinishReason::kCancelled;
            break;
        }
        if (im.tokens.size() >= size_t(n_ctx)) {  // no room for another token
            if (options.n_keep >= 0 && size_t(im.n_evaluated()) + 1 == im.tokens.size() &&
                im.shift(options.n_keep) > 0) {
                ++r.context_shifts;
            } else {
                r.finish = FinishReason::kContextFull;
                break;
            }
        }
        int32_t t = -1;
        bool in_window = false;  // the speculative step put t in the sampler's window already
        if (next_pick < queued_picks.size()) {
            t = queued_picks[next_pick++];
            in_window = true;
        } else if (spec && size_t(im.n_evaluated()) < im.tokens.size() && speculate()) {
            t = queued_picks[next_pick++];
            in_window = true;
        } else if (size_t(im.n_evaluated()) < im.tokens.size()) {  // the last sampled token goes in first
            if (spec) spec->forget();
            const bool final_pick = options.max_tokens >= 0 && r.generated_tokens + 1 >= options.max_tokens;
            const DecodePick pick = decoder->step(im.tokens.back(), final_pick);
            t = pick.token;
            if (pick.logits == LogitsAt::kHost)
                im.logits_on_host();
            else
                im.logits_left_on_device();
            ++r.decode_steps;
            ++r.decode_tokens;
        } else {
            // has_logits: checked above, or set by prefill
            t = sampler.sample(im.logits.data(), matcher ? matcher->mask() : nullptr);
        }
        if (matcher && !matcher->accept_token(t)) {  // no token could continue the text
            r.finish = FinishReason::kStop;
            break;
        }
        SampledLogprobs lp;
        if (options.logprobs >= 0) {  // the strategy keeps the row on the host when logprobs are asked for
            lp.top.resize(size_t(std::min(options.logprobs, n_vocab)));
            lp.token = {t, sampler.log_probs(im.logits.data(), t, int32_t(lp.top.size()), lp.top.data())};
        }
        if (!in_window) sampler.accept(t);
        ++r.generated_tokens;
        sink.on_token(t);
        if (options.logprobs >= 0) {
            sink.on_logprobs(lp);
            r.logprobs.push_back(std::move(lp));
        }
        if (r.generated_tokens == 1) im.flush_store();  // the logits are still the prompt's
        if (!options.ignore_eos && tok.is_eog(t)) {
            r.finish = FinishReason::kEos;  // the end token stays out of the sequence
            break;
        }
        im.tokens.push_back(t);
        if (stopper.feed(detok.push(t), out)) {
            emit(out);
            r.finish = FinishReason::kStop;
            r.stop_string = stopper.matched();
            break;
        }
        emit(out);
        if (matcher && matcher->is_complete()) {  // only end-of-generation could follow
            r.finish = FinishReason::kStop;
            break;
        }
    }
    if (r.finish != FinishReason::kStop || r.stop_string.empty()) {  // a stop string drops what follows it
        if (stopper.end(detok.flush(), out)) {
            r.finish = FinishReason::kStop;
            r.stop_string = stopper.matched();
        }
        emit(out);
    }
    if (spec) {
        // A finish before the speculative step's last token: the state goes back to the sequence, and the
        // logits after its last token come from that step's verification.
        if (size_t(im.n_evaluated()) > im.tokens.size()) im.state->truncate(int32_t(im.tokens.size()));
        if (size_t(im.n_evaluated()) == im.tokens.size() && !im.has_logits && !im.logits_on_device) {
            if (spec->logits_after(im.n_evaluated(), im.logits.data()))
                im.logits_on_host();
            else if (im.state->rewind_floor() < im.n_evaluated()) {
                // A greedy step brought back ids only: the last token again, for its logits (one step a call).
                im.state->truncate(im.n_evaluated() - 1);
                im.state->eval({.tokens = {&im.tokens.back(), 1}, .logits = im.logits.data()});
                im.logits_on_host();
            }
        }
        r.drafted_tokens = spec->drafted();
        r.accepted_tokens = spec->accepted();
    }
    r.decode_seconds = seconds_since(t_decode);
    im.flush_store();  // when no token was sampled
    sink.on_done(r);
    im.cancel.store(false);  // a cancel() that came too late to stop this call must not stop the next
    return r;
}

void Session::cancel() { impl_->cancel.store(true); }

void Session::reset() {
    impl_->shifted = false;
    impl_->pending_store = 0;
    impl_->state->reset();
    impl_->tokens.clear();
    impl_->images.clear();
    impl_->drop_logits();
}

void Session::truncate(int32_t n) {
    Impl& im = *impl_;
    if (n < 0 || size_t(n) > im.tokens.size())
        throw_error(ErrorCode::kOutOfRange, "truncate to %d tokens: the session holds %zu", n, im.tokens.size());
    if (n < im.n_evaluated()) {
        if (n < im.state->rewind_floor()) {
            im.state->reset();  // the conv state cannot be rewound that far: the kept tokens are queued again
            im.shifted = false;
        } else {
            im.state->truncate(n);
        }
        im.drop_logits();
    }
    im.tokens.resize(size_t(n));
    im.drop_images_from(size_t(n));
}

int32_t Session::shift_context(int32_t n_keep) { return impl_->shift(n_keep); }

std::vector<uint8_t> Session::save_state() const {
    std::vector<uint8_t> out;
    impl_->ensure_logits();  // fetches logits a greedy decode step left on the device
    encode_state(impl_->eng->state_identity(), impl_->snapshot(impl_->tokens.size()), out);
    return out;
}

void Session::save_state_file(const std::string& path) const {
    const std::vector<uint8_t> bytes = save_state();
    write_file_atomic(path, bytes, /*durable=*/true);
}

void Session::load_state(std::span<const uint8_t> bytes) {
    impl_->restore(decode_state(bytes, impl_->eng->state_identity()));
}

void Session::load_state_file(const std::string& path) { load_state(read_file_bytes(path)); }

std::vector<float> Session::embed(std::span<const int32_t> tokens, Pooling pooling) {
    Impl& im = *impl_;
    const int64_t n = int64_t(tokens.size());
    if (n == 0) throw_error(ErrorCode::kInvalidArgument, "embed: no tokens");
    if (n > im.state->n_ctx())
        throw_error(ErrorCode::kOutOfRange, "embed: %" PRId64 " tokens exceed the context of %d tokens", n,
                    im.state->n_ctx());
    const int32_t n_vocab = im.engine->info().n_vocab;
    for (int32_t t : tokens)
        if (t < 0 || t >= n_vocab)
            throw_error(ErrorCode::kOutOfRange, "token id %d is outside the vocabulary [0, %d)", t, n_vocab);
    reset();
    im.tokens.assign(tokens.begin(), tokens.end());
    return embed_sequence(pooling);
}

std::vector<float> Session::embed_sequence(Pooling pooling) {
    Impl& im = *impl_;
    const int64_t n = int64_t(im.tokens.size()), n_embd = im.engine->info().n_embd;
    if (n == 0) throw_error(ErrorCode::kInvalidArgument, "embed: no tokens");
    im.state->reset();
    im.drop_logits();
    im.pending_store = 0;
    im.shifted = false;
    im.cancel.store(false);
    std::vector<float> hidden(static_cast<size_t>(n * n_embd));
    const int64_t n_batch = std::max<int32_t>(1, im.eng->options.n_batch);
    const std::span<const int32_t> tokens(im.tokens);
    for (int64_t off = 0; off < n; off += n_batch) {
        if (im.cancel.exchange(false)) {
            reset();
            throw_error(ErrorCode::kCancelled, "embed: cancelled");
        }
        const int64_t m = std::min(n_batch, n - off);
        // Hidden rows for every token; logits only for the very last (so that generate() can continue).
        const int64_t plain = off + m == n ? m - 1 : m;
        if (plain > 0)
            im.state->eval({.tokens = tokens.subspan(size_t(off), size_t(plain)),
                            .embd = im.runs_in(size_t(off), size_t(plain)),
                            .all_logits = true,
                            .hidden = hidden.data() + off * n_embd});
        if (plain < m)
            im.state->eval({.tokens = tokens.subspan(size_t(n - 1), 1),
                            .embd = im.runs_in(size_t(n - 1), 1),
                            .logits = im.logits.data(),
                            .hidden = hidden.data() + (n - 1) * n_embd});
    }
    im.logits_on_host();
    if (pooling == Pooling::kNone) return hidden;
    if (pooling == Pooling::kLast) return std::vector<float>(hidden.end() - n_embd, hidden.end());
    std::vector<double> sum(size_t(n_embd), 0.0);
    for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < n_embd; ++i) sum[size_t(i)] += hidden[size_t(t * n_embd + i)];
    std::vector<float> mean(static_cast<size_t>(n_embd));
    for (int64_t i = 0; i < n_embd; ++i) mean[size_t(i)] = float(sum[size_t(i)] / double(n));
    return mean;
}

std::span<const float> Session::logits() {
    Impl& im = *impl_;
    if (im.tokens.empty()) throw_error(ErrorCode::kInvalidArgument, "logits: the session is empty");
    if (size_t(im.n_evaluated()) < im.tokens.size()) {
        GenerateOptions g;
        g.max_tokens = 0;
        NullSink sink;
        if (generate(g, sink).finish == FinishReason::kCancelled)
            throw_error(ErrorCode::kCancelled, "logits: cancelled while evaluating the queued tokens");
    }
    if (!im.ensure_logits()) throw_error(ErrorCode::kInvalidArgument, "logits: the session has no logits");
    return im.logits;
}

int32_t Session::n_evaluated() const { return impl_->n_evaluated(); }
int32_t Session::position() const { return int32_t(impl_->tokens.size()); }
int32_t Session::n_ctx() const { return impl_->state->n_ctx(); }
const std::vector<int32_t>& Session::tokens() const { return impl_->tokens; }
const std::shared_ptr<Engine>& Session::engine() const { return impl_->engine; }

}  // namespace cera
