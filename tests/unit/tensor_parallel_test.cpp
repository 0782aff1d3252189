// Tensor parallelism on CPU ranks (models/shard.h): a model split over two backends gives the logits of
// the whole model on one, for every fixture architecture (attention heads, FFN columns, LFM2's conv
// channels, MoE experts' columns and the LM head's vocabulary split), in prefill, greedy decoding and
// the batched engine's steps; shapes that do not divide run as pipeline stages; what cannot run is
// refused by name; saved states round-trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "batched_side_by_side.h"
#include "cera/error.h"
#include "models/arch.h"
#include "models/batch_state.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

std::unique_ptr<Model> load(const std::string& path, int world) {
    ModelOptions o;
    o.n_threads = std::max(2, world);
    o.tensor_parallel = world;
    o.n_batch = 32;
    return load_model(path, o);
}

std::vector<int32_t> prompt(const std::string& model) {
    const nlohmann::json pj =
        nlohmann::json::parse(test::read_text(test::data_path("fixtures/" + model + "/ref/prompt_2.json")));
    return pj["ids"].get<std::vector<int32_t>>();
}

// Every row of a prompt's logits (several prefill chunks), then 12 greedy steps, split against whole.
// F32 weights: the ranks' partial sums only reorder additions, so the logits agree to rounding. Block
// weights: the products quantize their input rows to 8 bits a block of 32 (the CPU kernels' kAct32), and
// an input that moved by an ulp may round to the next code, so a few rows move by up to a code's share
// and the rows after them with them: the mean stays small, and greedy picks part only where the whole
// model's top two logits are close.
void split_matches_whole(const std::string& path, const std::vector<int32_t>& ids, bool block_weights = false,
                         int world = 2) {
    auto whole = load(path, 1), split = load(path, world);
    ASSERT_EQ(split->world(), world);
    const int64_t n_vocab = whole->info().n_vocab;
    // Tensor-parallel ranks compute their rows of the vocabulary; pipeline stages the whole head.
    for (int r = 0; r < world; ++r)
        EXPECT_EQ(split->rank_model(r).arch().head.output.ne[1], split->pipeline() ? n_vocab : n_vocab / world);
    auto a = whole->create_state(256), b = split->create_state(256);
    std::vector<float> la(ids.size() * size_t(n_vocab)), lb(la.size());
    a->eval({.tokens = ids, .all_logits = true, .logits = la.data()});
    b->eval({.tokens = ids, .all_logits = true, .logits = lb.data()});
    double max_d = 0, max_abs = 0, sum_d = 0;
    for (size_t i = 0; i < la.size(); ++i) {
        const double d = std::fabs(la[i] - lb[i]);
        max_d = std::max(max_d, d), sum_d += d;
        max_abs = std::max(max_abs, double(std::fabs(la[i])));
    }
    const double mean_d = sum_d / double(la.size());
    std::printf("  %s: %zu positions, max |dlogit| %.3g, mean %.3g (max |logit| %.3g)\n", path.c_str(), ids.size(),
                max_d, mean_d, max_abs);
    if (block_weights) {
        EXPECT_LT(mean_d, 2e-3 * max_abs);
        EXPECT_LT(max_d, 0.05 * max_abs);
    } else {
        EXPECT_LT(max_d, 1e-4 * std::max(1.0, max_abs));
    }
    // Greedy decoding after the prompt, the whole model's logits beside each pick.
    std::vector<float> row(la.end() - n_vocab, la.end());
    int32_t pb = int32_t(std::max_element(lb.end() - n_vocab, lb.end()) - (lb.end() - n_vocab));
    for (int i = 0; i < 12; ++i) {
        const int32_t pa = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        if (pa != pb) {
            std::vector<float> top = row;
            std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
            EXPECT_TRUE(block_weights && top[0] - top[1] < 0.05)
                << path << " step " << i << ": " << pa << " against " << pb << ", top two " << top[0] << " " << top[1];
            break;
        }
        a->eval({.tokens = {&pa, 1}, .logits = row.data()});
        pb = b->eval({.tokens = {&pb, 1}, .head = HeadOutput::kGreedy}).token;
    }
    EXPECT_EQ(a->position(), b->position());
}

TEST(TensorParallel, TwoCpuRanksGiveTheWholeModelsLogits) {
    for (const char* m :
         {"tiny-lfm2", "tiny-lfm2moe", "tiny-qwen3", "tiny-llama-random", "tiny-qwen2-random", "tiny-granite-random"})
        split_matches_whole(test::data_path(std::string("fixtures/") + m + "/model.gguf"), prompt(m));
}

// Quantized weights split in whole blocks (the bundled model, Q8_0).
TEST(TensorParallel, QuantizedWeightsSplitInWholeBlocks) {
    split_matches_whole(test::source_path("models/tiny-lfm2-Q8_0.gguf"), prompt("tiny-lfm2"), true);
}

// Shapes that do not divide among the ranks run as pipeline stages of whole layers: tiny-lfm2's conv
// channels (256) among 3 ranks, tiny-llama-random's 4 heads and 2 KV heads among 3; the stages compute
// the whole model's ops, so the logits agree to rounding, recurrent conv states included.
TEST(TensorParallel, PipelineStagesWhereTheShapeDoesNotDivide) {
    for (const char* m : {"tiny-lfm2", "tiny-llama-random"}) {
        const std::string path = test::data_path(std::string("fixtures/") + m + "/model.gguf");
        ModelOptions o;
        o.n_threads = 3, o.tensor_parallel = 3, o.n_batch = 32;
        auto split = load_model(path, o);
        EXPECT_TRUE(split->pipeline()) << m;
        EXPECT_EQ(split->world(), 3);
    }
    split_matches_whole(test::data_path("fixtures/tiny-lfm2/model.gguf"), prompt("tiny-lfm2"), false, 3);
    split_matches_whole(test::data_path("fixtures/tiny-llama-random/model.gguf"), prompt("tiny-llama-random"), false,
                        3);
}

TEST(TensorParallel, WhatCannotRunIsRefusedByName) {
    // tiny-llama-random's 3 layers cannot make 4 pipeline stages (nor its heads 4 tensor-parallel ranks).
    try {
        load(test::data_path("fixtures/tiny-llama-random/model.gguf"), 4);
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
        EXPECT_NE(std::string(e.what()).find("layers"), std::string::npos) << e.what();
        EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
    for (int bad : {0, -1, 65}) EXPECT_THROW(load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), bad), Error);
}

// The batched engine's steps on a split model: three sequences, prompt chunks beside decoding, against
// the same steps on the whole model (F32 weights: to rounding), and a cached prefix taken on every rank.
// Two ranks split every layer; three are pipeline stages (tiny-lfm2's conv channels and tiny-qwen3's
// heads do not divide by 3), whose last stage's outputs are the caller's.
void batched_matches_whole(const std::string& m, int world) {
    SCOPED_TRACE(m + ", " + std::to_string(world) + " ranks");
    const std::string path = test::data_path("fixtures/" + m + "/model.gguf");
    const std::vector<int32_t> ids = prompt(m);
    auto whole = load(path, 1), split = load(path, world);
    EXPECT_EQ(split->pipeline(), world == 3);
    BatchStateOptions bo;
    bo.max_seqs = 4, bo.kv_tokens = 1024, bo.max_step_tokens = 96;
    BatchState a(*whole, bo), b(*split, bo);
    if (world == 2) EXPECT_EQ(b.pool_bytes(), a.pool_bytes());  // the ranks' halves of every layer's heads and channels
    const int64_t n_vocab = whole->info().n_vocab;
    test::SideBySide run;
    ASSERT_NO_FATAL_FAILURE(test::batched_side_by_side(a, b, ids, n_vocab, run));
    const std::vector<std::vector<int32_t>>& toks = run.tokens;
    std::printf("  %s, %d ranks: batched steps, max |dlogit| %.3g\n", m.c_str(), world, run.max_dlogit);
    EXPECT_LT(run.max_dlogit, 1e-4 * 25);
    // A fourth sequence repeating sequence 0's prompt takes its cached blocks on every rank, and goes on
    // from them as the whole model does (tiny-lfm2: the conv states of the prefix's end, on the stages
    // that hold conv layers).
    const int na = a.add_sequence(), nb = b.add_sequence();
    ASSERT_EQ(na, nb);
    EXPECT_EQ(a.attach_prefix(na, toks[0]), b.attach_prefix(nb, toks[0]));
    EXPECT_EQ(a.free_blocks(), b.free_blocks());
    const std::span<const int32_t> rest = std::span(toks[0]).subspan(size_t(a.position(na)));
    if (!rest.empty()) {
        StepOutput oa, ob;
        a.step(std::vector<BatchState::Entry>{{na, rest, Pick::kLogits}}, oa);
        b.step(std::vector<BatchState::Entry>{{nb, rest, Pick::kLogits}}, ob);
        double d = 0;
        for (int64_t j = 0; j < n_vocab; ++j)
            d = std::max(d, double(std::fabs(oa.logits[size_t(j)] - ob.logits[size_t(j)])));
        EXPECT_LT(d, 1e-4 * 25);
    }
}

TEST(TensorParallel, BatchedStepsMatchTheWholeModel) {
    for (const char* m : {"tiny-lfm2", "tiny-qwen3"}) batched_matches_whole(m, 2);
}

TEST(TensorParallel, BatchedStepsOnPipelineStages) {
    for (const char* m : {"tiny-lfm2", "tiny-qwen3"}) batched_matches_whole(m, 3);
}

// A saved state restores on a split model; one saved by the whole model does not.
TEST(TensorParallel, SavedStatesRoundTripOnEveryRank) {
    const std::string path = test::data_path("fixtures/tiny-lfm2/model.gguf");
    const std::vector<int32_t> ids = prompt("tiny-lfm2");
    auto split = load(path, 2);
    auto s = split->create_state(256);
    const size_t half = ids.size() / 2;
    s->eval({.tokens = std::span(ids).first(half)});
    std::vector<uint8_t> saved;
    s->save_state(saved);
    EXPECT_EQ(saved.size(), s->state_size());
    std::vector<float> want(size_t(split->info().n_vocab)), got(want.size());
    s->eval({.tokens = std::span(ids).subspan(half), .logits = want.data()});
    auto t = split->create_state(256);
    t->restore_state(saved);
    EXPECT_EQ(t->position(), int32_t(half));
    t->eval({.tokens = std::span(ids).subspan(half), .logits = got.data()});
    EXPECT_EQ(want, got);

    auto whole = load(path, 1);
    auto w = whole->create_state(256);
    w->eval({.tokens = std::span(ids).first(half)});
    std::vector<uint8_t> one;
    w->save_state(one);
    EXPECT_THROW(t->restore_state(one), Error);
    EXPECT_EQ(t->position(), int32_t(ids.size()));  // unchanged by the refused state
}

}  // namespace
}  // namespace cera
