// Grammar::Impl and the bridge from a public Grammar to matchers over a vocabulary (not a public header).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cera/grammar.h"
#include "chat/grammar/matcher.h"

namespace cera {

struct Grammar::Impl {
    std::string gbnf;
    std::string trigger;  // a lazy grammar's trigger, or empty
    grammar::MatcherOptions::Thinking thinking = grammar::MatcherOptions::Thinking::kNone;  // lazy: see there
    std::shared_ptr<const grammar::GrammarDef> def;
    // One position cache per vocabulary this grammar was used with.
    mutable std::mutex mu;
    mutable std::vector<std::pair<std::weak_ptr<const grammar::TokenTrie>, std::shared_ptr<grammar::PositionCache>>>
        caches;

    // The position cache for `trie` (made on first use; shared by every matcher of this grammar on it).
    std::shared_ptr<grammar::PositionCache> cache_for(const std::shared_ptr<const grammar::TokenTrie>& trie) const;
};

// Lazy grammar `lazy` whose trigger counts only after a thinking block at the start of the reply
// (in_thinking: the reply starts inside one), MatcherOptions::thinking.
std::shared_ptr<const Grammar> lazy_after_thinking(const Grammar& lazy, bool in_thinking);

// A matcher of `g` over `trie`'s vocabulary.
std::unique_ptr<grammar::Matcher> make_matcher(const Grammar& g, const std::shared_ptr<const grammar::TokenTrie>& trie,
                                               const grammar::MatcherOptions& options = {});

}  // namespace cera
