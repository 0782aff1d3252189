#include "chat/grammar/number_range.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace cera::grammar {
namespace {

constexpr size_t kMaxDigits = 16;            // integer and fraction digits of the numbers written
constexpr uint64_t kBig = 9999999999999999;  // the largest integer part written

std::string quoted(const std::string& digits) { return "\"" + digits + "\""; }

std::string join(const std::vector<std::string>& alts) {
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out;
}

// Decimal strings of equal length lo <= hi as a GBNF expression. A side whose remaining digits span all
// of their strings (lo's all 0, hi's all 9) joins the middle range of first digits, so each level recurses
// on one side only and the expression grows with the square of the length, not exponentially.
std::string digits_range(const std::string& lo, const std::string& hi) {
    if (lo.empty()) return "";
    if (lo == hi) return quoted(lo);
    if (lo.size() == 1) return "[" + lo + "-" + hi + "]";
    const std::string rest_lo = lo.substr(1), rest_hi = hi.substr(1);
    if (lo[0] == hi[0]) return quoted(lo.substr(0, 1)) + " (" + digits_range(rest_lo, rest_hi) + ")";
    const size_t n = lo.size() - 1;
    const bool lo_all = rest_lo == std::string(n, '0'), hi_all = rest_hi == std::string(n, '9');
    const char first = lo_all ? lo[0] : char(lo[0] + 1), last = hi_all ? hi[0] : char(hi[0] - 1);
    std::vector<std::string> alts;
    if (!lo_all) alts.push_back(quoted(lo.substr(0, 1)) + " (" + digits_range(rest_lo, std::string(n, '9')) + ")");
    if (first <= last)
        alts.push_back((first == last ? quoted(std::string(1, first))
                                      : "[" + std::string(1, first) + "-" + std::string(1, last) + "]") +
                       " [0-9]{" + std::to_string(n) + "}");
    if (!hi_all) alts.push_back(quoted(hi.substr(0, 1)) + " (" + digits_range(std::string(n, '0'), rest_hi) + ")");
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out;
}

}  // namespace

std::string uint_range(uint64_t lo, uint64_t hi) {
    std::vector<std::string> alts;
    uint64_t start = lo;
    while (start <= hi) {
        const std::string s = std::to_string(start);
        uint64_t top = 9;
        for (size_t i = 1; i < s.size(); ++i) top = top * 10 + 9;  // the largest number of s's length
        const uint64_t end = std::min(top, hi);
        alts.push_back("(" + digits_range(s, std::to_string(end)) + ")");
        if (end == hi) break;
        start = end + 1;
    }
    std::string out;
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
    return out;
}

namespace {

std::optional<std::string> frac_digits(const std::string& lo, bool lo_incl, const std::string& hi, bool hi_incl,
                                       bool hi_inf, size_t n);

// What may follow a fraction digit: nothing or up to n more digits, with the remaining digits of the
// bounds (see frac_digits).
std::optional<std::string> frac_tail(const std::string& lo, bool lo_incl, const std::string& hi, bool hi_incl,
                                     bool hi_inf, size_t n) {
    const std::string k = std::to_string(n);
    if (lo.empty() && lo_incl && hi_inf) return n > 0 ? "[0-9]{0," + k + "}" : std::string();
    if (lo.empty() && lo_incl && hi.empty() && hi_incl) return n > 0 ? "\"0\"{0," + k + "}" : std::string();
    const bool empty_ok = lo.empty() && lo_incl && (hi_inf || !hi.empty() || hi_incl);  // value 0 in range
    const auto more = frac_digits(lo, lo_incl, hi, hi_incl, hi_inf, n);
    if (more) return "( " + *more + (empty_ok ? " )?" : " )");
    if (empty_ok) return std::string();
    return std::nullopt;
}

// Fraction digit strings D of 1..n digits whose value 0.D lies between 0.lo and 0.hi (lo, hi: digits
// without trailing zeros, "" for 0; each bound inclusive or not; hi_inf: no upper bound below 1). The
// first digit meets a bound only at that bound's first digit, where the rest of the bound passes to the
// rest of D, and a bound whose rest leaves the rest of D free joins the middle digits; so each level
// recurses on at most two chains, one a side.
std::optional<std::string> frac_digits(const std::string& lo, bool lo_incl, const std::string& hi, bool hi_incl,
                                       bool hi_inf, size_t n) {
    if (n == 0) return std::nullopt;
    const std::string rest = "[0-9]{0," + std::to_string(n - 1) + "}";
    if (lo.empty() && !lo_incl && hi_inf)  // above 0: a nonzero digit somewhere
        return "\"0\"{0," + std::to_string(n - 1) + "} [1-9] " + rest;
    const int lo0 = lo.empty() ? 0 : lo[0] - '0';
    const int hi0 = hi_inf ? 9 : hi.empty() ? 0 : hi[0] - '0';
    if (lo0 > hi0) return std::nullopt;
    const std::string lo_rest = lo.empty() ? "" : lo.substr(1), hi_rest = hi.empty() ? "" : hi.substr(1);
    std::vector<std::string> alts;
    auto add = [&](int d, const std::optional<std::string>& tail) {
        if (tail) alts.push_back(quoted(std::string(1, char('0' + d))) + (tail->empty() ? "" : " " + *tail));
    };
    if (lo0 == hi0) {
        add(lo0, frac_tail(lo_rest, lo_incl, hi_rest, hi_incl, hi_inf, n - 1));
    } else {
        const bool lo_free = lo_rest.empty() && lo_incl, hi_free = hi_inf;
        if (!lo_free) add(lo0, frac_tail(lo_rest, lo_incl, "", true, true, n - 1));
        const int first = lo_free ? lo0 : lo0 + 1, last = hi_free ? hi0 : hi0 - 1;
        if (first <= last)
            alts.push_back((first == last ? quoted(std::to_string(first))
                                          : "[" + std::to_string(first) + "-" + std::to_string(last) + "]") +
                           (n > 1 ? " " + rest : ""));
        if (!hi_free) add(hi0, frac_tail("", true, hi_rest, hi_incl, hi_inf, n - 1));
    }
    if (alts.empty()) return std::nullopt;
    return join(alts);
}

// The optional fraction part ("." and digits) of a number whose integer part sits at the bounds.
std::optional<std::string> fraction(const std::string& lo, bool lo_incl, const std::string& hi, bool hi_incl,
                                    bool hi_inf) {
    if (lo.empty() && lo_incl && hi_inf) return std::string("( \".\" [0-9]{1,16} )?");
    const bool empty_ok = lo.empty() && lo_incl && (hi_inf || !hi.empty() || hi_incl);
    const auto d = frac_digits(lo, lo_incl, hi, hi_incl, hi_inf, kMaxDigits);
    if (d) return "( \".\" ( " + *d + (empty_ok ? " ) )?" : " ) )");
    if (empty_ok) return std::string();
    return std::nullopt;
}

// Unsigned decimal texts m (integer part without leading zeros, optional fraction) with lo <(=) m <(=) hi,
// both bounds non-negative; no hi: no upper bound.
std::optional<std::string> magnitude(const NumberBound& lo, std::optional<NumberBound> hi) {
    if (hi) {
        const int c = compare(lo.value, hi->value);
        if (c > 0 || (c == 0 && !(lo.inclusive && hi->inclusive))) return std::nullopt;
    }
    const std::string& li = lo.value.int_digits;
    if (li.size() > kMaxDigits) return std::nullopt;                 // above every number written
    if (hi && hi->value.int_digits.size() > kMaxDigits) hi.reset();  // above every number written
    std::vector<std::string> alts;
    auto add = [&](const std::string& int_part, const std::optional<std::string>& frac) {
        if (frac) alts.push_back(quoted(int_part) + (frac->empty() ? "" : " " + *frac));
    };
    if (hi && hi->value.int_digits == li) {
        add(li, fraction(lo.value.frac_digits, lo.inclusive, hi->value.frac_digits, hi->inclusive, false));
    } else {
        add(li, fraction(lo.value.frac_digits, lo.inclusive, "", true, true));
        const uint64_t a = std::stoull(li) + 1, b = hi ? std::stoull(hi->value.int_digits) - 1 : kBig;
        if (a <= b) alts.push_back("( " + uint_range(a, b) + " ) ( \".\" [0-9]{1,16} )?");
        if (hi) add(hi->value.int_digits, fraction("", true, hi->value.frac_digits, hi->inclusive, false));
    }
    if (alts.empty()) return std::nullopt;
    return join(alts);
}

}  // namespace

std::optional<Decimal> Decimal::parse(const std::string& text) {
    size_t i = 0;
    Decimal d;
    const bool negative = !text.empty() && text[0] == '-';
    if (negative) ++i;
    std::string digits;
    long point = -1;
    for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'); ++i) {
        if (text[i] == '.') {
            if (point >= 0) return std::nullopt;
            point = long(digits.size());
        } else {
            digits += text[i];
        }
    }
    if (digits.empty()) return std::nullopt;
    if (point < 0) point = long(digits.size());
    if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
        ++i;
        const bool neg_exp = i < text.size() && text[i] == '-';
        if (i < text.size() && (text[i] == '-' || text[i] == '+')) ++i;
        if (i == text.size()) return std::nullopt;
        long e = 0;
        for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i)
            e = std::min(e * 10 + (text[i] - '0'), 1000L);  // far past any bound a number written meets
        point += neg_exp ? -e : e;
    }
    if (i != text.size()) return std::nullopt;
    std::string ip, fp;
    if (point <= 0) {
        ip = "0", fp = std::string(size_t(-point), '0') + digits;
    } else if (size_t(point) >= digits.size()) {
        ip = digits + std::string(size_t(point) - digits.size(), '0');
    } else {
        ip = digits.substr(0, size_t(point)), fp = digits.substr(size_t(point));
    }
    ip.erase(0, std::min(ip.find_first_not_of('0'), ip.size() - 1));
    fp.erase(fp.find_last_not_of('0') + 1);
    d.int_digits = ip, d.frac_digits = fp;
    d.negative = negative && !d.is_zero();
    return d;
}

int compare(const Decimal& a, const Decimal& b) {
    if (a.negative != b.negative) return a.negative ? -1 : 1;
    int c = 0;
    if (a.int_digits.size() != b.int_digits.size())
        c = a.int_digits.size() < b.int_digits.size() ? -1 : 1;
    else if (a.int_digits != b.int_digits)
        c = a.int_digits < b.int_digits ? -1 : 1;
    else if (a.frac_digits != b.frac_digits)
        c = a.frac_digits < b.frac_digits ? -1 : 1;
    return a.negative ? -c : c;
}

std::optional<std::string> number_range(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi) {
    std::vector<std::string> alts;
    // x >= 0, written without a sign.
    if (!hi || !hi->value.negative) {
        const NumberBound m_lo = lo && !lo->value.negative ? *lo : NumberBound{};
        if (auto m = magnitude(m_lo, hi)) alts.push_back(*m);
    }
    // x < 0: "-" and a magnitude above 0 (so never "-0").
    if (!lo || lo->value.negative) {
        NumberBound m_lo{Decimal{}, false};
        if (hi && hi->value.negative)
            m_lo = {Decimal{false, hi->value.int_digits, hi->value.frac_digits}, hi->inclusive};
        std::optional<NumberBound> m_hi;
        if (lo) m_hi = NumberBound{Decimal{false, lo->value.int_digits, lo->value.frac_digits}, lo->inclusive};
        if (auto m = magnitude(m_lo, m_hi)) alts.push_back("\"-\" ( " + *m + " )");
    }
    if (alts.empty()) return std::nullopt;
    return join(alts);
}

}  // namespace cera::grammar
