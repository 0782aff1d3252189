// The public Grammar: parsing, JSON Schema conversion, whole-text matching, matchers per vocabulary.
#include <algorithm>

#include "chat/grammar/grammar_impl.h"
#include "chat/grammar/json_schema.h"
#include "core/check.h"

namespace cera {

Grammar::Grammar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Grammar::~Grammar() = default;

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, std::string_view root) {
    auto impl = std::make_unique<Impl>();
    impl->def = std::make_shared<const grammar::GrammarDef>(grammar::parse_gbnf(gbnf, root));
    impl->gbnf = std::string(gbnf);
    return std::make_shared<const Grammar>(std::move(impl));
}

std::shared_ptr<const Grammar> Grammar::lazy(std::string_view gbnf, std::string_view trigger) {
    if (trigger.empty()) throw_error(ErrorCode::kInvalidArgument, "a lazy grammar needs a non-empty trigger");
    auto impl = std::make_unique<Impl>();
    impl->def = std::make_shared<const grammar::GrammarDef>(grammar::parse_gbnf(gbnf, "root"));
    impl->gbnf = std::string(gbnf);
    impl->trigger = std::string(trigger);
    return std::make_shared<const Grammar>(std::move(impl));
}

std::string Grammar::json_schema_to_gbnf(std::string_view schema_json) {
    return grammar::json_schema_to_gbnf(schema_json);
}

std::shared_ptr<const Grammar> Grammar::from_json_schema(std::string_view schema_json) {
    return parse(grammar::json_schema_to_gbnf(schema_json));
}

std::shared_ptr<const Grammar> Grammar::json(bool any_value) { return parse(grammar::json_gbnf(any_value)); }

const std::string& Grammar::gbnf() const { return impl_->gbnf; }
const std::string& Grammar::trigger() const { return impl_->trigger; }

int64_t Grammar::match(std::string_view text) const {
    size_t from = 0;
    if (!impl_->trigger.empty()) {
        using Thinking = grammar::MatcherOptions::Thinking;
        if (impl_->thinking != Thinking::kNone) {  // the trigger counts after a leading thinking block
            const size_t b = std::min(text.find_first_not_of(" \t\n\r"), text.size());
            const bool opened = impl_->thinking == Thinking::kOpen || text.substr(b, 7) == "<think>";
            if (opened) {
                const size_t close = text.find("</think>", impl_->thinking == Thinking::kOpen ? 0 : b + 7);
                if (close == std::string_view::npos) return -1;
                from = close + 8;
            }
        }
        from = text.find(impl_->trigger, from);
        if (from == std::string_view::npos) return -1;
    }
    grammar::Matcher m(impl_->def);
    const size_t n = m.accept_bytes(text.substr(from));
    if (n < text.size() - from) return int64_t(from + n);
    return m.can_end() ? -1 : int64_t(text.size());
}

std::shared_ptr<grammar::PositionCache> Grammar::Impl::cache_for(
    const std::shared_ptr<const grammar::TokenTrie>& trie) const {
    std::lock_guard<std::mutex> lk(mu);
    std::erase_if(caches, [](const auto& c) { return c.first.expired(); });
    for (const auto& [t, c] : caches)
        if (t.lock() == trie) return c;
    auto c = std::make_shared<grammar::PositionCache>(def, trie);
    caches.push_back({trie, c});
    return c;
}

std::shared_ptr<const Grammar> lazy_after_thinking(const Grammar& lazy, bool in_thinking) {
    CERA_CHECK(!lazy.trigger().empty(), "lazy_after_thinking needs a lazy grammar");
    auto impl = std::make_unique<Grammar::Impl>();
    impl->def = lazy.impl().def;
    impl->gbnf = lazy.gbnf();
    impl->trigger = lazy.trigger();
    impl->thinking =
        in_thinking ? grammar::MatcherOptions::Thinking::kOpen : grammar::MatcherOptions::Thinking::kMayOpen;
    return std::make_shared<const Grammar>(std::move(impl));
}

std::unique_ptr<grammar::Matcher> make_matcher(const Grammar& g, const std::shared_ptr<const grammar::TokenTrie>& trie,
                                               const grammar::MatcherOptions& options) {
    grammar::MatcherOptions o = options;
    if (o.trigger.empty()) o.trigger = g.impl().trigger, o.thinking = g.impl().thinking;
    return std::make_unique<grammar::Matcher>(g.impl().cache_for(trie), o);
}

}  // namespace cera
