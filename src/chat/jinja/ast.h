// Syntax tree of a parsed template. One node type for expressions and one for
// statements; which fields a node uses depends on its kind (listed per kind).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/value.h"

namespace cera::jinja {

enum class ExprKind {
    kLiteral,  // literal
    kName,     // name
    kList,     // items
    kTuple,    // items (evaluates to a list)
    kDict,     // items: key0, value0, key1, value1, ...
    kAttr,     // a.name
    kItem,     // a[b]
    kSlice,    // a[b:c:d] (missing parts are null)
    kCall,     // a(items..., kwargs...)
    kFilter,   // a | name(items..., kwargs...); a is null inside set/filter blocks
    kTest,     // a is [not] name(items...)
    kNeg,      // -a
    kPos,      // +a
    kNot,      // not a
    kBinary,   // a op b, op in + - * / // % **
    kConcat,   // items joined with ~
    kCompare,  // a ops[0] items[0] ops[1] items[1] ... (chained)
    kAnd,      // a and b
    kOr,       // a or b
    kCond,     // a if b else c (c may be null)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
    ExprKind kind = ExprKind::kLiteral;
    int line = 0;
    int depth = 1;  // height of this subtree (bounded by the parser)
    Value literal;
    std::string name;  // name, attribute, filter, test or operator
    ExprPtr a, b, c, d;
    std::vector<ExprPtr> items;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    std::vector<std::string> ops;  // comparison operators: == != < <= > >= in notin
    bool negated = false;          // `is not`
};

enum class StmtKind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches (condition, body); else_body
    kFor,          // targets in expr [if cond]; body; else_body
    kSet,          // targets = expr, or attr_target.attr = expr
    kSetBlock,     // {% set targets[0] | filters %} body {% endset %}; filters in expr (may be null)
    kMacro,        // name(params) body
    kCallBlock,    // {% call(params) expr %} body {% endcall %}
    kFilterBlock,  // {% filter expr %} body {% endfilter %}
    kBreak,
    kContinue,
    kDo,           // {% do expr %}
    kWith,         // {% with targets = values %} body {% endwith %}
    kScope,        // body run as-is ({% generation %}); no own scope
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
    StmtKind kind = StmtKind::kText;
    int line = 0;
    std::string text;
    ExprPtr expr;
    ExprPtr cond;                                      // for-loop filter
    std::vector<std::pair<ExprPtr, Body>> branches;    // if / elif
    Body body, else_body;
    std::vector<std::string> targets;                  // assigned names
    std::vector<ExprPtr> values;                       // with: one per target
    ExprPtr attr_target;                               // set ns.attr = ...: the namespace expression
    std::string name;                                  // macro name, or the attribute of attr_target
    std::vector<std::pair<std::string, ExprPtr>> params;  // macro / call-block parameters with defaults
};

}  // namespace cera::jinja
