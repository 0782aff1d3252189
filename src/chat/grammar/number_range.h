// GBNF expressions for JSON numbers within bounds: the JSON Schema converter's integer ranges and its
// number ranges (minimum, maximum, exclusiveMinimum, exclusiveMaximum on "number").
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace cera::grammar {

// Non-negative integers in [lo, hi], without leading zeros.
std::string uint_range(uint64_t lo, uint64_t hi);

// A decimal value: sign, integer digits without leading zeros ("0" for none), fraction digits without
// trailing zeros ("" for none). Zero is never negative.
struct Decimal {
    bool negative = false;
    std::string int_digits = "0", frac_digits;
    // From a JSON number's text ("12", "-0.25", "1e-05", "2.5E+3"); nullopt when it is not one.
    static std::optional<Decimal> parse(const std::string& text);
    bool is_zero() const { return int_digits == "0" && frac_digits.empty(); }
};
int compare(const Decimal& a, const Decimal& b);  // <0, 0, >0

struct NumberBound {
    Decimal value;
    bool inclusive = true;
};

// JSON numbers x with lo <= x <= hi (< and > for bounds that are not inclusive; a missing bound: no limit),
// written in decimal notation without an exponent, with at most 16 integer and 16 fraction digits (a
// subset of the numbers in range, every one of them in it). nullopt when no such number lies in range.
std::optional<std::string> number_range(const std::optional<NumberBound>& lo, const std::optional<NumberBound>& hi);

}  // namespace cera::grammar
