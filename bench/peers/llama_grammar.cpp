// llama.cpp's side of grammar_bench's mask figures: the time its grammar sampler takes over the whole
// vocabulary for each token of the same documents, under the grammar its own converter makes of the
// same JSON Schema. Built against a llama.cpp source tree by bench/peers/build_llama_grammar.sh:
//
//   llama_grammar VOCAB.gguf
//
// llama.cpp's converter puts the required properties first, so the first document's two optional
// keys move after "orders"; the tokens are otherwise the same.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../grammar_bench_data.h"
#include "json-schema-to-grammar.h"
#include "llama.h"

namespace {

using Clock = std::chrono::steady_clock;

void print(const char* what, std::vector<double> us) {
    std::sort(us.begin(), us.end());
    const auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
    double sum = 0;
    for (double u : us) sum += u;
    std::printf("%-28s tokens %5zu  median %8.1f us  p90 %8.1f us  p99 %8.1f us  max %9.1f us  mean %8.1f us\n", what,
                us.size(), at(0.5), at(0.9), at(0.99), us.back(), sum / double(us.size()));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: llama_grammar VOCAB.gguf\n");
        return 2;
    }
    llama_backend_init();
    llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model* model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        std::fprintf(stderr, "llama_grammar: cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab* vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    const std::string gbnf = json_schema_to_grammar(nlohmann::ordered_json::parse(grammar_bench::kSchema));
    std::printf("vocabulary %s: %d tokens\n", argv[1], n_vocab);

    std::vector<std::string> docs = grammar_bench::kDocs;
    const std::string optional = "\"email\": \"ada.king@example.org\", \"created\": \"2024-05-17T09:30:00Z\", ";
    const size_t at = docs[0].find(optional);
    if (at == std::string::npos) {
        std::fprintf(stderr, "llama_grammar: the first document no longer holds the optional keys\n");
        return 1;
    }
    docs[0].erase(at, optional.size());
    docs[0].insert(docs[0].find("\"active\""), optional);

    std::vector<llama_token_data> cand(static_cast<size_t>(n_vocab));
    for (int round = 0; round < 2; ++round) {
        std::vector<double> us;
        for (const std::string& d : docs) {
            std::vector<llama_token> toks(d.size() + 8);
            toks.resize(
                size_t(llama_tokenize(vocab, d.c_str(), int(d.size()), toks.data(), int(toks.size()), false, false)));
            llama_sampler* g = llama_sampler_init_grammar(vocab, gbnf.c_str(), "root");
            for (llama_token id : toks) {
                for (int i = 0; i < n_vocab; ++i) cand[size_t(i)] = {i, 0.0f, 0.0f};
                llama_token_data_array arr = {cand.data(), size_t(n_vocab), -1, false};
                const auto a = Clock::now();
                llama_sampler_apply(g, &arr);
                us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
                if (std::isinf(cand[size_t(id)].logit)) {
                    std::fprintf(stderr, "llama_grammar: token %d not allowed\n", id);
                    return 1;
                }
                llama_sampler_accept(g, id);
            }
            llama_sampler_free(g);
        }
        print(round == 0 ? "llama.cpp grammar, round 1" : "llama.cpp grammar, round 2", us);
    }
    llama_model_free(model);
    return 0;
}
