// Engine and Session on the bundled tiny LFM2 model: determinism, stop strings, EOS,
// max tokens, a full context, cancel from another thread, reset, shared engines, and
// that the streamed text equals the detokenized tokens.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "test_util.h"

namespace cera {
namespace {

std::shared_ptr<Engine> engine() {
    static std::shared_ptr<Engine> e =
        Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cpu", .threads = 1});
    return e;
}

struct Collect : Sink {
    std::vector<int32_t> ids;
    std::vector<std::string> pieces;
    std::string text;
    int done = 0;
    GenerationResult last;
    void on_text(std::string_view t) override {
        pieces.emplace_back(t);
        text += t;
    }
    void on_token(int32_t id) override { ids.push_back(id); }
    void on_done(const GenerationResult& r) override {
        ++done;
        last = r;
    }
};

GenerateOptions greedy(int32_t n) {
    GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = n;
    return g;
}

TEST(Engine, InfoDescribesTheModel) {
    const EngineInfo& i = engine()->info();
    EXPECT_EQ(i.architecture, "lfm2");
    EXPECT_EQ(i.weight_type, "Q8_0");
    EXPECT_GT(i.n_params, 1000000);
    EXPECT_GT(i.weight_bytes, 0u);
    EXPECT_LE(i.decode_bytes_per_token, i.weight_bytes);
    EXPECT_GT(i.decode_bytes_per_token, i.weight_bytes / 2);
    EXPECT_GT(i.n_ctx, 0);
    EXPECT_EQ(engine()->metadata("general.architecture"), "lfm2");
    EXPECT_EQ(engine()->metadata("no.such.key"), "");
    EXPECT_FALSE(i.on_gpu);
}

TEST(Engine, BadOptionsAndFilesThrow) {
    EXPECT_THROW(Engine::load("/no/such/model.gguf"), Error);
    EXPECT_THROW(Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "gpu"}), Error);
    EXPECT_THROW(Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cuda:x"}), Error);
    // One device a rank: a list of cuda:N only, as many as the ranks asked for.
    for (const EngineOptions& o : {EngineOptions{.device = "cuda:0,cpu"}, EngineOptions{.device = "cuda:0,"},
                                   EngineOptions{.device = "cuda:0,cuda:1", .tensor_parallel = 3}}) {
        try {
            Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), o);
            ADD_FAILURE() << o.device << ": no error";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
            EXPECT_NE(std::string(e.what()).find(o.device), std::string::npos) << e.what();
        }
    }
    try {
        Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cuda"});
        SUCCEED() << "a CUDA device is present";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kDevice);
    }
}

TEST(Session, GreedyIsDeterministicAndTextMatchesTokens) {
    Session a(engine()), b(engine());
    a.append_text("Once upon a time");
    b.append_text("Once upon a time");
    Collect ca, cb;
    const auto ra = a.generate(greedy(40), ca);
    const auto rb = b.generate(greedy(40), cb);
    EXPECT_EQ(ca.ids, cb.ids);
    EXPECT_EQ(ca.text, cb.text);
    EXPECT_EQ(ra.finish, FinishReason::kLength);
    EXPECT_EQ(ra.generated_tokens, 40);
    EXPECT_EQ(ra.decode_steps, 39);
    EXPECT_EQ(ca.done, 1);
    EXPECT_EQ(ca.last.text, ra.text);
    EXPECT_EQ(ra.text, ca.text);
    // The streamed text is what detokenizing the prompt + generated ids adds to the prompt's text.
    std::vector<int32_t> all = a.tokens();
    ASSERT_EQ(all.size(), size_t(ra.prompt_tokens) + 40);
    std::vector<int32_t> prompt(all.begin(), all.begin() + ra.prompt_tokens);
    const std::string full = engine()->detokenize(all), head = engine()->detokenize(prompt);
    ASSERT_EQ(full.substr(0, head.size()), head);
    EXPECT_EQ(ca.text, full.substr(head.size()));
    EXPECT_EQ(a.position(), ra.prompt_tokens + 40);
}

TEST(Session, ContinuingEqualsOneLongGeneration) {
    Session one(engine()), two(engine());
    one.append_text("The little dog");
    two.append_text("The little dog");
    Collect c1, c2a, c2b;
    one.generate(greedy(30), c1);
    two.generate(greedy(12), c2a);
    two.generate(greedy(18), c2b);  // continues from the pending last token
    EXPECT_EQ(c2a.ids.size() + c2b.ids.size(), c1.ids.size());
    std::vector<int32_t> joined = c2a.ids;
    joined.insert(joined.end(), c2b.ids.begin(), c2b.ids.end());
    EXPECT_EQ(joined, c1.ids);
    EXPECT_EQ(c2a.text + c2b.text, c1.text);
}

TEST(Session, StopStringEndsGenerationAndIsNeverEmitted) {
    Session ref(engine());
    ref.append_text("Once upon a time");
    Collect c;
    ref.generate(greedy(60), c);
    ASSERT_GT(c.text.size(), 30u);
    // A stop string from the middle of the reference continuation.
    const std::string stop = c.text.substr(20, 6);
    const size_t at = c.text.find(stop);
    Session s(engine());
    s.append_text("Once upon a time");
    GenerateOptions g = greedy(60);
    g.stop = {stop, "never appears \x01"};
    Collect cs;
    const auto r = s.generate(g, cs);
    EXPECT_EQ(r.finish, FinishReason::kStop);
    EXPECT_EQ(r.stop_string, stop);
    EXPECT_EQ(cs.text, c.text.substr(0, at));
    EXPECT_LT(r.generated_tokens, 60);
}

TEST(Session, EosEndsGenerationUnlessIgnored) {
    // Sample (seeded) until the model ends a story; the end token is reported but kept out of
    // the text and the sequence.
    GenerateOptions g;
    g.sampling.seed = 7;
    g.max_tokens = 1500;
    Session s(engine());
    s.append_text("Once upon a time");
    Collect c;
    const auto r = s.generate(g, c);
    if (r.finish != FinishReason::kEos) GTEST_SKIP() << "no EOS within 1500 tokens for this seed";
    ASSERT_FALSE(c.ids.empty());
    EXPECT_TRUE(engine()->is_eog(c.ids.back()));
    EXPECT_NE(s.tokens().back(), c.ids.back());
    for (size_t i = 0; i + 1 < c.ids.size(); ++i) EXPECT_FALSE(engine()->is_eog(c.ids[i]));

    Session t(engine());
    t.append_text("Once upon a time");
    g.ignore_eos = true;
    g.max_tokens = r.generated_tokens + 5;
    Collect ct;
    const auto rt = t.generate(g, ct);
    EXPECT_EQ(rt.finish, FinishReason::kLength);
    EXPECT_EQ(rt.generated_tokens, r.generated_tokens + 5);
    ASSERT_GE(ct.ids.size(), c.ids.size());
    EXPECT_TRUE(std::equal(c.ids.begin(), c.ids.end(), ct.ids.begin()));  // same seed, same draws
}

TEST(Session, SameSeedSameSampledText) {
    GenerateOptions g;
    g.sampling.seed = 1234;
    g.max_tokens = 40;
    g.ignore_eos = true;
    Session a(engine()), b(engine());
    a.append_text("Tom and Sue");
    b.append_text("Tom and Sue");
    Collect ca, cb;
    a.generate(g, ca);
    b.generate(g, cb);
    EXPECT_EQ(ca.ids, cb.ids);
    g.sampling.seed = 4321;
    Session c(engine());
    c.append_text("Tom and Sue");
    Collect cc;
    c.generate(g, cc);
    EXPECT_NE(ca.ids, cc.ids);
}

TEST(Session, ContextFullStops) {
    Session s(engine(), 16);
    EXPECT_EQ(s.n_ctx(), 16);
    s.append_text("Once upon a time");
    const int32_t p = s.position();
    GenerateOptions g = greedy(-1);
    g.ignore_eos = true;
    Collect c;
    const auto r = s.generate(g, c);
    EXPECT_EQ(r.finish, FinishReason::kContextFull);
    EXPECT_EQ(r.generated_tokens, 16 - p);
    EXPECT_EQ(s.position(), 16);
    // A prompt that does not fit is refused and leaves the session unchanged.
    std::vector<int32_t> more(1, 300);
    EXPECT_THROW(s.append_tokens(more), Error);
    EXPECT_EQ(s.position(), 16);
}

TEST(Session, OverlongInputThrowsOutOfRange) {
    Session s(engine(), 8);
    try {
        s.append_text("one two three four five six seven eight nine ten eleven twelve");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
    }
    EXPECT_EQ(s.position(), 0);
    std::vector<int32_t> bad = {engine()->info().n_vocab};
    EXPECT_THROW(s.append_tokens(bad), Error);
}

TEST(Session, MaxTokensZeroOnlyPrefills) {
    Session s(engine());
    s.append_text("Once upon a time");
    Collect c;
    const auto r = s.generate(greedy(0), c);
    EXPECT_EQ(r.generated_tokens, 0);
    EXPECT_EQ(r.prompt_tokens, s.position());
    EXPECT_TRUE(c.text.empty());
    EXPECT_EQ(r.finish, FinishReason::kLength);
    // generating afterwards continues from the prefilled logits
    Collect c2;
    const auto r2 = s.generate(greedy(5), c2);
    EXPECT_EQ(r2.prompt_tokens, 0);
    EXPECT_EQ(r2.generated_tokens, 5);
}

TEST(Session, EmptySessionCannotGenerate) {
    Session s(engine());
    Collect c;
    EXPECT_THROW(s.generate(greedy(5), c), Error);
}

TEST(Session, ResetStartsOver) {
    Session s(engine());
    s.append_text("Once upon a time");
    Collect a;
    s.generate(greedy(20), a);
    s.reset();
    EXPECT_EQ(s.position(), 0);
    s.append_text("Once upon a time");
    Collect b;
    s.generate(greedy(20), b);
    EXPECT_EQ(a.ids, b.ids);
}

TEST(Session, CancelFromAnotherThread) {
    Session s(engine());
    s.append_text("Once upon a time");
    GenerateOptions g = greedy(-1);
    g.ignore_eos = true;
    struct CancelAfter : Collect {
        Session* s;
        std::thread th;
        void on_token(int32_t id) override {
            Collect::on_token(id);
            if (ids.size() == 5) th = std::thread([this] { s->cancel(); });
        }
    } sink;
    sink.s = &s;
    const auto r = s.generate(g, sink);
    if (sink.th.joinable()) sink.th.join();
    EXPECT_EQ(r.finish, FinishReason::kCancelled);
    EXPECT_LT(r.generated_tokens, s.n_ctx() - 10);
    // cancel() before generate() cancels that generate() at once, and only that one
    s.cancel();
    Collect c;
    const auto r2 = s.generate(greedy(5), c);
    EXPECT_EQ(r2.finish, FinishReason::kCancelled);
    EXPECT_EQ(r2.generated_tokens, 0);
    Collect c3;
    EXPECT_EQ(s.generate(greedy(3), c3).generated_tokens, 3);
}

TEST(Session, SessionsShareOneEngineAcrossThreads) {
    Session ref(engine());
    ref.append_text("A big red ball");
    Collect want;
    ref.generate(greedy(24), want);
    std::vector<std::string> got(3);
    std::vector<std::thread> ths;
    for (int i = 0; i < 3; ++i)
        ths.emplace_back([&, i] {
            Session s(engine());
            s.append_text("A big red ball");
            Collect c;
            s.generate(greedy(24), c);
            got[size_t(i)] = c.text;
        });
    for (auto& t : ths) t.join();
    for (const auto& g : got) EXPECT_EQ(g, want.text);
}

TEST(Session, EngineOutlivesItsHandle) {
    auto e = Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), {.device = "cpu", .threads = 1});
    auto s = std::make_unique<Session>(e);
    std::weak_ptr<Engine> w = e;
    e.reset();
    EXPECT_FALSE(w.expired());  // the session keeps it alive
    s->append_text("Hello");
    Collect c;
    EXPECT_EQ(s->generate(greedy(3), c).generated_tokens, 3);
    s.reset();
    EXPECT_TRUE(w.expired());
}

TEST(Session, BadSamplingOptionsThrow) {
    Session s(engine());
    s.append_text("Hi");
    GenerateOptions g;
    g.sampling.repeat_penalty = -1.0f;
    Collect c;
    EXPECT_THROW(s.generate(g, c), Error);
}

}  // namespace
}  // namespace cera
