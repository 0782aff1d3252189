// The GBNF parser: recursive descent over the text, building rules of elements; then checks (undefined
// rules, root, left recursion) on the flattened table.
#include "chat/grammar/gbnf.h"

#include <algorithm>
#include <map>
#include <span>
#include <unordered_map>

#include "core/check.h"

namespace cera::grammar {

CharClass make_class(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate) {
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : ranges) {
        if (r.first > r.second) continue;
        if (!merged.empty() && r.first <= merged.back().second + 1)
            merged.back().second = std::max(merged.back().second, r.second);
        else
            merged.push_back(r);
    }
    CharClass c;
    if (negate) {
        uint32_t next = 0;
        for (const auto& r : merged) {
            if (r.first > next) c.ranges.push_back({next, r.first - 1});
            next = r.second + 1;
        }
        if (next <= 0x10FFFF) c.ranges.push_back({next, 0x10FFFF});
    } else {
        c.ranges = std::move(merged);
    }
    for (const auto& r : c.ranges)
        for (uint32_t cp = r.first; cp <= std::min<uint32_t>(r.second, 127); ++cp)
            c.ascii[cp >> 6] |= 1ull << (cp & 63);
    return c;
}

namespace {

constexpr int kMaxNesting = 200;
constexpr size_t kMaxElems = size_t(1) << 22;
constexpr uint32_t kMaxRepeat = 10000;

struct Ladder {  // a bounded repetition's rungs (R_1, R_2, ...) and its item
    std::vector<uint32_t> rungs;
    std::vector<Elem> item;
    std::string rule;  // the rule it appears in
    int line;
};

struct ProtoRule {
    std::string name;
    int line = 0;      // definition line; 0 while only referenced
    int ref_line = 0;  // first reference
    bool generated = false;
    std::vector<std::vector<Elem>> alts;
};

class Parser {
 public:
    explicit Parser(std::string_view text) : s_(text) {
        for (size_t i = 0; i < s_.size(); ++i)
            if (s_[i] == '\n') newlines_.push_back(i);
    }

    GrammarDef run(std::string_view root) {
        for (;;) {
            space(true);
            if (eof()) break;
            parse_rule();
        }
        return finish(root);
    }

 private:
    [[noreturn]] void fail(const char* fmt, const std::string& a = "") const {
        int line = 1, col = 1;
        for (size_t i = 0; i < pos_ && i < s_.size(); ++i) {
            if (s_[i] == '\n')
                ++line, col = 1;
            else
                ++col;
        }
        char msg[512];
        std::snprintf(msg, sizeof msg, fmt, a.c_str());
        throw_error(ErrorCode::kParse, "grammar: line %d, column %d: %s", line, col, msg);
    }
    int line_at(size_t p) const {
        return 1 + int(std::upper_bound(newlines_.begin(), newlines_.end(), p) - newlines_.begin());
    }
    bool eof() const { return pos_ >= s_.size(); }
    char peek(size_t k = 0) const { return pos_ + k < s_.size() ? s_[pos_ + k] : '\0'; }
    static bool word_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
    }

    // Spaces, tabs and comments; newlines too when newline_ok (inside parentheses, after '|' or '::=').
    void space(bool newline_ok) {
        while (!eof()) {
            const char c = peek();
            if (c == ' ' || c == '\t') {
                ++pos_;
            } else if (c == '#') {
                while (!eof() && peek() != '\n' && peek() != '\r') ++pos_;
            } else if (newline_ok && (c == '\n' || c == '\r')) {
                ++pos_;
            } else {
                break;
            }
        }
    }

    std::string name() {
        const size_t b = pos_;
        while (!eof() && word_char(peek())) ++pos_;
        if (pos_ == b) fail("expecting a rule name");
        return std::string(s_.substr(b, pos_ - b));
    }

    uint32_t symbol(const std::string& n, int line) {
        auto [it, fresh] = ids_.emplace(n, uint32_t(rules_.size()));
        if (fresh) {
            rules_.push_back({});
            rules_.back().name = n;
            rules_.back().ref_line = line;
        }
        return it->second;
    }

    // A group's rule: its name has a '#', which no rule name in the text can, so that a rule defined
    // further on never meets it.
    uint32_t generated(const std::string& parent, int line) {
        const std::string n = parent + "#" + std::to_string(++gen_counter_);
        const uint32_t id = symbol(n, line);
        rules_[id].generated = true;
        rules_[id].line = line;
        return id;
    }

    uint32_t class_id(const CharClass& c) {
        auto [it, fresh] = class_ids_.emplace(c.ranges, uint32_t(classes_.size()));
        if (fresh) classes_.push_back(c);
        return it->second;
    }
    Elem char_elem(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate) {
        return {Op::kChar, class_id(make_class(std::move(ranges), negate))};
    }

    uint32_t hex(int digits) {
        uint32_t v = 0;
        for (int i = 0; i < digits; ++i) {
            const char c = peek();
            int d;
            if (c >= '0' && c <= '9')
                d = c - '0';
            else if (c >= 'a' && c <= 'f')
                d = c - 'a' + 10;
            else if (c >= 'A' && c <= 'F')
                d = c - 'A' + 10;
            else
                fail("expecting %s hex digits in an escape", std::to_string(digits));
            v = v * 16 + uint32_t(d);
            ++pos_;
        }
        return v;
    }

    // One code point of a literal or class: an escape or a UTF-8 character.
    uint32_t character() {
        if (eof()) fail("unexpected end of input");
        uint32_t cp;
        const unsigned char c = static_cast<unsigned char>(peek());
        if (c == '\\') {
            ++pos_;
            const char e = peek();
            ++pos_;
            switch (e) {
                case 'x':
                    cp = hex(2);
                    break;
                case 'u':
                    cp = hex(4);
                    break;
                case 'U':
                    cp = hex(8);
                    break;
                case 'n':
                    cp = '\n';
                    break;
                case 'r':
                    cp = '\r';
                    break;
                case 't':
                    cp = '\t';
                    break;
                case '\\':
                case '"':
                case '[':
                case ']':
                case '-':
                case '^':
                case '\'':
                    cp = uint32_t(e);
                    break;
                default:
                    --pos_;
                    fail("unknown escape '\\%s'", std::string(1, e));
            }
            if (cp > 0x10FFFF) fail("code point beyond U+10FFFF in an escape");
            return cp;
        }
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || pos_ + size_t(n) > s_.size()) fail("invalid UTF-8");
        cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
        for (int i = 1; i < n; ++i) {
            const unsigned char d = static_cast<unsigned char>(s_[pos_ + size_t(i)]);
            if ((d & 0xC0) != 0x80) fail("invalid UTF-8");
            cp = cp << 6 | (d & 0x3F);
        }
        pos_ += size_t(n);
        return cp;
    }

    void parse_rule() {
        const int line = line_at(pos_);
        const std::string n = name();
        space(false);
        if (s_.substr(pos_, 3) != "::=") fail("expecting '::=' after the rule name '%s'", n);
        pos_ += 3;
        space(true);
        const uint32_t id = symbol(n, line);
        if (rules_[id].line != 0)
            fail(("rule '%s' is defined twice (first on line " + std::to_string(rules_[id].line) + ")").c_str(), n);
        rules_[id].line = line;
        auto alts = alternates(n, false, 0);
        rules_[id].alts = std::move(alts);
        space(false);
        if (peek() == '\r') ++pos_;
        if (peek() == '\n')
            ++pos_;
        else if (!eof())
            fail("expecting the end of the line, found '%s'", std::string(1, peek()));
    }

    std::vector<std::vector<Elem>> alternates(const std::string& rule, bool nested, int depth) {
        std::vector<std::vector<Elem>> alts;
        alts.push_back(sequence(rule, nested, depth));
        while (peek() == '|') {
            ++pos_;
            space(true);
            alts.push_back(sequence(rule, nested, depth));
        }
        return alts;
    }

    void grow(size_t n) {
        total_ += n;
        if (total_ > kMaxElems) fail("the grammar is too large (over %s elements)", std::to_string(kMaxElems));
    }

    uint32_t count() {
        if (!(peek() >= '0' && peek() <= '9')) fail("expecting a number in a repetition");
        uint64_t v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + uint64_t(peek() - '0');
            if (v > kMaxRepeat) fail("a repetition count above %s", std::to_string(kMaxRepeat));
            ++pos_;
        }
        return uint32_t(v);
    }

    // Replaces the last item of `seq` (elements from `start`) by its repetition {lo, hi} (hi < 0: no bound).
    void repeat(std::vector<Elem>& seq, size_t start, uint32_t lo, int64_t hi, const std::string& rule, int line) {
        std::vector<Elem> item(seq.begin() + std::ptrdiff_t(start), seq.end());
        seq.resize(start);
        if (item.size() > 1) {  // a sequence (an inlined group): one rule, so that each copy is one reference
            const uint32_t g = generated(rule, line);
            rules_[g].alts = {std::move(item)};
            item = {{Op::kRef, g}};
        }
        grow(item.size() * (size_t(lo) + size_t(std::max<int64_t>(hi - lo, 1)) + 1));
        for (uint32_t i = 0; i < lo; ++i) seq.insert(seq.end(), item.begin(), item.end());
        if (hi < 0) {  // R ::= item R | ""
            const uint32_t r = generated(rule, line);
            std::vector<Elem> a = item;
            a.push_back({Op::kRef, r});
            rules_[r].alts = {std::move(a), {}};
            seq.push_back({Op::kRef, r});
        } else if (hi > int64_t(lo)) {  // R_1 ::= item | "";  R_k ::= item R_{k-1} | ""
            Ladder ladder{{}, item, rule, line};
            uint32_t prev = 0;
            for (int64_t k = 1; k <= hi - int64_t(lo); ++k) {
                const uint32_t r = generated(rule, line);
                std::vector<Elem> a = item;
                if (k > 1) a.push_back({Op::kRef, prev});
                rules_[r].alts = {std::move(a), {}};
                ladder.rungs.push_back(r);
                prev = r;
            }
            seq.push_back({Op::kRef, prev});
            if (ladder.rungs.size() >= 2) ladders_.push_back(std::move(ladder));
        }
    }

    std::vector<Elem> sequence(const std::string& rule, bool nested, int depth) {
        std::vector<Elem> seq;
        size_t last = std::string::npos;  // start of the last item, for a postfix operator
        while (!eof()) {
            const char c = peek();
            const int line = line_at(pos_);
            if (c == '"') {
                ++pos_;
                last = seq.size();
                while (peek() != '"') {
                    if (eof() || peek() == '\n') fail("unterminated string literal");
                    const uint32_t cp = character();
                    seq.push_back(char_elem({{cp, cp}}, false));
                }
                ++pos_;
                grow(seq.size() - last);
            } else if (c == '[') {
                ++pos_;
                bool negate = false;
                if (peek() == '^') negate = true, ++pos_;
                std::vector<std::pair<uint32_t, uint32_t>> ranges;
                while (peek() != ']') {
                    if (eof()) fail("unterminated character class");
                    const uint32_t a = character();
                    uint32_t b = a;
                    if (peek() == '-' && peek(1) != ']' && pos_ + 1 < s_.size()) {
                        ++pos_;
                        b = character();
                        if (b < a) fail("a character range whose end comes before its start");
                    }
                    ranges.push_back({a, b});
                }
                ++pos_;
                last = seq.size();
                seq.push_back(char_elem(std::move(ranges), negate));
                grow(1);
            } else if (c == '.') {
                ++pos_;
                last = seq.size();
                seq.push_back(char_elem({{0, 0x10FFFF}}, false));
                grow(1);
            } else if (word_char(c)) {
                const std::string n = name();
                last = seq.size();
                seq.push_back({Op::kRef, symbol(n, line)});
                grow(1);
            } else if (c == '(') {
                if (depth >= kMaxNesting) fail("parentheses nested deeper than %s", std::to_string(kMaxNesting));
                ++pos_;
                space(true);
                auto alts = alternates(rule, true, depth + 1);
                if (peek() != ')') fail("expecting ')'");
                ++pos_;
                last = seq.size();
                if (alts.size() == 1) {  // a plain sequence: its elements stand in place of the group
                    seq.insert(seq.end(), alts[0].begin(), alts[0].end());
                } else {
                    const uint32_t g = generated(rule, line);
                    rules_[g].alts = std::move(alts);
                    seq.push_back({Op::kRef, g});
                    grow(1);
                }
            } else if (c == '*' || c == '+' || c == '?' || c == '{') {
                if (last == std::string::npos) fail("'%s' follows nothing to repeat", std::string(1, c));
                ++pos_;
                uint32_t lo = c == '+' ? 1 : 0;
                int64_t hi = c == '?' ? 1 : -1;
                if (c == '{') {
                    space(false);
                    lo = count();
                    space(false);
                    hi = lo;
                    if (peek() == ',') {
                        ++pos_;
                        space(false);
                        hi = peek() == '}' ? -1 : int64_t(count());
                        space(false);
                    }
                    if (peek() != '}') fail("expecting '}' to close a repetition");
                    ++pos_;
                    if (hi >= 0 && hi < int64_t(lo)) fail("a repetition {m,n} with n < m");
                }
                repeat(seq, last, lo, hi, rule, line);
                last = std::string::npos;  // "a**" is an error, as in llama.cpp
            } else {
                break;
            }
            space(nested);
        }
        return seq;
    }

    GrammarDef finish(std::string_view root) {
        for (const auto& r : rules_)
            if (r.line == 0)
                throw_error(ErrorCode::kParse, "grammar: line %d: undefined rule '%s'", r.ref_line, r.name.c_str());
        const auto it = ids_.find(std::string(root));
        if (it == ids_.end())
            throw_error(ErrorCode::kParse, "grammar: no rule named '%.*s' (the start rule)", int(root.size()),
                        root.data());
        GrammarDef g;
        g.root = it->second;
        g.classes = std::move(classes_);
        for (uint32_t i = 0; i < rules_.size(); ++i) {
            Rule r;
            r.name = rules_[i].name;
            r.line = rules_[i].line;
            for (const auto& alt : rules_[i].alts) {
                r.alts.push_back(uint32_t(g.elems.size()));
                g.elems.insert(g.elems.end(), alt.begin(), alt.end());
                g.elems.push_back({Op::kEnd, i});
            }
            g.rules.push_back(std::move(r));
        }
        const std::vector<char> nullable = nullable_rules(g);
        check_left_recursion(g, nullable);
        add_loops(g, nullable);
        find_same_futures(g);
        return g;
    }

    // GrammarDef::same_as. Rules are put in classes of rules that match alike, starting from one class
    // per rule and merging those whose alternatives are the same sequences of character classes and
    // references to classes (a reference to the rule itself counting as "itself", so that
    // L1 ::= x L1 | "" and L2 ::= x L2 | "" merge). Every merge is sound; a pass merges the rules
    // whose references were merged by the pass before, and the passes stop when one merges nothing
    // or after kPasses (what is left unmerged is only not shared).
    static void find_same_futures(GrammarDef& g) {
        constexpr int kPasses = 8;
        constexpr uint64_t kSelf = (1u << 30) - 1;
        const uint32_t n = uint32_t(g.rules.size());
        std::vector<uint32_t> cls(n);
        for (uint32_t r = 0; r < n; ++r) cls[r] = r;
        // The future of each position: an id of (element, future after it), the rule's end being 0. The
        // ids are kept in an open-addressing table of (element, next) keys.
        size_t size = 64;
        while (size < 2 * g.elems.size()) size *= 2;
        std::vector<uint64_t> keys(size);
        std::vector<uint32_t> vals(size);
        uint32_t n_ids = 0;
        auto id_of = [&](uint64_t key) {
            uint64_t m = (key ^ (key >> 29)) * 0xbf58476d1ce4e5b9ull;
            size_t h = size_t(m ^ (m >> 32)) & (size - 1);
            while (vals[h] != 0 && keys[h] != key) h = (h + 1) & (size - 1);
            if (vals[h] == 0) keys[h] = key, vals[h] = ++n_ids;
            return vals[h];
        };
        std::vector<uint32_t> future(g.elems.size(), 0);
        auto futures = [&](bool self) {
            std::fill(vals.begin(), vals.end(), 0u);
            n_ids = 0;
            for (uint32_t r = 0; r < n; ++r)
                for (uint32_t a : g.rules[r].alts) {
                    uint32_t end = a;
                    while (g.elems[end].op != Op::kEnd) ++end;
                    uint32_t next = 0;
                    for (uint32_t p = end; p-- > a;) {
                        const Elem e = g.elems[p];
                        const uint64_t arg = e.op == Op::kChar ? e.arg : self && e.arg == r ? kSelf : cls[e.arg];
                        next = id_of(uint64_t(e.op) << 62 | arg << 32 | next);
                        future[p] = next;
                    }
                }
        };
        // A rule's alternatives as a sorted set of futures, in one pool.
        std::vector<uint32_t> pool, at(n + 1), next_cls(n);
        std::vector<std::pair<uint64_t, uint32_t>> order(n);  // (hash of the alternatives, rule)
        size_t classes = n;
        for (int pass = 0; pass < kPasses; ++pass) {
            futures(true);
            pool.clear();
            for (uint32_t r = 0; r < n; ++r) {
                at[r] = uint32_t(pool.size());
                for (uint32_t a : g.rules[r].alts) pool.push_back(g.elems[a].op == Op::kEnd ? 0 : future[a]);
                std::sort(pool.begin() + at[r], pool.end());
                pool.erase(std::unique(pool.begin() + at[r], pool.end()), pool.end());
            }
            at[n] = uint32_t(pool.size());
            auto alts = [&](uint32_t r) { return std::span<const uint32_t>(pool.data() + at[r], at[r + 1] - at[r]); };
            for (uint32_t r = 0; r < n; ++r) {
                uint64_t h = 0x9e3779b97f4a7c15ull;
                for (uint32_t f : alts(r)) h = (h ^ f) * 0x100000001b3ull + (h >> 31);
                order[r] = {h, r};
            }
            std::sort(order.begin(), order.end());
            // Within a run of one hash, each rule joins the first one with the same alternatives.
            size_t count = 0;
            std::vector<uint32_t> firsts;  // of the current run
            for (uint32_t i = 0; i < n; ++i) {
                const uint32_t r = order[i].second;
                if (i == 0 || order[i].first != order[i - 1].first) firsts.clear();
                next_cls[r] = r;
                for (uint32_t f : firsts)
                    if (std::ranges::equal(alts(r), alts(f))) {
                        next_cls[r] = f;
                        break;
                    }
                if (next_cls[r] == r) firsts.push_back(r), ++count;
            }
            cls.swap(next_cls);
            if (count == classes) break;
            classes = count;
        }
        futures(false);
        std::unordered_map<uint32_t, uint32_t> first;
        g.same_as.resize(g.elems.size());
        for (uint32_t p = 0; p < g.elems.size(); ++p)
            g.same_as[p] = g.elems[p].op == Op::kEnd ? p : first.try_emplace(future[p], p).first->second;
    }

    // The loop rule of each ladder whose item cannot match the empty text (see Rule::loop). Its first
    // alternative is laid out like every rung's (item, one reference, end).
    void add_loops(GrammarDef& g, const std::vector<char>& nullable) const {
        for (const Ladder& l : ladders_) {
            bool empty = true;
            for (const Elem& e : l.item) empty = empty && e.op == Op::kRef && nullable[e.arg];
            if (empty) continue;
            const uint32_t id = uint32_t(g.rules.size());
            Rule r;
            r.name = l.rule + "-loop";
            r.line = l.line;
            r.alts.push_back(uint32_t(g.elems.size()));
            g.elems.insert(g.elems.end(), l.item.begin(), l.item.end());
            g.elems.push_back({Op::kRef, id});
            g.elems.push_back({Op::kEnd, id});
            r.alts.push_back(uint32_t(g.elems.size()));
            g.elems.push_back({Op::kEnd, id});
            g.rules.push_back(std::move(r));
            for (size_t k = 2; k <= l.rungs.size(); ++k) {
                g.rules[l.rungs[k - 1]].loop = id;
                g.rules[l.rungs[k - 1]].rung = uint32_t(k);
            }
        }
    }

    // Which rules can match the empty text.
    static std::vector<char> nullable_rules(const GrammarDef& g) {
        const size_t n = g.rules.size();
        std::vector<char> nullable(n, 0);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                for (uint32_t a : g.rules[r].alts) {
                    uint32_t p = a;
                    while (g.elems[p].op == Op::kRef && nullable[g.elems[p].arg]) ++p;
                    if (g.elems[p].op == Op::kEnd) {
                        nullable[r] = 1, changed = true;
                        break;
                    }
                }
            }
        }
        return nullable;
    }

    // Rejects a rule that can reach itself before consuming a character: the matcher would expand it
    // forever.
    void check_left_recursion(const GrammarDef& g, const std::vector<char>& nullable) const {
        const size_t n = g.rules.size();
        std::vector<std::vector<uint32_t>> left(n);  // rules each rule can start with
        for (size_t r = 0; r < n; ++r)
            for (uint32_t a : g.rules[r].alts)
                for (uint32_t p = a; g.elems[p].op == Op::kRef; ++p) {
                    left[r].push_back(g.elems[p].arg);
                    if (!nullable[g.elems[p].arg]) break;
                }
        std::vector<char> color(n, 0);  // 0 new, 1 on the path, 2 done
        std::vector<std::pair<uint32_t, size_t>> stack;
        for (uint32_t s = 0; s < n; ++s) {
            if (color[s]) continue;
            stack.push_back({s, 0});
            color[s] = 1;
            while (!stack.empty()) {
                auto& [r, i] = stack.back();
                if (i == left[r].size()) {
                    color[r] = 2;
                    stack.pop_back();
                    continue;
                }
                const uint32_t next = left[r][i++];
                if (color[next] == 1) {
                    // Name the first user-written rule on the cycle.
                    size_t k = 0;
                    while (k < stack.size() && stack[k].first != next) ++k;
                    uint32_t named = next;
                    for (size_t j = k; j < stack.size(); ++j)
                        if (!rules_[stack[j].first].generated) {
                            named = stack[j].first;
                            break;
                        }
                    throw_error(ErrorCode::kParse,
                                "grammar: line %d: rule '%s' is left-recursive (it can reach itself without "
                                "consuming input)",
                                g.rules[named].line, g.rules[named].name.c_str());
                }
                if (color[next] == 0) {
                    color[next] = 1;
                    stack.push_back({next, 0});
                }
            }
        }
    }

    std::string_view s_;
    std::vector<size_t> newlines_;  // offsets of '\n', for line numbers
    size_t pos_ = 0;
    size_t total_ = 0;
    int gen_counter_ = 0;
    std::vector<ProtoRule> rules_;
    std::vector<Ladder> ladders_;
    std::unordered_map<std::string, uint32_t> ids_;
    std::vector<CharClass> classes_;
    std::map<std::vector<std::pair<uint32_t, uint32_t>>, uint32_t> class_ids_;
};

}  // namespace

GrammarDef parse_gbnf(std::string_view text, std::string_view root) { return Parser(text).run(root); }

}  // namespace cera::grammar
