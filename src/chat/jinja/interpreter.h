// Tree-walking interpreter for parsed templates, with Jinja's scoping (a for-loop
// body and a macro call get their own scope; `namespace()` objects carry values
// out), loop variables, macros and call blocks. Every render is bounded: output
// size, evaluation steps, bytes of strings and lists built, macro call depth.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/value.h"

namespace cera::jinja {

struct RenderLimits {
    size_t max_output_bytes = 16u << 20;  // rendered text
    uint64_t max_steps = 5'000'000;       // statements, expressions and loop iterations evaluated
    size_t max_alloc_bytes = 256u << 20;  // total size of strings and lists built by operators and filters
    int max_call_depth = 64;              // nested macro calls
    size_t max_range = 1'000'000;         // elements of one range()
};

// strftime_now(format): the text for the current (or an injected) date.
using StrftimeFn = std::function<std::string(const std::string& format)>;

class Interpreter {
   public:
    Interpreter(const RenderLimits& limits, StrftimeFn strftime_now);

    // Renders `body` with `globals` as the outermost variables. Throws cera::Error:
    // kParse for template errors (with the line), kInvalidArgument for raise_exception(),
    // kOutOfRange when a limit is hit.
    std::string render(const Body& body, const std::vector<std::pair<std::string, Value>>& globals);

    // ---- used by the builtins ----
    // Calls a callable value.
    Value call(const Value& callee, CallArgs& args, int line);
    // Applies filter `name` to `input`.
    Value apply_filter(const std::string& name, const Value& input, CallArgs& args, int line);
    // Runs test `name` on `input`.
    bool apply_test(const std::string& name, const Value& input, CallArgs& args, int line);
    // Counts `bytes` of newly built data against the allocation budget.
    void charge(size_t bytes);
    // Counts one evaluation step.
    void step();
    const RenderLimits& limits() const { return limits_; }
    const StrftimeFn& strftime_now() const { return strftime_now_; }

   private:
    struct Frame {
        std::vector<std::pair<std::string, Value>> vars;
        Value* find(const std::string& name);
        void set(const std::string& name, Value v);
    };
    using Scope = std::vector<std::shared_ptr<Frame>>;
    static std::shared_ptr<Frame> new_frame();  // a frame emptied when the render's CycleBreaker ends
    enum class Flow { kNormal, kBreak, kContinue };

    RenderLimits limits_;
    StrftimeFn strftime_now_;
    Scope scope_;
    uint64_t steps_ = 0;
    size_t allocated_ = 0;
    int call_depth_ = 0;

    Value lookup(const std::string& name);
    void assign(const std::string& name, Value v);
    void assign_targets(const std::vector<std::string>& targets, const Value& v);

    Flow exec_body(const Body& body, std::string& out);
    Flow exec(const Stmt& s, std::string& out);
    Flow exec_for(const Stmt& s, std::string& out);
    void exec_set(const Stmt& s, std::string& out);
    void exec_call_block(const Stmt& s, std::string& out);
    void append(std::string& out, const std::string& text);
    Value make_macro(const Stmt& s);

    Value eval(const Expr& e);
    Value eval_filter_chain(const Expr& e, const Value& input);
    Value eval_compare(const Expr& e);
    void eval_args(const Expr& e, CallArgs& args);
    Value eval_slice(const Expr& e);
};

// Helpers shared by the interpreter and the builtins (builtins.cpp).
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value binary_op(Interpreter& interp, const std::string& op, const Value& a, const Value& b);
// Python ordering for sort/min/max/comparisons; throws for unordered types.
int compare_values(const Value& a, const Value& b, bool case_sensitive = true);
// `needle in haystack`.
bool contains(const Value& haystack, const Value& needle);
// The elements a for loop visits: list items, dict keys, string characters; undefined gives none.
ValueList iterate(const Value& v);
// Global functions: range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> builtin_globals(Interpreter& interp);

}  // namespace cera::jinja
