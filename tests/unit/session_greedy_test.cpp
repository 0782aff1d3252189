// Greedy decoding on the device (HeadOutput::kGreedy, GenerateOptions::device_greedy) against
// the host sampler on real models: the same tokens, the same saved state, the same continuation
// after a save/restore, an EOS or the prefix cache; and the model-level contract (the id equals the
// arg-max of eval()'s logits, read_last_logits() returns those logits until the state moves on).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cera/engine.h"
#include "cera/error.h"
#include "backends/top_logits_host.h"
#include "cera/sampler.h"
#include "cera/session.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

const char* const kModels[] = {"models/tiny-lfm2-Q8_0.gguf", "models/stories260K.gguf"};

std::shared_ptr<Engine> engine(const std::string& rel, size_t prefix_cache_bytes = 0) {
    EngineOptions o;
    o.device = "cpu";
    o.threads = 1;
    o.prefix_cache_bytes = prefix_cache_bytes;
    return Engine::load(test::source_path(rel), o);
}

struct Ids : Sink {
    std::vector<int32_t> ids;
    std::string text;
    void on_text(std::string_view t) override { text += t; }
    void on_token(int32_t id) override { ids.push_back(id); }
};

// Parameters: the model, and GenerateOptions::decode_ahead for the device-greedy sessions (the CPU backend
// runs in step with the host, so -1 means "not ahead" there; 1 forces the pipelined path).
class SessionGreedy : public testing::TestWithParam<std::tuple<const char*, int>> {
 protected:
    static const char* model() { return std::get<0>(GetParam()); }
    static GenerateOptions greedy(int32_t n, bool device) {
        GenerateOptions g;
        g.sampling.temperature = 0.0f;
        g.max_tokens = n;
        g.device_greedy = device;
        g.decode_ahead = std::get<1>(GetParam());
        return g;
    }
};

TEST_P(SessionGreedy, DeviceAndHostPickTheSameTokens) {
    auto e = engine(model());
    Session dev(e), host(e);
    for (Session* s : {&dev, &host}) s->append_text("Once upon a time, there was a little");
    Ids a, b;
    const auto ra = dev.generate(greedy(48, true), a);
    const auto rb = host.generate(greedy(48, false), b);
    ASSERT_EQ(a.ids.size(), 48u);
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(ra.decode_steps, rb.decode_steps);
    EXPECT_EQ(dev.tokens(), host.tokens());

    // The saved state carries the last logits: the device path fetches them from the model state.
    EXPECT_EQ(dev.save_state(), host.save_state());

    // Continuing (the last token is still queued), and after more text.
    Ids a2, b2;
    dev.generate(greedy(20, true), a2);
    host.generate(greedy(20, false), b2);
    EXPECT_EQ(a2.ids, b2.ids);
    dev.append_text(" The end. Then", false, true);
    host.append_text(" The end. Then", false, true);
    Ids a3, b3;
    dev.generate(greedy(20, true), a3);
    host.generate(greedy(20, false), b3);
    EXPECT_EQ(a3.ids, b3.ids);
    EXPECT_EQ(dev.save_state(), host.save_state());
}

TEST_P(SessionGreedy, RestoredStateContinuesTheSame) {
    auto e = engine(model());
    Session dev(e);
    dev.append_text("Tom had a red ball");
    Ids first;
    dev.generate(greedy(16, true), first);
    const std::vector<uint8_t> saved = dev.save_state();
    Ids rest;
    dev.generate(greedy(24, true), rest);

    Session again(e);
    again.load_state(saved);
    Ids rest2;
    again.generate(greedy(24, false), rest2);
    EXPECT_EQ(rest.ids, rest2.ids);
}

// With nothing queued (the state at the end of the sequence, as after an EOS), generate() samples from
// the last logits; after a device-greedy step they are fetched from the model state.
TEST_P(SessionGreedy, ContinuesFromLogitsLeftOnTheDevice) {
    auto e = engine(model());
    Session dev(e), host(e);
    for (Session* s : {&dev, &host}) s->append_text("The sun was");
    GenerateOptions g = greedy(400, true);
    Ids a;
    const auto ra = dev.generate(g, a);
    g.device_greedy = false;
    Ids b;
    const auto rb = host.generate(g, b);
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(ra.finish, rb.finish);
    if (ra.finish != FinishReason::kEos) GTEST_SKIP() << "no EOS within 400 greedy tokens";
    EXPECT_EQ(dev.n_evaluated(), dev.position());  // the EOS stays out: nothing is queued
    Ids a2, b2;
    GenerateOptions more = greedy(5, true);
    more.ignore_eos = true;
    dev.generate(more, a2);
    more.device_greedy = false;
    host.generate(more, b2);
    EXPECT_EQ(a2.ids, b2.ids);
    ASSERT_FALSE(a2.ids.empty());
    EXPECT_EQ(a2.ids[0], a.ids.back());  // the same logits as the ones that gave the EOS
}

TEST_P(SessionGreedy, PrefixCacheEntriesKeepTheirLogits) {
    auto e = engine(model(), 64 << 20);
    const std::string prompt = "Lily went to the park with her mom";
    Ids ref;
    {
        Session s(e);
        s.append_text(prompt);
        s.generate(greedy(24, false), ref);
    }
    for (bool device : {true, false}) {
        Session s(e);
        s.append_text(prompt);
        Ids c;
        const auto r = s.generate(greedy(24, device), c);
        EXPECT_GT(r.cached_tokens, 0) << "device " << device;
        EXPECT_EQ(c.ids, ref.ids) << "device " << device;
    }
}

TEST_P(SessionGreedy, PenaltiesAndSamplingStayOnTheHost) {
    // The option only applies when the pick is a plain arg-max; with a repetition penalty the device
    // path would be wrong, so the two settings must agree.
    auto e = engine(model());
    Session a(e), b(e);
    for (Session* s : {&a, &b}) s->append_text("Once upon a time");
    GenerateOptions g = greedy(40, true);
    g.sampling.repeat_penalty = 1.5f;
    Ids ca, cb;
    a.generate(g, ca);
    g.device_greedy = false;
    b.generate(g, cb);
    EXPECT_EQ(ca.ids, cb.ids);
}

// Sampling with a top-k on the device (HeadOutput::kTopK, GenerateOptions::device_sampling): the same
// draws as the host sampler over the whole logits, with penalties, and the same state afterwards.
TEST_P(SessionGreedy, DeviceSamplingDrawsTheHostTokens) {
    auto e = engine(model());
    GenerateOptions g;
    g.max_tokens = 64;
    g.sampling.temperature = 0.9f;
    g.sampling.top_k = 20;
    g.sampling.top_p = 0.95f;
    g.sampling.min_p = 0.02f;
    g.sampling.repeat_penalty = 1.2f;
    g.sampling.presence_penalty = 0.1f;
    g.sampling.penalty_last_n = 16;
    g.sampling.seed = 7;
    ASSERT_GT(Sampler(g.sampling, e->info().n_vocab).top_needed(), 0);  // the device path applies
    Session dev(e), host(e);
    for (Session* s : {&dev, &host}) s->append_text("Once upon a time, there was a little");
    Ids a, b;
    g.device_sampling = true;
    dev.generate(g, a);
    g.device_sampling = false;
    host.generate(g, b);
    ASSERT_EQ(a.ids.size(), b.ids.size());
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(a.text, b.text);
    EXPECT_EQ(dev.save_state(), host.save_state());  // the last logits, fetched from the model state
    for (uint64_t seed : {1u, 99u}) {  // more draws, continuing
        g.sampling.seed = seed;
        Ids a2, b2;
        g.device_sampling = true;
        dev.generate(g, a2);
        g.device_sampling = false;
        host.generate(g, b2);
        EXPECT_EQ(a2.ids, b2.ids) << "seed " << seed;
    }
}

INSTANTIATE_TEST_SUITE_P(Models, SessionGreedy, testing::Combine(testing::ValuesIn(kModels), testing::Values(-1, 1)));

std::unique_ptr<Model> load_stories() {
    ModelOptions o;
    o.n_threads = 1;
    return load_model(test::source_path("models/stories260K.gguf"), o);
}

int32_t first_argmax(const std::vector<float>& v) {
    return int32_t(std::max_element(v.begin(), v.end()) - v.begin());  // the first of the largest
}

int32_t greedy_pick(ModelState& st, std::span<const int32_t> tokens) {
    return st.eval({.tokens = tokens, .head = HeadOutput::kGreedy}).token;
}
int32_t ahead_pick(ModelState& st, std::span<const int32_t> tokens) {
    return st.eval({.tokens = tokens, .head = HeadOutput::kGreedy, .ahead = true}).token;
}

TEST(ModelStateGreedy, IdIsTheArgmaxOfTheLogitsAndTheLogitsStayReadable) {
    auto model = load_stories();
    const int64_t n_vocab = model->info().n_vocab;
    auto g = model->create_state(), h = model->create_state();
    const std::vector<int32_t> prompt = {1, 400, 27, 80, 300, 12};
    std::vector<float> logits(static_cast<size_t>(n_vocab)), held(static_cast<size_t>(n_vocab));
    EXPECT_FALSE(g->read_last_logits(held.data()));

    // A prompt (several tokens, one forward pass) and then single-token steps.
    int32_t next_g = greedy_pick(*g, prompt);
    h->eval({.tokens = prompt, .logits = logits.data()});
    int32_t next_h = first_argmax(logits);
    for (int step = 0; step < 24; ++step) {
        ASSERT_EQ(next_g, next_h) << "step " << step;
        ASSERT_TRUE(g->read_last_logits(held.data()));
        EXPECT_EQ(0, std::memcmp(held.data(), logits.data(), logits.size() * sizeof(float))) << "step " << step;
        next_g = greedy_pick(*g, {&next_g, 1});
        h->eval({.tokens = {&next_h, 1}, .logits = logits.data()});
        next_h = first_argmax(logits);
    }
    EXPECT_EQ(g->position(), h->position());

    // Gone once the state moves on.
    g->eval({.tokens = {&next_g, 1}});
    EXPECT_FALSE(g->read_last_logits(held.data()));
    (void)greedy_pick(*g, {&next_g, 1});
    g->reset();
    EXPECT_FALSE(g->read_last_logits(held.data()));
    EXPECT_THROW(greedy_pick(*g, std::span<const int32_t>()), Error);
}

// Greedy steps queued ahead against plain greedy steps on a second state: the same picks and positions, and
// whatever follows a pick (its own token ahead or plainly, another token, a save, a logits read, a kLogits
// eval(), a truncate or a reset) finds the state plain steps would have left, conv states included
// (tiny-lfm2), the pending step taken or undone.
TEST(ModelStateGreedy, AheadStepsMatchPlainSteps) {
    for (const char* path : kModels) {
        SCOPED_TRACE(path);
        ModelOptions o;
        o.n_threads = 1;
        auto model = load_model(test::source_path(path), o);
        const int64_t n_vocab = model->info().n_vocab;
        const int n_ctx = 48;
        auto g = model->create_state(n_ctx), h = model->create_state(n_ctx);
        std::vector<float> lg(static_cast<size_t>(n_vocab)), lh(lg.size());
        std::vector<uint8_t> sg, sh;
        auto same_state = [&](const char* what, int step) {
            ASSERT_EQ(g->position(), h->position()) << what << " step " << step;
            g->save_state(sg);
            h->save_state(sh);
            EXPECT_TRUE(sg == sh) << what << " step " << step;
            ASSERT_TRUE(g->read_last_logits(lg.data()));
            ASSERT_TRUE(h->read_last_logits(lh.data()));
            EXPECT_EQ(0, std::memcmp(lg.data(), lh.data(), lg.size() * sizeof(float))) << what << " step " << step;
        };
        const std::vector<int32_t> prompt = {1, 400, 27, 80, 300, 12};
        int32_t pg = ahead_pick(*g, prompt), ph = greedy_pick(*h, prompt);
        for (int step = 0; h->position() < n_ctx; ++step) {
            ASSERT_EQ(pg, ph) << "step " << step;
            EXPECT_EQ(g->position(), h->position());
            int32_t next = ph;
            switch (step % 6) {
                case 1: same_state("save", step); break;  // then the pick, as usual
                case 2: next = (ph + 17) % int32_t(n_vocab); break;  // another token than the pick
                case 3: {                                              // a kLogits eval() of the pick
                    g->eval({.tokens = {&next, 1}, .logits = lg.data()});
                    h->eval({.tokens = {&next, 1}, .logits = lh.data()});
                    EXPECT_EQ(0, std::memcmp(lg.data(), lh.data(), lg.size() * sizeof(float))) << "step " << step;
                    if (h->position() >= n_ctx) break;
                    next = first_argmax(lh);
                    break;
                }
                default: break;
            }
            if (h->position() >= n_ctx) break;
            const bool plain = step % 6 == 4;  // the pending step taken by a request without ahead
            pg = plain ? greedy_pick(*g, {&next, 1}) : ahead_pick(*g, {&next, 1});
            ph = greedy_pick(*h, {&next, 1});
            if (plain) same_state("plain after ahead", step);
        }
        // At the end of the context nothing was queued ahead; the last pick agrees.
        EXPECT_EQ(pg, ph);
        same_state("end", -1);
        // Truncate (attention-only) or reset while a step is pending.
        h->reset();
        g->reset();
        pg = ahead_pick(*g, prompt);
        ph = greedy_pick(*h, prompt);
        ASSERT_EQ(pg, ph);
        if (!g->has_recurrent_state()) {
            g->truncate(3);
            h->truncate(3);
            pg = ahead_pick(*g, {&ph, 1});
            ph = greedy_pick(*h, {&ph, 1});
            EXPECT_EQ(pg, ph);
            same_state("truncate", -1);
        }
        g->reset();
        EXPECT_EQ(g->position(), 0);
        EXPECT_FALSE(g->read_last_logits(lg.data()));
    }
}

TEST(ModelStateTop, EvalTopIsTheBestOfTheLogits) {
    auto model = load_stories();
    const int64_t n_vocab = model->info().n_vocab;
    auto g = model->create_state(), h = model->create_state();
    std::vector<int32_t> tokens = {1, 400, 27, 80, 300, 12};
    std::vector<float> logits(static_cast<size_t>(n_vocab)), held(logits.size());
    const std::vector<int32_t> gather = {3, 0, int32_t(n_vocab) - 1, int32_t(n_vocab), 400};
    for (int step = 0; step < 12; ++step) {
        const int32_t m = 1 + step * 7;
        std::vector<int32_t> ids(static_cast<size_t>(m)), ref(static_cast<size_t>(1 + 2 * m) + gather.size());
        std::vector<float> top(static_cast<size_t>(m)), got(gather.size());
        const int32_t c = g->eval({.tokens = tokens,
                                   .head = HeadOutput::kTopK,
                                   .top_k = m,
                                   .gather = gather,
                                   .top_ids = ids.data(),
                                   .top_logits = top.data(),
                                   .gathered = got.data()})
                              .n_top;
        h->eval({.tokens = tokens, .logits = logits.data()});
        top_logits_host(logits.data(), n_vocab, m, gather.data(), int64_t(gather.size()), ref.data());
        ASSERT_EQ(c, ref[0]) << "step " << step;
        for (int32_t j = 0; j < c; ++j) {
            EXPECT_EQ(ids[size_t(j)], ref[size_t(1 + j)]) << "step " << step << " rank " << j;
            EXPECT_EQ(0, std::memcmp(&top[size_t(j)], &ref[size_t(1 + m + j)], 4));
        }
        EXPECT_EQ(0, std::memcmp(got.data(), &ref[size_t(1 + 2 * m)], got.size() * 4)) << "step " << step;
        ASSERT_TRUE(g->read_last_logits(held.data()));
        EXPECT_EQ(0, std::memcmp(held.data(), logits.data(), logits.size() * sizeof(float)));
        tokens = {ids[0]};
    }
    const EvalRequest no_k{.tokens = tokens, .head = HeadOutput::kTopK, .top_k = 0};
    EXPECT_THROW(g->eval(no_k), Error);
}

}  // namespace
}  // namespace cera
