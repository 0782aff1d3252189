// GBNF expressions for JSON numbers that are multiples of a step (JSON Schema's multipleOf), within
// bounds: the JSON Schema converter's integers and numbers with a multipleOf.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "chat/grammar/number_range.h"

namespace cera::grammar {

// A step m > 0 as the numbers it admits are written: x is a multiple of m exactly when x written with
// `frac` fraction digits, read as an integer without its point, is a multiple of `modulus`.
struct MultipleStep {
    uint64_t modulus = 1;
    int frac = 0;
};
// The step of a multipleOf for an integer (integer_only: frac 0, the modulus the smallest integer multiple
// of m) or for a number. nullopt when m is not positive, has more than 16 decimals, or its modulus is
// above 10^6.
std::optional<MultipleStep> multiple_step(const Decimal& m, bool integer_only);

// The multiples x of the step with lo <= x <= hi (< and > for bounds that are not inclusive; a missing
// bound: no limit), written in decimal with an integer part of at most 15 digits without leading zeros
// and, for frac > 0, a point and exactly frac digits. Rules that the expression refers to are made with
// add_rule(body), which returns the rule's name.
struct MultipleRange {
    std::optional<std::string> expr;  // nullopt: no such multiple (or too_large)
    bool too_large = false;           // the grammar would pass kMaxMultipleRules rules
};
constexpr int kMaxMultipleRules = 4096;
MultipleRange multiple_range(const MultipleStep& step, const std::optional<NumberBound>& lo,
                             const std::optional<NumberBound>& hi,
                             const std::function<std::string(const std::string&)>& add_rule);

}  // namespace cera::grammar
