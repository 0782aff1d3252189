// Session state save/load (buffer and file) and cancellation on the bundled model:
// a restored session continues exactly like the original; files of another model or KV
// type, corrupt and truncated files are rejected with a clear error and leave the session
// unchanged; cancel() stops a long prefill at a chunk boundary and a decode at a token, and
// the session then continues exactly like an uncancelled one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "runtime/state_io.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kModel = cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");

std::shared_ptr<cera::Engine> engine(cera::KvCacheType kv = cera::KvCacheType::kF32, int32_t n_batch = 512) {
    cera::EngineOptions o;
    o.device = "cpu";
    o.threads = 1;
    o.kv_type_k = o.kv_type_v = kv;
    o.n_batch = n_batch;
    return cera::Engine::load(kModel, o);
}

cera::GenerateOptions greedy(int32_t n) {
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = n;
    g.ignore_eos = true;
    return g;
}

std::string temp_path(const std::string& name) {
    return (fs::temp_directory_path() / ("cera_state_" + std::to_string(::getpid()) + "_" + name)).string();
}

// A long prompt: the same sentences repeated to about n tokens.
std::string long_text(const cera::Engine& e, size_t n) {
    std::string text;
    while (e.tokenize(text, true).size() < n) text += "The little dog ran to the park and saw a big red ball. ";
    return text;
}

TEST(SessionState, RestoredSessionContinuesExactly) {
    auto e = engine();
    cera::Session a(e);
    a.append_text("Once upon a time, there was a little");
    cera::NullSink sink;
    a.generate(greedy(8), sink);
    const std::vector<uint8_t> saved = a.save_state();
    const std::vector<int32_t> tokens_at_save = a.tokens();
    const std::string rest_a = a.generate(greedy(24), sink).text;

    cera::Session b(e);
    b.load_state(saved);
    EXPECT_EQ(b.tokens(), tokens_at_save);
    EXPECT_EQ(b.n_evaluated(), a.n_evaluated() - 24);  // the last sampled token was queued at save time
    EXPECT_EQ(b.generate(greedy(24), sink).text, rest_a);
    EXPECT_EQ(b.tokens(), a.tokens());

    // Through a file, into a session on another engine of the same model.
    const std::string path = temp_path("roundtrip.bin");
    cera::Session c(e);
    c.append_text("Once upon a time, there was a little");
    c.generate(greedy(8), sink);
    c.save_state_file(path);
    cera::Session d(engine());
    d.load_state_file(path);
    EXPECT_EQ(d.generate(greedy(24), sink).text, rest_a);
    fs::remove(path);
}

TEST(SessionState, QueuedTokensAndLogitsAreSaved) {
    auto e = engine();
    cera::Session a(e);
    a.append_text("Once upon a time");
    cera::NullSink sink;
    a.generate(greedy(0), sink);  // prefill only
    a.append_text(", there was");  // queued, not evaluated
    const auto bytes = a.save_state();
    cera::Session b(e);
    b.load_state(bytes);
    EXPECT_EQ(b.tokens(), a.tokens());
    EXPECT_EQ(b.n_evaluated(), a.n_evaluated());
    EXPECT_LT(b.n_evaluated(), b.position());
    EXPECT_EQ(b.generate(greedy(16), sink).text, a.generate(greedy(16), sink).text);

    const cera::SessionSnapshot s = cera::decode_state(bytes, {e->fingerprint(), 0, e->info().n_vocab});
    EXPECT_EQ(s.logits.size(), size_t(e->info().n_vocab));
}

void expect_rejected(cera::Session& s, std::span<const uint8_t> bytes, const std::string& what) {
    const std::vector<int32_t> before = s.tokens();
    const std::vector<uint8_t> state_before = s.save_state();
    try {
        s.load_state(bytes);
        FAIL() << "accepted: " << what;
    } catch (const cera::Error& err) {
        EXPECT_EQ(err.code(), cera::ErrorCode::kInvalidFile) << what;
        EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
    EXPECT_EQ(s.tokens(), before);
    EXPECT_EQ(s.save_state(), state_before);
}

TEST(SessionState, MismatchedAndDamagedStatesAreRejected) {
    auto e = engine();
    cera::Session a(e);
    a.append_text("Once upon a time");
    cera::NullSink sink;
    a.generate(greedy(4), sink);
    const std::vector<uint8_t> good = a.save_state();

    cera::Session target(e);
    target.append_text("Hello");
    target.generate(greedy(2), sink);

    // Another KV type.
    cera::Session f16(engine(cera::KvCacheType::kF16));
    expect_rejected(f16, good, "KV cache type f32");
    // Another model.
    cera::Session other(cera::Engine::load(cera::test::source_path("models/stories260K.gguf"), {.device = "cpu"}));
    expect_rejected(other, good, "different model");
    // A flipped payload byte, a flipped header byte, truncation, bad magic, nothing.
    std::vector<uint8_t> bad = good;
    bad[bad.size() / 2] ^= 0x40;
    expect_rejected(target, bad, "checksum");
    bad = good;
    bad[20] ^= 1;
    expect_rejected(target, bad, "corrupt header");
    bad.assign(good.begin(), good.begin() + std::ptrdiff_t(good.size() - 100));
    expect_rejected(target, bad, "truncated");
    bad = good;
    bad[0] = 'X';
    expect_rejected(target, bad, "bad magic");
    expect_rejected(target, std::span<const uint8_t>(), "shorter than its header");

    // A state longer than the context of the loading session.
    cera::Session small(e, 4);
    try {
        small.load_state(good);
        FAIL();
    } catch (const cera::Error& err) {
        EXPECT_EQ(err.code(), cera::ErrorCode::kOutOfRange);
    }
    EXPECT_THROW(target.load_state_file(temp_path("does_not_exist")), cera::Error);
}

TEST(SessionState, TruncateRewindsAndRecomputes) {
    auto e = engine();
    cera::NullSink sink;
    cera::Session a(e);
    a.append_text("Once upon a time, there was a little");
    const int32_t n_prompt = a.position();
    const std::string first = a.generate(greedy(12), sink).text;
    a.truncate(n_prompt);  // LFM2 has conv state: the prompt is queued again
    EXPECT_EQ(a.position(), n_prompt);
    EXPECT_EQ(a.generate(greedy(12), sink).text, first);
    EXPECT_THROW(a.truncate(a.position() + 1), cera::Error);

    // An attention-only model rewinds its KV cache in place.
    auto llama = cera::Engine::load(cera::test::source_path("models/stories260K.gguf"), {.device = "cpu"});
    cera::Session b(llama);
    b.append_text("Once upon a time");
    const int32_t n = b.position();
    const std::string text = b.generate(greedy(12), sink).text;
    b.truncate(n);
    EXPECT_EQ(b.n_evaluated(), n);
    const int32_t last = b.tokens()[size_t(n - 1)];
    b.truncate(n - 1);
    EXPECT_EQ(b.n_evaluated(), n - 1);
    b.append_tokens(std::vector<int32_t>{last});
    EXPECT_EQ(b.generate(greedy(12), sink).text, text);
}

// cancel() from another thread during a long prefill stops it at a chunk boundary; the next
// generate() resumes the prefill and the result equals an uncancelled run.
TEST(SessionCancel, LongPrefillFromAnotherThread) {
    constexpr int32_t kBatch = 32;
    auto e = engine(cera::KvCacheType::kF32, kBatch);
    const std::string prompt = long_text(*e, 1000);
    cera::NullSink sink;

    cera::Session ref(e);
    ref.append_text(prompt);
    const auto t0 = std::chrono::steady_clock::now();
    const cera::GenerationResult want = ref.generate(greedy(16), sink);
    const double prefill_ms = want.prefill_seconds * 1e3;
    std::printf("[ bench    ] prefill of %d tokens in %.1f ms (total %.1f ms)\n", want.prompt_tokens, prefill_ms,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());

    cera::Session s(e);
    s.append_text(prompt);
    std::thread canceller([&] {
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(prefill_ms / 4));
        s.cancel();
    });
    const cera::GenerationResult r = s.generate(greedy(16), sink);
    canceller.join();
    ASSERT_EQ(r.finish, cera::FinishReason::kCancelled) << "the prefill ended before the cancel";
    EXPECT_EQ(r.generated_tokens, 0);
    EXPECT_GT(s.n_evaluated(), 0);
    EXPECT_LT(s.n_evaluated(), s.position());
    EXPECT_EQ(s.n_evaluated() % kBatch, 0) << "stopped inside a chunk";

    const cera::GenerationResult rest = s.generate(greedy(16), sink);
    EXPECT_EQ(rest.text, want.text);
    EXPECT_EQ(s.tokens(), ref.tokens());
}

// A Sink that cancels its session after n tokens: the decode stops at the next token.
class CancelAfter : public cera::Sink {
   public:
    CancelAfter(cera::Session& s, int n) : s_(s), n_(n) {}
    void on_text(std::string_view) override {}
    void on_token(int32_t) override {
        if (++seen_ == n_) s_.cancel();
    }

   private:
    cera::Session& s_;
    int n_, seen_ = 0;
};

TEST(SessionCancel, DecodeStopsWithinOneTokenAndContinues) {
    auto e = engine();
    cera::NullSink null;
    cera::Session ref(e);
    ref.append_text("Once upon a time");
    ref.generate(greedy(20), null);

    cera::Session s(e);
    s.append_text("Once upon a time");
    CancelAfter sink(s, 5);
    const cera::GenerationResult r = s.generate(greedy(20), sink);
    EXPECT_EQ(r.finish, cera::FinishReason::kCancelled);
    EXPECT_EQ(r.generated_tokens, 5);
    s.generate(greedy(15), null);
    EXPECT_EQ(s.tokens(), ref.tokens());
}

}  // namespace
