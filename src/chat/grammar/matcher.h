// Matcher: where a text is in a grammar, and which tokens may come next.
//
// The state is a set of stacks (a pushdown automaton's configurations, all at once): each stack is a
// grammar position whose element is a character class, above the return positions of the rules it
// is inside. Stacks are interned nodes (position, parent), so stacks that share their lower part
// share it in memory, and a stack is a number. The text is matched byte by byte: a code point split
// across bytes (or tokens) is carried as a partial UTF-8 value, and at each partial byte only the
// stacks whose class can still hold a completion survive.
//
// The mask of allowed tokens comes from three layers:
//  - per stack top (shared by every matcher of one grammar and vocabulary, PositionCache): a walk of
//    the token trie from the stack's top few frames alone, with the frames below cut off, sorts each
//    token into accepted (it matches within those frames, whatever lies below), rejected, or
//    uncertain (it runs past them, so the answer depends on the rest of the stack); frames are keyed
//    by the first position of the same future (GrammarDef::same_as), and a frame in rung k of a
//    bounded repetition takes the tokens of fewer than k code points from its loop's entry (Rule::loop),
//    walking only the longer ones;
//  - per state: the union over its stacks of the accepted tokens, plus the uncertain ones whose rest,
//    past the place where they leave the top frames, matches from the stack below (the entry groups
//    them by rest, so each distinct rest is checked once); the result is cached per state;
//  - a state in the middle of a code point walks the whole trie from the state instead.
// A walk settles a trie subtree in one step when a stack on the way can take all of it: its class
// holds every byte of the subtree (TokenTrie::Subtree) and its run (how many code points of its
// class it can take in a row, through successors whose classes hold its own) is at least the
// subtree's longest path. Inside a JSON string that skips all but the few subtrees that hold a quote,
// a backslash or a control character.
// End-of-generation tokens are allowed exactly when the text so far is a complete match; when it is
// complete and nothing may follow, they are the only ones.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/token_trie.h"

namespace cera::grammar {

// The token classification of stack tops for one grammar and vocabulary (see above). An entry is
// keyed by the positions of a stack's top frames (kTopFrames of them, fewer when the stack is that
// short, which makes the entry exact). Filled lazily by the matchers that use it; thread-safe.
class PositionCache {
 public:
    static constexpr size_t kTopFrames = 3;
    struct Entry {
        std::vector<int32_t> accepted;        // sparse form, when few
        std::vector<uint64_t> accepted_bits;  // dense form, when many ([n_vocab / 64] words)
        // Tokens that leave the frames (uncertain), grouped by what must follow: past the place where
        // they leave, the rest must match from the stack below the frames. Group g: the rest is
        // rests[rest_at[g], rest_at[g + 1]), the tokens left[left_at[g], left_at[g + 1]). A token that
        // can leave at several places is in several groups.
        std::string rests;
        std::vector<uint32_t> rest_at, left_at;
        std::vector<int32_t> left;
        size_t groups() const { return rest_at.empty() ? 0 : rest_at.size() - 1; }
    };
    PositionCache(std::shared_ptr<const GrammarDef> def, std::shared_ptr<const TokenTrie> trie)
        : def_(std::move(def)), trie_(std::move(trie)) {}

    const GrammarDef& def() const { return *def_; }
    const TokenTrie& trie() const { return *trie_; }
    std::shared_ptr<const Entry> get(const std::vector<uint32_t>& key) const {
        std::lock_guard<std::mutex> lk(mu_);
        auto it = entries_.find(key);
        return it == entries_.end() ? nullptr : it->second;
    }
    std::shared_ptr<const Entry> put(const std::vector<uint32_t>& key, std::shared_ptr<const Entry> e) {
        std::lock_guard<std::mutex> lk(mu_);
        return entries_.emplace(key, std::move(e)).first->second;
    }
    size_t size() const {
        std::lock_guard<std::mutex> lk(mu_);
        return entries_.size();
    }
    // The tokens whose bytes hold the whole of a lazy grammar's trigger (computed on first use).
    std::shared_ptr<const std::vector<int32_t>> trigger_tokens(const std::string& trigger) const {
        std::lock_guard<std::mutex> lk(mu_);
        if (!trigger_tokens_ || trigger_ != trigger) {
            auto t = std::make_shared<std::vector<int32_t>>();
            for (int32_t id = 0; id < trie_->n_vocab(); ++id)
                if (!trie_->is_excluded(id) && trie_->piece(id).find(trigger) != std::string::npos) t->push_back(id);
            trigger_ = trigger;
            trigger_tokens_ = std::move(t);
        }
        return trigger_tokens_;
    }

 private:
    struct KeyHash {
        size_t operator()(const std::vector<uint32_t>& k) const {
            size_t h = 0x9e3779b97f4a7c15ull;
            for (uint32_t v : k) h = (h ^ v) * 0x100000001b3ull;
            return h;
        }
    };
    std::shared_ptr<const GrammarDef> def_;
    std::shared_ptr<const TokenTrie> trie_;
    mutable std::mutex mu_;
    std::unordered_map<std::vector<uint32_t>, std::shared_ptr<const Entry>, KeyHash> entries_;
    mutable std::string trigger_;
    mutable std::shared_ptr<const std::vector<int32_t>> trigger_tokens_;
};

struct MatcherOptions {
    size_t mask_cache_bytes = size_t(32) << 20;  // masks kept per matcher (cleared when full)
    // A lazy grammar: until the generated text contains `trigger`, every token is allowed and the
    // text may end anywhere; from the trigger's first byte on, the text must match the grammar (which
    // therefore starts with the trigger). Empty: the grammar applies from the first byte.
    std::string trigger;
    // A lazy grammar's trigger counts only after a thinking block at the start of the text (a thinking
    // model's reply, which may mention the trigger while it thinks): kMayOpen: the text may start, after
    // blanks, with <think>; kOpen: it starts inside one (the prompt opened it). Either way the trigger is
    // looked for from the block's </think> on.
    enum class Thinking { kNone, kMayOpen, kOpen } thinking = Thinking::kNone;
};

class Matcher {
 public:
    // An ambiguous grammar (a rule that calls itself around any-character runs, say) can hold more
    // stacks at once with every byte: past these bounds a step throws cera::Error (kInvalidArgument)
    // naming the grammar's ambiguity, and the state stays where it was. Grammars from JSON Schemas
    // and ordinary GBNF stay far below (tens of stacks).
    static constexpr size_t kMaxStacks = size_t(1) << 12;  // in one state
    static constexpr size_t kMaxNodes = size_t(1) << 21;   // interned stack nodes over the matcher's life

    // Text matching only (no masks).
    explicit Matcher(std::shared_ptr<const GrammarDef> def);
    // Text matching and token masks over the cache's vocabulary.
    Matcher(std::shared_ptr<PositionCache> cache, const MatcherOptions& options = {});

    // The tokens allowed next: bit id of words[id / 64]; [ceil(n_vocab / 64)] words. Valid until the
    // next call on this matcher. No allocation when the state's mask is cached.
    const uint64_t* mask();
    // Advances by a token's bytes. False (state unchanged) when the token is not allowed; an
    // end-of-generation token is allowed when can_end(). mask(), accept_token() and accept_bytes()
    // throw past kMaxStacks or kMaxNodes.
    bool accept_token(int32_t id);
    // Advances by bytes; returns how many were matched (all of them, or the offset of the first byte
    // that no stack accepts; the state then stays after the matched part).
    size_t accept_bytes(std::string_view bytes);

    bool can_end() const;      // the text so far is a whole match (or a lazy grammar is still waiting)
    bool is_complete() const;  // a whole match, and nothing may follow
    bool is_dead() const { return !waiting_ && cur_.empty(); }
    bool is_waiting() const { return waiting_; }  // a lazy grammar that has not seen its trigger yet
    void reset();
    size_t n_words() const { return words_; }

 private:
    struct Utf8 {
        uint32_t val = 0;
        uint32_t rem = 0;                        // continuation bytes still expected
        uint8_t next_lo = 0x80, next_hi = 0xBF;  // the next byte's range (no overlong form, no surrogate)
        bool operator==(const Utf8& o) const {
            return val == o.val && rem == o.rem && next_lo == o.next_lo && next_hi == o.next_hi;
        }
    };
    struct CacheEntry {
        std::vector<uint32_t> set;
        Utf8 utf8;
        size_t slot;
    };

    void init_nodes();
    uint32_t intern(uint32_t pos, uint32_t parent);
    void closure(uint32_t node, std::vector<uint32_t>& out);
    void successors(uint32_t node, uint32_t& begin, uint32_t& end);
    bool step(const std::vector<uint32_t>& in, Utf8 u, uint8_t byte, std::vector<uint32_t>& out, Utf8& nu);
    size_t walk(const std::vector<uint32_t>& start, Utf8 u, uint32_t above_cp);
    std::shared_ptr<const PositionCache::Entry> classify(uint32_t stack, Utf8 u);
    std::shared_ptr<const PositionCache::Entry> entry(std::vector<uint32_t> key, size_t n_frames, bool whole, Utf8 u);
    bool takes(const std::vector<uint32_t>& from, std::string_view bytes);
    void group_left(PositionCache::Entry& e);
    uint32_t run(uint32_t stack, int depth);
    void level_runs(uint32_t d);
    bool takes_subtree(uint32_t d, uint32_t trie_node);
    bool class_holds(uint32_t a, uint32_t b) const;
    void compute_mask(uint64_t* bits);

    std::shared_ptr<const GrammarDef> def_;
    std::shared_ptr<PositionCache> cache_;
    const TokenTrie* trie_ = nullptr;
    MatcherOptions options_;
    size_t words_ = 0;

    struct Node {
        uint32_t pos, parent;
    };
    std::vector<Node> nodes_;  // 0: the bottom of a whole match; 1: the cut-off bottom (classification)
    std::unordered_map<uint64_t, uint32_t> intern_;
    std::vector<uint32_t> succ_begin_, succ_end_, succ_pool_;  // memoised successors per node
    std::vector<uint32_t> stamp_;                              // closure's visited marks
    std::vector<uint16_t> run_;                                // memoised run() per node (0: not yet)
    uint32_t run_budget_ = 0;                                  // run(): nodes this call may still evaluate
    std::vector<char> class_high_;  // per class: holds every code point past ASCII (surrogates aside)
    // Per position in the first alternative of a ladder's rung (Rule::loop): the same place in the loop
    // rule, and the rung; kUnset elsewhere.
    std::vector<uint32_t> loop_pos_, rung_of_;
    uint32_t epoch_ = 0;
    std::vector<uint32_t> work_;
    std::vector<uint32_t> key_;  // classify()'s cache key

    std::vector<uint32_t> initial_, cur_;  // sorted stack sets
    Utf8 cur_utf8_;
    std::vector<uint32_t> tmp_a_, tmp_b_;
    std::vector<std::vector<uint32_t>> levels_;  // walk(): the stack set at each trie depth
    std::vector<Utf8> level_utf8_;
    std::vector<char> level_pop_;  // walk(): some level down to this one left the frames
    std::vector<char> level_cut_;  // walk(): this level left the frames
    std::vector<uint32_t> path_;   // walk(): the trie node of each depth on the current path
    std::vector<uint32_t> level_cp_;  // walk(): the code points the current path has started by each depth
    std::vector<uint32_t> exits_;  // walk(): the depths at which the current path left the frames
    std::vector<std::pair<uint32_t, uint32_t>> accepted_runs_;  // walk(): accepted runs of the trie order
    std::vector<std::pair<int32_t, uint32_t>> left_;  // walk(): tokens that left the frames, and where
    std::vector<uint32_t> group_slots_, group_of_, group_first_;  // classify(): grouping left_ by rest
    std::vector<uint32_t> below_;                     // compute_mask(): the stacks below a stack's top frames
    struct LevelRuns {  // walk(): the stacks of a level that could take a subtree whole
        static constexpr uint32_t kMax = 4;
        struct Run {
            uint64_t ascii[2];  // the stack's class, ASCII part
            uint32_t length;    // run()
            bool high;          // the class holds all of non-ASCII
        } run[kMax];
        uint32_t n = 0;
        bool ready = false;
    };
    std::vector<LevelRuns> level_runs_;

    std::vector<std::unique_ptr<uint64_t[]>> slots_;  // cached masks, [words_] each (at most max_slots_)
    size_t max_slots_ = 0, used_slots_ = 0;
    std::unordered_multimap<uint64_t, CacheEntry> mask_cache_;

    bool waiting_ = false;             // lazy: the trigger has not appeared yet
    std::string seen_;                 // lazy: the text's tail that may hold the start of the trigger
    // lazy, MatcherOptions::thinking: where the text stands against its leading thinking block, and the
    // text that decides it (blanks dropped before <think>; the tail that may begin </think> inside).
    enum class Think { kBefore, kInside, kPast } think_ = Think::kPast;
    std::string think_text_;
    bool follow_thinking(const std::string& piece);  // false while the block is not over
    bool find_trigger();                             // looks for the trigger in seen_
    std::vector<uint64_t> free_mask_;  // lazy: every token
    std::vector<uint64_t> base_mask_;  // lazy: every token but those holding the trigger wrongly followed
    std::vector<uint64_t> lazy_mask_;  // lazy: base_mask_'s rule after a text ending in part of the trigger
    std::shared_ptr<const std::vector<int32_t>> trigger_tokens_;  // lazy: tokens holding the whole trigger
    const uint64_t* waiting_mask();
};

}  // namespace cera::grammar
