#include "chat/grammar/multiple_of.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

namespace cera::grammar {
namespace {

// Integer digits of the numbers written: 15, so that an integer multiple is below 2^53 and a validator
// that reads numbers as doubles divides it exactly.
constexpr size_t kMaxIntDigits = 15;
constexpr size_t kMaxFracDigits = 16;
constexpr uint64_t kMaxModulus = 1000000;

// Magnitudes as decimal digit strings without leading zeros ("0" for zero).
std::string strip(std::string s) {
    s.erase(0, std::min(s.find_first_not_of('0'), s.size() - 1));
    return s;
}
int cmp(const std::string& a, const std::string& b) {
    if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
    return a == b ? 0 : a < b ? -1 : 1;
}
std::string inc(std::string s) {
    size_t i = s.size();
    while (i > 0 && s[i - 1] == '9') s[--i] = '0';
    if (i == 0) return "1" + s;
    ++s[i - 1];
    return s;
}
std::string dec(std::string s) {  // s > 0
    size_t i = s.size();
    while (s[i - 1] == '0') s[--i] = '9';
    --s[i - 1];
    return strip(s);
}

// A signed integer.
struct Int {
    bool neg = false;
    std::string mag = "0";
};
Int plus1(const Int& v) {
    if (!v.neg) return {false, inc(v.mag)};
    const std::string m = dec(v.mag);
    return {m != "0", m};
}
Int minus1(const Int& v) {
    if (v.neg) return {true, inc(v.mag)};
    if (v.mag == "0") return {true, "1"};
    return {false, dec(v.mag)};
}

// The integers N with N 10^-frac on the allowed side of bound b: the smallest (lower) or the largest.
Int scaled(const NumberBound& b, int frac, bool lower) {
    const Decimal& v = b.value;
    std::string f = v.frac_digits;
    const bool exact = f.size() <= size_t(frac);
    f.resize(size_t(frac), '0');
    Int t{v.negative, strip(v.int_digits + f)};  // v 10^frac truncated towards zero
    if (t.mag == "0") t.neg = false;
    if (!exact) {  // the bound lies between t and its neighbour away from zero
        if (lower && !v.negative) t = plus1(t);
        if (!lower && v.negative) t = minus1(t);
    } else if (!b.inclusive) {
        t = lower ? plus1(t) : minus1(t);
    }
    return t;
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }
std::string any_digits(size_t n) { return n == 1 ? "[0-9]" : "[0-9]{" + std::to_string(n) + "}"; }

// Writes the digit strings of one length L (the text's digits without its point: the integer part, then
// exactly `frac` fraction digits) that lie in a range and make a multiple of the modulus. A piece of the
// expression covers the digits at some distance from the text's end, so the point goes where a piece
// reaches frac digits from the end.
class Writer {
 public:
    Writer(const MultipleStep& step, const std::function<std::string(const std::string&)>& add_rule)
        : m_(step.modulus), k_(size_t(step.frac)), add_rule_(add_rule) {
        uint64_t p = 1;
        for (size_t j = 0; j <= 19 && p != 0; ++j) {  // the least j with m | 10^j, if any below 20
            if (p % m_ == 0) {
                pow10_divisible_ = int(j);
                break;
            }
            if (p > UINT64_MAX / 10) break;
            p *= 10;
        }
    }
    bool too_large() const { return too_large_; }

    // Digit strings s with lo <= s <= hi (equal lengths) whose value makes rem * 10^len + s a multiple.
    std::optional<std::string> range(const std::string& lo, const std::string& hi, uint64_t rem) {
        if (too_large_) return std::nullopt;
        const size_t n = lo.size();
        const uint64_t need = (m_ - mulmod(rem, pow10mod(n))) % m_;
        if (lo == std::string(n, '0') && hi == std::string(n, '9')) return free(n, need);
        const int d0 = lo[0] - '0', d1 = hi[0] - '0';
        std::vector<std::pair<int, std::string>> alts;  // (digit, what follows it)
        auto next = [&](int d) { return (mulmod(rem, 10) + uint64_t(d)) % m_; };
        if (n == 1) {
            for (int d = d0; d <= d1; ++d)
                if (next(d) == 0) alts.push_back({d, ""});
        } else if (d0 == d1) {
            if (auto r = range(lo.substr(1), hi.substr(1), next(d0))) alts.push_back({d0, *r});
        } else {
            if (auto r = range(lo.substr(1), std::string(n - 1, '9'), next(d0))) alts.push_back({d0, *r});
            for (int d = d0 + 1; d < d1; ++d)
                if (auto r = free(n - 1, need_after(n, need, d))) alts.push_back({d, *r});
            if (auto r = range(std::string(n - 1, '0'), hi.substr(1), next(d1))) alts.push_back({d1, *r});
        }
        if (alts.empty()) return std::nullopt;
        return point_before(n) + join(alts);
    }

 private:
    uint64_t mulmod(uint64_t a, uint64_t b) const { return (a % m_) * (b % m_) % m_; }  // m <= 10^6

    uint64_t pow10mod(size_t n) const {
        uint64_t r = 1 % m_;
        for (size_t i = 0; i < n; ++i) r = mulmod(r, 10);
        return r;
    }
    // What the remaining n - 1 digits must be, modulo m, after digit d, for the n digits to be `need`.
    uint64_t need_after(size_t n, uint64_t need, int d) const {
        const uint64_t lead = mulmod(uint64_t(d), pow10mod(n - 1));
        return (need + m_ - lead) % m_;
    }
    // The point, when it comes right before the first of the last n digits.
    std::string point_before(size_t n) const { return k_ > 0 && n == k_ ? "\".\" " : ""; }

    // Alternatives (digit, what follows): digits with the same continuation share a class.
    static std::string join(const std::vector<std::pair<int, std::string>>& alts) {
        std::vector<std::pair<std::string, std::string>> groups;  // (digits, continuation)
        for (const auto& alt : alts) {
            const char d = char('0' + alt.first);
            auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.second == alt.second; });
            if (it == groups.end())
                groups.push_back({std::string(1, d), alt.second});
            else
                it->first += d;
        }
        std::string out;
        for (const auto& [ds, rest] : groups) {
            std::string head = ds.size() == 1 ? quoted(ds) : "[" + ds + "]";
            out += (out.empty() ? "" : " | ") + head + (rest.empty() ? "" : " ( " + rest + " )");
        }
        return groups.size() == 1 ? out : "( " + out + " )";
    }

    // c free digits followed by `tail` more digits.
    std::string any(size_t c, size_t tail) const {
        if (c == 0) return "";
        if (k_ > 0 && c + tail >= k_ && c + tail - k_ < c) {
            const size_t i = c + tail - k_;  // digits before the point
            return (i ? any_digits(i) + " " : "") + "\".\" " + any_digits(c - i);
        }
        return any_digits(c);
    }
    // The last n digits as the literal value v.
    std::string literal(uint64_t v, size_t n) const {
        std::string s = std::to_string(v);
        s.insert(0, n - s.size(), '0');
        if (k_ > 0 && n >= k_) {
            const size_t i = n - k_;
            return (i ? quoted(s.substr(0, i)) + " " : "") + "\".\" " + quoted(s.substr(i));
        }
        return quoted(s);
    }

    // The last n digits, any value congruent to need modulo m.
    std::optional<std::string> free(size_t n, uint64_t need) {
        if (too_large_) return std::nullopt;
        if (n == 0) return need == 0 ? std::optional<std::string>("") : std::nullopt;
        if (m_ == 1) return any(n, 0);
        if (n < 19) {  // at most one value below 10^n <= m
            uint64_t p = 1;
            for (size_t i = 0; i < n; ++i) p *= 10;
            if (p <= m_) return need < p ? std::optional<std::string>(literal(need, n)) : std::nullopt;
        }
        // m divides 10^j: the digits before the last j are free.
        if (pow10_divisible_ >= 0 && n > size_t(pow10_divisible_)) {
            const size_t j = size_t(pow10_divisible_);
            auto t = free(j, need);
            if (!t) return std::nullopt;
            return any(n - j, j) + (t->empty() ? "" : " " + *t);
        }
        const auto key = std::make_pair(n, need);
        if (auto it = memo_.find(key); it != memo_.end()) return it->second;
        std::vector<std::pair<int, std::string>> alts;
        for (int d = 0; d <= 9; ++d)
            if (auto r = free(n - 1, need_after(n, need, d))) alts.push_back({d, *r});
        std::optional<std::string> out;
        if (!alts.empty()) {
            if (++rules_ > kMaxMultipleRules) {
                too_large_ = true;
                return std::nullopt;
            }
            out = add_rule_(point_before(n) + join(alts));
        }
        memo_[key] = out;
        return out;
    }

    uint64_t m_;
    size_t k_;
    const std::function<std::string(const std::string&)>& add_rule_;
    int pow10_divisible_ = -1;
    std::map<std::pair<size_t, uint64_t>, std::optional<std::string>> memo_;
    int rules_ = 0;
    bool too_large_ = false;
};

// Magnitudes a <= N <= b (digit strings) as texts: each length of digits in turn, lengths below frac + 1
// written with leading zeros (an integer part of "0").
std::optional<std::string> magnitudes(Writer& w, const std::string& a, const std::string& b, size_t frac) {
    if (cmp(a, b) > 0) return std::nullopt;
    const size_t l0 = std::max(a.size(), frac + 1), l1 = std::max(b.size(), frac + 1);
    std::string out;
    for (size_t len = l0; len <= l1; ++len) {
        std::string lo = len == l0 ? std::string(len - a.size(), '0') + a : std::string(len, '0');
        if (len != l0) lo[0] = '1';  // the least of len digits
        std::string hi = len == l1 ? std::string(len - b.size(), '0') + b : std::string(len, '9');
        if (auto r = w.range(lo, hi, 0)) out += (out.empty() ? "" : " | ") + *r;
    }
    if (out.empty()) return std::nullopt;
    return out;
}

}  // namespace

std::optional<MultipleStep> multiple_step(const Decimal& m, bool integer_only) {
    const std::string digits = strip(m.int_digits + m.frac_digits);
    if (m.negative || digits == "0" || digits.size() > 7 || m.frac_digits.size() > kMaxFracDigits) return std::nullopt;
    MultipleStep s{std::stoull(digits), int(m.frac_digits.size())};
    if (s.modulus > kMaxModulus) return std::nullopt;
    if (integer_only) {  // the least integer multiple of modulus / 10^frac: modulus / gcd(modulus, 10^frac)
        for (int i = 0; i < s.frac && s.modulus % 2 == 0; ++i) s.modulus /= 2;
        for (int i = 0; i < s.frac && s.modulus % 5 == 0; ++i) s.modulus /= 5;
        s.frac = 0;
    }
    return s;
}

MultipleRange multiple_range(const MultipleStep& step, const std::optional<NumberBound>& lo,
                             const std::optional<NumberBound>& hi,
                             const std::function<std::string(const std::string&)>& add_rule) {
    const size_t frac = size_t(step.frac);
    const std::string limit(kMaxIntDigits + frac, '9');
    const Int n_lo = lo ? scaled(*lo, step.frac, true) : Int{true, limit};
    const Int n_hi = hi ? scaled(*hi, step.frac, false) : Int{false, limit};
    auto at_most = [&](const std::string& v) { return cmp(v, limit) > 0 ? limit : v; };
    Writer w(step, add_rule);
    std::string out;
    if (!n_hi.neg) {  // N >= 0, unsigned
        if (auto e = magnitudes(w, n_lo.neg ? "0" : n_lo.mag, at_most(n_hi.mag), frac)) out = *e;
    }
    if (n_lo.neg) {  // N < 0: "-" and a magnitude of at least 1, so never "-0"
        if (auto e = magnitudes(w, n_hi.neg ? n_hi.mag : "1", at_most(n_lo.mag), frac))
            out += (out.empty() ? "" : " | ") + std::string("\"-\" ( ") + *e + " )";
    }
    MultipleRange r;
    r.too_large = w.too_large();
    if (!out.empty() && !r.too_large) r.expr = out;
    return r;
}

}  // namespace cera::grammar
