// libFuzzer target for the grammar engine. The input's first byte picks GBNF (even) or JSON Schema
// (odd); the rest is the grammar or schema, then optionally a NUL and a text. Any input must either
// throw cera::Error or give a grammar; a schema that converts must give GBNF that parses; the text
// is matched byte by byte (matching may throw cera::Error for a grammar too ambiguous), and a few token masks over a
// small vocabulary (bytes, pairs, UTF-8 pieces) are computed and followed. No crash, hang or leak.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cera/error.h"
#include "chat/grammar/gbnf.h"
#include "chat/grammar/json_schema.h"
#include "chat/grammar/matcher.h"
#include "chat/grammar/token_trie.h"

namespace {

std::shared_ptr<const cera::grammar::TokenTrie> small_vocab() {
    std::vector<std::string> pieces = {"</s>"};
    for (int b = 1; b < 256; ++b) pieces.push_back(std::string(1, char(b)));
    for (const char* p :
         {"{\"", "\":", "\",", "\"}", "[]", "true", "null", "12", "\xc3\xa9", "\xe4\xb8\xad", " \"", "ab"})
        pieces.push_back(p);
    std::vector<bool> eog(pieces.size(), false), control(pieces.size(), false);
    eog[0] = true;
    return std::make_shared<const cera::grammar::TokenTrie>(pieces, eog, control);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    static const auto trie = small_vocab();
    const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
    const size_t nul = in.find('\0');
    const std::string_view spec = in.substr(0, nul);
    const std::string_view text = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
    std::string gbnf;
    const bool schema = data[0] & 1;
    try {
        gbnf = schema ? cera::grammar::json_schema_to_gbnf(spec) : std::string(spec);
    } catch (const cera::Error&) {
        return 0;
    }
    std::shared_ptr<const cera::grammar::GrammarDef> def;
    try {
        def = std::make_shared<const cera::grammar::GrammarDef>(cera::grammar::parse_gbnf(gbnf));
    } catch (const cera::Error& e) {
        // The converter's output always parses (a grammar past the size limit aside).
        if (schema && std::string(e.what()).find("too large") == std::string::npos) __builtin_trap();
        return 0;
    }
    // Matching may throw cera::Error too: a grammar ambiguous past the matcher's bounds.
    try {
        cera::grammar::Matcher m(def);
        m.accept_bytes(text);
        (void)m.can_end();
    } catch (const cera::Error&) {
    }

    auto cache = std::make_shared<cera::grammar::PositionCache>(def, trie);
    cera::grammar::Matcher tm(cache, {.mask_cache_bytes = 1 << 16});
    try {
        for (int step = 0; step < 8 && !tm.is_dead(); ++step) {
            const uint64_t* mask = tm.mask();
            int32_t pick = -1;
            for (int32_t id = 0; id < trie->n_vocab() && pick < 0; ++id)
                if ((mask[id >> 6] >> (id & 63)) & 1) pick = id;
            if (pick < 0) break;
            if (!tm.accept_token(pick)) __builtin_trap();  // a token of the mask is always accepted
            if (pick == 0) break;
        }
    } catch (const cera::Error&) {
    }
    return 0;
}
