#include "runtime/batch_draft.h"

#include <algorithm>

#include "core/check.h"
#include "runtime/engine_impl.h"
#include "runtime/speculative.h"

namespace cera {

BatchDrafter::BatchDrafter(const Engine& target, std::shared_ptr<Engine> draft, BatchStateOptions o)
    : engine_(std::move(draft)) {
    check_same_vocabulary(target, *engine_);
    // A draft step carries one or two tokens a sequence (its pending token after a fully kept draft).
    o.max_step_tokens = std::max<int64_t>(o.max_step_tokens, 2 * int64_t(o.max_seqs));
    step_tokens_ = o.max_step_tokens;
    state_ = std::make_unique<BatchState>(*engine_->impl().model, o);
    slots_.resize(size_t(o.max_seqs));
}

BatchDrafter::~BatchDrafter() = default;

void BatchDrafter::add(int seq, std::span<const int32_t> tokens) {
    Slot& s = slots_.at(size_t(seq));
    CERA_CHECK(s.draft_seq < 0, "draft: sequence %d added twice", seq);
    s.draft_seq = state_->add_sequence();
    CERA_CHECK(s.draft_seq >= 0, "draft: no free sequence slot");
    const int64_t got = state_->attach_prefix(s.draft_seq, tokens);
    s.tokens.assign(tokens.begin(), tokens.begin() + got);
    s.run_from = -1;
}

void BatchDrafter::remove(int seq) {
    Slot& s = slots_.at(size_t(seq));
    if (s.draft_seq < 0) return;
    state_->remove_sequence(s.draft_seq);
    s.draft_seq = -1;
    s.tokens.clear();
    s.run_from = -1;
}

void BatchDrafter::sync(Slot& s, std::span<const int32_t> tokens, size_t n) {
    size_t common = 0;
    const size_t lim = std::min(s.tokens.size(), n);
    while (common < lim && s.tokens[common] == tokens[common]) ++common;
    if (s.run_from >= 0 && common > size_t(s.run_from)) {  // drafted tokens past `common` were rejected
        state_->keep(s.draft_seq, int32_t(common - size_t(s.run_from)));
        s.tokens.resize(common);
        s.run_from = -1;
        return;
    }
    if (s.run_from < 0 && common == s.tokens.size()) return;
    // It differs before its run: a fresh sequence from the cached prefix (the slot just freed is free).
    state_->remove_sequence(s.draft_seq);
    s.draft_seq = state_->add_sequence();
    CERA_CHECK(s.draft_seq >= 0, "draft: no free sequence slot");
    const int64_t got = state_->attach_prefix(s.draft_seq, tokens.first(n));
    s.tokens.assign(tokens.begin(), tokens.begin() + got);
    s.run_from = -1;
}

void BatchDrafter::draft(std::span<const Job> jobs) {
    struct Active {
        const Job* job;
        Slot* slot;
        int32_t cur = 0;  // the token it evaluates in a drafting step after the first
    };
    std::vector<Active> act;
    int64_t free = state_->free_blocks();
    for (const Job& j : jobs) {
        j.draft->clear();
        j.q->clear();
        Slot& s = slots_.at(size_t(j.seq));
        CERA_CHECK(s.draft_seq >= 0 && !j.tokens.empty() && j.k >= 1, "draft: sequence %d cannot draft", j.seq);
        sync(s, j.tokens, j.tokens.size() - 1);
        const int64_t need =
            state_->blocks_needed(s.draft_seq, int64_t(j.tokens.size() - s.tokens.size()) + int64_t(j.k));
        if (need > free) continue;  // no room in the draft's pool: no draft this time
        free -= need;
        act.push_back({&j, &s});
    }
    std::vector<BatchState::Entry> en;
    std::vector<Active*> owners;
    StepOutput out;
    // What a sequence lacks but its last two tokens, in chunks of the step's budget.
    for (;;) {
        en.clear(), owners.clear();
        int64_t budget = step_tokens_;
        for (Active& a : act) {
            const size_t have = a.slot->tokens.size(), T = a.job->tokens.size();
            const int64_t n = std::min<int64_t>(int64_t(T) - 2 - int64_t(have), budget);
            if (n <= 0) continue;
            budget -= n;
            en.push_back({.seq = a.slot->draft_seq, .tokens = a.job->tokens.subspan(have, size_t(n))});
            owners.push_back(&a);
        }
        if (en.empty()) break;
        state_->step(en, out);
        for (size_t i = 0; i < en.size(); ++i)
            owners[i]->slot->tokens.insert(owners[i]->slot->tokens.end(), en[i].tokens.begin(), en[i].tokens.end());
    }
    // Drafting: the first step evaluates the rest of the sequence (its pending token, and the one before
    // when that is missing), each later one the token drafted last; a verify run from the first.
    const int64_t n_vocab = engine_->info().n_vocab;
    for (int32_t i = 0;; ++i) {
        en.clear(), owners.clear();
        for (Active& a : act) {
            if (int32_t(a.job->draft->size()) >= a.job->k) continue;
            BatchState::Entry e;
            e.seq = a.slot->draft_seq;
            if (i == 0) {
                e.tokens = a.job->tokens.subspan(a.slot->tokens.size());
                a.slot->run_from = int32_t(a.slot->tokens.size());
            } else {
                a.cur = a.job->draft->back();
                e.tokens = std::span<const int32_t>(&a.cur, 1);
            }
            e.pick = a.job->sampler->picks_argmax() ? Pick::kArgmax : Pick::kLogits;
            e.verify = true;
            en.push_back(e);
            owners.push_back(&a);
        }
        if (en.empty()) break;
        state_->step(en, out);
        for (size_t i_e = 0; i_e < en.size(); ++i_e) {
            Active& a = *owners[i_e];
            a.slot->tokens.insert(a.slot->tokens.end(), en[i_e].tokens.begin(), en[i_e].tokens.end());
            const size_t last = en[i_e].tokens.size() - 1;  // the output after the entry's last token
            a.job->q->emplace_back();
            int32_t d;
            if (en[i_e].pick == Pick::kArgmax) {
                d = out.words[out.at[i_e] + last];
                a.job->q->back().assign(1, TokenProb{d, 0.0f, 1.0f});
            } else {
                d = draw_draft(*a.job->sampler, out.logits.data() + out.row_at[i_e] + last * size_t(n_vocab),
                               a.job->q->back());
            }
            a.job->draft->push_back(d);
        }
    }
}

}  // namespace cera
