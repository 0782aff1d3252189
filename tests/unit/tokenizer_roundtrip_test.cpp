// Round trips and the streaming detokenizer: decode(encode(x)) == x over a Unicode corpus on every
// byte-level vocabulary (and the SPM ones, which fall back to byte tokens), and the streaming
// output is valid UTF-8 after every token and adds up to decode().
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/utf8.h"
#include "gguf/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace cera {
namespace {

std::vector<std::string> corpus() {
    std::vector<std::string> c = {
        "Hello world",
        " leading space and trailing space ",
        "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82 \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"
        "\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88 \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4",  // CJK
        // family (ZWJ sequence), flags, skin tone, keycap
        "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7\xE2\x80\x8D\xF0\x9F\x91\xA6 "
        "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7\xF0\x9F\x87\xAF\xF0\x9F\x87\xB5 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD 1\xEF\xB8\x8F\xE2\x83\xA3",
        // combining marks: e + U+0301, a + U+0308 + U+0323, Devanagari, Thai
        "e\xCC\x81 a\xCC\x88\xCC\xA3 \xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 "
        "\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5",
        // right-to-left: Hebrew and Arabic, with a directional mark
        "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D \xD8\xA7\xD9\x84\xD8\xB3\xD9\x84\xD8\xA7\xD9\x85 \xE2\x80\x8F(123)",
        std::string("control \x01\x02\x1b[0m\x7f and NUL ", 22) + std::string(1, '\0') + " end",
        "tabs\t\tand\r\nwindows\r\nlines",
        std::string(300, ' ') + "x" + std::string(77, '\n') + "y" + std::string(5, '\t') + std::string(9, ' '),
        "\n\n\n",
        "   ",
        "numbers 1234567890 3.14159 1,000,000 \xD9\xA1\xD9\xA2\xD9\xA3 \xE2\x85\xA0\xE2\x85\xA1",
        "contractions: I'm, you're, they've, it's, we'll, he'd, DON'T, Y'ALL",
        "code: for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; } // <tag attr=\"v\"> $HOME ~/.rc",
        "mixed\xC2\xA0nbsp\xE2\x80\x83" "em-space\xE3\x80\x80ideographic\xE2\x80\xA8line-sep",
        "math \xE2\x88\x91\xE2\x88\xAB\xE2\x88\x9E \xF0\x9D\x90\x80\xF0\x9D\x90\x81 and private use \xEE\x80\x80 and "
        "unassigned \xF0\xB0\x80\x80\xF3\xA0\x80\x81",
        "\xCE\x91\xCE\xB8\xCE\xAE\xCE\xBD\xCE\xB1 \xD0\x9C\xD0\xBE\xD1\x81\xD0\xBA\xD0\xB2\xD0\xB0 \xC5\x81\xC3\xB3\xC5\xBA",
        "",
    };
    // Every recorded fixture story too.
    std::istringstream lines(test::read_text(test::data_path("fixtures/tokenizer/corpus_sample.jsonl")));
    std::string line;
    int n = 0;
    while (std::getline(lines, line) && n < 10) {
        if (line.empty()) continue;
        const auto j = nlohmann::json::parse(line);
        c.push_back(j.is_string() ? j.get<std::string>() : j.value("text", ""));
        ++n;
    }
    return c;
}

void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::string& want,
                  const std::string& name) {
    StreamingDetokenizer d(tok);
    std::string acc;
    for (size_t i = 0; i < ids.size(); ++i) {
        const std::string part = d.push(ids[i]);
        ASSERT_TRUE(utf8::is_valid(part)) << name << ": invalid UTF-8 after token " << i;
        acc += part;
        ASSERT_EQ(want.compare(0, acc.size(), acc), 0) << name << ": stream is not a prefix after token " << i;
    }
    acc += d.flush();
    EXPECT_EQ(acc, want) << name;
}

void roundtrip(const std::string& rel) {
    auto f = gguf::File::open(test::data_path(rel));
    auto tok = Tokenizer::from_gguf(*f);
    int ok = 0, n = 0;
    for (const std::string& text : corpus()) {
        ASSERT_TRUE(utf8::is_valid(text));
        const auto ids = tok->encode(text, false, false);
        const std::string back = tok->decode(ids);
        EXPECT_EQ(back, text) << rel;
        ok += back == text;
        ++n;
        check_stream(*tok, ids, text, rel);
        // With BOS: the stream and decode skip the control token.
        const auto with_bos = tok->encode(text, true, false);
        EXPECT_EQ(tok->decode(with_bos), text) << rel;
    }
    std::printf("[roundtrip] %-44s %d/%d\n", rel.c_str(), ok, n);
}

TEST(TokenizerRoundTrip, Gpt2) { roundtrip("vocab/ggml-vocab-gpt-2.gguf"); }
TEST(TokenizerRoundTrip, Qwen2) { roundtrip("vocab-extra/qwen3-vocab-qwen2.gguf"); }
TEST(TokenizerRoundTrip, Llama3) { roundtrip("vocab-extra/gpt2-vocab-llama3.gguf"); }
TEST(TokenizerRoundTrip, Lfm2) { roundtrip("vocab-extra/gpt2-vocab-lfm2.gguf"); }
TEST(TokenizerRoundTrip, DeepseekLlm) { roundtrip("vocab/ggml-vocab-deepseek-llm.gguf"); }
TEST(TokenizerRoundTrip, DeepseekCoder) { roundtrip("vocab/ggml-vocab-deepseek-coder.gguf"); }
TEST(TokenizerRoundTrip, Falcon) { roundtrip("vocab/ggml-vocab-falcon.gguf"); }
TEST(TokenizerRoundTrip, Starcoder) { roundtrip("vocab/ggml-vocab-starcoder.gguf"); }
TEST(TokenizerRoundTrip, Mpt) { roundtrip("vocab/ggml-vocab-mpt.gguf"); }
TEST(TokenizerRoundTrip, FixtureLfm2) { roundtrip("fixtures/tiny-lfm2/model.gguf"); }
TEST(TokenizerRoundTrip, LlamaSpm) { roundtrip("vocab/ggml-vocab-llama-spm.gguf"); }

// SPM pieces: '▁' renders as a space, byte tokens as bytes, a character split over byte tokens
// is held until complete, and broken sequences become U+FFFD only when they cannot complete.
TEST(TokenizerStream, BytesAndReplacement) {
    auto f = gguf::File::open(test::data_path("vocab/ggml-vocab-llama-spm.gguf"));
    auto tok = Tokenizer::from_gguf(*f);
    auto byte = [&](int b) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
        return *tok->find_token(hex);
    };
    StreamingDetokenizer d(*tok);
    // "▁Hello" first: the space prefix is removed from the first piece.
    EXPECT_EQ(d.push(*tok->find_token("\xE2\x96\x81Hello")), "Hello");
    EXPECT_EQ(d.push(*tok->find_token("\xE2\x96\x81world")), " world");
    // U+1F600 as four byte tokens: nothing until the last one.
    EXPECT_EQ(d.push(byte(0xF0)), "");
    EXPECT_EQ(d.push(byte(0x9F)), "");
    EXPECT_EQ(d.push(byte(0x98)), "");
    EXPECT_EQ(d.push(byte(0x80)), "\xF0\x9F\x98\x80");
    // A lead byte followed by ASCII can never complete: U+FFFD, then the ASCII.
    EXPECT_EQ(d.push(byte(0xE2)), "");
    EXPECT_EQ(d.push(byte('A')), "\xEF\xBF\xBD" "A");
    // A stray continuation byte and 0xFF are invalid at once.
    EXPECT_EQ(d.push(byte(0x80)), "\xEF\xBF\xBD");
    EXPECT_EQ(d.push(byte(0xFF)), "\xEF\xBF\xBD");
    // An unfinished character at the end becomes U+FFFD in flush(), not before.
    EXPECT_EQ(d.push(byte(0xE4)), "");
    EXPECT_EQ(d.push(byte(0xBD)), "");
    EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
    // After flush a new stream starts (the space prefix rule applies again).
    EXPECT_EQ(d.push(*tok->find_token("\xE2\x96\x81Hi")), "Hi");
    // Control tokens render as nothing by default, as their text when asked.
    EXPECT_EQ(d.push(tok->eos()), "");
    StreamingDetokenizer special(*tok, true);
    EXPECT_EQ(special.push(tok->bos()), "<s>");
    EXPECT_EQ(tok->decode(std::vector<int32_t>{tok->bos(), *tok->find_token("\xE2\x96\x81Hi")}, true), "<s>Hi");
}

TEST(TokenizerStream, TakeValidUtf8) {
    // Overlong, surrogate and out-of-range forms are invalid; each maximal bad subpart is one U+FFFD.
    std::string s = "a\xC0\xAF" "b\xED\xA0\x80" "c\xF4\x90\x80\x80" "d\xE2\x82";
    const std::string out = take_valid_utf8(s, false);
    EXPECT_EQ(out, "a\xEF\xBF\xBD\xEF\xBF\xBD" "b\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
                   "c\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "d");
    EXPECT_EQ(s, "\xE2\x82");  // held: may still complete
    s += "\xAC";
    EXPECT_EQ(take_valid_utf8(s, false), "\xE2\x82\xAC");
    EXPECT_TRUE(s.empty());
}

// Every prefix of a multi-byte-heavy text, streamed token by token on an SPM vocabulary where
// characters split into byte tokens.
TEST(TokenizerStream, EveryPrefixValid) {
    auto f = gguf::File::open(test::data_path("vocab/ggml-vocab-llama-spm.gguf"));
    auto tok = Tokenizer::from_gguf(*f);
    const std::string text = "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x87\xAB"
                             "\xF0\x9F\x87\xB7 \xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D e\xCC\x81";
    const auto ids = tok->encode(text, true, false);
    for (size_t k = 0; k <= ids.size(); ++k) {
        StreamingDetokenizer d(*tok);
        std::string acc;
        for (size_t i = 0; i < k; ++i) acc += d.push(ids[i]);
        ASSERT_TRUE(utf8::is_valid(acc)) << "prefix " << k;
        acc += d.flush();
        ASSERT_TRUE(utf8::is_valid(acc)) << "prefix " << k;
    }
}

// encode and decode are const and may run on several threads at once (per-thread scratch and caches).
TEST(TokenizerThreads, ConcurrentEncodeMatchesSerial) {
    auto f = gguf::File::open(test::data_path("vocab-extra/qwen3-vocab-qwen2.gguf"));
    auto tok = Tokenizer::from_gguf(*f);
    const auto texts = corpus();
    std::vector<std::vector<int32_t>> want;
    for (const auto& t : texts) want.push_back(tok->encode(t, true, true));
    std::vector<int> bad(4, 0);
    std::vector<std::thread> threads;
    for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&, k] {
            for (int rep = 0; rep < 3; ++rep) {
                for (size_t i = 0; i < texts.size(); ++i) {
                    const size_t j = (i + size_t(k)) % texts.size();
                    if (tok->encode(texts[j], true, true) != want[j]) ++bad[size_t(k)];
                    if (tok->decode(want[j]) != texts[j]) ++bad[size_t(k)];
                }
            }
        });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(bad, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace cera
