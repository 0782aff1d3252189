// Structured-output costs (bench/NOTES.md has figures and the commands):
//
//   grammar_bench mask VOCAB.gguf [rounds]
//     The time to compute one token's mask (median, p99, max) on one core, for a JSON Schema with
//     nested objects and arrays, while matching hand-written documents tokenized by the vocabulary:
//     cold (a new grammar: nothing precomputed), then steady (new matchers of the same grammar: the
//     per-position token classification is shared, each matcher's mask cache starts empty).
//   grammar_bench decode MODEL.gguf [tokens] [threads] [device]
//     Decode tokens/s of a Session with the schema's grammar, and without it (the default sampling
//     path, and the host-sampling path that a grammar uses), alternating, three rounds; on the CPU
//     unless a device ("cuda") is named.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "cera/grammar.h"
#include "cera/session.h"
#include "chat/grammar/grammar_impl.h"
#include "chat/tool_grammar.h"
#include "grammar_bench_data.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using grammar_bench::kDocs;
using grammar_bench::kSchema;

struct Stats {
    std::vector<double> us;
    void print(const char* what) {
        std::sort(us.begin(), us.end());
        const auto at = [&](double q) { return us[std::min(us.size() - 1, size_t(q * double(us.size())))]; };
        double sum = 0;
        for (double u : us) sum += u;
        std::printf("%-34s tokens %5zu  median %8.1f us  p90 %8.1f us  p99 %8.1f us  max %9.1f us  mean %8.1f us\n",
                    what, us.size(), at(0.5), at(0.9), at(0.99), us.back(), sum / double(us.size()));
    }
};

int bench_mask(const std::string& vocab, int rounds) {
    auto tok = cera::Tokenizer::from_file(vocab);
    auto t0 = Clock::now();
    auto trie = cera::grammar::TokenTrie::from_tokenizer(*tok);
    const double trie_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("vocabulary %s: %d tokens, trie %zu nodes, built in %.1f ms\n", vocab.c_str(), tok->n_vocab(),
                trie->n_nodes(), trie_ms);
    std::vector<std::vector<int32_t>> docs;
    for (const auto& d : kDocs) docs.push_back(tok->encode(d, false, false));

    auto run = [&](const std::shared_ptr<const cera::Grammar>& g, Stats& st) {
        for (const auto& ids : docs) {
            auto m = cera::make_matcher(*g, trie);
            for (int32_t id : ids) {
                const auto a = Clock::now();
                const uint64_t* mask = m->mask();
                st.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
                if (!((mask[id >> 6] >> (id & 63)) & 1) || !m->accept_token(id)) {
                    std::fprintf(stderr, "grammar_bench: token %d ('%s') not allowed\n", id,
                                 tok->token_to_piece(id).c_str());
                    std::exit(1);
                }
            }
            if (!m->can_end()) {
                std::fprintf(stderr, "grammar_bench: a document does not complete the grammar\n");
                std::exit(1);
            }
        }
    };
    for (int r = 0; r < rounds; ++r) {
        auto g = cera::Grammar::from_json_schema(kSchema);  // a new grammar: nothing shared yet
        Stats cold, steady;
        t0 = Clock::now();
        run(g, cold);
        const double cold_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        for (int k = 0; k < 3; ++k) run(g, steady);
        std::printf("round %d (cold pass %.0f ms for %zu tokens)\n", r + 1, cold_ms, cold.us.size());
        cold.print("  cold (first use of the grammar)");
        steady.print("  steady (new matchers)");
    }
    // Tool calls with tool_choice "auto" (Hermes format, the schema as the tool's parameters): a lazy
    // grammar over a sentence of free text, then the call. Setup: a new matcher's construction.
    const std::vector<cera::ToolDef> tools = {{"record", kSchema}};
    std::vector<std::vector<int32_t>> calls;
    for (const auto& d : kDocs)
        calls.push_back(
            tok->encode("Let me save that record for you, with every field filled in.\n<tool_call>\n"
                        "{\"name\": \"record\", \"arguments\": " +
                            d + "}\n</tool_call>",
                        false, false));
    docs = calls;
    for (int r = 0; r < rounds; ++r) {
        auto g = cera::tool_call_grammar(cera::ToolCallFormat::kHermes, tools, {cera::ToolChoice::kAuto});
        Stats setup, cold, steady;
        for (int k = 0; k < 4; ++k) {
            const auto a = Clock::now();
            auto m = cera::make_matcher(*g, trie);
            setup.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
        }
        run(g, cold);
        for (int k = 0; k < 3; ++k) run(g, steady);
        std::printf("tool calls, lazy grammar, round %d\n", r + 1);
        setup.print("  new matcher (first, then shared)");
        cold.print("  cold (first use of the grammar)");
        steady.print("  steady (new matchers)");
    }
    return 0;
}

struct Count : cera::Sink {
    void on_text(std::string_view) override {}
};

int bench_decode(const std::string& model, int tokens, int threads, const std::string& device) {
    auto e = cera::Engine::load(model, {.device = device, .threads = threads, .n_ctx = 1024});
    auto g = cera::Grammar::from_json_schema(kSchema);
    std::printf("model %s, %s, %d threads, %d tokens a run\n", model.c_str(), device.c_str(), threads, tokens);
    for (int round = 0; round < 3; ++round) {
        for (int with : {0, 1, 2}) {
            cera::Session s(e);
            s.append_text("Customer record as JSON:");
            cera::GenerateOptions o;
            o.max_tokens = tokens;
            o.ignore_eos = true;
            o.sampling.seed = uint64_t(round);
            if (with == 1) o.device_sampling = false;  // the logits come to the host, as under a grammar
            if (with == 2) o.grammar = g;
            Count sink;
            const auto r = s.generate(o, sink);
            std::printf("round %d %-10s decode %7.2f tok/s (%d steps, finish %s)\n", round + 1,
                        with == 2   ? "grammar"
                        : with == 1 ? "plain-host"
                                    : "plain",
                        r.decode_tokens_per_second(), r.decode_steps, cera::finish_reason_name(r.finish));
        }
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        if (argc >= 3 && std::string(argv[1]) == "mask") return bench_mask(argv[2], argc > 3 ? std::atoi(argv[3]) : 2);
        if (argc >= 3 && std::string(argv[1]) == "decode")
            return bench_decode(argv[2], argc > 3 ? std::atoi(argv[3]) : 128, argc > 4 ? std::atoi(argv[4]) : 2,
                                argc > 5 ? argv[5] : "cpu");
    } catch (const std::exception& ex) {
        std::fprintf(stderr, "grammar_bench: %s\n", ex.what());
        return 1;
    }
    std::fprintf(stderr, "usage: grammar_bench mask VOCAB.gguf [rounds] | decode MODEL.gguf [tokens] [threads] [device]\n");
    return 2;
}
