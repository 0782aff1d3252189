// cera::Batcher: many sequences generated together on one Engine (continuous batching).
//
//   auto batcher = cera::Batcher::create(engine, {.parallel = 8});
//   auto req = batcher->submit(engine->tokenize("Once upon a time", true), options, sink);  // any thread
//   cera::GenerationResult r = req->wait();
//
// Each step evaluates the next token of every running sequence and chunks of the prompts being
// prefilled, up to a token budget, in one forward pass; requests join and leave between steps. Each
// request keeps its own sampler (seed), stop strings and stream. Sequences keep their K/V in one pool
// of fixed-size blocks; full blocks stay cached after their request ends, and a request whose prompt
// starts with cached blocks (a shared system prompt) takes them instead of evaluating those tokens
// (GenerationResult::cached_tokens). When the pool runs out, the newest running sequence is preempted
// (its blocks freed) and later resumed by evaluating its tokens again, with the same output. The Sink
// of a request is called from the batcher's thread.
//
// Speculative decoding (GenerateOptions::speculative, or BatcherOptions::speculative for requests that set
// none): a decoding sequence drafts a continuation (prompt lookup in its own tokens, or the draft model)
// and the step evaluates its pending token and the draft together, with outputs at every position;
// speculative sampling keeps what the model agrees with, exactly as Session does (greedy output is plain
// greedy output), and the sequence's KV blocks, conv states and prefix-cache entries go back to its last
// kept token. Every sequence still advances in the same single forward pass a step. Off for requests
// with a grammar or logprobs (they decode one token a step).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cera/engine.h"
#include "cera/session.h"

namespace cera {

struct BatcherOptions {
    int32_t parallel = 8;       // sequences in flight at once
    int64_t kv_tokens = 0;      // KV pool size in tokens; 0: `parallel` full contexts
    int32_t n_ctx = 0;          // longest sequence (prompt and generated); 0: the engine's context
    int32_t block_size = 16;    // tokens a KV block (a power of two)
    int32_t step_tokens = 512;  // tokens a step evaluates, all sequences together (prefill chunks are cut to it)
    int32_t max_queue = 1024;   // requests waiting for a slot; submit() refuses more
    // Speculative decoding for requests whose GenerateOptions::speculative is not enabled. Its draft model
    // (if any) is the only one requests may name; it runs a batch of its own beside the model's.
    SpeculativeOptions speculative;
    // Drafted tokens a sequence verifies in a step at most (a request's draft_max is capped to it): sizes
    // the step's output rows (n_vocab floats each) and, on LFM2, conv-state rows. 0: no speculation (requests
    // asking for it decode plainly); -1: speculative.draft_max when speculative is enabled, else 0.
    int32_t max_draft = -1;
};

struct BatcherStats {
    int64_t steps = 0;
    int64_t tokens_evaluated = 0;  // prompt and generated tokens through the model
    int64_t preemptions = 0;
    int64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding: tokens drafted, and kept
    int64_t verify_passes = 0;                        // sequences' verifications of a draft
    int64_t kv_blocks_total = 0, kv_blocks_free = 0;
    int32_t kv_block_tokens = 0;   // tokens a block
    uint64_t kv_bytes = 0;         // the pool: K/V of every block (and short-conv states at block ends)
    int32_t running = 0, waiting = 0;
};

class Request {
   public:
    virtual ~Request() = default;
    // Finishes the request (FinishReason::kCancelled) before its next step; its blocks go back at once.
    virtual void cancel() = 0;
    virtual bool done() const = 0;
    // Blocks until the request finishes; its result (the Sink's on_done got the same). Throws the
    // cera::Error that failed it, if one did.
    virtual GenerationResult wait() = 0;
};

class Batcher {
   public:
    // Starts the batcher's thread and makes its KV pool on the engine's device (reported by stats()).
    // Throws cera::Error (kInvalidArgument for bad options, kUnsupported where the device cannot run
    // batches yet).
    static std::shared_ptr<Batcher> create(std::shared_ptr<Engine> engine, const BatcherOptions& options = {});
    // Stops the thread; requests still running finish as cancelled.
    virtual ~Batcher() = default;

    // Queues a request: `prompt` is evaluated, then tokens are sampled as GenerateOptions say
    // (max_tokens, sampling, stop, ignore_eos, logprobs, grammar with one matcher per request; the device
    // and context-shift settings do not apply).
    // sink may be null. `images` (in prompt order; Engine::expand_images makes them) put images into the
    // prompt; cached prefix blocks are shared only where the images match too. Throws kInvalidArgument
    // for an empty prompt, a bad token id or an image whose tokens are not where it says, kOutOfRange
    // when the prompt cannot fit a sequence, kOverCapacity when the queue is full.
    virtual std::shared_ptr<Request> submit(std::span<const int32_t> prompt, const GenerateOptions& options,
                                            std::shared_ptr<Sink> sink = nullptr,
                                            std::span<const PromptImage> images = {}) = 0;
    virtual BatcherStats stats() const = 0;
    virtual int32_t n_ctx() const = 0;  // the longest sequence, prompt and generated tokens together
};

}  // namespace cera
