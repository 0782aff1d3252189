// Whole fixture models on the CUDA backend against the CPU backend: prefill logits and greedy tokens,
// greedy and top-k selection on the device (HeadOutput::kGreedy, kTopK), greedy decoding queued ahead
// (EvalRequest::ahead, the pick mailbox). Skips when no CUDA device is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/device.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

std::vector<int32_t> greedy(ModelState& st, std::vector<int32_t> prompt, int n, int64_t n_vocab,
                            std::vector<float>* first_logits) {
    std::vector<float> logits(static_cast<size_t>(n_vocab));
    std::vector<int32_t> out;
    st.eval({.tokens = prompt, .logits = logits.data()});
    if (first_logits) *first_logits = logits;
    for (int i = 0; i < n; ++i) {
        const int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
        out.push_back(id);
        if (i + 1 < n) st.eval({.tokens = {&id, 1}, .logits = logits.data()});
    }
    return out;
}

int32_t greedy_pick(ModelState& st, std::span<const int32_t> tokens) {
    return st.eval({.tokens = tokens, .head = HeadOutput::kGreedy}).token;
}
int32_t ahead_pick(ModelState& st, std::span<const int32_t> tokens) {
    return st.eval({.tokens = tokens, .head = HeadOutput::kGreedy, .ahead = true}).token;
}

// A fixture model (its F32 file, or another of its files) loaded on the CPU and on CUDA, and an
// 11-token prompt inside its vocabulary.
std::pair<std::unique_ptr<Model>, std::unique_ptr<Model>> load_fixture_pair(const char* name,
                                                                            const char* file = "model.gguf",
                                                                            GgmlType kv = GgmlType::kF32,
                                                                            bool rotate = false,
                                                                            GgmlType kv_v = GgmlType::kI8,  // kI8: as kv
                                                                            int rotate_v = -1) {
    const std::string path = test::data_path(std::string("fixtures/") + name + "/" + file);
    ModelOptions o;
    o.n_threads = 2, o.n_ctx = 256;
    o.kv_type_k = kv, o.kv_type_v = kv_v == GgmlType::kI8 ? kv : kv_v;
    o.kv_rotate_k = rotate, o.kv_rotate_v = rotate_v < 0 ? rotate : rotate_v == 1;
    auto cpu = load_model(path, o);
    o.device = DeviceKind::kCuda;
    return {std::move(cpu), load_model(path, o)};
}
std::vector<int32_t> fixture_prompt(int64_t n_vocab) {
    std::vector<int32_t> prompt;
    for (int i = 0; i < 11; ++i) prompt.push_back(int32_t((i * 7919 + 13) % n_vocab));
    return prompt;
}

TEST(CudaModel, FixturesMatchCpu) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    for (const char* name : {"tiny-lfm2", "tiny-lfm2moe", "tiny-qwen3", "tiny-llama-random", "tiny-qwen2-random",
                             "tiny-granite-random"}) {
        SCOPED_TRACE(name);
        auto [cpu, gpu] = load_fixture_pair(name);
        const int64_t n_vocab = cpu->info().n_vocab;
        const std::vector<int32_t> prompt = fixture_prompt(n_vocab);
        std::vector<float> lc, lg;
        auto sc = cpu->create_state();
        auto sg = gpu->create_state();
        const auto tc = greedy(*sc, prompt, 24, n_vocab, &lc);
        const auto tg = greedy(*sg, prompt, 24, n_vocab, &lg);
        EXPECT_EQ(tc, tg);
        double err = 0;
        for (size_t i = 0; i < lc.size(); ++i) err = std::max(err, double(std::fabs(lc[i] - lg[i])));
        EXPECT_LT(err, 1e-3) << "prefill logits";
    }
}

// Every KV cache type on CUDA against the same type on the CPU: the caches hold the same kind of rows
// (CUDA stores them with the reference quantizers' arithmetic), so prefill logits of the F32 files
// agree to the float noise of the two backends plus, for the types the tensor-core prefill decodes
// into f16 tiles, that rounding; the Q4_0 file's logits differ as the backends' 8-bit activations do
// (0.2 here with an F16 cache too); greedy tokens are the same. tiny-lfm2 (heads of 64) takes the staged decode kernels and the
// tensor cores, its Q4_0 file the fused q/k/v + RoPE + KV-store launch; tiny-llama-random (heads of 32)
// the per-query kernel. tq4 adds the head rotation on the device (in the q/k/v launch's epilogue for the
// Q4_0 file and the fused RoPE + store launch for the F32 ones).
TEST(CudaModel, KvCacheTypesMatchCpu) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    struct C {
        const char* name;
        const char* file;
        GgmlType kv;
        bool rotate;
        GgmlType v = GgmlType::kI8;  // the values' type (kI8: kv's) and rotation (-1: rotate's)
        int rotate_v = -1;
    };
    for (const C& c : {C{"tiny-lfm2", "model.gguf", GgmlType::kBF16, false},
                       C{"tiny-lfm2", "model.gguf", GgmlType::kQ8_0, false},
                       C{"tiny-lfm2", "model-Q4_0.gguf", GgmlType::kF16, false},
                       C{"tiny-lfm2", "model-Q4_0.gguf", GgmlType::kQ8_0, false},
                       C{"tiny-lfm2", "model-Q4_0.gguf", GgmlType::kQ4_0, false},
                       C{"tiny-lfm2", "model.gguf", GgmlType::kQ4_0, true},
                       C{"tiny-lfm2", "model-Q4_0.gguf", GgmlType::kQ4_0, true},
                       C{"tiny-llama-random", "model.gguf", GgmlType::kQ8_0, false},
                       C{"tiny-llama-random", "model.gguf", GgmlType::kQ4_0, true},
                       C{"tiny-lfm2", "model.gguf", GgmlType::kQ3_KV, true},
                       C{"tiny-lfm2", "model-Q4_0.gguf", GgmlType::kQ3_KV, true},
                       C{"tiny-llama-random", "model.gguf", GgmlType::kQ3_KV, true},
                       // Keys and values apart: the per-query kernel, and the stores of both kinds.
                       C{"tiny-lfm2", "model.gguf", GgmlType::kQ8_0, false, GgmlType::kF16},
                       C{"tiny-lfm2", "model-Q4_0.gguf", GgmlType::kQ8_0, false, GgmlType::kQ4_0},
                       C{"tiny-lfm2", "model-Q4_0.gguf", GgmlType::kF16, false, GgmlType::kQ8_0},
                       C{"tiny-lfm2", "model.gguf", GgmlType::kQ4_0, true, GgmlType::kF16, 0},
                       C{"tiny-llama-random", "model.gguf", GgmlType::kBF16, false, GgmlType::kQ4_0}}) {
        const GgmlType v = c.v == GgmlType::kI8 ? c.kv : c.v;
        SCOPED_TRACE(std::string(c.name) + "/" + c.file + " " + type_name(c.kv) + "/" + type_name(v) +
                     (c.rotate ? " rotated" : ""));
        auto [cpu, gpu] = load_fixture_pair(c.name, c.file, c.kv, c.rotate, c.v, c.rotate_v);
        const int64_t n_vocab = cpu->info().n_vocab;
        std::vector<int32_t> prompt = fixture_prompt(n_vocab);
        for (int i = 0; i < 40; ++i) prompt.push_back(prompt[size_t(i) % 11]);  // 51 tokens: the prefill kernels
        std::vector<float> lc, lg;
        auto sc = cpu->create_state();
        auto sg = gpu->create_state();
        const auto tc = greedy(*sc, prompt, 24, n_vocab, &lc);
        const auto tg = greedy(*sg, prompt, 24, n_vocab, &lg);
        double err = 0, mag = 0;
        for (size_t i = 0; i < lc.size(); ++i)
            err = std::max(err, double(std::fabs(lc[i] - lg[i]))), mag = std::max(mag, double(std::fabs(lc[i])));
        std::printf("  [kv] %s/%s %s/%s%s: prefill logits max |diff| %.2e (max |logit| %.2f)\n", c.name, c.file,
                    type_name(c.kv), type_name(v), c.rotate ? " rotated" : "", err, mag);
        const bool f32_file = std::string(c.file) == "model.gguf";
        // Q3_KV's steps are a quarter of the deviation: a key the backends round apart by a float's last bit
        // may change code at a bound, and move the logits by more than the other types.
        EXPECT_LT(err, !f32_file                     ? 0.5
                       : c.kv == GgmlType::kBF16     ? 2e-3
                       : c.kv == GgmlType::kQ3_KV    ? 5e-2
                                                     : 1e-2)
            << "prefill logits";
        // The F32 files give the same tokens. The Q4_0 file's logits differ by err, so its tokens may part
        // only where the CPU's best two logits are within 2 err of each other (a near-tie).
        const auto at = std::mismatch(tc.begin(), tc.end(), tg.begin()).first - tc.begin();
        if (f32_file || at == int64_t(tc.size())) {
            EXPECT_EQ(tc, tg);
            continue;
        }
        std::vector<int32_t> prefix = prompt;
        prefix.insert(prefix.end(), tc.begin(), tc.begin() + at);
        auto s2 = cpu->create_state();
        std::vector<float> l2(static_cast<size_t>(n_vocab));
        s2->eval({.tokens = prefix, .logits = l2.data()});
        std::partial_sort(l2.begin(), l2.begin() + 2, l2.end(), std::greater<float>());
        std::printf("  [kv] tokens part at %lld, the CPU's best two %.3f apart\n", (long long)at, l2[0] - l2[1]);
        EXPECT_LT(l2[0] - l2[1], 2 * err) << "tokens part at " << at << " without a near-tie";
    }
}

// Greedy decoding on the device: HeadOutput::kGreedy (the arg-max inside the recorded, then
// replayed, decode step) picks the same tokens as the CPU and keeps the step's logits readable.
TEST(CudaModel, EvalGreedyMatchesCpu) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    for (const char* name : {"tiny-lfm2", "tiny-qwen3", "tiny-llama-random"}) {
        SCOPED_TRACE(name);
        auto [cpu, gpu] = load_fixture_pair(name);
        const int64_t n_vocab = cpu->info().n_vocab;
        const std::vector<int32_t> prompt = fixture_prompt(n_vocab);
        auto sc = cpu->create_state();
        auto sg = gpu->create_state();
        const auto tc = greedy(*sc, prompt, 24, n_vocab, nullptr);
        std::vector<int32_t> tg;
        std::vector<float> held(static_cast<size_t>(n_vocab));
        int32_t id = greedy_pick(*sg, prompt);
        for (int i = 0; i < 24; ++i) {
            tg.push_back(id);
            ASSERT_TRUE(sg->read_last_logits(held.data()));
            EXPECT_EQ(id, int32_t(std::max_element(held.begin(), held.end()) - held.begin())) << "step " << i;
            if (i + 1 < 24) id = greedy_pick(*sg, {&id, 1});
        }
        EXPECT_EQ(tc, tg);
    }
}

// Sampling on the device (HeadOutput::kTopK) gives the best of the very logits it leaves there.
TEST(CudaModel, EvalTopIsTheBestOfTheLogits) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    for (const char* name : {"tiny-lfm2", "tiny-llama-random"}) {
        SCOPED_TRACE(name);
        auto [cpu, gpu] = load_fixture_pair(name);
        const int64_t n_vocab = gpu->info().n_vocab;
        std::vector<int32_t> tokens = fixture_prompt(n_vocab);
        auto sg = gpu->create_state();
        std::vector<float> held(static_cast<size_t>(n_vocab));
        const std::vector<int32_t> gather = {5, 0, int32_t(n_vocab) - 1, 17};
        for (int step = 0; step < 16; ++step) {
            const int32_t m = 1 + 9 * step;
            std::vector<int32_t> ids(static_cast<size_t>(m)), want(static_cast<size_t>(1 + 2 * m) + gather.size());
            std::vector<float> top(static_cast<size_t>(m)), got(gather.size());
            const int32_t c = sg->eval({.tokens = tokens,
                                        .head = HeadOutput::kTopK,
                                        .top_k = m,
                                        .gather = gather,
                                        .top_ids = ids.data(),
                                        .top_logits = top.data(),
                                        .gathered = got.data()})
                                  .n_top;
            ASSERT_TRUE(sg->read_last_logits(held.data()));
            top_logits_host(held.data(), n_vocab, m, gather.data(), int64_t(gather.size()), want.data());
            ASSERT_EQ(c, want[0]) << "step " << step;
            for (int32_t j = 0; j < c; ++j) {
                EXPECT_EQ(ids[size_t(j)], want[size_t(1 + j)]) << "step " << step << " rank " << j;
                EXPECT_EQ(0, std::memcmp(&top[size_t(j)], &want[size_t(1 + m + j)], 4));
            }
            EXPECT_EQ(0, std::memcmp(got.data(), &want[size_t(1 + 2 * m)], got.size() * 4));
            tokens = {ids[size_t(step % c)]};
        }
    }
}

// Pipelined greedy decoding on the device (EvalRequest::ahead: each pick's step queued before the host
// reads the pick) against plain greedy steps on a second state of the same model: the same picks, and after
// a save, another token than the pick, a kLogits eval() or the end of the context, the state and logits
// plain greedy steps would have left (the pending step undone, conv states included), byte for byte. The
// quantized lfm2 files take the fused decode launches (Q4_0: q/k/v + RoPE + KV store; Q4_K_M: in_proj
// + short conv, whose undo keeps the replaced state).
TEST(CudaModel, EvalGreedyAheadMatchesPlainSteps) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    for (auto [name, file] : {std::pair{"tiny-lfm2", "model.gguf"}, {"tiny-qwen3", "model.gguf"},
                              {"tiny-lfm2", "model-Q4_0.gguf"}, {"tiny-lfm2", "model-Q4_K_M.gguf"}}) {
        SCOPED_TRACE(std::string(name) + "/" + file);
        auto [cpu, gpu] = load_fixture_pair(name, file);
        const int64_t n_vocab = gpu->info().n_vocab;
        const int n_ctx = 64;
        auto g = gpu->create_state(n_ctx), h = gpu->create_state(n_ctx);
        std::vector<float> lg(static_cast<size_t>(n_vocab)), lh(lg.size());
        std::vector<uint8_t> sg, sh;
        auto same_state = [&](int step) {
            ASSERT_EQ(g->position(), h->position()) << "step " << step;
            g->save_state(sg);
            h->save_state(sh);
            EXPECT_TRUE(sg == sh) << "step " << step;
            ASSERT_TRUE(g->read_last_logits(lg.data()));
            ASSERT_TRUE(h->read_last_logits(lh.data()));
            EXPECT_EQ(0, std::memcmp(lg.data(), lh.data(), lg.size() * sizeof(float))) << "step " << step;
        };
        const std::vector<int32_t> prompt = fixture_prompt(n_vocab);
        int32_t pg = ahead_pick(*g, prompt), ph = greedy_pick(*h, prompt);
        for (int step = 0; h->position() < n_ctx; ++step) {
            ASSERT_EQ(pg, ph) << "step " << step;
            int32_t next = ph;
            if (step % 7 == 3) same_state(step);
            if (step % 7 == 5) next = int32_t((ph + 101) % n_vocab);
            if (step % 7 == 6) {
                g->eval({.tokens = {&next, 1}, .logits = lg.data()});
                h->eval({.tokens = {&next, 1}, .logits = lh.data()});
                EXPECT_EQ(0, std::memcmp(lg.data(), lh.data(), lg.size() * sizeof(float))) << "step " << step;
                if (h->position() >= n_ctx) break;
                next = int32_t(std::max_element(lh.begin(), lh.end()) - lh.begin());
            }
            pg = ahead_pick(*g, {&next, 1});
            ph = greedy_pick(*h, {&next, 1});
        }
        same_state(-1);
    }
}

// Several sequences decoding ahead on one device, interleaved: each pick must come back to its own
// state (the CUDA backend tracks, per output tensor, the feed whose pick the mailbox holds), also when
// a state sat out while the others queued enough steps to wrap the mailbox's ring (then the pick is
// copied back instead). Plain greedy steps on twin states are the reference.
TEST(CudaModel, InterleavedAheadStatesKeepTheirPicks) {
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << ")";
    auto [cpu, gpu] = load_fixture_pair("tiny-llama-random");
    const int64_t n_vocab = gpu->info().n_vocab;
    constexpr int kStates = 4;
    std::vector<std::unique_ptr<ModelState>> a, b;
    std::vector<int32_t> pa(kStates), pb(kStates);
    for (int i = 0; i < kStates; ++i) {
        a.push_back(gpu->create_state(96));
        b.push_back(gpu->create_state(96));
        std::vector<int32_t> prompt = fixture_prompt(n_vocab);
        prompt[0] = int32_t((37 * i + 5) % n_vocab);
        pa[size_t(i)] = ahead_pick(*a.back(), prompt);
        pb[size_t(i)] = greedy_pick(*b.back(), prompt);
    }
    for (int round = 0; round < 24; ++round) {
        for (int k = 0; k < kStates; ++k) {
            const int i = (3 * round + k) % kStates;
            if (round % 6 >= 3 && i == round % kStates) continue;  // sits out while the others run ahead
            ASSERT_EQ(pa[size_t(i)], pb[size_t(i)]) << "round " << round << " state " << i;
            const int32_t next = round % 5 == 4 ? int32_t((pb[size_t(i)] + 11) % n_vocab) : pb[size_t(i)];
            pa[size_t(i)] = ahead_pick(*a[size_t(i)], {&next, 1});
            pb[size_t(i)] = greedy_pick(*b[size_t(i)], {&next, 1});
        }
    }
    for (int i = 0; i < kStates; ++i) EXPECT_EQ(pa[size_t(i)], pb[size_t(i)]) << "state " << i;
}

}  // namespace
}  // namespace cera
