// Several sequences in one pass (models/batch_state.h) on every fixture model, on the CPU: each
// sequence's logits equal, bit for bit, those of the sequence run alone (a single-sequence state:
// its prompt in one pass, then one token a step), while sequences of different lengths join and
// leave mid-batch and their blocks are spread over the pool. The pool gets every block back.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "models/batch_state.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

const std::vector<int32_t> kGather = {3, 0, 11};  // kTop entries' gathered ids

const char* const kModels[] = {"tiny-lfm2",         "tiny-lfm2moe",      "tiny-qwen3",
                               "tiny-llama-random", "tiny-qwen2-random", "tiny-granite-random"};

// rotated: the rotated caches' rows of that type (EngineOptions' kTq4: Q4_0, kTq3: Q3_KV).
std::unique_ptr<Model> load(const std::string& name, GgmlType rotated = GgmlType::kF32) {
    ModelOptions o;
    o.n_threads = 2;
    o.n_ctx = 128;
    if (rotated != GgmlType::kF32) {
        o.kv_type_k = o.kv_type_v = rotated;
        o.kv_rotate_k = o.kv_rotate_v = true;
    }
    return load_model(test::data_path(std::string("fixtures/") + name) + "/model.gguf", o);
}

struct Plan {
    int join = 0;                 // the step the sequence joins at (its prompt goes in that step)
    std::vector<int32_t> prompt;  // then one token a step:
    std::vector<int32_t> decode;
};

// Each sequence alone: the logits after its prompt and after each decode token.
std::vector<std::vector<float>> alone(const Model& m, const Plan& p) {
    const int64_t n_vocab = m.info().n_vocab;
    auto st = m.create_state();
    std::vector<std::vector<float>> out;
    out.emplace_back(size_t(n_vocab));
    st->eval({.tokens = p.prompt, .logits = out.back().data()});
    for (int32_t id : p.decode) {
        out.emplace_back(size_t(n_vocab));
        st->eval({.tokens = {&id, 1}, .logits = out.back().data()});
    }
    return out;
}

class BatchFixture : public ::testing::TestWithParam<const char*> {};

// scale: prompts `scale` times as long (and the pool and the step to match).
void sequences_in_one_pass_match_each_alone(std::unique_ptr<Model> model, int scale = 1) {
    const int64_t n_vocab = model->info().n_vocab;
    std::mt19937 rng(3);
    auto ids = [&](int n) {
        std::vector<int32_t> v;
        for (int i = 0; i < n; ++i) v.push_back(int32_t(rng() % uint32_t(n_vocab)));
        return v;
    };
    // Prompts of 1 to 40 tokens (blocks of 8: some end mid-block, one fills several), joining at steps
    // 0, 0, 2, 3 and 5; decodes of 1 to 9 steps, so sequences leave while others run.
    const std::vector<Plan> plans = {{0, ids(13 * scale), ids(9)},
                                     {0, ids(1 * scale), ids(3)},
                                     {2, ids(40 * scale), ids(6)},
                                     {3, ids(8 * scale), ids(1)},
                                     {5, ids(5 * scale), ids(4)}};
    std::vector<std::vector<std::vector<float>>> want;
    for (const Plan& p : plans) want.push_back(alone(*model, p));

    BatchStateOptions bo;
    bo.max_seqs = 4;  // the fifth sequence waits for a free slot
    bo.block_size = 8;
    bo.kv_tokens = 256 * scale;
    bo.max_step_tokens = 64 * scale;
    BatchState batch(*model, bo);
    const int64_t all_blocks = batch.free_blocks();
    std::map<int, int> slot_of;  // plan -> slot
    std::vector<size_t> done(plans.size(), 0);  // logits rows checked per plan
    StepOutput out;
    for (int step = 0; step < 64; ++step) {
        std::vector<BatchState::Entry> entries;
        std::vector<int> plan_of;
        for (size_t i = 0; i < plans.size(); ++i) {
            const Plan& p = plans[i];
            if (done[i] == p.decode.size() + 1) continue;  // finished
            if (!slot_of.count(int(i))) {
                if (step < p.join) continue;
                const int slot = batch.add_sequence();
                if (slot < 0) continue;  // no free slot yet
                slot_of[int(i)] = slot;
                entries.push_back({slot, p.prompt, Pick::kLogits});
            } else {
                entries.push_back({slot_of[int(i)], {&p.decode[done[i] - 1], 1}, Pick::kLogits});
            }
            // Some outputs as the arg-max or the best logits (the selections a sampler takes).
            if ((step + i) % 3 == 1) entries.back().pick = Pick::kArgmax;
            if ((step + i) % 3 == 2) entries.back().pick = Pick::kTop, entries.back().top = 5, entries.back().gather = kGather;
            plan_of.push_back(int(i));
        }
        if (entries.empty()) break;
        batch.step(entries, out);
        for (size_t e = 0; e < entries.size(); ++e) {
            const int i = plan_of[e];
            const std::vector<float>& w = want[size_t(i)][done[size_t(i)]];
            const std::string at = "sequence " + std::to_string(i) + " output " + std::to_string(done[size_t(i)]) +
                                   " (step " + std::to_string(step) + ")";
            if (entries[e].pick == Pick::kLogits) {
                for (int64_t j = 0; j < n_vocab; ++j)
                    ASSERT_EQ(out.logits[out.row_at[e] + size_t(j)], w[size_t(j)]) << at << " logit " << j;
            } else if (entries[e].pick == Pick::kArgmax) {
                int32_t best = 0;
                argmax_rows_host(w.data(), 1, n_vocab, &best);
                EXPECT_EQ(out.words[out.at[e]], best) << at;
            } else {
                std::vector<int32_t> top(1 + 2 * 5 + kGather.size());
                top_logits_host(w.data(), n_vocab, 5, kGather.data(), int64_t(kGather.size()), top.data());
                EXPECT_EQ(std::vector<int32_t>(out.words.begin() + int64_t(out.at[e]),
                                               out.words.begin() + int64_t(out.at[e] + top.size())),
                          top)
                    << at;
            }
            if (++done[size_t(i)] == plans[size_t(i)].decode.size() + 1) {
                batch.remove_sequence(slot_of[i]);
            }
        }
    }
    for (size_t i = 0; i < plans.size(); ++i) EXPECT_EQ(done[i], plans[i].decode.size() + 1) << "sequence " << i;
    EXPECT_EQ(batch.free_blocks(), all_blocks);
}

TEST_P(BatchFixture, SequencesInOnePassMatchEachAlone) { sequences_in_one_pass_match_each_alone(load(GetParam())); }

// The paged pool holds rotated 4-bit and 3-bit rows (tq4, tq3) as the single-sequence cache does: the
// same logits.
TEST(Batch, RotatedCacheSequencesMatchEachAlone) {
    sequences_in_one_pass_match_each_alone(load("tiny-lfm2", GgmlType::kQ4_0));
    sequences_in_one_pass_match_each_alone(load("tiny-lfm2", GgmlType::kQ3_KV));
}

// kivi4: keys coded per channel over groups of 64 (blocks of 64 rows in the pool), each sequence's open
// group in a slot of the pool's: the same logits as alone, with prompts that fill groups (5, 25, 40, 65
// and 200 tokens).
TEST(Batch, GroupedKeySequencesMatchEachAlone) {
    for (const char* name : {"tiny-lfm2", "tiny-qwen3"}) {
        ModelOptions o;
        o.n_threads = 2;
        o.n_ctx = 512;
        o.kv_type_k = GgmlType::kQ4_CH, o.kv_type_v = GgmlType::kQ4_KV;
        sequences_in_one_pass_match_each_alone(
            load_model(test::data_path(std::string("fixtures/") + name) + "/model.gguf", o), 5);
    }
}

// A prompt sharing a cached prefix with a sequence that has left takes its blocks (and, on models with
// short-conv layers, the conv states kept at the block ends inside a step) and gives the logits of a
// cold run; a prompt that fills the pool then evicts the cached blocks.
TEST_P(BatchFixture, PrefixHitsGiveTheColdLogits) {
    auto model = load(GetParam());
    const int64_t n_vocab = model->info().n_vocab;
    std::mt19937 rng(8);
    std::vector<int32_t> shared, tail;
    for (int i = 0; i < 40; ++i) shared.push_back(int32_t(rng() % uint32_t(n_vocab)));
    for (int i = 0; i < 10; ++i) tail.push_back(int32_t(rng() % uint32_t(n_vocab)));
    std::vector<int32_t> prompt = shared;
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    const std::vector<std::vector<float>> cold = alone(*model, {0, prompt, {7, 9}});

    BatchStateOptions bo;
    bo.max_seqs = 2;
    bo.block_size = 8;
    bo.kv_tokens = 96;
    bo.max_step_tokens = 64;
    bo.snapshot_blocks = 1;
    BatchState batch(*model, bo);
    StepOutput out;
    const int a = batch.add_sequence();
    const std::vector<int32_t> more = {3, 4, 5};
    std::vector<int32_t> first = shared;  // 43 tokens in one step: conv states kept at 8, 16, .., 40
    first.insert(first.end(), more.begin(), more.end());
    batch.step(std::vector<BatchState::Entry>{{a, first, Pick::kLogits}}, out);
    batch.remove_sequence(a);
    EXPECT_EQ(batch.free_blocks(), batch.total_blocks());  // its blocks are cached, and takeable

    const int b = batch.add_sequence();
    EXPECT_EQ(batch.attach_prefix(b, prompt), 40);
    auto rest = std::span<const int32_t>(prompt).subspan(40);
    batch.step(std::vector<BatchState::Entry>{{b, rest, Pick::kLogits}}, out);
    EXPECT_EQ(out.logits, cold[0]);
    for (size_t i = 0; i < 2; ++i) {
        const int32_t id = i == 0 ? 7 : 9;
        batch.step(std::vector<BatchState::Entry>{{b, {&id, 1}, Pick::kLogits}}, out);
        EXPECT_EQ(out.logits, cold[i + 1]);
    }
    batch.remove_sequence(b);

    // A 90-token prompt needs every block: the cached ones are evicted, and the shared prefix is gone.
    std::vector<int32_t> big(90, 2);
    const int c = batch.add_sequence();
    batch.step(std::vector<BatchState::Entry>{{c, std::span<const int32_t>(big).first(64)}}, out);
    batch.step(std::vector<BatchState::Entry>{{c, std::span<const int32_t>(big).subspan(64)}}, out);
    batch.remove_sequence(c);
    const int d = batch.add_sequence();
    EXPECT_EQ(batch.attach_prefix(d, prompt), 0);
    batch.remove_sequence(d);
    EXPECT_EQ(batch.free_blocks(), batch.total_blocks());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, BatchFixture, ::testing::ValuesIn(kModels));

TEST(Batch, BadStepsChangeNothing) {
    auto model = load("tiny-llama-random");
    BatchStateOptions bo;
    bo.max_seqs = 2;
    bo.block_size = 8;
    bo.kv_tokens = 16;  // two blocks
    bo.max_step_tokens = 32;
    BatchState batch(*model, bo);
    const int a = batch.add_sequence(), b = batch.add_sequence();
    EXPECT_EQ(batch.add_sequence(), -1);
    const std::vector<int32_t> t17(17, 1), t3(3, 1), bad = {int32_t(model->info().n_vocab)};
    StepOutput out;
    EXPECT_THROW(batch.step(std::vector<BatchState::Entry>{{a, t17, Pick::kLogits}}, out), Error);  // 3 blocks
    EXPECT_THROW(batch.step(std::vector<BatchState::Entry>{{a, t3, Pick::kLogits}, {a, t3, Pick::kLogits}}, out), Error);
    EXPECT_THROW(batch.step(std::vector<BatchState::Entry>{{b, bad, Pick::kLogits}}, out), Error);
    EXPECT_THROW(batch.step(std::vector<BatchState::Entry>{{7, t3, Pick::kLogits}}, out), Error);
    EXPECT_EQ(batch.free_blocks(), 2);
    EXPECT_EQ(batch.position(a), 0);
    batch.step(std::vector<BatchState::Entry>{{a, t3, Pick::kLogits}, {b, t3}}, out);
    EXPECT_EQ(batch.position(a), 3);
    EXPECT_EQ(batch.free_blocks(), 0);
    batch.remove_sequence(a);
    EXPECT_EQ(batch.free_blocks(), 1);
}

// The host work that overlaps a step (EvalRequest::meanwhile, BatchState::step's meanwhile) runs once
// a step, whether or not the step has outputs to wait for, and what it throws is dropped: the outputs
// are those of a step without it.
TEST(Batch, MeanwhileRunsOnceAndItsErrorsAreDropped) {
    auto model = load("tiny-lfm2");
    const int64_t n_vocab = model->info().n_vocab;
    const std::vector<int32_t> prompt = {1, 5, 9, 2, 7};
    auto plain = model->create_state(64);
    std::vector<float> want(static_cast<size_t>(n_vocab)), got(static_cast<size_t>(n_vocab));
    plain->eval({.tokens = prompt, .logits = want.data()});
    for (const bool throws : {false, true}) {
        auto st = model->create_state(64);
        int calls = 0;
        EvalRequest rq{.tokens = prompt, .logits = got.data()};
        rq.meanwhile = [&] {
            ++calls;
            if (throws) throw std::runtime_error("meanwhile");
        };
        st->eval(rq);
        EXPECT_EQ(calls, 1);
        EXPECT_EQ(got, want) << "throws " << throws;
        EXPECT_EQ(st->position(), int32_t(prompt.size()));
        st->eval({.tokens = {}, .meanwhile = [&] { ++calls; }});  // no tokens: it still runs, once
        EXPECT_EQ(calls, 2);
    }

    BatchStateOptions bo;
    bo.max_seqs = 2;
    bo.block_size = 8;
    bo.kv_tokens = 32;
    bo.max_step_tokens = 32;
    StepOutput ref, out;
    {
        BatchState batch(*model, bo);
        const int a = batch.add_sequence();
        batch.step(std::vector<BatchState::Entry>{{a, prompt, Pick::kLogits}}, ref);
    }
    BatchState batch(*model, bo);
    const int a = batch.add_sequence(), b = batch.add_sequence();
    int calls = 0;
    batch.step(std::vector<BatchState::Entry>{{a, prompt, Pick::kLogits}}, out, [&] {
        ++calls;
        throw std::runtime_error("meanwhile");
    });
    EXPECT_EQ(calls, 1);
    EXPECT_EQ(std::vector<float>(out.logits.begin(), out.logits.begin() + n_vocab),
              std::vector<float>(ref.logits.begin(), ref.logits.begin() + n_vocab));
    batch.step(std::vector<BatchState::Entry>{{b, prompt}}, out, [&] { ++calls; });  // no outputs
    EXPECT_EQ(calls, 2);
    EXPECT_EQ(batch.position(b), int32_t(prompt.size()));
}

}  // namespace
}  // namespace cera
