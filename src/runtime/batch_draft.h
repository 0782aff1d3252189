// BatchDrafter: the draft model of the batched engine's speculative decoding. It keeps a BatchState of its
// own on the draft engine, a sequence for each target sequence that drafts with it, and drafts for all of
// them together: one step brings every sequence to its tokens (what it evaluated beyond them, drafted
// tokens the target rejected, goes back through BatchState::keep()), then each further step drafts one more
// token of every sequence. The draft steps are verify entries, so that a draft's rejected tail can be
// dropped, conv states included (an LFM2 draft model).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cera/engine.h"
#include "cera/sampler.h"
#include "models/batch_state.h"

namespace cera {

class BatchDrafter {
 public:
    // draft: the draft engine (kInvalidArgument when its vocabulary is not the target's); options: the
    // target's BatchState's (slots, pool, blocks, longest sequence, max_draft).
    BatchDrafter(const Engine& target, std::shared_ptr<Engine> draft, BatchStateOptions options);
    ~BatchDrafter();

    // The target's sequence seq (a slot of its BatchState) drafts from now on; its tokens start with
    // `tokens` (the cached prefix of the draft's pool is taken).
    void add(int seq, std::span<const int32_t> tokens);
    // It leaves (nothing when it was not added).
    void remove(int seq);

    struct Job {
        int seq = -1;
        std::span<const int32_t> tokens;                   // the sequence; its last token is the target's pending one
        int32_t k = 0;                                     // tokens to draft
        Sampler* sampler = nullptr;                        // the draft sampler (draft_sampler_params())
        std::vector<int32_t>* draft = nullptr;             // receives the draft (empty: no room in the draft's pool)
        std::vector<std::vector<TokenProb>>* q = nullptr;  // and the proposal of each token
    };
    // Drafts k tokens for every job, in max k + 1 steps of the draft model over all of them.
    void draft(std::span<const Job> jobs);

 private:
    struct Slot {
        int draft_seq = -1;           // its sequence in state_, or -1
        std::vector<int32_t> tokens;  // the tokens that sequence holds
        int32_t run_from = -1;        // where its open run of verify entries starts (-1: none)
    };
    // Brings slot s to tokens[0, n) where they agree with what it holds: drops the rest (ends the run).
    void sync(Slot& s, std::span<const int32_t> tokens, size_t n);

    std::shared_ptr<Engine> engine_;
    std::unique_ptr<BatchState> state_;
    std::vector<Slot> slots_;  // by target sequence
    int64_t step_tokens_ = 0;
};

}  // namespace cera
