// Session: queue tokens, prefill them in chunks, then sample, detokenize and stream
// text through the stop-string matcher until a finish condition.
#include "cera/session.h"

#include <algorithm>
#include <atomic>
#include <chrono>

#include "core/check.h"
#include "runtime/engine_impl.h"
#include "runtime/session_stop.h"

namespace cera {

const char* finish_reason_name(FinishReason reason) {
    switch (reason) {
        case FinishReason::kNone: return "none";
        case FinishReason::kEos: return "eos";
        case FinishReason::kStop: return "stop";
        case FinishReason::kLength: return "length";
        case FinishReason::kContextFull: return "context";
        case FinishReason::kCancelled: return "cancelled";
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
    std::vector<int32_t> tokens;  // the whole sequence; [0, state->position()) is evaluated
    std::vector<float> logits;    // [n_vocab] after the last evaluated token
    bool has_logits = false;
    std::atomic<bool> cancel{false};

    int32_t n_evaluated() const { return state->position(); }

    void check_fit(size_t n_new) const {
        const size_t total = tokens.size() + n_new;
        if (total > size_t(state->n_ctx()))
            throw_error(ErrorCode::kOutOfRange,
                        "the input (%zu tokens) does not fit in the context: %zu of %d tokens are in use",
                        n_new, tokens.size(), state->n_ctx());
    }

    // Evaluates the queued tokens in chunks of n_batch, checking cancel between chunks.
    // Returns false when cancelled (the evaluated prefix stays in the cache).
    bool prefill() {
        const int32_t n_batch = std::max<int32_t>(1, eng->options.n_batch);
        while (size_t(n_evaluated()) < tokens.size()) {
            if (cancel.exchange(false)) return false;
            const size_t begin = size_t(n_evaluated());
            const size_t n = std::min(tokens.size() - begin, size_t(n_batch));
            state->eval(std::span<const int32_t>(tokens.data() + begin, n), logits.data(), false);
            has_logits = true;
        }
        return true;
    }
};

Session::Session(std::shared_ptr<Engine> engine, int32_t n_ctx) : impl_(std::make_unique<Impl>()) {
    if (!engine) throw_error(ErrorCode::kInvalidArgument, "session: no engine");
    if (n_ctx < 0) throw_error(ErrorCode::kInvalidArgument, "session: context = %d must be >= 0", n_ctx);
    impl_->eng = &engine->impl();
    impl_->state = impl_->eng->model->create_state(n_ctx);
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
    if (size_t(im.n_evaluated()) == im.tokens.size() && !im.has_logits)
        throw_error(ErrorCode::kInvalidArgument, "nothing to generate from: the session has no logits");

    // The penalty window starts with the end of the sequence, as llama.cpp's does.
    {
        const size_t window = size_t(std::max(0, options.sampling.penalty_last_n));
        const size_t from = im.tokens.size() > window ? im.tokens.size() - window : 0;
        for (size_t i = from; i < im.tokens.size(); ++i) sampler.accept(im.tokens[i]);
    }

    // Prefill.
    const auto t_prefill = Clock::now();
    r.prompt_tokens = int32_t(im.tokens.size()) - im.n_evaluated();
    const bool prefilled = im.prefill();
    r.prefill_seconds = seconds_since(t_prefill);
    if (!prefilled) {
        r.finish = FinishReason::kCancelled;
        sink.on_done(r);
        return r;
    }

    // Decode.
    StopMatcher stopper(options.stop);
    StreamingDetokenizer detok(tok);
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
    const auto t_decode = Clock::now();
    const int32_t n_ctx = im.state->n_ctx();
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
            r.finish = FinishReason::kContextFull;
            break;
        }
        if (size_t(im.n_evaluated()) < im.tokens.size()) {  // the last sampled token goes in first
            const int32_t last = im.tokens.back();
            im.state->eval(std::span<const int32_t>(&last, 1), im.logits.data(), false);
            ++r.decode_steps;
        }
        const int32_t t = sampler.sample(im.logits.data());
        sampler.accept(t);
        ++r.generated_tokens;
        sink.on_token(t);
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
    }
    if (r.finish != FinishReason::kStop) {
        stopper.feed(detok.flush(), out);
        if (stopper.stopped()) {
            r.finish = FinishReason::kStop;
            r.stop_string = stopper.matched();
        } else {
            stopper.finish(out);
        }
        emit(out);
    }
    r.decode_seconds = seconds_since(t_decode);
    sink.on_done(r);
    return r;
}

void Session::cancel() { impl_->cancel.store(true); }

void Session::reset() {
    impl_->state->reset();
    impl_->tokens.clear();
    impl_->has_logits = false;
}

int32_t Session::position() const { return int32_t(impl_->tokens.size()); }
int32_t Session::n_ctx() const { return impl_->state->n_ctx(); }
const std::vector<int32_t>& Session::tokens() const { return impl_->tokens; }
const std::shared_ptr<Engine>& Session::engine() const { return impl_->engine; }

}  // namespace cera
