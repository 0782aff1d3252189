// The LoRA tests' mixed batch (tests/golden/lora_test.cpp, lora_experts_test.cpp): sequences under
// different adapter sets, each run alone and all together in one BatchState, so that a test can hold the
// batch's logits to each sequence's own.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "models/batch_state.h"
#include "models/lora.h"
#include "models/model.h"

namespace cera::test {

// logits[sequence][step]: f32 [n_vocab] of the prompt's last token (step 0), then of each decode token.
struct MixedBatchLogits {
    std::vector<std::vector<std::vector<float>>> alone, batched;
};

// Sequence i takes sets[i] and the prompt p less its last i tokens (so that the adapters' segments start
// at different rows), then the decode tokens one a step.
inline MixedBatchLogits mixed_batch_logits(Model& model, const std::vector<LoraSet>& sets,
                                           const std::vector<int32_t>& p, const std::vector<int32_t>& decode) {
    const size_t n_vocab = size_t(model.info().n_vocab);
    std::vector<std::vector<int32_t>> prompts;
    for (size_t i = 0; i < sets.size(); ++i) prompts.emplace_back(p.begin(), p.end() - int64_t(i));
    MixedBatchLogits r;
    r.alone.resize(sets.size());
    for (size_t i = 0; i < sets.size(); ++i) {
        auto st = model.create_state();
        st->set_lora(sets[i]);
        r.alone[i].emplace_back(n_vocab);
        st->eval({.tokens = prompts[i], .logits = r.alone[i].back().data()});
        for (int32_t id : decode) {
            r.alone[i].emplace_back(n_vocab);
            st->eval({.tokens = {&id, 1}, .logits = r.alone[i].back().data()});
        }
    }
    BatchStateOptions bo;
    bo.max_seqs = 8;
    bo.kv_tokens = 1024;
    BatchState bs(model, bo);
    std::vector<int> seq;
    for (size_t i = 0; i < sets.size(); ++i) {
        seq.push_back(bs.add_sequence());
        bs.set_lora(seq.back(), sets[i]);
    }
    r.batched.resize(sets.size());
    for (size_t step = 0; step <= decode.size(); ++step) {
        std::vector<BatchState::Entry> entries;
        for (size_t i = 0; i < sets.size(); ++i) {
            BatchState::Entry e;
            e.seq = seq[i];
            e.tokens =
                step == 0 ? std::span<const int32_t>(prompts[i]) : std::span<const int32_t>(&decode[step - 1], 1);
            e.pick = Pick::kLogits;
            entries.push_back(e);
        }
        StepOutput out;
        bs.step(entries, out);
        for (size_t i = 0; i < sets.size(); ++i) {
            const float* row = out.logits.data() + out.row_at[i];
            r.batched[i].emplace_back(row, row + n_vocab);
        }
    }
    return r;
}

}  // namespace cera::test
