// The matcher: stack interning and closure, the byte step, the trie walk and the mask cache.
#include "chat/grammar/matcher.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace cera::grammar {
namespace {

constexpr uint32_t kUnset = 0xFFFFFFFFu;
constexpr uint32_t kAccept = 0;  // bottom: popping it means the whole text matched
constexpr uint32_t kCut = 1;     // bottom: popping it means the walk left the position's rule
constexpr uint16_t kRunBusy = 0xFFFF;
constexpr uint32_t kRunMax = 256;      // longer than any token (the trie holds pieces of up to 255 bytes)
constexpr int kRunDepth = 300;         // run()'s recursion bound: above kRunMax, so chains up to it are exact
constexpr uint32_t kRunBudget = 4096;  // nodes one run() call may evaluate

uint64_t hash_state(const std::vector<uint32_t>& set, uint32_t val, uint32_t rem) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t(val) << 3 | rem);
    for (uint32_t s : set) h = (h ^ s) * 0x100000001b3ull + (h >> 29);
    return h;
}

inline void sort_unique(std::vector<uint32_t>& v) {
    if (v.size() > 1) {
        std::sort(v.begin(), v.end());
        v.erase(std::unique(v.begin(), v.end()), v.end());
    }
}

inline bool has_real(const std::vector<uint32_t>& set) { return !set.empty() && set.back() >= 2; }

}  // namespace

Matcher::Matcher(std::shared_ptr<const GrammarDef> def) : def_(std::move(def)) { init_nodes(); }

Matcher::Matcher(std::shared_ptr<PositionCache> cache, const MatcherOptions& options)
    : cache_(std::move(cache)), options_(options) {
    // The cache keeps the definition alive; the matcher shares it.
    def_ = std::shared_ptr<const GrammarDef>(cache_, &cache_->def());
    trie_ = &cache_->trie();
    words_ = (size_t(trie_->n_vocab()) + 63) / 64;
    max_slots_ = std::max<size_t>(1, options_.mask_cache_bytes / (words_ * 8));
    levels_.resize(257);
    level_utf8_.resize(257);
    level_runs_.resize(257);
    level_pop_.resize(257);
    path_.resize(257);
    level_cut_.resize(257);
    level_cp_.resize(257);
    if (!options_.trigger.empty()) {
        free_mask_.assign(words_, ~uint64_t(0));
        if (trie_->n_vocab() % 64) free_mask_.back() = (uint64_t(1) << (trie_->n_vocab() % 64)) - 1;
        trigger_tokens_ = cache_->trigger_tokens(options_.trigger);
    }
    init_nodes();
}

void Matcher::init_nodes() {
    nodes_ = {{kUnset, kUnset}, {kUnset, kUnset}};
    succ_begin_ = {kUnset, kUnset};
    succ_end_ = {kUnset, kUnset};
    stamp_ = {0, 0};
    run_ = {0, 0};
    class_high_.clear();
    for (const CharClass& c : def_->classes) {
        auto covers = [&](uint32_t lo, uint32_t hi) {
            for (const auto& r : c.ranges)
                if (r.first <= lo && hi <= r.second) return true;
            return false;
        };
        class_high_.push_back(covers(0x80, 0xD7FF) && covers(0xE000, 0x10FFFF));
    }
    loop_pos_.assign(def_->elems.size(), kUnset);
    rung_of_.assign(def_->elems.size(), kUnset);
    for (const Rule& r : def_->rules) {  // on the positions classify() keys by (GrammarDef::same_as)
        if (r.loop == UINT32_MAX) continue;
        const uint32_t from = r.alts[0], to = def_->rules[r.loop].alts[0];
        for (uint32_t p = 0; def_->elems[from + p].op != Op::kEnd; ++p) {
            const uint32_t at = def_->same_as[from + p];
            if (loop_pos_[at] != kUnset) continue;  // the same future as a rung position already set
            loop_pos_[at] = def_->same_as[to + p];
            rung_of_[at] = r.rung;
        }
    }
    initial_.clear();
    for (uint32_t a : def_->rules[def_->root].alts) closure(intern(a, kAccept), initial_);
    sort_unique(initial_);
    reset();
}

void Matcher::reset() {
    cur_ = initial_;
    cur_utf8_ = {};
    waiting_ = !options_.trigger.empty();
    seen_.clear();
    think_ = options_.thinking == MatcherOptions::Thinking::kOpen      ? Think::kInside
             : options_.thinking == MatcherOptions::Thinking::kMayOpen ? Think::kBefore
                                                                       : Think::kPast;
    think_text_.clear();
}

uint32_t Matcher::intern(uint32_t pos, uint32_t parent) {
    const uint64_t key = uint64_t(pos) << 32 | parent;
    if (nodes_.size() >= kMaxNodes && !intern_.count(key))
        throw_error(ErrorCode::kInvalidArgument,
                    "grammar: over %zu parse stack nodes (an ambiguous grammar: a rule that can match the same "
                    "text in ever more ways)",
                    kMaxNodes);
    auto [it, fresh] = intern_.try_emplace(key, uint32_t(nodes_.size()));
    if (fresh) {
        nodes_.push_back({pos, parent});
        succ_begin_.push_back(kUnset);
        succ_end_.push_back(kUnset);
        stamp_.push_back(0);
        run_.push_back(0);
    }
    return it->second;
}

// Appends the stacks (nodes at a character class) and bottoms reachable from `node` without consuming
// input. Iterative, with visited marks, so that a deep or ambiguous grammar costs one visit per node.
void Matcher::closure(uint32_t node, std::vector<uint32_t>& out) {
    if (++epoch_ == 0) {
        std::fill(stamp_.begin(), stamp_.end(), 0u);
        epoch_ = 1;
    }
    work_.clear();
    work_.push_back(node);
    while (!work_.empty()) {
        const uint32_t n = work_.back();
        work_.pop_back();
        if (n < 2) {
            out.push_back(n);
            continue;
        }
        if (stamp_[n] == epoch_) continue;
        stamp_[n] = epoch_;
        const Node nd = nodes_[n];
        const Elem e = def_->elems[nd.pos];
        switch (e.op) {
            case Op::kChar:
                out.push_back(n);
                break;
            case Op::kEnd:
                work_.push_back(nd.parent);
                break;
            case Op::kRef: {
                // A reference in tail position returns straight to the parent: `R ::= x R | ""` then
                // keeps a constant stack, and its states repeat (and hit the mask cache).
                const uint32_t frame =
                    def_->elems[nd.pos + 1].op == Op::kEnd ? nd.parent : intern(nd.pos + 1, nd.parent);
                for (uint32_t a : def_->rules[e.arg].alts) {
                    work_.push_back(intern(a, frame));
                }
                break;
            }
        }
    }
}

void Matcher::successors(uint32_t node, uint32_t& begin, uint32_t& end) {
    if (succ_begin_[node] == kUnset) {
        const Node nd = nodes_[node];
        std::vector<uint32_t> out;
        closure(intern(nd.pos + 1, nd.parent), out);
        sort_unique(out);
        succ_begin_[node] = uint32_t(succ_pool_.size());
        succ_pool_.insert(succ_pool_.end(), out.begin(), out.end());
        succ_end_[node] = uint32_t(succ_pool_.size());
    }
    begin = succ_begin_[node];
    end = succ_end_[node];
}

// One byte: `in` (a sorted set) with the partial code point u becomes `out` with nu. False when the
// byte cannot continue UTF-8 (out is then empty).
bool Matcher::step(const std::vector<uint32_t>& in, Utf8 u, uint8_t b, std::vector<uint32_t>& out, Utf8& nu) {
    out.clear();
    // Strict UTF-8: the lead byte fixes the range of the byte after it, which rules out overlong
    // forms, surrogates and code points past U+10FFFF.
    if (u.rem == 0) {
        if (b < 0x80)
            nu = {b, 0};
        else if (b >= 0xC2 && b <= 0xDF)
            nu = {uint32_t(b & 0x1F), 1};
        else if (b == 0xE0)
            nu = {0, 2, 0xA0, 0xBF};
        else if (b == 0xED)
            nu = {0xD, 2, 0x80, 0x9F};
        else if (b >= 0xE1 && b <= 0xEF)
            nu = {uint32_t(b & 0x0F), 2};
        else if (b == 0xF0)
            nu = {0, 3, 0x90, 0xBF};
        else if (b >= 0xF1 && b <= 0xF3)
            nu = {uint32_t(b & 0x07), 3};
        else if (b == 0xF4)
            nu = {4, 3, 0x80, 0x8F};
        else
            return false;
    } else {
        if (b < u.next_lo || b > u.next_hi) return false;
        nu = {u.val << 6 | (b & 0x3F), u.rem - 1};
    }
    const auto& classes = def_->classes;
    const auto& elems = def_->elems;
    if (nu.rem == 0) {
        const uint32_t cp = nu.val;
        int from = 0;
        for (uint32_t s : in) {
            if (s < 2 || !classes[elems[nodes_[s].pos].arg].contains(cp)) continue;
            uint32_t sb, se;
            successors(s, sb, se);
            out.insert(out.end(), succ_pool_.begin() + sb, succ_pool_.begin() + se);
            ++from;
        }
        if (from > 1) sort_unique(out);  // one stack's successors are sorted and distinct already
        if (out.size() > kMaxStacks) {
            out.clear();
            throw_error(ErrorCode::kInvalidArgument,
                        "grammar: over %zu parse stacks at once (an ambiguous grammar: a rule that can match "
                        "the same text in ever more ways)",
                        kMaxStacks);
        }
    } else {
        // The completions of the partial code point are exactly [lo, hi].
        const uint32_t shift = 6 * (nu.rem - 1);
        const uint32_t lo = nu.val << (shift + 6) | uint32_t(nu.next_lo & 0x3F) << shift;
        const uint32_t hi = nu.val << (shift + 6) | uint32_t(nu.next_hi & 0x3F) << shift | ((1u << shift) - 1);
        for (uint32_t s : in)
            if (s >= 2 && classes[elems[nodes_[s].pos].arg].intersects(lo, hi)) out.push_back(s);
    }
    return !out.empty();
}

size_t Matcher::accept_bytes(std::string_view bytes) {
    for (size_t i = 0; i < bytes.size(); ++i) {
        Utf8 nu;
        if (!step(cur_, cur_utf8_, uint8_t(bytes[i]), tmp_a_, nu)) return i;
        cur_.swap(tmp_a_);
        cur_utf8_ = nu;
    }
    return bytes.size();
}

bool Matcher::accept_token(int32_t id) {
    CERA_CHECK(trie_ != nullptr, "accept_token on a matcher without a vocabulary");
    if (id < 0 || id >= trie_->n_vocab()) return false;
    if (waiting_) {
        if (trie_->is_eog(id) || trie_->is_excluded(id)) return true;
        if (think_ != Think::kPast) return !follow_thinking(trie_->piece(id)) || find_trigger();
        seen_ += trie_->piece(id);
        return find_trigger();
    }
    if (trie_->is_eog(id)) {
        if (!can_end()) return false;
        cur_ = {kAccept};
        return true;
    }
    if (trie_->is_excluded(id)) return false;
    const std::string& p = trie_->piece(id);
    tmp_b_ = cur_;
    Utf8 u = cur_utf8_;
    for (char c : p) {
        Utf8 nu;
        if (!step(tmp_b_, u, uint8_t(c), tmp_a_, nu)) return false;
        tmp_b_.swap(tmp_a_);
        u = nu;
    }
    cur_.swap(tmp_b_);
    cur_utf8_ = u;
    return true;
}

bool Matcher::can_end() const { return waiting_ || (cur_utf8_.rem == 0 && !cur_.empty() && cur_[0] == kAccept); }
bool Matcher::is_complete() const { return !waiting_ && can_end() && !has_real(cur_); }

// Whether class a holds every code point of class b.
bool Matcher::class_holds(uint32_t a, uint32_t b) const {
    if (a == b) return true;
    const CharClass& ca = def_->classes[a];
    const CharClass& cb = def_->classes[b];
    size_t j = 0;
    for (const auto& r : cb.ranges) {  // each range of b lies within one range of a (a's are maximal)
        while (j < ca.ranges.size() && ca.ranges[j].second < r.first) ++j;
        if (j == ca.ranges.size() || ca.ranges[j].first > r.first || ca.ranges[j].second < r.second) return false;
    }
    return true;
}

// How many code points of its class a stack can take in a row, capped at kRunMax: one, plus the most
// that a successor whose class holds this one's can take. A cycle among such successors is a loop
// (kRunMax). Memoised per node. The recursion is bounded (kRunDepth deep, run_budget_ nodes a call,
// since successors can be new nodes without end); where it is cut a node counts as one code point, so
// a result is then a lower bound, which is safe: a walk takes a subtree only when the run covers it.
uint32_t Matcher::run(uint32_t stack, int depth) {
    if (run_[stack] == kRunBusy) return kRunMax;
    if (run_[stack] != 0) return run_[stack];
    if (depth > kRunDepth || run_budget_ == 0) return 1;
    --run_budget_;
    run_[stack] = kRunBusy;
    const uint32_t cls = def_->elems[nodes_[stack].pos].arg;
    uint32_t b, e, best = 0;
    successors(stack, b, e);
    for (uint32_t k = b; k < e && best + 1 < kRunMax; ++k) {
        const uint32_t next = succ_pool_[k];
        if (next >= 2 && class_holds(def_->elems[nodes_[next].pos].arg, cls))
            best = std::max(best, run(next, depth + 1));
    }
    const uint32_t r = std::min(kRunMax, best + 1);
    run_[stack] = uint16_t(r);
    return r;
}

// The stacks of walk level d that could take a subtree whole (their class and run), found once per
// level set.
void Matcher::level_runs(uint32_t d) {
    LevelRuns& lr = level_runs_[d];
    lr.n = 0;
    lr.ready = true;
    for (uint32_t s : levels_[d]) {
        if (s < 2 || lr.n == LevelRuns::kMax) continue;
        const uint32_t cls = def_->elems[nodes_[s].pos].arg;
        const CharClass& c = def_->classes[cls];
        run_budget_ = kRunBudget;
        lr.run[lr.n] = {{c.ascii[0], c.ascii[1]}, run(s, 0), class_high_[cls] != 0};
        ++lr.n;
    }
}

// Whether a stack of walk level d (at a code point boundary) takes every token under trie_node whole.
bool Matcher::takes_subtree(uint32_t d, uint32_t trie_node) {
    const TokenTrie::Node& t = trie_->nodes()[trie_node];
    if (!t.utf8_ok()) return false;
    if (!level_runs_[d].ready) level_runs(d);
    const LevelRuns& lr = level_runs_[d];
    for (uint32_t k = 0; k < lr.n; ++k) {
        const auto& r = lr.run[k];
        if (!(t.ascii[0] & ~r.ascii[0]) && !(t.ascii[1] & ~r.ascii[1]) && (r.high || !t.non_ascii()) &&
            r.length >= t.max_cp)
            return true;
    }
    return false;
}

// Walks the trie from `start` (stack tops over the cut-off bottom, or over the real one) and sorts
// the tokens: accepted ones into accepted_runs_ (runs of the trie order, in increasing order; returns
// how many tokens), uncertain ones into left_. With above_cp > 0 only the tokens that start more code
// points than that need sorting: subtrees without one are skipped (others may be sorted too).
size_t Matcher::walk(const std::vector<uint32_t>& start, Utf8 u, uint32_t above_cp) {
    const auto& nodes = trie_->nodes();
    const auto& order = trie_->order();
    size_t n_accepted = 0;
    accepted_runs_.clear();
    auto accept = [&](uint32_t b, uint32_t e) {
        if (b == e) return;
        n_accepted += e - b;
        if (!accepted_runs_.empty() && accepted_runs_.back().second == b)
            accepted_runs_.back().second = e;
        else
            accepted_runs_.push_back({b, e});
    };
    auto uncertain = [&](uint32_t b, uint32_t e, uint32_t depth) {  // tokens that left at a level <= depth
        exits_.clear();
        for (uint32_t k = 1; k <= depth; ++k)
            if (level_cut_[k]) exits_.push_back(k);
        for (uint32_t k = b; k < e; ++k)
            for (uint32_t at : exits_) left_.push_back({order[k], at});
    };
    left_.clear();
    levels_[0] = start;
    level_utf8_[0] = u;
    level_runs_[0].ready = false;
    level_pop_[0] = 0;
    level_cp_[0] = 0;
    // Depth-first over the trie: i is a node at depth d, path_[k] the node at depth k above it.
    uint32_t d = 1, i = nodes[0].first_child;
    while (i != 0) {
        const TokenTrie::Node& nd = nodes[i];
        bool descend = false;
        if (above_cp != 0 && level_cp_[d - 1] + nd.max_cp <= above_cp) {
            // skipped: every token below is short
        } else if (level_utf8_[d - 1].rem == 0 && takes_subtree(d - 1, i)) {
            accept(nd.tok_begin, nd.tok_end);
        } else {
            if (nd.first_child) __builtin_prefetch(&nodes[nd.first_child]);
            std::vector<uint32_t>& out = levels_[d];
            const bool alive = step(levels_[d - 1], level_utf8_[d - 1], nd.byte, out, level_utf8_[d]);
            level_runs_[d].ready = false;
            level_cp_[d] = level_cp_[d - 1] + ((nd.byte & 0xC0) != 0x80);
            const bool cut = alive && (out[0] == kCut || (out.size() > 1 && out[1] == kCut));
            level_cut_[d] = cut;
            level_pop_[d] = level_pop_[d - 1] || cut;
            if (!alive) {
                if (level_pop_[d - 1]) uncertain(nd.tok_begin, nd.tok_end, d - 1);
            } else {
                const uint32_t own_end = trie_->own_end(nd);
                accept(nd.tok_begin, own_end);
                if (has_real(out))
                    descend = nd.first_child != 0;
                else if (level_pop_[d])  // only bottoms: nothing more can be consumed
                    uncertain(own_end, nd.tok_end, d);
            }
        }
        if (descend) {
            path_[d++] = i;
            i = nd.first_child;
            continue;
        }
        while (i != 0 && nodes[i].last()) i = --d == 0 ? 0 : path_[d];
        if (i != 0) ++i;
    }
    return n_accepted;
}

std::shared_ptr<const PositionCache::Entry> Matcher::classify(uint32_t stack, Utf8 u) {
    // The key: the positions of the top frames (the first of the same future: they walk alike), and
    // kUnset when the stack ends within them.
    key_.clear();
    uint32_t n = stack;
    while (n >= 2 && key_.size() < PositionCache::kTopFrames) {
        key_.push_back(def_->same_as[nodes_[n].pos]);
        n = nodes_[n].parent;
    }
    const bool whole = n < 2;
    const size_t n_frames = key_.size();
    if (whole) key_.push_back(kUnset);
    if (u.rem != 0) {  // inside a code point: the bytes still to come are part of the key
        key_.push_back(kUnset - 1);
        key_.push_back(u.val);
        key_.push_back(u.rem << 16 | uint32_t(u.next_lo) << 8 | u.next_hi);
    }
    if (auto e = cache_->get(key_)) return e;
    return entry(key_, n_frames, whole, u);
}

// The classification of a key (classify()) that is not cached yet. When a frame is in rung k of a
// ladder, the tokens of fewer than k code points are sorted as for the ladder's loop in that frame's
// place (an entry shared by every rung), and the walk sorts only the longer ones.
std::shared_ptr<const PositionCache::Entry> Matcher::entry(std::vector<uint32_t> key, size_t n_frames, bool whole,
                                                           Utf8 u) {
    if (auto e = cache_->get(key)) return e;
    std::shared_ptr<const PositionCache::Entry> loop;
    uint32_t above_cp = 0;
    for (size_t j = 0; j < n_frames && u.rem == 0; ++j) {
        // Rung k has room for k - 1 items past the current one, and a token of at most k - 1 code
        // points starts at most k - 2 of them. Worth it when the longer tokens are few (the walk
        // then skips most of the trie).
        if (loop_pos_[key[j]] == kUnset || trie_->longer_than(rung_of_[key[j]] - 1) * 8 > trie_->order().size())
            continue;
        above_cp = rung_of_[key[j]] - 1;
        std::vector<uint32_t> loop_key = key;
        loop_key[j] = loop_pos_[key[j]];
        loop = entry(std::move(loop_key), n_frames, whole, u);
        break;
    }
    // The same frames over the cut-off bottom (or the real one, when they are the whole stack).
    uint32_t chain = whole ? kAccept : kCut;
    for (size_t i = n_frames; i-- > 0;) chain = intern(key[i], chain);
    auto e = std::make_shared<PositionCache::Entry>();
    const size_t n_accepted = walk({chain}, u, above_cp);
    const auto& order = trie_->order();
    if (loop) {
        if (loop->groups() != 0) {  // the loop's uncertain tokens that are short
            e->rests = loop->rests;
            e->rest_at = loop->rest_at;
            e->left_at = {0};
            for (size_t g = 0; g < loop->groups(); ++g) {
                for (uint32_t k = loop->left_at[g]; k < loop->left_at[g + 1]; ++k)
                    if (trie_->n_cp(loop->left[k]) <= above_cp) e->left.push_back(loop->left[k]);
                e->left_at.push_back(uint32_t(e->left.size()));
            }
        }
        if (!left_.empty()) group_left(*e);
        if (!loop->accepted_bits.empty()) {  // the loop's accepted tokens less the long ones, and the walk's
            e->accepted_bits = loop->accepted_bits;
            const auto& by_cp = trie_->by_cp();
            for (size_t k = 0, end = trie_->longer_than(above_cp); k < end; ++k)
                e->accepted_bits[uint32_t(by_cp[k]) >> 6] &= ~(1ull << (by_cp[k] & 63));
            for (const auto& [b, end] : accepted_runs_)
                for (uint32_t k = b; k < end; ++k) e->accepted_bits[uint32_t(order[k]) >> 6] |= 1ull << (order[k] & 63);
        } else {
            for (int32_t t : loop->accepted)
                if (trie_->n_cp(t) <= above_cp) e->accepted.push_back(t);
            for (const auto& [b, end] : accepted_runs_)
                e->accepted.insert(e->accepted.end(), &order[b], &order[end]);
        }
        return cache_->put(key, std::move(e));
    }
    if (!left_.empty()) group_left(*e);
    if (n_accepted * 16 <= size_t(trie_->n_vocab())) {  // few: keep them as a list
        e->accepted.reserve(n_accepted);
        for (const auto& [b, end] : accepted_runs_) e->accepted.insert(e->accepted.end(), &order[b], &order[end]);
    } else if (2 * n_accepted > order.size()) {  // most of the trie: its bitset less the gaps between the runs
        e->accepted_bits = trie_->in_trie();
        uint32_t at = 0;
        auto clear = [&](uint32_t b, uint32_t end) {
            for (uint32_t k = b; k < end; ++k) e->accepted_bits[uint32_t(order[k]) >> 6] &= ~(1ull << (order[k] & 63));
        };
        for (const auto& [b, end] : accepted_runs_) {
            clear(at, b);
            at = end;
        }
        clear(at, uint32_t(order.size()));
    } else {
        e->accepted_bits.assign(words_, 0);
        for (const auto& [b, end] : accepted_runs_)
            for (uint32_t k = b; k < end; ++k) e->accepted_bits[uint32_t(order[k]) >> 6] |= 1ull << (order[k] & 63);
    }
    return cache_->put(key, std::move(e));
}

// Groups the tokens of left_ by their rest (an open-addressing table of views into the pieces), then
// lays the groups out in the entry, after those it has.
void Matcher::group_left(PositionCache::Entry& e) {
    const size_t n = left_.size();
    size_t size = 16;
    while (size < 2 * n) size *= 2;
    group_slots_.assign(size, kUnset);
    group_of_.resize(n);
    group_first_.clear();
    auto rest_of = [&](size_t i) { return std::string_view(trie_->piece(left_[i].first)).substr(left_[i].second); };
    for (size_t i = 0; i < n; ++i) {
        const std::string_view r = rest_of(i);
        uint64_t h = 0xcbf29ce484222325ull;
        for (char c : r) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
        size_t slot = size_t(h ^ (h >> 29)) & (size - 1);
        while (group_slots_[slot] != kUnset && rest_of(group_first_[group_slots_[slot]]) != r)
            slot = (slot + 1) & (size - 1);
        if (group_slots_[slot] == kUnset) {
            group_slots_[slot] = uint32_t(group_first_.size());
            group_first_.push_back(uint32_t(i));
        }
        group_of_[i] = group_slots_[slot];
    }
    const size_t groups = group_first_.size();
    if (e.rest_at.empty()) e.rest_at = e.left_at = {0};
    const size_t g0 = e.groups();
    for (size_t g = 0; g < groups; ++g) {
        e.rests += rest_of(group_first_[g]);
        e.rest_at.push_back(uint32_t(e.rests.size()));
    }
    e.left_at.resize(g0 + groups + 1, 0);
    for (size_t i = 0; i < n; ++i) ++e.left_at[g0 + group_of_[i] + 1];
    for (size_t g = g0; g < g0 + groups; ++g) e.left_at[g + 1] += e.left_at[g];
    e.left.resize(e.left_at.back());
    std::vector<uint32_t>& fill = group_first_;  // reused: the next free place of each group
    for (size_t g = 0; g < groups; ++g) fill[g] = e.left_at[g0 + g];
    for (size_t i = 0; i < n; ++i) e.left[fill[group_of_[i]]++] = left_[i].first;
}

// Whether the stacks `from` (at a code point boundary) take all of bytes.
bool Matcher::takes(const std::vector<uint32_t>& from, std::string_view bytes) {
    tmp_b_ = from;
    Utf8 u;
    for (char c : bytes) {
        Utf8 nu;
        if (!step(tmp_b_, u, uint8_t(c), tmp_a_, nu)) return false;
        tmp_b_.swap(tmp_a_);
        u = nu;
    }
    return true;
}

void Matcher::compute_mask(uint64_t* bits) {
    std::memset(bits, 0, words_ * 8);
    for (uint32_t s : cur_) {
        if (s < 2) continue;
        const auto e = classify(s, cur_utf8_);
        if (!e->accepted_bits.empty())
            for (size_t w = 0; w < words_; ++w) bits[w] |= e->accepted_bits[w];
        for (int32_t t : e->accepted) bits[size_t(t) >> 6] |= 1ull << (t & 63);
        if (e->groups() == 0) continue;
        // The uncertain tokens left the top frames (there are kTopFrames of them, and more below).
        uint32_t n = s;
        for (size_t k = 0; k < PositionCache::kTopFrames; ++k) n = nodes_[n].parent;
        below_.clear();
        closure(n, below_);
        sort_unique(below_);
        for (size_t g = 0; g < e->groups(); ++g)
            if (takes(below_, std::string_view(e->rests).substr(e->rest_at[g], e->rest_at[g + 1] - e->rest_at[g])))
                for (uint32_t k = e->left_at[g]; k < e->left_at[g + 1]; ++k)
                    bits[size_t(e->left[k]) >> 6] |= 1ull << (e->left[k] & 63);
    }
    if (can_end())
        for (int32_t t : trie_->eog_tokens()) bits[size_t(t) >> 6] |= 1ull << (t & 63);
}

// Before the trigger every token is allowed, except one that completes the trigger with bytes after it
// that the grammar does not accept: the tokens that hold the whole trigger (the same for every text
// that ends in no part of the trigger: base_mask_, made once), and those that finish a trigger begun
// at the end of the text so far (found in the trie under the trigger's rest).
const uint64_t* Matcher::waiting_mask() {
    const std::string& trig = options_.trigger;
    auto clear_if_bad = [&](std::vector<uint64_t>& mask, const std::string& before, int32_t t) {
        const std::string text = before + trie_->piece(t);
        const size_t at = text.find(trig);
        if (at != std::string::npos && !takes(initial_, std::string_view(text).substr(at)))
            mask[size_t(t) >> 6] &= ~(uint64_t(1) << (t & 63));
    };
    if (base_mask_.empty()) {
        base_mask_ = free_mask_;
        for (int32_t t : *trigger_tokens_) clear_if_bad(base_mask_, "", t);
    }
    const auto& nodes = trie_->nodes();
    const auto& order = trie_->order();
    bool partial = false;
    for (size_t k = std::min(seen_.size(), trig.size() - 1); k > 0; --k) {
        if (seen_.compare(seen_.size() - k, k, trig, 0, k) != 0) continue;
        uint32_t node = 0;  // follow the trigger's rest down the trie
        for (size_t b = k; b < trig.size() && node != UINT32_MAX; ++b) {
            uint32_t found = UINT32_MAX;
            for (uint32_t c = nodes[node].first_child; c != 0; c = nodes[c].last() ? 0 : c + 1)
                if (nodes[c].byte == uint8_t(trig[b])) {
                    found = c;
                    break;
                }
            node = found;
        }
        if (node == UINT32_MAX) continue;
        if (!partial) {
            lazy_mask_ = free_mask_;
            for (int32_t t : *trigger_tokens_) clear_if_bad(lazy_mask_, seen_, t);
            partial = true;
        }
        for (uint32_t i = nodes[node].tok_begin; i < nodes[node].tok_end; ++i)
            clear_if_bad(lazy_mask_, seen_, order[i]);
    }
    return partial ? lazy_mask_.data() : base_mask_.data();
}

bool Matcher::find_trigger() {
    const size_t at = seen_.find(options_.trigger);
    if (at == std::string::npos) {  // keep only what could still be the trigger's start
        const size_t keep = options_.trigger.size() - 1;
        if (seen_.size() > keep) seen_.erase(0, seen_.size() - keep);
        return true;
    }
    waiting_ = false;
    const std::string tail = seen_.substr(at);
    seen_.clear();
    return accept_bytes(tail) == tail.size();  // false: the token's text after the trigger cannot match
}

bool Matcher::follow_thinking(const std::string& piece) {
    static constexpr std::string_view kOpen = "<think>", kClose = "</think>";
    think_text_ += piece;
    if (think_ == Think::kBefore) {
        const size_t b = think_text_.find_first_not_of(" \t\n\r");
        think_text_.erase(0, b == std::string::npos ? think_text_.size() : b);
        if (think_text_.compare(0, kOpen.size(), kOpen) == 0) {
            think_text_.erase(0, kOpen.size());
            think_ = Think::kInside;
        } else if (kOpen.substr(0, think_text_.size()) == think_text_) {
            seen_ = think_text_;  // undecided: as text before the trigger, for the masks
            return false;
        } else {  // no thinking: the text so far is where the trigger is looked for
            think_ = Think::kPast;
            seen_ = std::move(think_text_);
            think_text_.clear();
            return true;
        }
    }
    const size_t close = think_text_.find(kClose);
    if (close == std::string::npos) {
        if (think_text_.size() > kClose.size()) think_text_.erase(0, think_text_.size() - (kClose.size() - 1));
        seen_.clear();
        return false;
    }
    think_ = Think::kPast;
    seen_ = think_text_.substr(close + kClose.size());
    think_text_.clear();
    return true;
}

const uint64_t* Matcher::mask() {
    CERA_CHECK(trie_ != nullptr, "mask() on a matcher without a vocabulary");
    // Inside the thinking block every token goes (one that ends the block and holds the trigger wrongly
    // followed is refused by accept_token).
    if (waiting_) return think_ == Think::kInside ? free_mask_.data() : waiting_mask();
    const uint64_t h = hash_state(cur_, cur_utf8_.val, cur_utf8_.rem);
    auto range = mask_cache_.equal_range(h);
    for (auto it = range.first; it != range.second; ++it)
        if (it->second.utf8 == cur_utf8_ && it->second.set == cur_) return slots_[it->second.slot].get();
    if (used_slots_ == max_slots_) {  // full: start over
        mask_cache_.clear();
        used_slots_ = 0;
    }
    if (slots_.size() == used_slots_) slots_.push_back(std::make_unique_for_overwrite<uint64_t[]>(words_));
    const size_t slot = used_slots_++;
    uint64_t* bits = slots_[slot].get();
    compute_mask(bits);
    mask_cache_.emplace(h, CacheEntry{cur_, cur_utf8_, slot});
    return bits;
}

}  // namespace cera::grammar
