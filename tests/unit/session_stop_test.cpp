// Stop strings in streamed text: held back while they may start, never emitted past.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "runtime/session_stop.h"

namespace cera {
namespace {

TEST(StopMatcher, NoStopsReleasesEverything) {
    StopMatcher m({});
    std::string out;
    EXPECT_FALSE(m.feed("hello ", out));
    EXPECT_FALSE(m.feed("world", out));
    EXPECT_EQ(out, "hello world");
    EXPECT_EQ(m.held(), 0u);
}

TEST(StopMatcher, HoldsAPossiblePrefixThenReleasesIt) {
    StopMatcher m({"END"});
    std::string out;
    EXPECT_FALSE(m.feed("abc E", out));
    EXPECT_EQ(out, "abc ");
    EXPECT_FALSE(m.feed("N", out));
    EXPECT_EQ(out, "abc ");
    EXPECT_EQ(m.held(), 2u);
    EXPECT_FALSE(m.feed("X", out));  // "ENX" cannot become "END"
    EXPECT_EQ(out, "abc ENX");
    EXPECT_TRUE(m.feed(" then END and more", out));
    EXPECT_EQ(out, "abc ENX then ");
    EXPECT_EQ(m.matched(), "END");
    EXPECT_TRUE(m.feed("ignored", out));  // nothing after a stop
    m.finish(out);
    EXPECT_EQ(out, "abc ENX then ");
}

TEST(StopMatcher, StopAcrossSingleCharacterPieces) {
    StopMatcher m({"<|end|>"});
    std::string out;
    const std::string text = "hello world<|end|>more";
    bool stopped = false;
    for (char c : text) {
        stopped = m.feed(std::string(1, c), out);
        EXPECT_TRUE(std::string("hello world").rfind(out, 0) == 0) << out;  // always a prefix of the answer
        if (stopped) break;
    }
    EXPECT_TRUE(stopped);
    EXPECT_EQ(out, "hello world");
}

TEST(StopMatcher, FirstStopToCompleteWins) {
    StopMatcher m({"c", "b c"});  // both end at the same byte: the longer one starts earlier
    std::string out;
    EXPECT_TRUE(m.feed("a b c", out));
    EXPECT_EQ(out, "a ");
    EXPECT_EQ(m.matched(), "b c");
    StopMatcher n({"bca", "c"});  // "c" completes before "bca" could
    std::string out2;
    EXPECT_TRUE(n.feed("xbca", out2));
    EXPECT_EQ(out2, "xb");
    EXPECT_EQ(n.matched(), "c");
}

TEST(StopMatcher, OverlappingPrefixes) {
    StopMatcher m({"aab"});
    std::string out;
    EXPECT_FALSE(m.feed("aa", out));
    EXPECT_EQ(out, "");
    EXPECT_FALSE(m.feed("a", out));
    EXPECT_EQ(out, "a");
    EXPECT_TRUE(m.feed("b", out));
    EXPECT_EQ(out, "a");
}

TEST(StopMatcher, FinishReleasesHeldText) {
    StopMatcher m({"xyz"});
    std::string out;
    EXPECT_FALSE(m.feed("abx", out));
    EXPECT_EQ(out, "ab");
    m.finish(out);
    EXPECT_EQ(out, "abx");
}

TEST(StopMatcher, NeverSplitsAUtf8Character) {
    StopMatcher m({"\xa9z"});  // a stop string that starts with a continuation byte
    std::string out;
    EXPECT_FALSE(m.feed("caf\xc3\xa9", out));  // "café": the é must not be split
    EXPECT_EQ(out, "caf");
    EXPECT_FALSE(m.feed("!", out));
    EXPECT_EQ(out, "caf\xc3\xa9!");
}

// Random texts over a tiny alphabet, random stop strings, random piece boundaries:
// the streamed output equals the text up to the earliest stop, is a prefix of it at
// every step, and holds back less than the longest stop string.
TEST(StopMatcher, RandomStreamsMatchReference) {
    std::mt19937 g(5);
    auto rand_str = [&](int lo, int hi) {
        std::string s(size_t(std::uniform_int_distribution<int>(lo, hi)(g)), 'a');
        for (auto& c : s) c = char('a' + std::uniform_int_distribution<int>(0, 2)(g));
        return s;
    };
    for (int iter = 0; iter < 2000; ++iter) {
        const std::string text = rand_str(0, 30);
        std::vector<std::string> stops;
        const int n_stops = std::uniform_int_distribution<int>(0, 3)(g);
        size_t longest = 0;
        for (int i = 0; i < n_stops; ++i) {
            stops.push_back(rand_str(1, 4));
            longest = std::max(longest, stops.back().size());
        }
        // The first stop string to complete (ending at the smallest e), the longest of those ending at e.
        size_t cut = text.size();
        for (size_t e = 1; e <= text.size() && cut == text.size(); ++e)
            for (const auto& s : stops)
                if (s.size() <= e && text.compare(e - s.size(), s.size(), s) == 0) cut = std::min(cut, e - s.size());
        const std::string want = text.substr(0, cut);

        StopMatcher m(stops);
        std::string out;
        size_t fed = 0;
        bool stopped = false;
        while (fed < text.size() && !stopped) {
            const size_t n = std::min(text.size() - fed, size_t(std::uniform_int_distribution<int>(1, 4)(g)));
            stopped = m.feed(std::string_view(text).substr(fed, n), out);
            fed += n;
            ASSERT_EQ(want.rfind(out, 0), 0u) << "emitted past a stop: text '" << text << "' out '" << out << "' want '" << want << "' stops " << ::testing::PrintToString(stops);
            if (!stopped && longest > 0) {
                ASSERT_LE(fed - out.size(), longest - 1) << text;
            }
        }
        m.finish(out);
        ASSERT_EQ(out, want) << "text '" << text << "'";
        ASSERT_EQ(stopped, cut < text.size());
    }
}

}  // namespace
}  // namespace cera
