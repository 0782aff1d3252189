// `cera grammar` and the structured-output flags of `cera run`: exit codes, messages, outputs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace cera {
namespace {

std::string grammars(const std::string& f) { return test::source_path("tests/data/grammars/" + f); }

test::ShellResult cera(const std::string& args) {
    return test::run_shell(test::shell_quote(test::cera_bin()) + " " + args);
}

TEST(GrammarCli, CheckValidatesAndMatches) {
    for (const char* f : {"json.gbnf", "arithmetic.gbnf", "chess.gbnf", "c-like.gbnf", "unicode.gbnf", "list.gbnf"}) {
        const auto r = cera("grammar check " + test::shell_quote(grammars(f)));
        EXPECT_EQ(r.code, 0) << f << r.err;
        EXPECT_EQ(r.out, "valid\n");
    }
    auto r = cera("grammar check " + grammars("arithmetic.gbnf") + " --text '(1+2)*-3'");
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "match\n");
    r = cera("grammar check " + grammars("arithmetic.gbnf") + " --text '(1+2)*x3'");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("matching stops at byte 6"), std::string::npos) << r.out;
    r = cera("grammar check " + grammars("arithmetic.gbnf") + " --text '(1+2'");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("ends at byte 4 before the grammar is complete"), std::string::npos) << r.out;

    const std::string tmp = (std::filesystem::temp_directory_path() / "cera_grammar_cli").string();
    std::filesystem::create_directories(tmp);
    std::ofstream(tmp + "/bad.gbnf") << "root ::= item\nitem ::= \"a\" other\n";
    r = cera("grammar check " + tmp + "/bad.gbnf");
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.err, "cera grammar: error: grammar: line 2: undefined rule 'other'\n");
    std::ofstream(tmp + "/doc.json") << R"({"name": "Ann", "age": 41, "tags": ["user"]})";
    r = cera("grammar check --schema " + grammars("person.schema.json") + " --text-file " + tmp + "/doc.json");
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    r = cera("grammar check --schema " + grammars("person.schema.json") + " --text '{\"name\": \"Ann\"}'");
    EXPECT_EQ(r.code, 1);
    std::ofstream(tmp + "/bad.json") << R"({"type": "object", "patternProperties": {}})";
    r = cera("grammar check --schema " + tmp + "/bad.json");
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("the keyword 'patternProperties'"), std::string::npos) << r.err;
    std::filesystem::remove_all(tmp);
}

TEST(GrammarCli, FromSchemaPrintsAGrammarThatChecks) {
    const auto r = cera("grammar from-schema " + grammars("tree.schema.json"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("root ::= ", 0), 0u) << r.out;
    const std::string tmp = (std::filesystem::temp_directory_path() / "cera_tree.gbnf").string();
    std::ofstream(tmp) << r.out;
    const auto c = cera("grammar check " + tmp + " --text '{\"value\": 1, \"children\": [{\"value\": null}]}'");
    EXPECT_EQ(c.code, 0) << c.out << c.err;
    std::filesystem::remove(tmp);
}

TEST(GrammarCli, RunFollowsTheGrammar) {
    auto r = cera("run -p 'Data:' -n 120 --seed 3 --temp 1 --json-schema " + grammars("person.schema.json"));
    ASSERT_EQ(r.code, 0) << r.err;
    if (r.err.find("finish: stop") != std::string::npos || r.err.find("finish: eos") != std::string::npos) {
        ASSERT_TRUE(nlohmann::json::accept(r.out)) << r.out;
        const auto j = nlohmann::json::parse(r.out);
        EXPECT_TRUE(j.contains("name") && j.contains("age")) << r.out;
    }
    // A schema inline gives what the same schema in a file gives.
    const std::string inline_schema = test::read_text(grammars("person.schema.json"));
    const auto from_file = cera("run -p 'Data:' -n 60 --temp 0 --json-schema " + grammars("person.schema.json"));
    const auto inline_run = cera("run -p 'Data:' -n 60 --temp 0 --json-schema '" + inline_schema + "'");
    ASSERT_EQ(inline_run.code, 0) << inline_run.err;
    EXPECT_EQ(inline_run.out, from_file.out);
    EXPECT_EQ(cera("grammar from-schema '{\"type\": \"integer\", \"multipleOf\": 5}'").code, 0);
    r = cera("run -p x --json-schema '{\"type\": '");
    EXPECT_EQ(r.code, 1);  // inline text that does not parse: the parser's error, not a missing file
    EXPECT_EQ(r.err.find("cannot read"), std::string::npos) << r.err;
    r = cera("run -p 'Move:' -n 40 --seed 5 --grammar-file " + grammars("chess.gbnf"));
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out, "");
    r = cera("run -p x --json --grammar 'root ::= \"a\"'");
    EXPECT_EQ(r.code, 2);  // one constraint at a time
    r = cera("run -p x --grammar 'root ::= undefined-rule'");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("undefined rule 'undefined-rule'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cera
