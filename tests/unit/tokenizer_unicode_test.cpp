// Unicode helpers under the tokenizers: categories (utf8proc), the GPT-2 byte map, llama.cpp-style
// UTF-8 decoding, strict validation, and NFC. Expected values are Unicode facts (UnicodeData.txt,
// PropList.txt White_Space, NFC as computed by Python's unicodedata).
#include <gtest/gtest.h>

#include <set>

#include "core/utf8.h"
#include "tokenizer/unicode.h"

namespace cera::unicode {
namespace {

TEST(TokenizerUnicode, Categories) {
    EXPECT_EQ(cp_flags('A'), kLetter);
    EXPECT_EQ(cp_flags(0xE9), kLetter);            // é
    EXPECT_EQ(cp_flags(0x4E2D), kLetter);          // 中
    EXPECT_EQ(cp_flags('7'), kNumber);
    EXPECT_EQ(cp_flags(0x0663), kNumber);          // Arabic-Indic three (Nd)
    EXPECT_EQ(cp_flags(0x216B), kNumber);          // Roman numeral twelve (Nl)
    EXPECT_EQ(cp_flags(0xB2), kNumber);            // superscript two (No)
    EXPECT_EQ(cp_flags(0x0301), kMark);            // combining acute
    EXPECT_EQ(cp_flags(0x20AC), kSymbol);          // €
    EXPECT_EQ(cp_flags(0x1F600), kSymbol);         // 😀
    EXPECT_EQ(cp_flags(0xAB), kPunctuation);       // «
    EXPECT_EQ(cp_flags('_'), kPunctuation);
    EXPECT_EQ(cp_flags('$'), kSymbol);
    EXPECT_EQ(cp_flags(' '), kSeparator | kWhitespace);
    EXPECT_EQ(cp_flags(0xA0), kSeparator | kWhitespace);   // no-break space
    EXPECT_EQ(cp_flags(0x3000), kSeparator | kWhitespace); // ideographic space
    EXPECT_EQ(cp_flags(0x2029), kSeparator | kWhitespace); // paragraph separator
    EXPECT_EQ(cp_flags('\n'), kControl | kWhitespace);
    EXPECT_EQ(cp_flags(0x85), kControl | kWhitespace);     // next line
    EXPECT_EQ(cp_flags(0x1C), kControl);                   // file separator: not White_Space
    EXPECT_EQ(cp_flags(0x200B), kControl);                 // zero width space is Cf, not White_Space
    EXPECT_EQ(cp_flags(0xE000), kControl);                 // private use
    EXPECT_EQ(cp_flags(0x0378), 0);                        // unassigned
    EXPECT_EQ(cp_flags(0x110000), 0);
    EXPECT_EQ(to_lower('Q'), uint32_t('q'));
    EXPECT_EQ(to_lower(0x0130), 0x69u);  // İ -> i
    EXPECT_EQ(to_lower(0x0416), 0x0436u);
}

TEST(TokenizerUnicode, Gpt2ByteMap) {
    std::set<std::string> seen;
    for (int b = 0; b < 256; ++b) {
        const std::string s(byte_to_unicode(uint8_t(b)));
        seen.insert(s);
        const auto cps = decode_utf8(s);
        ASSERT_EQ(cps.size(), 1u);
        EXPECT_EQ(unicode_to_byte(cps[0]), b);
        const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (printable) {
            EXPECT_EQ(cps[0], uint32_t(b));
        }
    }
    EXPECT_EQ(seen.size(), 256u);
    EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // Ġ
    EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // Ċ
    EXPECT_EQ(byte_to_unicode(0), "\xC4\x80");     // Ā
    EXPECT_EQ(unicode_to_byte('a'), 'a');
    EXPECT_EQ(unicode_to_byte(0x4E2D), -1);
}

TEST(TokenizerUnicode, DecodeLikeLlamaCpp) {
    std::vector<uint32_t> cps;
    EXPECT_TRUE(decode_utf8("a\xC3\xA9\xF0\x9F\x98\x80", cps));
    EXPECT_EQ(cps, (std::vector<uint32_t>{'a', 0xE9, 0x1F600}));
    EXPECT_FALSE(decode_utf8("a\xFF" "b", cps));
    EXPECT_EQ(cps, (std::vector<uint32_t>{'a', kReplacement, 'b'}));
    EXPECT_FALSE(decode_utf8("\xE2\x82", cps));  // truncated: each byte on its own
    EXPECT_EQ(cps, (std::vector<uint32_t>{kReplacement, kReplacement}));
    EXPECT_FALSE(decode_utf8("\xC0\x80", cps));  // overlong: decodes, but is not clean
    EXPECT_EQ(cps, (std::vector<uint32_t>{0}));
}

TEST(TokenizerUnicode, StrictValidation) {
    EXPECT_TRUE(utf8::is_valid("plain \xE2\x82\xAC \xF0\x9F\x98\x80"));
    EXPECT_FALSE(utf8::is_valid("\xC0\xAF"));          // overlong
    EXPECT_FALSE(utf8::is_valid("\xED\xA0\x80"));      // surrogate
    EXPECT_FALSE(utf8::is_valid("\xF4\x90\x80\x80"));  // above U+10FFFF
    EXPECT_EQ(utf8::valid_prefix("ab\xE2\x82"), 2u);
}

TEST(TokenizerUnicode, Nfc) {
    EXPECT_EQ(nfc("e\xCC\x81"), "\xC3\xA9");
    EXPECT_EQ(nfc("cafe\xCC\x81 ok"), "caf\xC3\xA9 ok");
    EXPECT_EQ(nfc("\xEF\xA4\x80"), "\xE8\xB1\x88");                      // U+F900 -> U+8C48
    EXPECT_EQ(nfc("\xE1\x84\x80\xE1\x85\xA1"), "\xEA\xB0\x80");          // jamo -> 가
    EXPECT_EQ(nfc("a\xCC\x88\xCC\xA3"), "\xE1\xBA\xA1\xCC\x88");         // reorder, then compose
    EXPECT_EQ(nfc("A\xCC\x8A\xE2\x84\xAB"), "\xC3\x85\xC3\x85");         // Å twice (U+212B is a singleton)
    EXPECT_EQ(nfc("\xEF\xBC\xA1"), "\xEF\xBC\xA1");                      // fullwidth A: compatibility only
    EXPECT_EQ(nfc("already \xC3\xA9 NFC \xE4\xB8\xAD"), "already \xC3\xA9 NFC \xE4\xB8\xAD");
    EXPECT_EQ(nfc("bad \xFF byte"), "bad \xFF byte");                    // invalid input is left alone
}

}  // namespace
}  // namespace cera::unicode
