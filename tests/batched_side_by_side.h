// The batched engine's steps on two models side by side (tensor_parallel_test,
// cuda_tensor_parallel_test): a split model against the whole one.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "models/batch_state.h"

namespace cera::test {

struct SideBySide {
    std::vector<int> seqs;                     // the same ids in both states
    std::vector<std::vector<int32_t>> tokens;  // each sequence's prompt, then the whole model's picks
    double max_dlogit = 0, max_logit = 0;      // over every row of logits, and of the whole model's
};

// Three sequences in `whole` and `split` (sequence i's prompt: ids from 7 i on, 40 + 20 i tokens, fed 24
// a step; then decoding), ten steps of prompt chunks beside decoding. Each pick of the whole model is the
// next token of both. Both states end at the same positions.
inline void batched_side_by_side(BatchState& whole, BatchState& split, const std::vector<int32_t>& ids,
                                 int64_t n_vocab, SideBySide& out) {
    std::vector<int> sb;
    for (int i = 0; i < 3; ++i) out.seqs.push_back(whole.add_sequence()), sb.push_back(split.add_sequence());
    ASSERT_EQ(out.seqs, sb);
    const std::vector<int>& seqs = out.seqs;
    std::vector<std::vector<int32_t>>& toks = out.tokens;
    toks.assign(3, {});
    for (int i = 0; i < 3; ++i) toks[size_t(i)].assign(ids.begin() + 7 * i, ids.begin() + 7 * i + 40 + 20 * i);
    std::vector<size_t> fed(3, 0);
    for (int step = 0; step < 10; ++step) {
        std::vector<BatchState::Entry> es;
        for (int i = 0; i < 3; ++i) {
            const std::vector<int32_t>& t = toks[size_t(i)];
            const size_t n = std::min<size_t>(24, t.size() - fed[size_t(i)]);
            if (n == 0) continue;
            es.push_back({seqs[size_t(i)], std::span(t).subspan(fed[size_t(i)], n),
                          fed[size_t(i)] + n == t.size() ? Pick::kLogits : Pick::kNone});
            fed[size_t(i)] += n;
        }
        StepOutput oa, ob;
        whole.step(es, oa), split.step(es, ob);
        ASSERT_EQ(oa.row_at, ob.row_at);
        for (size_t e = 0; e < es.size(); ++e) {
            if (es[e].pick != Pick::kLogits) continue;
            const float* la = oa.logits.data() + oa.row_at[e];
            const float* lb = ob.logits.data() + ob.row_at[e];
            for (int64_t j = 0; j < n_vocab; ++j) {
                out.max_dlogit = std::max(out.max_dlogit, double(std::fabs(la[j] - lb[j])));
                out.max_logit = std::max(out.max_logit, double(std::fabs(la[j])));
            }
            const int i = int(std::find(seqs.begin(), seqs.end(), es[e].seq) - seqs.begin());
            toks[size_t(i)].push_back(int32_t(std::max_element(la, la + n_vocab) - la));
        }
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(whole.position(seqs[size_t(i)]), split.position(sb[size_t(i)]));
}

}  // namespace cera::test
