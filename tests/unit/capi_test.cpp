// The C API (include/cera/cera.h) against the C++ API it wraps: the same greedy text, tokens,
// logits, embeddings and chat rendering; errors as codes with messages (never exceptions); the
// callback stops generation; states round-trip; batched requests give the text each gives alone.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "capi/chat.h"
#include "cera/batcher.h"
#include "cera/cera.h"
#include "cera/engine.h"
#include "cera/perplexity.h"
#include "cera/sampler.h"
#include "cera/session.h"
#include "test_util.h"

namespace {

const std::string kModel = cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");

cera_engine* load(const std::string& path = kModel) {
    cera_engine_options o = cera_engine_default_options();
    o.device = "cpu";
    o.threads = 1;
    cera_engine* e = nullptr;
    EXPECT_EQ(cera_engine_load(path.c_str(), &o, &e), CERA_OK) << cera_last_error();
    return e;
}

std::shared_ptr<cera::Engine> load_cpp() {
    cera::EngineOptions o;
    o.device = "cpu";
    o.threads = 1;
    return cera::Engine::load(kModel, o);
}

cera::ChatMessage message(const std::string& role, const std::string& content) {
    cera::ChatMessage m;
    m.role = role;
    m.content = content;
    return m;
}

cera_generate_options greedy(int32_t n) {
    cera_generate_options g = cera_generate_default_options();
    g.max_tokens = n;
    g.sampling.temperature = 0.0f;
    return g;
}

std::string cpp_greedy(const std::string& prompt, int32_t n) {
    cera::Session s(load_cpp());
    s.append_text(prompt);
    cera::GenerateOptions g;
    g.max_tokens = n;
    g.sampling.temperature = 0.0f;
    cera::NullSink sink;
    return s.generate(g, sink).text;
}

struct Collected {
    std::string text;
    std::vector<int32_t> tokens;
    int stop_after = -1;  // return false at this event (0-based); -1: never
    int events = 0;
};

bool collect(const cera_token_event* ev, void* user) {
    auto* c = static_cast<Collected*>(user);
    c->text.append(ev->text, ev->text_len);
    if (ev->token != CERA_TOKEN_NULL) c->tokens.push_back(ev->token);
    return c->stop_after < 0 || c->events++ < c->stop_after;
}

TEST(CApi, LoadProgressCountsUpToTheWholeModel) {
    struct Seen {
        std::vector<std::pair<uint64_t, uint64_t>> calls;
    } seen;
    cera_engine_options o = cera_engine_default_options();
    EXPECT_EQ(o.load_progress, nullptr);
    o.device = "cpu";
    o.threads = 1;
    o.load_progress = [](uint64_t done, uint64_t total, void* user) {
        static_cast<Seen*>(user)->calls.push_back({done, total});
    };
    o.load_progress_user_data = &seen;
    cera_engine* e = nullptr;
    ASSERT_EQ(cera_engine_load(cera::test::data_path("fixtures/tiny-lfm2/model.gguf").c_str(), &o, &e), CERA_OK)
        << cera_last_error();
    cera_engine_free(e);
    ASSERT_GT(seen.calls.size(), 10u);  // one a weight
    const uint64_t total = seen.calls.back().second;
    EXPECT_GT(total, 1000000u);
    EXPECT_EQ(seen.calls.back().first, total);
    for (size_t i = 0; i < seen.calls.size(); ++i) {
        EXPECT_EQ(seen.calls[i].second, total);
        if (i > 0) EXPECT_GE(seen.calls[i].first, seen.calls[i - 1].first);
    }
}

// Perplexity and the KL divergence against a saved base: the C++ API's figures, and its errors as codes.
TEST(CApi, PerplexityEqualsTheCppApis) {
    cera_engine* e = load();
    auto cpp = load_cpp();
    std::string text;
    for (int i = 0; i < 40; ++i) text += "Once upon a time there was a little girl who liked to play in the park. ";
    const std::vector<int32_t> ids = cpp->tokenize(text, true);
    const cera::PerplexityResult want = cera::perplexity(*cpp, ids, {.n_ctx = 64});

    cera_perplexity_options o = cera_perplexity_default_options();
    EXPECT_EQ(o.n_ctx, 512);
    o.n_ctx = 64;
    const std::string base = (std::filesystem::temp_directory_path() / "cera_capi_ppl_base.kl").string();
    o.save_base = base.c_str();
    int calls = 0;
    o.user_data = &calls;
    o.on_chunk = [](int32_t chunk, int32_t n_chunks, double ppl, void* user) {
        int& c = *static_cast<int*>(user);
        EXPECT_EQ(chunk, c);
        EXPECT_GT(n_chunks, chunk);
        EXPECT_GT(ppl, 1.0);
        ++c;
    };
    cera_perplexity_result r{};
    ASSERT_EQ(cera_perplexity(e, ids.data(), ids.size(), &o, &r), CERA_OK) << cera_last_error();
    EXPECT_EQ(r.n_chunks, want.n_chunks);
    EXPECT_EQ(calls, want.n_chunks);
    EXPECT_EQ(r.n_scored, want.n_scored);
    EXPECT_DOUBLE_EQ(r.ppl, want.ppl);
    EXPECT_DOUBLE_EQ(r.ppl_err, want.ppl_err);
    EXPECT_FALSE(r.has_kl);

    // Against itself: the tokens come from the base file, the divergence is zero.
    cera_perplexity_options k = cera_perplexity_default_options();
    k.compare_base = base.c_str();
    ASSERT_EQ(cera_perplexity(e, nullptr, 0, &k, &r), CERA_OK) << cera_last_error();
    EXPECT_TRUE(r.has_kl);
    EXPECT_EQ(r.n_ctx, 64);
    EXPECT_DOUBLE_EQ(r.ppl, want.ppl);
    EXPECT_NEAR(r.kld, 0.0, 1e-9);
    EXPECT_DOUBLE_EQ(r.same_top, 1.0);

    EXPECT_EQ(cera_perplexity(e, ids.data(), 10, &o, &r), CERA_ERR_INVALID_ARGUMENT);  // under two windows
    EXPECT_NE(std::string(cera_last_error()).find("perplexity"), std::string::npos) << cera_last_error();
    k.compare_base = "/nonexistent/base.kl";
    EXPECT_EQ(cera_perplexity(e, nullptr, 0, &k, &r), CERA_ERR_IO);
    EXPECT_EQ(cera_perplexity(nullptr, ids.data(), ids.size(), &o, &r), CERA_ERR_INVALID_ARGUMENT);
    std::filesystem::remove(base);
    cera_engine_free(e);
}

// A lazy grammar (tool calls with tool_choice "auto"): free text until the trigger, then the grammar.
TEST(CApi, LazyGrammar) {
    cera_grammar* g = nullptr;
    ASSERT_EQ(cera_grammar_lazy("root ::= \"<call>\" [a-z]+ \"</call>\"", "<call>", &g), CERA_OK) << cera_last_error();
    char buf[64];
    size_t len = 0;
    ASSERT_EQ(cera_grammar_trigger(g, buf, sizeof buf, &len), CERA_OK);
    EXPECT_EQ(std::string(buf, len), "<call>");
    // Greedy text from the bundled model under it equals the C++ API's.
    cera_engine* e = load();
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK) << cera_last_error();
    ASSERT_EQ(cera_session_append_text(s, "Once upon a time", false), CERA_OK);
    cera_generate_options o = greedy(12);
    o.grammar = g;
    cera_generation_result r{};
    ASSERT_EQ(cera_session_generate(s, &o, nullptr, nullptr, &r), CERA_OK) << cera_last_error();
    cera::Session cs(load_cpp());
    cs.append_text("Once upon a time");
    cera::GenerateOptions cg;
    cg.max_tokens = 12;
    cg.sampling.temperature = 0.0f;
    cg.grammar = cera::Grammar::lazy("root ::= \"<call>\" [a-z]+ \"</call>\"", "<call>");
    cera::NullSink sink;
    EXPECT_EQ(std::string(r.text, r.text_len), cs.generate(cg, sink).text);
    cera_session_free(s);
    cera_engine_free(e);
    cera_grammar_free(g);
    EXPECT_EQ(cera_grammar_lazy("root ::= \"x\"", "", &g), CERA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(cera_grammar_lazy("root ::= [a-", "x", &g), CERA_ERR_PARSE);
}

// The sampler's distribution and log-probabilities: the C++ Sampler's.
TEST(CApi, SamplerDistributionAndLogProbsEqualTheCpps) {
    const int32_t n_vocab = 300;
    std::vector<float> logits(n_vocab);
    for (int32_t i = 0; i < n_vocab; ++i) logits[size_t(i)] = float((i * 37) % 101) / 10.0f;
    cera_sampling_params p = cera_generate_default_options().sampling;
    p.temperature = 0.8f;
    p.top_k = 20;
    p.top_p = 0.9f;
    cera_sampler* s = nullptr;
    ASSERT_EQ(cera_sampler_new(&p, n_vocab, &s), CERA_OK) << cera_last_error();
    cera::SamplerParams cp;
    cp.temperature = 0.8f;
    cp.top_k = 20;
    cp.top_p = 0.9f;
    cp.min_p = p.min_p;
    cp.seed = p.seed;
    cera::Sampler ref(cp, n_vocab);
    const auto want = ref.distribution(logits.data());
    size_t n = 0;
    EXPECT_EQ(cera_sampler_distribution(s, logits.data(), nullptr, nullptr, 0, &n), CERA_ERR_BUFFER_TOO_SMALL);
    ASSERT_EQ(n, want.size());
    std::vector<cera_token_prob> got(n);
    ASSERT_EQ(cera_sampler_distribution(s, logits.data(), nullptr, got.data(), n, &n), CERA_OK);
    for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(got[i].token, want[i].id);
        EXPECT_EQ(got[i].p, want[i].p);
        EXPECT_EQ(got[i].logit, want[i].logit);
    }
    cera_token_logprob top[3];
    float lp = 0;
    ASSERT_EQ(cera_sampler_log_probs(s, logits.data(), 7, 3, top, &lp), CERA_OK);
    cera::TokenLogprob rtop[3];
    EXPECT_EQ(lp, ref.log_probs(logits.data(), 7, 3, rtop));
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(top[i].token, rtop[i].id);
        EXPECT_EQ(top[i].logprob, rtop[i].logprob);
    }
    EXPECT_EQ(cera_sampler_log_probs(s, logits.data(), n_vocab, 0, nullptr, &lp), CERA_ERR_OUT_OF_RANGE);
    cera_sampler_free(s);
}

TEST(CApi, VersionAndStatusNames) {
    EXPECT_STREQ(cera_version(), CERA_TEST_PROJECT_VERSION);
    EXPECT_EQ(cera_abi_version(), CERA_ABI_VERSION);
    EXPECT_STREQ(cera_status_name(CERA_OK), "ok");
    EXPECT_STREQ(cera_status_name(CERA_ERR_INVALID_FILE), "invalid file");
    EXPECT_STREQ(cera_finish_reason_name(CERA_FINISH_LENGTH), "length");
    // Values a C caller may pass that are no enumerator.
    cera_status bad_status;
    cera_finish_reason bad_reason;
    const int junk = 99;
    std::memcpy(&bad_status, &junk, sizeof junk);
    std::memcpy(&bad_reason, &junk, sizeof junk);
    EXPECT_STREQ(cera_status_name(bad_status), "unknown status");
    EXPECT_STREQ(cera_finish_reason_name(bad_reason), "unknown");
}

TEST(CApi, GreedyTextEqualsTheSessionsAndTheCallbackSeesEveryToken) {
    cera_engine* e = load();
    ASSERT_NE(e, nullptr);
    const cera_model_info* info = cera_engine_info(e);
    EXPECT_STREQ(info->architecture, "lfm2");
    EXPECT_GT(info->n_vocab, 0);

    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK) << cera_last_error();
    cera_engine_free(e);  // the session keeps the model alive
    ASSERT_EQ(cera_session_append_text(s, "Once upon a time", true), CERA_OK);
    const cera_generate_options g = greedy(32);
    Collected c;
    cera_generation_result r;
    ASSERT_EQ(cera_session_generate(s, &g, collect, &c, &r), CERA_OK) << cera_last_error();
    const std::string want = cpp_greedy("Once upon a time", 32);
    EXPECT_EQ(std::string(r.text, r.text_len), want);
    EXPECT_EQ(c.text, want);
    EXPECT_EQ(int32_t(c.tokens.size()), r.generated_tokens);
    EXPECT_EQ(r.finish, CERA_FINISH_LENGTH);
    EXPECT_EQ(r.generated_tokens, 32);
    EXPECT_STREQ(r.stop_string, "");
    cera_session_free(s);
}

// Every architecture's fixture: the C API's greedy tokens are the C++ Session's, from the
// reference prompt's ids (tests/golden checks those against Hugging Face's).
TEST(CApi, GreedyTokensEqualTheSessionsOnEveryFixture) {
    for (const char* name :
         {"tiny-lfm2", "tiny-lfm2moe", "tiny-qwen3", "tiny-llama-random", "tiny-qwen2-random", "tiny-granite-random"}) {
        const std::string path = cera::test::data_path(std::string("fixtures/") + name + "/model.gguf");
        cera_engine* e = load(path);
        ASSERT_NE(e, nullptr) << name;
        cera::EngineOptions eo;
        eo.device = "cpu";
        eo.threads = 1;
        auto cpp = cera::Engine::load(path, eo);
        const std::vector<int32_t> ids = cpp->tokenize("Once upon a time, there was a little", true);

        cera_session* s = nullptr;
        ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
        ASSERT_EQ(cera_session_append_tokens(s, ids.data(), ids.size()), CERA_OK);
        cera_generate_options g = greedy(24);
        g.ignore_eos = true;
        Collected c;
        cera_generation_result r;
        ASSERT_EQ(cera_session_generate(s, &g, collect, &c, &r), CERA_OK) << name << ": " << cera_last_error();

        struct Tokens : cera::Sink {
            std::vector<int32_t> ids;
            void on_text(std::string_view) override {}
            void on_token(int32_t t) override { ids.push_back(t); }
        } want;
        cera::Session ref(cpp);
        ref.append_tokens(ids);
        cera::GenerateOptions cg;
        cg.max_tokens = 24;
        cg.ignore_eos = true;
        cg.sampling.temperature = 0.0f;
        const cera::GenerationResult rr = ref.generate(cg, want);
        EXPECT_EQ(c.tokens, want.ids) << name;
        EXPECT_EQ(std::string(r.text, r.text_len), rr.text) << name;
        EXPECT_EQ(c.text, rr.text) << name;
        cera_session_free(s);
        cera_engine_free(e);
    }
}

TEST(CApi, CallbackFalseStopsGeneration) {
    cera_engine* e = load();
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    ASSERT_EQ(cera_session_append_text(s, "Once upon a time", true), CERA_OK);
    const cera_generate_options g = greedy(64);
    Collected c;
    c.stop_after = 4;  // false at the fifth event
    cera_generation_result r;
    ASSERT_EQ(cera_session_generate(s, &g, collect, &c, &r), CERA_OK) << cera_last_error();
    EXPECT_EQ(r.finish, CERA_FINISH_CANCELLED);
    EXPECT_EQ(c.events, 5);
    EXPECT_LE(r.generated_tokens, 6);  // the callback of a token may come with the next one
    EXPECT_LT(r.generated_tokens, 64);
    cera_session_free(s);
    cera_engine_free(e);
}

TEST(CApi, AStopAtTheLastEventDoesNotCancelTheNextGeneration) {
    cera_engine* e = load();
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    ASSERT_EQ(cera_session_append_text(s, "Once upon a time", true), CERA_OK);
    cera_generate_options g = greedy(4);
    g.ignore_eos = true;
    Collected c;
    c.stop_after = 3;  // false at the fourth and last token's event
    cera_generation_result r;
    ASSERT_EQ(cera_session_generate(s, &g, collect, &c, &r), CERA_OK);
    EXPECT_EQ(r.generated_tokens, 4);
    Collected next;
    ASSERT_EQ(cera_session_generate(s, &g, collect, &next, &r), CERA_OK);
    EXPECT_EQ(r.finish, CERA_FINISH_LENGTH);
    EXPECT_EQ(r.generated_tokens, 4);
    cera_session_free(s);
    cera_engine_free(e);
}

TEST(CApi, StopStringsAndGrammar) {
    cera_engine* e = load();
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    const std::string full = cpp_greedy("Once upon a time", 32);
    ASSERT_GT(full.size(), 8u);
    const std::string stop = full.substr(4, 3);
    const char* stops[] = {stop.c_str()};
    cera_generate_options g = greedy(32);
    g.stop = stops;
    g.n_stop = 1;
    ASSERT_EQ(cera_session_append_text(s, "Once upon a time", true), CERA_OK);
    cera_generation_result r;
    ASSERT_EQ(cera_session_generate(s, &g, nullptr, nullptr, &r), CERA_OK) << cera_last_error();
    EXPECT_EQ(r.finish, CERA_FINISH_STOP);
    EXPECT_EQ(std::string(r.stop_string), stop);
    EXPECT_EQ(std::string(r.text), full.substr(0, full.find(stop)));

    cera_grammar* gr = nullptr;
    ASSERT_EQ(cera_grammar_from_gbnf("root ::= \"yes\" | \"no\"", nullptr, &gr), CERA_OK) << cera_last_error();
    cera_generate_options gg = greedy(8);
    gg.grammar = gr;
    ASSERT_EQ(cera_session_reset(s), CERA_OK);
    ASSERT_EQ(cera_session_append_text(s, "Answer:", true), CERA_OK);
    ASSERT_EQ(cera_session_generate(s, &gg, nullptr, nullptr, &r), CERA_OK) << cera_last_error();
    EXPECT_TRUE(std::string(r.text) == "yes" || std::string(r.text) == "no") << r.text;
    cera_grammar_free(gr);
    EXPECT_EQ(cera_grammar_from_gbnf("root ::= (", nullptr, &gr), CERA_ERR_PARSE);
    EXPECT_NE(std::string(cera_last_error()), "");
    cera_session_free(s);
    cera_engine_free(e);
}

TEST(CApi, ErrorsAreCodesWithMessages) {
    cera_engine* e = nullptr;
    cera_engine_options o = cera_engine_default_options();
    o.device = "cpu";
    EXPECT_EQ(cera_engine_load("/nonexistent/model.gguf", &o, &e), CERA_ERR_IO);
    EXPECT_EQ(e, nullptr);
    EXPECT_NE(std::string(cera_last_error()).find("/nonexistent/model.gguf"), std::string::npos) << cera_last_error();

    // Not a GGUF.
    EXPECT_EQ(cera_engine_load(cera::test::source_path("README.md").c_str(), &o, &e), CERA_ERR_INVALID_FILE)
        << cera_last_error();

    o.device = "tpu";
    EXPECT_NE(cera_engine_load(kModel.c_str(), &o, &e), CERA_OK);
    EXPECT_NE(std::string(cera_last_error()), "");
    o = cera_engine_default_options();
    o.device = "cpu";
    o.n_batch = -3;
    EXPECT_EQ(cera_engine_load(kModel.c_str(), &o, &e), CERA_ERR_INVALID_ARGUMENT) << cera_last_error();
    o = cera_engine_default_options();
    const int past_the_last = CERA_KV_KIVI4 + 1;
    std::memcpy(&o.kv_type, &past_the_last, sizeof past_the_last);
    EXPECT_EQ(cera_engine_load(kModel.c_str(), &o, &e), CERA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(cera_engine_load(nullptr, nullptr, &e), CERA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(e, nullptr);

    e = load();
    cera_session* s = nullptr;
    EXPECT_EQ(cera_session_new(nullptr, 0, &s), CERA_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    // Nothing to generate from.
    EXPECT_EQ(cera_session_generate(s, nullptr, nullptr, nullptr, nullptr), CERA_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(cera_last_error()).find("nothing to generate"), std::string::npos) << cera_last_error();
    const cera_token bad = 1 << 30;
    EXPECT_EQ(cera_session_append_tokens(s, &bad, 1), CERA_ERR_OUT_OF_RANGE);
    // Bad sampling values are the C++ API's kInvalidArgument.
    ASSERT_EQ(cera_session_append_text(s, "Hello", true), CERA_OK);
    cera_generate_options g = greedy(4);
    g.sampling.top_p = -1.0f;
    g.sampling.temperature = 1.0f;
    EXPECT_EQ(cera_session_generate(s, &g, nullptr, nullptr, nullptr), CERA_ERR_INVALID_ARGUMENT);
    g = greedy(4);
    g.n_stop = 2;  // with stop NULL
    EXPECT_EQ(cera_session_generate(s, &g, nullptr, nullptr, nullptr), CERA_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(cera_session_truncate(s, 1000), CERA_ERR_OUT_OF_RANGE);
    // A prompt longer than the context.
    cera_session* small = nullptr;
    ASSERT_EQ(cera_session_new(e, 8, &small), CERA_OK);
    EXPECT_EQ(cera_session_append_text(small, "one two three four five six seven eight nine ten eleven", true),
              CERA_ERR_OUT_OF_RANGE);
    EXPECT_EQ(cera_session_position(small), 0);
    cera_session_free(small);

    // Buffers: a short one gets the size it needs.
    char buf[4];
    size_t len = 0;
    EXPECT_EQ(cera_engine_metadata(e, "general.architecture", buf, sizeof buf, &len), CERA_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(len, 4u);  // "lfm2": the text would fit, its NUL would not
    char big[16];
    ASSERT_EQ(cera_engine_metadata(e, "general.architecture", big, sizeof big, &len), CERA_OK);
    EXPECT_STREQ(big, "lfm2");
    EXPECT_EQ(cera_engine_metadata(e, "no.such.key", big, sizeof big, &len), CERA_ERR_MISSING);

    // The last error is per thread.
    std::string other;
    std::thread([&] { other = cera_last_error(); }).join();
    EXPECT_EQ(other, "");
    cera_session_free(s);
    cera_engine_free(e);
}

TEST(CApi, TokenizeDetokenizeMatchTheEngine) {
    cera_engine* e = load();
    auto cpp = load_cpp();
    const cera_tokenizer* t = cera_engine_tokenizer(e);
    const std::string text = "Hello world, once upon a time <|im_start|>";
    size_t n = 0;
    ASSERT_EQ(cera_tokenize(t, text.data(), text.size(), true, true, nullptr, 0, &n), CERA_ERR_BUFFER_TOO_SMALL);
    std::vector<cera_token> ids(n);
    ASSERT_EQ(cera_tokenize(t, text.data(), text.size(), true, true, ids.data(), ids.size(), &n), CERA_OK);
    EXPECT_EQ(ids, cpp->tokenize(text, true, true));
    std::vector<char> out(text.size() + 64);
    size_t len = 0;
    ASSERT_EQ(cera_detokenize(t, ids.data(), ids.size(), true, out.data(), out.size(), &len), CERA_OK);
    EXPECT_EQ(std::string(out.data(), len), cpp->detokenize(ids, true));
    EXPECT_EQ(cera_token_bos(t), cpp->bos_token());
    EXPECT_EQ(cera_token_eos(t), cpp->eos_token());
    EXPECT_EQ(cera_tokenizer_add_bos(t), cpp->add_bos());
    EXPECT_TRUE(cera_token_is_eog(t, cpp->eos_token()));
    EXPECT_EQ(cera_tokenizer_n_vocab(t), cpp->info().n_vocab);
    ASSERT_EQ(cera_token_text(t, ids.back(), out.data(), out.size(), &len), CERA_OK);
    EXPECT_EQ(std::string(out.data(), len), cpp->token_text(ids.back()));
    const cera_token bad = -5;
    EXPECT_EQ(cera_detokenize(t, &bad, 1, false, out.data(), out.size(), &len), CERA_ERR_OUT_OF_RANGE);
    cera_engine_free(e);
}

TEST(CApi, LogitsAndEmbeddingsEqualTheSessions) {
    cera_engine* e = load();
    auto cpp = load_cpp();
    const std::vector<int32_t> ids = cpp->tokenize("The cat sat on the mat", true);

    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    ASSERT_EQ(cera_session_append_tokens(s, ids.data(), ids.size()), CERA_OK);
    const float* logits = nullptr;
    int32_t n_vocab = 0;
    ASSERT_EQ(cera_session_logits(s, &logits, &n_vocab), CERA_OK) << cera_last_error();
    EXPECT_EQ(cera_session_n_evaluated(s), int32_t(ids.size()));
    cera::Session ref(cpp);
    ref.append_tokens(ids);
    const std::span<const float> want = ref.logits();
    ASSERT_EQ(size_t(n_vocab), want.size());
    for (int32_t i = 0; i < n_vocab; ++i) ASSERT_EQ(logits[i], want[size_t(i)]) << i;

    const size_t n_embd = size_t(cera_engine_info(e)->n_embd);
    std::vector<float> v(n_embd);
    size_t n = 0;
    ASSERT_EQ(cera_session_embed(s, ids.data(), ids.size(), CERA_POOLING_MEAN, v.data(), v.size(), &n), CERA_OK)
        << cera_last_error();
    EXPECT_EQ(n, n_embd);
    EXPECT_EQ(v, ref.embed(ids, cera::Pooling::kMean));
    EXPECT_EQ(cera_session_embed(s, ids.data(), ids.size(), CERA_POOLING_NONE, v.data(), v.size(), &n),
              CERA_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(n, n_embd * ids.size());
    EXPECT_EQ(cera_session_embed(s, ids.data(), 0, CERA_POOLING_MEAN, v.data(), v.size(), &n),
              CERA_ERR_INVALID_ARGUMENT);
    cera_pooling bad_pooling;
    const int nine = 9;
    std::memcpy(&bad_pooling, &nine, sizeof nine);
    EXPECT_EQ(cera_session_embed(s, ids.data(), ids.size(), bad_pooling, v.data(), v.size(), &n),
              CERA_ERR_INVALID_ARGUMENT);
    cera_session_free(s);
    cera_engine_free(e);
}

TEST(CApi, StateSaveLoadRoundTrips) {
    cera_engine* e = load();
    cera_session* a = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &a), CERA_OK);
    ASSERT_EQ(cera_session_append_text(a, "Once upon a time", true), CERA_OK);
    cera_generate_options g = greedy(8);
    cera_generation_result r;
    ASSERT_EQ(cera_session_generate(a, &g, nullptr, nullptr, &r), CERA_OK);
    uint8_t* data = nullptr;
    size_t size = 0;
    ASSERT_EQ(cera_session_save_state(a, &data, &size), CERA_OK) << cera_last_error();
    ASSERT_GT(size, 0u);

    // The continuation of the original and of a session loaded from its state are the same.
    g.max_tokens = 16;
    ASSERT_EQ(cera_session_generate(a, &g, nullptr, nullptr, &r), CERA_OK);
    const std::string want(r.text, r.text_len);
    cera_session* b = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &b), CERA_OK);
    ASSERT_EQ(cera_session_load_state(b, data, size), CERA_OK) << cera_last_error();
    ASSERT_EQ(cera_session_generate(b, &g, nullptr, nullptr, &r), CERA_OK);
    EXPECT_EQ(std::string(r.text, r.text_len), want);

    // Through a file too.
    const std::string path = (std::filesystem::temp_directory_path() / "cera_capi_state.bin").string();
    cera_session* c = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &c), CERA_OK);
    ASSERT_EQ(cera_session_load_state(c, data, size), CERA_OK);
    ASSERT_EQ(cera_session_save_state_file(c, path.c_str()), CERA_OK) << cera_last_error();
    ASSERT_EQ(cera_session_reset(c), CERA_OK);
    ASSERT_EQ(cera_session_load_state_file(c, path.c_str()), CERA_OK) << cera_last_error();
    ASSERT_EQ(cera_session_generate(c, &g, nullptr, nullptr, &r), CERA_OK);
    EXPECT_EQ(std::string(r.text, r.text_len), want);
    std::filesystem::remove(path);

    // Corrupt bytes are refused and leave the session as it was.
    const int32_t before = cera_session_position(c);
    data[size / 2] ^= 0x5a;
    EXPECT_EQ(cera_session_load_state(c, data, size), CERA_ERR_INVALID_FILE);
    EXPECT_EQ(cera_session_position(c), before);
    EXPECT_EQ(cera_session_load_state_file(c, "/nonexistent/state.bin"), CERA_ERR_IO);
    cera_free(data);
    cera_session_free(a);
    cera_session_free(b);
    cera_session_free(c);
    cera_engine_free(e);
}

TEST(CApi, ChatRendersWithTheModelsTemplate) {
    cera_engine* e = load();
    auto cpp = load_cpp();
    const cera_chat_message msgs[] = {{"system", "You are terse."}, {"user", "Hi there"}};
    size_t len = 0;
    ASSERT_EQ(cera_chat_apply_template(e, nullptr, msgs, 2, true, nullptr, 0, &len), CERA_ERR_BUFFER_TOO_SMALL);
    std::vector<char> buf(len + 1);
    ASSERT_EQ(cera_chat_apply_template(e, nullptr, msgs, 2, true, buf.data(), buf.size(), &len), CERA_OK);
    const std::vector<cera::ChatMessage> cpp_msgs = {message("system", "You are terse."), message("user", "Hi there")};
    EXPECT_EQ(std::string(buf.data()), cera::capi::render_chat(*cpp, nullptr, cpp_msgs, true));
    EXPECT_NE(std::string(buf.data()).find("Hi there"), std::string::npos);

    // A session fed the conversation holds its tokens.
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    ASSERT_EQ(cera_session_append_chat(s, msgs, 2), CERA_OK) << cera_last_error();
    size_t n = 0;
    std::vector<cera_token> toks(size_t(cera_session_position(s)));
    ASSERT_EQ(cera_session_tokens(s, toks.data(), toks.size(), &n), CERA_OK);
    EXPECT_EQ(toks, cera::capi::chat_tokens(*cpp, cpp_msgs));
    cera_generation_result r;
    const cera_generate_options g = greedy(8);
    EXPECT_EQ(cera_session_generate(s, &g, nullptr, nullptr, &r), CERA_OK) << cera_last_error();

    // A template of the caller's; a bad one is a parse error.
    ASSERT_EQ(cera_chat_apply_template(e, "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}", msgs, 2,
                                       false, buf.data(), buf.size(), &len),
              CERA_OK);
    EXPECT_EQ(std::string(buf.data(), len), "[system]You are terse.[user]Hi there");
    EXPECT_EQ(cera_chat_apply_template(e, "{% for %}", msgs, 2, false, buf.data(), buf.size(), &len), CERA_ERR_PARSE);
    const cera_chat_message bad[] = {{"user", nullptr}};
    EXPECT_EQ(cera_session_append_chat(s, bad, 1), CERA_ERR_INVALID_ARGUMENT);
    cera_session_free(s);
    cera_engine_free(e);
}

TEST(CApi, BatchedRequestsGiveTheTextEachGivesAlone) {
    cera_engine* e = load();
    auto cpp = load_cpp();
    cera_batcher_options bo = cera_batcher_default_options();
    bo.parallel = 3;
    cera_batcher* b = nullptr;
    ASSERT_EQ(cera_batcher_new(e, &bo, &b), CERA_OK) << cera_last_error();
    const char* prompts[] = {"Once upon a time", "The cat", "A little girl named"};
    std::vector<cera_request*> reqs;
    std::vector<Collected> streamed(3);
    const cera_generate_options g = greedy(24);
    for (int i = 0; i < 3; ++i) {
        const std::vector<int32_t> ids = cpp->tokenize(prompts[i], true);
        cera_request* r = nullptr;
        ASSERT_EQ(cera_batcher_submit(b, ids.data(), ids.size(), &g, collect, &streamed[size_t(i)], &r), CERA_OK)
            << cera_last_error();
        reqs.push_back(r);
    }
    for (int i = 0; i < 3; ++i) {
        cera_generation_result r;
        ASSERT_EQ(cera_request_wait(reqs[size_t(i)], &r), CERA_OK) << cera_last_error();
        EXPECT_TRUE(cera_request_done(reqs[size_t(i)]));
        const std::string alone = cpp_greedy(prompts[i], 24);
        EXPECT_EQ(std::string(r.text, r.text_len), alone) << prompts[i];
        EXPECT_EQ(streamed[size_t(i)].text, alone) << prompts[i];
        cera_request_free(reqs[size_t(i)]);
    }

    // Polling instead of a callback: the text grows at its end until the request is done.
    {
        const std::vector<int32_t> ids = cpp->tokenize("The cat", true);
        cera_request* r = nullptr;
        ASSERT_EQ(cera_batcher_submit(b, ids.data(), ids.size(), &g, nullptr, nullptr, &r), CERA_OK);
        std::string seen;
        bool done = false;
        std::vector<char> buf(4096);
        while (!done) {
            size_t len = 0;
            ASSERT_EQ(cera_request_poll(r, buf.data(), buf.size(), &len, &done), CERA_OK) << cera_last_error();
            const std::string now(buf.data(), len);
            EXPECT_EQ(now.compare(0, seen.size(), seen), 0) << "the text changed before its end";
            seen = now;
            if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        EXPECT_EQ(seen, cpp_greedy("The cat", 24));
        size_t len = 0;
        EXPECT_EQ(cera_request_poll(r, nullptr, 0, &len, nullptr), CERA_ERR_BUFFER_TOO_SMALL);
        EXPECT_EQ(len, seen.size());
        cera_request_free(r);
    }

    // A callback's false cancels its request.
    const std::vector<int32_t> ids = cpp->tokenize("Once upon a time", true);
    Collected c;
    c.stop_after = 2;
    cera_generate_options long_g = greedy(200);
    long_g.ignore_eos = true;
    cera_request* r = nullptr;
    ASSERT_EQ(cera_batcher_submit(b, ids.data(), ids.size(), &long_g, collect, &c, &r), CERA_OK);
    cera_generation_result res;
    ASSERT_EQ(cera_request_wait(r, &res), CERA_OK);
    EXPECT_EQ(res.finish, CERA_FINISH_CANCELLED);
    EXPECT_EQ(c.events, 3);
    EXPECT_LT(res.generated_tokens, 200);
    cera_request_free(r);

    // cancel() from the caller, and refusals as codes.
    ASSERT_EQ(cera_batcher_submit(b, ids.data(), ids.size(), &long_g, nullptr, nullptr, &r), CERA_OK);
    cera_request_cancel(r);
    ASSERT_EQ(cera_request_wait(r, &res), CERA_OK);
    EXPECT_EQ(res.finish, CERA_FINISH_CANCELLED);
    cera_request_free(r);
    EXPECT_EQ(cera_batcher_submit(b, ids.data(), 0, &g, nullptr, nullptr, &r), CERA_ERR_INVALID_ARGUMENT);
    cera_batcher_stats st;
    ASSERT_EQ(cera_batcher_stats_get(b, &st), CERA_OK);
    EXPECT_GT(st.steps, 0);
    cera_batcher_free(b);
    cera_engine_free(e);
}

TEST(CApi, AManualLoopOfLogitsAndSamplerGivesTheGreedyTokens) {
    cera_engine* e = load();
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    ASSERT_EQ(cera_session_append_text(s, "Once upon a time", true), CERA_OK);
    const cera_generate_options g = greedy(12);
    Collected c;
    cera_generation_result r;
    ASSERT_EQ(cera_session_generate(s, &g, collect, &c, &r), CERA_OK);

    cera_sampler* sampler = nullptr;
    ASSERT_EQ(cera_sampler_new(&g.sampling, cera_engine_info(e)->n_vocab, &sampler), CERA_OK) << cera_last_error();
    ASSERT_EQ(cera_session_reset(s), CERA_OK);
    ASSERT_EQ(cera_session_append_text(s, "Once upon a time", true), CERA_OK);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 12; ++i) {
        const float* logits = nullptr;
        ASSERT_EQ(cera_session_logits(s, &logits, nullptr), CERA_OK) << cera_last_error();
        const cera_token t = cera_sampler_sample(sampler, logits, nullptr);
        cera_sampler_accept(sampler, t);
        tokens.push_back(t);
        ASSERT_EQ(cera_session_append_tokens(s, &t, 1), CERA_OK);
    }
    EXPECT_EQ(tokens, c.tokens);
    cera_sampler_free(sampler);
    cera_sampling_params bad = g.sampling;
    bad.top_p = std::numeric_limits<float>::quiet_NaN();
    EXPECT_EQ(cera_sampler_new(&bad, 10, &sampler), CERA_ERR_INVALID_ARGUMENT);
    cera_session_free(s);
    cera_engine_free(e);
}

TEST(CApi, EngineFactsGrammarTextAndExplicitBos) {
    cera_engine* e = load();
    auto cpp = load_cpp();
    const size_t n = cera_engine_metadata_count(e);
    ASSERT_EQ(n, cpp->metadata_keys().size());
    char buf[256];
    size_t len = 0;
    ASSERT_EQ(cera_engine_metadata_key(e, 0, buf, sizeof buf, &len), CERA_OK);
    EXPECT_EQ(std::string(buf), cpp->metadata_keys()[0]);
    EXPECT_EQ(cera_engine_metadata_key(e, n, buf, sizeof buf, &len), CERA_ERR_OUT_OF_RANGE);
    EXPECT_EQ(cera_engine_fingerprint(e), cpp->fingerprint());
    cera_device_memory m;
    ASSERT_EQ(cera_engine_device_memory(e, &m), CERA_OK);
    EXPECT_EQ(m.weights, 0u);  // the CPU
    cera_prefix_cache_stats pc;
    ASSERT_EQ(cera_engine_prefix_cache_stats(e, &pc), CERA_OK);
    EXPECT_EQ(pc.stores, 0u);
    const cera_tokenizer* t = cera_engine_tokenizer(e);
    const int32_t id = cpp->tokenize("Hello", false).at(0);
    ASSERT_EQ(cera_token_bytes(t, id, buf, sizeof buf, &len), CERA_OK);
    EXPECT_EQ(std::string(buf, len), cpp->token_bytes(id));
    EXPECT_EQ(cera_token_bytes(t, -1, buf, sizeof buf, &len), CERA_ERR_OUT_OF_RANGE);

    cera_grammar* g = nullptr;
    ASSERT_EQ(cera_grammar_from_json_schema(R"({"type": "integer"})", &g), CERA_OK) << cera_last_error();
    int64_t where = 0;
    ASSERT_EQ(cera_grammar_match(g, "42", 2, &where), CERA_OK);
    EXPECT_EQ(where, -1);
    ASSERT_EQ(cera_grammar_match(g, "4x", 2, &where), CERA_OK);
    EXPECT_EQ(where, 1);
    ASSERT_EQ(cera_grammar_gbnf(g, nullptr, 0, &len), CERA_ERR_BUFFER_TOO_SMALL);
    std::vector<char> gbnf(len + 1);
    ASSERT_EQ(cera_grammar_gbnf(g, gbnf.data(), gbnf.size(), &len), CERA_OK);
    std::vector<char> converted(len + 1);
    ASSERT_EQ(cera_json_schema_to_gbnf(R"({"type": "integer"})", converted.data(), converted.size(), &len), CERA_OK);
    EXPECT_STREQ(gbnf.data(), converted.data());
    EXPECT_EQ(cera_json_schema_to_gbnf("{not json", buf, sizeof buf, &len), CERA_ERR_PARSE);
    cera_grammar_free(g);
    ASSERT_EQ(cera_grammar_json(false, &g), CERA_OK);
    cera_grammar_free(g);

    // Explicit BOS choices on an empty session.
    cera_session* s = nullptr;
    ASSERT_EQ(cera_session_new(e, 0, &s), CERA_OK);
    ASSERT_EQ(cera_session_append_text_bos(s, "Hello", false, true), CERA_OK);
    std::vector<cera_token> toks(64);
    ASSERT_EQ(cera_session_tokens(s, toks.data(), toks.size(), &len), CERA_OK);
    toks.resize(len);
    EXPECT_EQ(toks, cpp->tokenize("Hello", false));
    cera_session_free(s);

    cera_batcher* b = nullptr;
    ASSERT_EQ(cera_batcher_new(e, nullptr, &b), CERA_OK);
    EXPECT_EQ(cera_batcher_n_ctx(b), cera_engine_info(e)->n_ctx);
    cera_batcher_free(b);
    cera_engine_free(e);
}

}  // namespace
