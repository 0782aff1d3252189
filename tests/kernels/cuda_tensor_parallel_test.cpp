// Tensor parallelism on CUDA ranks (backends/collectives.h), simulated on one GPU: two or three ranks
// share the device and meet through device copies. The split model's logits against the whole model's
// on the same GPU, in prefill, greedy decoding on the device and the batched engine's steps; pipeline
// stages where a shape does not divide, also under the batched engine; refusals by name. Skips when no CUDA device is
// present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backends/device.h"
#include "batched_side_by_side.h"
#include "cera/error.h"
#include "models/batch_state.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

bool have_gpu() {
    std::string why;
    return !cuda_devices(&why).empty();
}

std::unique_ptr<Model> load(const std::string& path, int world) {
    ModelOptions o;
    o.device = DeviceKind::kCuda;
    o.n_threads = 2, o.n_ctx = 512, o.n_batch = 32;
    o.tensor_parallel = world;
    if (world > 1) o.gpu_ranks.assign(size_t(world), 0);  // every rank on the one GPU
    return load_model(path, o);
}

std::vector<int32_t> prompt(int64_t n_vocab, int n = 70) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(int32_t((i * 7919 + 13) % n_vocab));
    return ids;
}

// Every row of a 70-token prompt's logits (three prefill chunks of 32), then 16 greedy steps picked on
// the device by the split model, against the whole model's logits. The ranks' partial sums reorder the
// products' additions (and the whole model runs fused launches in graphs, the split one without
// graphs), so the logits agree to rounding; a quantized product's input rows may round to a neighbouring
// code, so greedy picks may part only where the whole model's top two logits are close.
void split_matches_whole(const std::string& path, int world, bool pipeline) {
    SCOPED_TRACE(path);
    auto whole = load(path, 1), split = load(path, world);
    ASSERT_EQ(split->world(), world);
    EXPECT_EQ(split->pipeline(), pipeline);
    const int64_t n_vocab = whole->info().n_vocab;
    const std::vector<int32_t> ids = prompt(n_vocab);
    auto a = whole->create_state(256), b = split->create_state(256);
    std::vector<float> la(ids.size() * size_t(n_vocab)), lb(la.size());
    a->eval({.tokens = ids, .all_logits = true, .logits = la.data()});
    b->eval({.tokens = ids, .all_logits = true, .logits = lb.data()});
    double max_d = 0, sum_d = 0, max_abs = 0;
    for (size_t i = 0; i < la.size(); ++i) {
        const double d = std::fabs(la[i] - lb[i]);
        max_d = std::max(max_d, d), sum_d += d;
        max_abs = std::max(max_abs, double(std::fabs(la[i])));
    }
    const double mean_d = sum_d / double(la.size());
    std::printf("  %s, %d ranks%s: max |dlogit| %.3g, mean %.3g (max |logit| %.3g)\n", path.c_str(), world,
                pipeline ? " (pipeline)" : "", max_d, mean_d, max_abs);
    EXPECT_LT(mean_d, 2e-3 * max_abs);
    EXPECT_LT(max_d, 0.05 * max_abs);
    std::vector<float> row(la.end() - n_vocab, la.end());
    int32_t pb = int32_t(std::max_element(lb.end() - n_vocab, lb.end()) - (lb.end() - n_vocab));
    for (int i = 0; i < 16; ++i) {
        const int32_t pa = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        if (pa != pb) {
            std::vector<float> top = row;
            std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
            EXPECT_LT(top[0] - top[1], 0.05) << "step " << i << ": " << pa << " against " << pb;
            break;
        }
        a->eval({.tokens = {&pa, 1}, .logits = row.data()});
        pb = b->eval({.tokens = {&pb, 1}, .head = HeadOutput::kGreedy}).token;
    }
    EXPECT_EQ(a->position(), b->position());
}

// Attention heads and KV heads, FFN columns, LFM2's conv channels and the LM head's vocabulary split in
// two; F32 weights and the bundled Q8_0 model (whole blocks a rank).
TEST(CudaTensorParallel, TwoRanksOnOneGpuGiveTheWholeModelsLogits) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    for (const char* m : {"tiny-lfm2", "tiny-llama-random"})
        split_matches_whole(test::data_path(std::string("fixtures/") + m + "/model.gguf"), 2, false);
    split_matches_whole(test::source_path("models/tiny-lfm2-Q8_0.gguf"), 2, false);
}

// Three ranks: tiny-lfm2's 256 conv channels and tiny-llama-random's heads do not divide, so the ranks
// are pipeline stages of whole layers, handing the residual stream on.
TEST(CudaTensorParallel, PipelineStagesWhereTheShapeDoesNotDivide) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    for (const char* m : {"tiny-lfm2", "tiny-llama-random"})
        split_matches_whole(test::data_path(std::string("fixtures/") + m + "/model.gguf"), 3, true);
}

// The batched engine on a split model: three sequences, prompt chunks beside decoding, against the same
// steps on the whole model; two ranks split every layer, three are pipeline stages.
class CudaTensorParallelBatched : public testing::TestWithParam<int> {};

TEST_P(CudaTensorParallelBatched, StepsMatchTheWholeModel) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const int world = GetParam();
    const std::string path = test::data_path("fixtures/tiny-lfm2/model.gguf");
    auto whole = load(path, 1), split = load(path, world);
    EXPECT_EQ(split->pipeline(), world == 3);
    const int64_t n_vocab = whole->info().n_vocab;
    const std::vector<int32_t> ids = prompt(n_vocab, 120);
    BatchStateOptions bo;
    bo.max_seqs = 4, bo.kv_tokens = 1024, bo.max_step_tokens = 96;
    BatchState a(*whole, bo), b(*split, bo);
    test::SideBySide run;
    ASSERT_NO_FATAL_FAILURE(test::batched_side_by_side(a, b, ids, n_vocab, run));
    std::printf("  batched steps, %d ranks: max |dlogit| %.3g (max |logit| %.3g)\n", world, run.max_dlogit,
                run.max_logit);
    EXPECT_LT(run.max_dlogit, 0.05 * run.max_logit);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CudaTensorParallelBatched, testing::Values(2, 3));

TEST(CudaTensorParallel, WhatCannotRunIsRefusedByName) {
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
    const std::string path = test::source_path("models/tiny-lfm2-Q8_0.gguf");
    auto expect_error = [&](const ModelOptions& o, ErrorCode code, const char* word) {
        try {
            load_model(path, o);
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), code) << e.what();
            EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
            EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
        }
    };
    ModelOptions o;
    o.device = DeviceKind::kCuda;
    o.tensor_parallel = 2;
    o.gpu_ranks = {0, 0, 0};
    expect_error(o, ErrorCode::kInvalidArgument, "3 devices for 2 ranks");
    o.gpu_ranks = {0, int(cuda_devices().size())};  // a device past the last
    expect_error(o, ErrorCode::kDevice, "not present");
}

}  // namespace
}  // namespace cera
