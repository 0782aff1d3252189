#include "chat/jinja/parser.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace cera::jinja {

namespace {

constexpr int kMaxDepth = 200;  // nesting of blocks and expressions

bool is_end_tag(const std::string& name) {
    return name == "endif" || name == "endfor" || name == "endmacro" || name == "endset" || name == "endcall" ||
           name == "endfilter" || name == "endwith" || name == "endgeneration" || name == "elif" || name == "else";
}

class Parser {
   public:
    explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

    Body parse_template() {
        std::string end;
        Body body = parse_body({}, end);
        return body;
    }

   private:
    const std::vector<Token>& t_;
    size_t i_ = 0;
    int depth_ = 0;
    int loop_depth_ = 0;

    struct DepthGuard {
        Parser& p;
        explicit DepthGuard(Parser& parser) : p(parser) {
            if (++p.depth_ > kMaxDepth) p.fail(p.cur(), "template nested too deeply");
        }
        ~DepthGuard() { --p.depth_; }
    };

    const Token& cur() const { return t_[i_]; }
    const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
    void advance() {
        if (i_ + 1 < t_.size()) ++i_;
    }

    static std::string describe(const Token& t) {
        switch (t.kind) {
            case TokenKind::kText: return "text";
            case TokenKind::kExprOpen: return "'{{'";
            case TokenKind::kExprClose: return "'}}'";
            case TokenKind::kBlockOpen: return "'{%'";
            case TokenKind::kBlockClose: return "'%}'";
            case TokenKind::kName: return "'" + t.text + "'";
            case TokenKind::kString: return "a string";
            case TokenKind::kInt:
            case TokenKind::kFloat: return "number " + t.text;
            case TokenKind::kOperator: return "'" + t.text + "'";
            case TokenKind::kEnd: return "end of template";
        }
        return "token";
    }

    [[noreturn]] void fail(const Token& at, const std::string& what) {
        throw_error(ErrorCode::kParse, "chat template: line %d, column %d: %s", at.line, at.column, what.c_str());
    }

    bool is_op(const char* op) const { return cur().kind == TokenKind::kOperator && cur().text == op; }
    bool is_name(const char* name) const { return cur().kind == TokenKind::kName && cur().text == name; }

    void expect_op(const char* op) {
        if (!is_op(op)) fail(cur(), std::string("expected '") + op + "', got " + describe(cur()));
        advance();
    }

    std::string expect_name(const char* what) {
        if (cur().kind != TokenKind::kName) fail(cur(), std::string("expected ") + what + ", got " + describe(cur()));
        std::string n = cur().text;
        advance();
        return n;
    }

    void expect_block_close() {
        if (cur().kind != TokenKind::kBlockClose) fail(cur(), "expected '%}', got " + describe(cur()));
        advance();
    }

    // ---- statements ----

    // Parses statements until a block tag named in `ends` (consumed up to its name; stored in `end`).
    Body parse_body(const std::vector<const char*>& ends, std::string& end) {
        DepthGuard guard(*this);
        Body body;
        while (true) {
            const Token& tok = cur();
            if (tok.kind == TokenKind::kEnd) {
                if (!ends.empty()) fail(tok, std::string("unexpected end of template, expected '{% ") + ends.back() + " %}'");
                return body;
            }
            if (tok.kind == TokenKind::kText) {
                auto s = std::make_unique<Stmt>();
                s->kind = StmtKind::kText;
                s->line = tok.line;
                s->text = tok.text;
                body.push_back(std::move(s));
                advance();
                continue;
            }
            if (tok.kind == TokenKind::kExprOpen) {
                advance();
                auto s = std::make_unique<Stmt>();
                s->kind = StmtKind::kOutput;
                s->line = tok.line;
                s->expr = parse_expression();
                if (cur().kind != TokenKind::kExprClose) fail(cur(), "expected '}}', got " + describe(cur()));
                advance();
                body.push_back(std::move(s));
                continue;
            }
            if (tok.kind != TokenKind::kBlockOpen) fail(tok, "unexpected " + describe(tok));
            const Token& name_tok = peek();
            if (name_tok.kind != TokenKind::kName) fail(name_tok, "expected a tag name after '{%', got " + describe(name_tok));
            for (const char* e : ends) {
                if (name_tok.text == e) {
                    advance();
                    advance();
                    end = e;
                    return body;
                }
            }
            if (is_end_tag(name_tok.text)) fail(name_tok, "unexpected '{% " + name_tok.text + " %}'");
            advance();
            body.push_back(parse_statement());
        }
    }

    StmtPtr parse_statement() {
        const Token& tok = cur();
        std::string tag = tok.text;
        advance();
        auto s = std::make_unique<Stmt>();
        s->line = tok.line;
        if (tag == "if") return parse_if(std::move(s));
        if (tag == "for") return parse_for(std::move(s));
        if (tag == "set") return parse_set(std::move(s));
        if (tag == "macro") return parse_macro(std::move(s));
        if (tag == "call") return parse_call_block(std::move(s));
        if (tag == "filter") {
            s->kind = StmtKind::kFilterBlock;
            s->expr = parse_filter_chain(nullptr, tok);
            expect_block_close();
            std::string end;
            s->body = parse_body({"endfilter"}, end);
            expect_block_close();
            return s;
        }
        if (tag == "break" || tag == "continue") {
            if (loop_depth_ == 0) fail(tok, "'{% " + tag + " %}' outside of a for loop");
            s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
            expect_block_close();
            return s;
        }
        if (tag == "do") {
            s->kind = StmtKind::kDo;
            s->expr = parse_expression();
            expect_block_close();
            return s;
        }
        if (tag == "with") return parse_with(std::move(s));
        if (tag == "generation") {
            s->kind = StmtKind::kScope;
            expect_block_close();
            std::string end;
            s->body = parse_body({"endgeneration"}, end);
            expect_block_close();
            return s;
        }
        if (tag == "extends" || tag == "block" || tag == "include" || tag == "import" || tag == "from" ||
            tag == "autoescape" || tag == "trans" || tag == "pluralize") {
            fail(tok, "unsupported: '{% " + tag + " %}' (template inheritance, includes, imports, autoescape and "
                      "i18n are not part of the chat template subset)");
        }
        fail(tok, "unknown tag '" + tag + "'");
    }

    StmtPtr parse_if(StmtPtr s) {
        s->kind = StmtKind::kIf;
        while (true) {
            ExprPtr cond = parse_expression();
            expect_block_close();
            std::string end;
            Body body = parse_body({"elif", "else", "endif"}, end);
            s->branches.emplace_back(std::move(cond), std::move(body));
            if (end == "elif") continue;
            if (end == "else") {
                expect_block_close();
                s->else_body = parse_body({"endif"}, end);
            }
            expect_block_close();
            return s;
        }
    }

    StmtPtr parse_for(StmtPtr s) {
        s->kind = StmtKind::kFor;
        s->targets = parse_targets();
        if (!is_name("in")) fail(cur(), "expected 'in' in for loop, got " + describe(cur()));
        advance();
        s->expr = parse_or_ternary(false);
        if (is_name("if")) {
            advance();
            s->cond = parse_expression();
        }
        if (is_name("recursive")) fail(cur(), "unsupported: recursive for loops");
        expect_block_close();
        std::string end;
        ++loop_depth_;
        s->body = parse_body({"else", "endfor"}, end);
        --loop_depth_;
        if (end == "else") {
            expect_block_close();
            s->else_body = parse_body({"endfor"}, end);
        }
        expect_block_close();
        return s;
    }

    std::vector<std::string> parse_targets() {
        std::vector<std::string> names;
        bool paren = is_op("(");
        if (paren) advance();
        names.push_back(expect_name("a variable name"));
        while (is_op(",")) {
            advance();
            if (cur().kind != TokenKind::kName) break;  // trailing comma
            names.push_back(expect_name("a variable name"));
        }
        if (paren) expect_op(")");
        for (const auto& n : names)
            if (n == "loop" || n == "true" || n == "false" || n == "none") fail(cur(), "cannot assign to '" + n + "'");
        return names;
    }

    StmtPtr parse_set(StmtPtr s) {
        const Token& first = cur();
        if (first.kind == TokenKind::kName && peek().kind == TokenKind::kOperator && peek().text == ".") {
            // set ns.attr = value
            auto ns = std::make_unique<Expr>();
            ns->kind = ExprKind::kName;
            ns->line = first.line;
            ns->name = first.text;
            advance();
            advance();
            s->kind = StmtKind::kSet;
            s->attr_target = std::move(ns);
            s->name = expect_name("an attribute name");
            expect_op("=");
            s->expr = parse_tuple_expression();
            expect_block_close();
            return s;
        }
        s->targets = parse_targets();
        if (is_op("=")) {
            advance();
            s->kind = StmtKind::kSet;
            s->expr = parse_tuple_expression();
            expect_block_close();
            return s;
        }
        if (s->targets.size() != 1) fail(cur(), "expected '=' after the names in '{% set %}'");
        s->kind = StmtKind::kSetBlock;
        if (is_op("|")) s->expr = parse_filter_chain(nullptr, cur());
        expect_block_close();
        std::string end;
        s->body = parse_body({"endset"}, end);
        expect_block_close();
        return s;
    }

    void parse_params(std::vector<std::pair<std::string, ExprPtr>>& params) {
        expect_op("(");
        while (!is_op(")")) {
            std::string n = expect_name("a parameter name");
            ExprPtr def;
            if (is_op("=")) {
                advance();
                def = parse_expression();
            }
            params.emplace_back(std::move(n), std::move(def));
            if (!is_op(",")) break;
            advance();
        }
        expect_op(")");
    }

    StmtPtr parse_macro(StmtPtr s) {
        s->kind = StmtKind::kMacro;
        s->name = expect_name("a macro name");
        parse_params(s->params);
        expect_block_close();
        std::string end;
        int saved = loop_depth_;
        loop_depth_ = 0;
        s->body = parse_body({"endmacro"}, end);
        loop_depth_ = saved;
        if (cur().kind == TokenKind::kName) advance();  // {% endmacro name %}
        expect_block_close();
        return s;
    }

    StmtPtr parse_call_block(StmtPtr s) {
        s->kind = StmtKind::kCallBlock;
        if (is_op("(")) parse_params(s->params);
        s->expr = parse_expression();
        if (s->expr->kind != ExprKind::kCall) fail(cur(), "expected a macro call in '{% call %}'");
        expect_block_close();
        std::string end;
        s->body = parse_body({"endcall"}, end);
        expect_block_close();
        return s;
    }

    StmtPtr parse_with(StmtPtr s) {
        s->kind = StmtKind::kWith;
        while (cur().kind == TokenKind::kName) {
            s->targets.push_back(expect_name("a variable name"));
            expect_op("=");
            s->values.push_back(parse_expression());
            if (!is_op(",")) break;
            advance();
        }
        expect_block_close();
        std::string end;
        s->body = parse_body({"endwith"}, end);
        expect_block_close();
        return s;
    }

    // ---- expressions ----

    ExprPtr make(ExprKind kind, int line) {
        auto e = std::make_unique<Expr>();
        e->kind = kind;
        e->line = line;
        return e;
    }

    // Records the height of `e` from its children; refuses trees too deep to evaluate safely.
    ExprPtr seal(ExprPtr e) {
        int h = 0;
        for (const ExprPtr* c : {&e->a, &e->b, &e->c, &e->d})
            if (*c) h = std::max(h, (*c)->depth);
        for (const auto& c : e->items)
            if (c) h = std::max(h, c->depth);
        for (const auto& kv : e->kwargs)
            if (kv.second) h = std::max(h, kv.second->depth);
        e->depth = h + 1;
        if (e->depth > kMaxDepth) fail(cur(), "expression nested too deeply");
        return e;
    }

    // An expression, or an unparenthesised tuple `a, b` (used by set).
    ExprPtr parse_tuple_expression() {
        int line = cur().line;
        ExprPtr first = parse_expression();
        if (!is_op(",")) return first;
        auto tuple = make(ExprKind::kTuple, line);
        tuple->items.push_back(std::move(first));
        while (is_op(",")) {
            advance();
            if (cur().kind == TokenKind::kBlockClose) break;
            tuple->items.push_back(parse_expression());
        }
        return tuple;
    }

    ExprPtr parse_expression() { return parse_or_ternary(true); }

    ExprPtr parse_or_ternary(bool allow_ternary) {
        DepthGuard guard(*this);
        ExprPtr e = parse_or();
        while (allow_ternary && is_name("if")) {
            int line = cur().line;
            advance();
            auto cond = make(ExprKind::kCond, line);
            cond->b = parse_or();
            cond->a = std::move(e);
            if (is_name("else")) {
                advance();
                cond->c = parse_or_ternary(true);
            }
            e = seal(std::move(cond));
        }
        return e;
    }

    ExprPtr parse_or() {
        ExprPtr e = parse_and();
        while (is_name("or")) {
            auto n = make(ExprKind::kOr, cur().line);
            advance();
            n->a = std::move(e);
            n->b = parse_and();
            e = seal(std::move(n));
        }
        return e;
    }

    ExprPtr parse_and() {
        ExprPtr e = parse_not();
        while (is_name("and")) {
            auto n = make(ExprKind::kAnd, cur().line);
            advance();
            n->a = std::move(e);
            n->b = parse_not();
            e = seal(std::move(n));
        }
        return e;
    }

    ExprPtr parse_not() {
        if (is_name("not")) {
            DepthGuard guard(*this);
            auto n = make(ExprKind::kNot, cur().line);
            advance();
            n->a = parse_not();
            return seal(std::move(n));
        }
        return parse_compare();
    }

    ExprPtr parse_compare() {
        int line = cur().line;
        ExprPtr e = parse_math1();
        ExprPtr cmp;
        while (true) {
            std::string op;
            if (cur().kind == TokenKind::kOperator &&
                (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                 cur().text == ">" || cur().text == ">=")) {
                op = cur().text;
                advance();
            } else if (is_name("in")) {
                op = "in";
                advance();
            } else if (is_name("not") && peek().kind == TokenKind::kName && peek().text == "in") {
                op = "notin";
                advance();
                advance();
            } else {
                break;
            }
            if (!cmp) {
                cmp = make(ExprKind::kCompare, line);
                cmp->a = std::move(e);
            }
            cmp->ops.push_back(op);
            cmp->items.push_back(parse_math1());
        }
        return cmp ? seal(std::move(cmp)) : std::move(e);
    }

    ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, int line) {
        auto n = make(ExprKind::kBinary, line);
        n->name = op;
        n->a = std::move(l);
        n->b = std::move(r);
        return seal(std::move(n));
    }

    ExprPtr parse_math1() {
        ExprPtr e = parse_concat();
        while (is_op("+") || is_op("-")) {
            std::string op = cur().text;
            int line = cur().line;
            advance();
            e = binary(op, std::move(e), parse_concat(), line);
        }
        return e;
    }

    ExprPtr parse_concat() {
        ExprPtr e = parse_math2();
        if (!is_op("~")) return e;
        auto n = make(ExprKind::kConcat, cur().line);
        n->items.push_back(std::move(e));
        while (is_op("~")) {
            advance();
            n->items.push_back(parse_math2());
        }
        return seal(std::move(n));
    }

    ExprPtr parse_math2() {
        ExprPtr e = parse_pow();
        while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
            std::string op = cur().text;
            int line = cur().line;
            advance();
            e = binary(op, std::move(e), parse_pow(), line);
        }
        return e;
    }

    ExprPtr parse_pow() {
        ExprPtr e = parse_unary(true);
        while (is_op("**")) {
            int line = cur().line;
            advance();
            e = binary("**", std::move(e), parse_unary(true), line);
        }
        return e;
    }

    ExprPtr parse_unary(bool with_filter) {
        DepthGuard guard(*this);
        ExprPtr e;
        if (is_op("-") || is_op("+")) {
            auto n = make(is_op("-") ? ExprKind::kNeg : ExprKind::kPos, cur().line);
            advance();
            n->a = parse_unary(false);
            e = seal(std::move(n));
        } else {
            e = parse_postfix(parse_primary());
        }
        if (with_filter) e = parse_filters_and_tests(std::move(e));
        return e;
    }

    ExprPtr parse_primary() {
        const Token& tok = cur();
        switch (tok.kind) {
            case TokenKind::kName: {
                advance();
                if (tok.text == "true" || tok.text == "True") return literal(Value(true), tok.line);
                if (tok.text == "false" || tok.text == "False") return literal(Value(false), tok.line);
                if (tok.text == "none" || tok.text == "None") return literal(Value::none(), tok.line);
                auto n = make(ExprKind::kName, tok.line);
                n->name = tok.text;
                return n;
            }
            case TokenKind::kString: {
                std::string s = tok.text;
                advance();
                while (cur().kind == TokenKind::kString) {  // adjacent literals concatenate
                    s += cur().text;
                    advance();
                }
                return literal(Value(std::move(s)), tok.line);
            }
            case TokenKind::kInt: advance(); return literal(Value(tok.int_value), tok.line);
            case TokenKind::kFloat: advance(); return literal(Value(tok.float_value), tok.line);
            case TokenKind::kOperator: {
                if (tok.text == "(") {
                    advance();
                    if (is_op(")")) {
                        advance();
                        return make(ExprKind::kTuple, tok.line);
                    }
                    ExprPtr e = parse_expression();
                    if (is_op(",")) {
                        auto t = make(ExprKind::kTuple, tok.line);
                        t->items.push_back(std::move(e));
                        while (is_op(",")) {
                            advance();
                            if (is_op(")")) break;
                            t->items.push_back(parse_expression());
                        }
                        e = std::move(t);
                    }
                    expect_op(")");
                    return e->kind == ExprKind::kTuple ? seal(std::move(e)) : std::move(e);
                }
                if (tok.text == "[") {
                    advance();
                    auto l = make(ExprKind::kList, tok.line);
                    while (!is_op("]")) {
                        l->items.push_back(parse_expression());
                        if (!is_op(",")) break;
                        advance();
                    }
                    expect_op("]");
                    return seal(std::move(l));
                }
                if (tok.text == "{") {
                    advance();
                    auto d = make(ExprKind::kDict, tok.line);
                    while (!is_op("}")) {
                        d->items.push_back(parse_expression());
                        expect_op(":");
                        d->items.push_back(parse_expression());
                        if (!is_op(",")) break;
                        advance();
                    }
                    expect_op("}");
                    return seal(std::move(d));
                }
                break;
            }
            default: break;
        }
        fail(tok, "expected an expression, got " + describe(tok));
    }

    ExprPtr literal(Value v, int line) {
        auto e = make(ExprKind::kLiteral, line);
        e->literal = std::move(v);
        return e;
    }

    void parse_call_args(Expr& call) {
        expect_op("(");
        while (!is_op(")")) {
            if (is_op("*") || is_op("**")) fail(cur(), "unsupported: '*args' / '**kwargs' in calls");
            if (cur().kind == TokenKind::kName && peek().kind == TokenKind::kOperator && peek().text == "=") {
                std::string key = cur().text;
                advance();
                advance();
                call.kwargs.emplace_back(std::move(key), parse_expression());
            } else {
                if (!call.kwargs.empty()) fail(cur(), "positional argument after keyword argument");
                call.items.push_back(parse_expression());
            }
            if (!is_op(",")) break;
            advance();
        }
        expect_op(")");
    }

    ExprPtr parse_postfix(ExprPtr e) {
        while (true) {
            if (is_op(".")) {
                int line = cur().line;
                advance();
                if (cur().kind == TokenKind::kInt) {  // a.0 is a[0]
                    auto n = make(ExprKind::kItem, line);
                    n->a = std::move(e);
                    n->b = literal(Value(cur().int_value), line);
                    advance();
                    e = seal(std::move(n));
                    continue;
                }
                auto n = make(ExprKind::kAttr, line);
                n->a = std::move(e);
                n->name = expect_name("an attribute name after '.'");
                e = seal(std::move(n));
            } else if (is_op("[")) {
                int line = cur().line;
                advance();
                ExprPtr parts[3];
                bool is_slice = false;
                for (int k = 0; k < 3; ++k) {
                    if (!is_op(":") && !is_op("]")) parts[k] = parse_expression();
                    if (k < 2 && is_op(":")) {
                        is_slice = true;
                        advance();
                    } else {
                        break;
                    }
                }
                expect_op("]");
                if (!is_slice && !parts[0]) fail(cur(), "empty subscript '[]'");
                auto n = make(is_slice ? ExprKind::kSlice : ExprKind::kItem, line);
                n->a = std::move(e);
                n->b = std::move(parts[0]);
                n->c = std::move(parts[1]);
                n->d = std::move(parts[2]);
                e = seal(std::move(n));
            } else if (is_op("(")) {
                auto n = make(ExprKind::kCall, cur().line);
                n->a = std::move(e);
                parse_call_args(*n);
                e = seal(std::move(n));
            } else {
                return e;
            }
        }
    }

    // One or more `| filter(args)` applied to `e` (null inside set/filter blocks).
    ExprPtr parse_filter_chain(ExprPtr e, const Token& at) {
        bool first = true;
        while (first || is_op("|")) {
            if (is_op("|")) advance();
            else if (!first) break;
            first = false;
            auto f = make(ExprKind::kFilter, cur().line);
            f->name = expect_name("a filter name");
            while (is_op(".")) {  // dotted filter names are not Jinja builtins, but keep the error clear
                advance();
                f->name += "." + expect_name("a filter name");
            }
            if (is_op("(")) parse_call_args(*f);
            f->a = std::move(e);
            e = seal(std::move(f));
        }
        (void)at;
        return e;
    }

    ExprPtr parse_filters_and_tests(ExprPtr e) {
        while (true) {
            if (is_op("|")) {
                e = parse_filter_chain(std::move(e), cur());
            } else if (is_name("is")) {
                auto t = make(ExprKind::kTest, cur().line);
                advance();
                if (is_name("not")) {
                    t->negated = true;
                    advance();
                }
                t->name = expect_name("a test name after 'is'");
                if (is_op("(")) {
                    parse_call_args(*t);
                } else if ((cur().kind == TokenKind::kName || cur().kind == TokenKind::kString ||
                            cur().kind == TokenKind::kInt || cur().kind == TokenKind::kFloat || is_op("[") ||
                            is_op("{")) &&
                           !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                           !is_name("is") && !is_name("in") && !is_name("not")) {
                    t->items.push_back(parse_postfix(parse_primary()));
                }
                t->a = std::move(e);
                e = seal(std::move(t));
            } else {
                return e;
            }
        }
    }
};

}  // namespace

Body parse(const std::vector<Token>& tokens) {
    Parser p(tokens);
    return p.parse_template();
}

}  // namespace cera::jinja
