// cera::Session: one sequence (its KV cache and recurrent state) on a shared Engine.
//
//   cera::Session s(engine);
//   s.append_text("Once upon a time");        // queued; evaluated by the next generate()
//   cera::GenerateOptions g;  g.max_tokens = 64;  g.stop = {"\n\n"};
//   MySink sink;                             // receives text as it decodes
//   cera::GenerationResult r = s.generate(g, sink);
//
// Text reaches the Sink only when it is final: whole UTF-8 characters, and never any
// part of a stop string (text that might be the start of one is held back until it
// is not). Thread-safety: one thread drives a Session; cancel() may be called from any
// thread. Sessions on one Engine may run concurrently on different threads.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cera/engine.h"
#include "cera/grammar.h"
#include "cera/sampler.h"

namespace cera {

enum class FinishReason {
    kNone,         // not finished
    kEos,          // the model produced an end-of-generation token
    kStop,         // a stop string appeared
    kLength,       // max_tokens reached (also max_tokens = 0: prefill only)
    kContextFull,  // the context has no room for another token
    kCancelled,    // cancel() was called
};
// "none", "eos", "stop", "length", "context", "cancelled".
const char* finish_reason_name(FinishReason reason);

// Speculative decoding: a decode step drafts a continuation of the sequence cheaply, evaluates the pending
// token and every drafted one in one forward pass of the model, and keeps the drafted tokens the model
// agrees with (speculative sampling: a drafted token d is kept with probability min(1, p(d) / q(d)), and
// the first one that is not is replaced by a draw from the residual max(0, p - q), normalised), plus one
// token the model samples itself. The tokens follow the model's own distribution exactly: greedy output is
// the one plain greedy decoding gives. The KV cache and the conv states of LFM2's short-conv layers go back
// to the last kept token. Off under a grammar and with logprobs (those decode one token at a time).
struct SpeculativeOptions {
    // Prompt lookup: the draft is what followed the latest earlier occurrence in the sequence of its last n
    // tokens, n from lookup_ngram down to 1. 0: off.
    int32_t lookup_ngram = 0;
    // A draft model (same vocabulary as this engine's, checked: kInvalidArgument otherwise): it samples
    // the draft one token at a time with the same sampling settings. Used when prompt lookup finds nothing.
    std::shared_ptr<Engine> draft;
    int32_t draft_max = 16;  // tokens drafted a step at most, 1..63 (and below EngineOptions::n_batch)
    int32_t draft_min = 0;   // a shorter draft is not verified: the step decodes one token plainly
    bool enabled() const { return lookup_ngram != 0 || draft != nullptr; }  // (a negative n-gram is an error)
};

struct GenerateOptions {
    int32_t max_tokens = -1;        // tokens to sample at most; < 0: until EOS, a stop string or a full context
    SamplerParams sampling;         // see sampler.h; temperature 0 is greedy
    std::vector<std::string> stop;  // stop strings (empty strings are ignored)
    bool ignore_eos = false;        // keep going past end-of-generation tokens (they are then ordinary text)
    // Context shift: >= 0 keeps generating when the context fills by dropping half of the tokens after
    // the first n_keep (BOS included in the count; their keys' RoPE is re-rotated); < 0 finishes with
    // kContextFull instead.
    int32_t n_keep = -1;
    // When the sampling is a plain arg-max (greedy, no penalties: Sampler::picks_argmax()), decode steps
    // take the arg-max on the device and copy back only the token id, not the n_vocab logits; the token
    // is the one the host sampler would pick. false: always copy the logits and sample on the host.
    bool device_greedy = true;
    // Greedy decoding on the device queues each step before the host has seen the previous pick
    // (EvalRequest::ahead in the model layer), so that the device does not wait for the host between
    // steps; the tokens and the final state are the same. A greedy draft model without recurrent state
    // (SpeculativeOptions::draft) drafts the same way. -1: when the device runs behind the host (CUDA);
    // 0: never; 1: always.
    int decode_ahead = -1;
    // When the sampler's chain starts with a top-k that leaves only the best k + window logits in the
    // running (Sampler::top_needed() > 0), decode steps select those on the device and copy back only
    // them (Backend::top_logits), not the n_vocab logits; the token is the one the host sampler would
    // draw, with the same random stream. false: always copy the logits and sample on the host.
    bool device_sampling = true;
    // >= 0: report each sampled token's log-probability and the `logprobs` most likely tokens at its
    // position (Sink::on_logprobs, GenerationResult::logprobs), as Sampler::log_probs() defines them:
    // the log-softmax over the whole vocabulary after the logit bias and the penalties, before the
    // truncations and temperature. Costs a pass over the logits a token, which then come to the host.
    // < 0: none.
    int32_t logprobs = -1;
    // Structured output: every sampled token keeps the text in the grammar's language (the sampler draws
    // from the allowed tokens only, with every setting above applying to them), and end-of-generation
    // is allowed only where the text is a whole match. Generation ends (FinishReason::kStop, no stop
    // string) as soon as the text is a whole match that nothing may extend, or if no token of the
    // vocabulary can continue it. The text is matched from the first generated token. Steps then
    // bring the logits to the host (device_greedy and device_sampling do not apply).
    std::shared_ptr<const Grammar> grammar;
    // Speculative decoding (see SpeculativeOptions); off by default.
    SpeculativeOptions speculative;
    // LoRA adapter: "" = the engine's default adapters (EngineOptions::lora), "base" = none, otherwise the
    // name of an adapter loaded with Engine::load_adapter (kMissing when there is none by that name). A
    // session whose adapter changes evaluates its tokens again under the new one.
    std::string adapter;
    // Control tokens whose text the output keeps (others render as nothing): the markers of a tool-call
    // format that the vocabulary holds as single control tokens (LFM2's <|tool_call_start|>), so that the
    // reply can be parsed. A grammar matches control tokens by their text either way.
    std::vector<int32_t> rendered_tokens;
};

// A sampled token's log-probability and the most likely tokens at its position (GenerateOptions::logprobs).
struct SampledLogprobs {
    TokenLogprob token;             // the sampled id
    std::vector<TokenLogprob> top;  // GenerateOptions::logprobs entries, most likely first
};

struct GenerationResult {
    FinishReason finish = FinishReason::kNone;
    std::string stop_string;                // the stop string that ended generation (kStop)
    int32_t prompt_tokens = 0;              // tokens evaluated before the first sample (prefill)
    int32_t generated_tokens = 0;           // tokens sampled, including a final EOS
    int32_t decode_steps = 0;               // forward passes run while generating (speculative verifications included)
    int32_t decode_tokens = 0;              // tokens those passes produced (decode_steps without speculation)
    int32_t drafted_tokens = 0;             // speculative decoding: tokens drafted and verified
    int32_t accepted_tokens = 0;            // speculative decoding: drafted tokens the model kept
    double prefill_seconds = 0.0;           // time of the prefill forward passes
    double decode_seconds = 0.0;            // time of the decode steps, sampling included
    int32_t cached_tokens = 0;              // prompt tokens restored from the prefix cache (not in prompt_tokens)
    int32_t context_shifts = 0;             // context shifts made to keep generating (GenerateOptions::n_keep)
    std::string text;                       // all text given to the Sink, concatenated
    std::vector<SampledLogprobs> logprobs;  // one per sampled token when GenerateOptions::logprobs >= 0

    double prefill_tokens_per_second() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0; }
    double decode_tokens_per_second() const { return decode_seconds > 0 ? decode_tokens / decode_seconds : 0.0; }
    // Speculative decoding: the fraction of drafted tokens kept, and tokens a forward pass produced.
    double acceptance_rate() const { return drafted_tokens > 0 ? double(accepted_tokens) / drafted_tokens : 0.0; }
    double tokens_per_pass() const { return decode_steps > 0 ? double(decode_tokens) / decode_steps : 0.0; }
};

// Receives a generation as it happens, on the thread that called generate().
class Sink {
 public:
    virtual ~Sink() = default;
    // Final text, in order (whole UTF-8 characters; never part of a stop string).
    virtual void on_text(std::string_view text) = 0;
    // Each sampled token id, before its text reaches on_text. Default: ignored.
    virtual void on_token(int32_t token) {}
    // Right after on_token, when GenerateOptions::logprobs >= 0: that token's log-probabilities.
    virtual void on_logprobs(const SampledLogprobs& logprobs) {}
    // Once, when generate() ends normally, with the result it returns. Default: ignored.
    virtual void on_done(const GenerationResult& result) {}
};

// A Sink that ignores everything (the result still carries the text).
class NullSink : public Sink {
 public:
    void on_text(std::string_view) override {}
};

class Session {
 public:
    // A new, empty sequence on `engine` (which it keeps alive). n_ctx = 0: the engine's context.
    // Allocates the KV cache; throws cera::Error on failure.
    explicit Session(std::shared_ptr<Engine> engine, int32_t n_ctx = 0);
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    // Tokenizes text and queues it. BOS is prepended when the session is empty and the model
    // wants it (Engine::add_bos()). Throws kOutOfRange when it does not fit in the context
    // (the session is then unchanged).
    void append_text(std::string_view text, bool parse_special = true);
    // As above with an explicit choice: add_bos prepends the model's BOS token (if it has one) even
    // when the model does not ask for it, or leaves it out. Only honoured when the session is empty.
    void append_text(std::string_view text, bool add_bos, bool parse_special);
    // Queues token ids. Throws kOutOfRange for an id outside the vocabulary or when they do not fit.
    void append_tokens(std::span<const int32_t> tokens);
    // Queues an image, given as the bytes of its file (PNG, JPEG, WebP, GIF's first frame or BMP): the
    // engine's vision projector (EngineOptions::mmproj) encodes it, and the tokens the chat template
    // expects for it (<|image_start|>, tile markers, one image token per embedding row, <|image_end|>)
    // join the sequence, the image's embeddings standing in for its image tokens. A repeated image (same
    // pixels) is not encoded again. BOS is prepended as append_text does. Throws kInvalidArgument for a
    // bad image (not an image, truncated, too large) or an engine without a projector, kOutOfRange when
    // it does not fit; the session is then unchanged.
    void append_image(std::span<const uint8_t> file_bytes);
    void append_image_file(const std::string& path);  // as append_image; kIo when unreadable

    // Evaluates what is queued, then samples until EOS, a stop string, max_tokens, a full context
    // or cancel(). Text streams to sink. Throws kInvalidArgument when there is nothing to continue
    // from (an empty session), and cera::Error for bad options; a cancel is a normal return.
    GenerationResult generate(const GenerateOptions& options, Sink& sink);

    // Stops the generate() in progress at the next token (or prefill chunk) boundary, or the next
    // generate() to start if none is running. Any thread. A cancel() that comes while a generate()
    // runs but too late to stop it (after its last token, or from its Sink's on_done) is dropped when
    // that generate() returns.
    void cancel();
    // Empties the sequence (position 0), keeping its memory.
    void reset();
    // Keeps the first n tokens (0 <= n <= position()). When evaluated tokens are dropped from a model
    // with recurrent state (LFM2 conv layers), the kept ones are re-evaluated (or restored from the prefix
    // cache) by the next generate(). Throws kOutOfRange for a bad n.
    void truncate(int32_t n);
    // Context shift now: drops half of the evaluated tokens after the first n_keep (see
    // GenerateOptions::n_keep). Returns the tokens dropped; 0 when nothing can be (n_keep too large).
    int32_t shift_context(int32_t n_keep);

    // The whole state (tokens, KV cache, conv states, the last logits) as bytes with a header (magic,
    // version, model fingerprint, KV type) and checksums. The sampler keeps no state between generate()
    // calls, so there is no RNG position to save.
    std::vector<uint8_t> save_state() const;
    // Writes save_state() to a file atomically (temp file, fsync, rename). Throws kIo.
    void save_state_file(const std::string& path) const;
    // Replaces this session's state with saved bytes. Throws kInvalidFile (the session is then unchanged)
    // for a file of another model or KV type, a bad header, a torn or corrupt payload, and kOutOfRange when
    // the saved tokens exceed this session's context.
    void load_state(std::span<const uint8_t> bytes);
    void load_state_file(const std::string& path);  // as load_state; kIo when unreadable

    // Embeddings: resets the session, evaluates `tokens` (in n_batch chunks, cancellable: throws kCancelled
    // and leaves the session empty) and returns the last layer's hidden states after the final norm,
    // pooled. The session then holds the tokens (generate() may continue). Throws kInvalidArgument for no
    // tokens, kOutOfRange for a bad id or too many tokens.
    std::vector<float> embed(std::span<const int32_t> tokens, Pooling pooling = Pooling::kMean);
    // embed() of the session's whole sequence as queued (text and images: rows for every position of an
    // image's expanded tokens), evaluated again from the start. Throws kInvalidArgument when it is empty.
    std::vector<float> embed_sequence(Pooling pooling = Pooling::kMean);

    // The next-token logits after the last evaluated token: [n_vocab] floats, valid until the session
    // changes. Evaluates queued tokens first (as generate() with max_tokens = 0 does). Throws
    // kInvalidArgument for an empty session.
    std::span<const float> logits();

    int32_t n_evaluated() const;  // tokens already in the KV cache (the rest are queued)

    int32_t position() const;  // tokens in the sequence, queued ones included
    int32_t n_ctx() const;     // the most tokens the sequence can hold
    // Every token of the sequence, queued ones included, in order.
    const std::vector<int32_t>& tokens() const;
    const std::shared_ptr<Engine>& engine() const;

 private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace cera
