// `cera tokenize -m FILE [--no-bos] [--ids] [--no-special] (-f TEXTFILE | TEXT)`: prints the token
// ids of a text. With --ids: one line of space-separated ids and nothing else. Otherwise one
// `id<TAB>piece` line per token, the piece's control characters and non-UTF-8 bytes escaped.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "core/check.h"
#include "core/utf8.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace cera::cli {
namespace {

// A piece on one line: \n \r \t \\ escaped, other control bytes and invalid UTF-8 as \xNN.
std::string escape_piece(const std::string& s) {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
        const size_t ok = utf8::valid_prefix(std::string_view(s).substr(i));
        for (size_t k = i; k < i + ok; ++k) {
            const unsigned char c = static_cast<unsigned char>(s[k]);
            if (c == '\n') {
                out += "\\n";
            } else if (c == '\r') {
                out += "\\r";
            } else if (c == '\t') {
                out += "\\t";
            } else if (c == '\\') {
                out += "\\\\";
            } else if (c < 0x20 || c == 0x7F) {
                char buf[8];
                std::snprintf(buf, sizeof(buf), "\\x%02X", c);
                out += buf;
            } else {
                out.push_back(char(c));
            }
        }
        i += ok;
        if (i < s.size()) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned char>(s[i]));
            out += buf;
            ++i;
        }
    }
    return out;
}

int run_tokenize(const std::vector<std::string>& args) {
    CLI::App app{"Prints the token ids of a text.", "cera tokenize"};
    std::string model, text_file;
    std::vector<std::string> words;
    bool no_bos = false, ids_only = false, no_special = false;
    app.add_option("-m,--model", model, "GGUF file or tokenizer.json")->required();
    app.add_option("-f,--file", text_file, "read the text from this file");
    app.add_flag("--no-bos", no_bos, "do not add BOS even when the vocabulary asks for it");
    app.add_flag("--ids", ids_only, "print only one line of space-separated ids");
    app.add_flag("--no-special", no_special, "tokenize control tokens such as <|im_start|> as plain text");
    app.add_option("text", words, "the text (words are joined with spaces)");
    if (int rc = parse_args(app, args, "tokenize", [&] {
            if (text_file.empty() == words.empty()) throw CLI::ValidationError("give either -f TEXTFILE or TEXT");
        });
        rc >= 0)
        return rc;

    std::string text;
    if (!text_file.empty()) {
        std::ifstream in(text_file, std::ios::binary);
        if (!in) throw_error(ErrorCode::kIo, "cannot open %s", text_file.c_str());
        text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } else {
        for (size_t i = 0; i < words.size(); ++i) text += (i ? " " : "") + words[i];
    }

    auto tok = Tokenizer::from_file(model);
    const std::vector<int32_t> ids = tok->encode(text, !no_bos, !no_special);
    std::string out;
    if (ids_only) {
        for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
        out += '\n';
    } else {
        for (int32_t id : ids) out += std::to_string(id) + '\t' + escape_piece(tok->token_to_piece(id, true)) + '\n';
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(tokenize, "tokenize", "token ids of a text (-m FILE [--ids] [--no-bos] [--no-special])", run_tokenize);

}  // namespace cera::cli
