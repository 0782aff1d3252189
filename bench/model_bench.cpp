// Prefill and decode speed of the model layer on one GGUF:
//   model_bench FILE [--threads N] [--pp 512] [--tg 128] [--reps 3] [--batch 512] [--kv f32|f16]
// pp: one prefill of `pp` tokens (fresh state); tg: `tg` single-token decode steps after a
// 16-token prompt. Prints the median and min/max over the repetitions, in tokens/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cera/error.h"
#include "models/model.h"

using Clock = std::chrono::steady_clock;

static double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

static void report(const char* what, std::vector<double> rates) {
    std::sort(rates.begin(), rates.end());
    std::printf("%-6s median %8.1f tok/s   (min %.1f, max %.1f, %zu runs)\n", what, rates[rates.size() / 2],
                rates.front(), rates.back(), rates.size());
}

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr,
                     "usage: model_bench FILE [--threads N] [--pp N] [--tg N] [--reps N] [--batch N] [--kv f32|f16]\n");
        return 2;
    }
    cera::ModelOptions o;
    int pp = 512, tg = 128, reps = 3;
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string k = argv[i];
        const int v = std::atoi(argv[i + 1]);
        if (k == "--threads")
            o.n_threads = v;
        else if (k == "--pp")
            pp = v;
        else if (k == "--tg")
            tg = v;
        else if (k == "--reps")
            reps = v;
        else if (k == "--batch")
            o.n_batch = v;
        else if (k == "--kv")
            o.kv_type_k = o.kv_type_v = std::strcmp(argv[i + 1], "f16") ? cera::GgmlType::kF32 : cera::GgmlType::kF16;
        else {
            std::fprintf(stderr, "unknown option %s\n", k.c_str());
            return 2;
        }
    }
    try {
        o.n_ctx = std::max(pp, 16 + tg) + 1;
        auto model = cera::load_model(argv[1], o);
        const auto& info = model->info();
        std::printf("%s (%s): n_embd %lld, n_layer %lld, n_vocab %lld; %s\n", argv[1], info.arch.c_str(),
                    (long long)info.n_embd, (long long)info.n_layer, (long long)info.n_vocab,
                    model->backend().description().c_str());
        std::vector<int32_t> prompt(size_t(std::max(pp, 16)));
        for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(info.n_vocab));
        std::vector<float> logits(size_t(info.n_vocab));
        auto state = model->create_state();
        // Warm-up: touches every weight page and grows the scratch buffers.
        state->eval({.tokens = {prompt.data(), 16}, .logits = logits.data()});
        std::vector<double> pp_rates, tg_rates;
        for (int r = 0; r < reps; ++r) {
            if (pp > 0) {
                state->reset();
                const auto t0 = Clock::now();
                state->eval({.tokens = {prompt.data(), size_t(pp)}, .logits = logits.data()});
                pp_rates.push_back(pp / seconds_since(t0));
            }
            if (tg > 0) {
                state->reset();
                state->eval({.tokens = {prompt.data(), 16}, .logits = logits.data()});
                const auto t0 = Clock::now();
                for (int i = 0; i < tg; ++i) {
                    const int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
                    state->eval({.tokens = {&id, 1}, .logits = logits.data()});
                }
                tg_rates.push_back(tg / seconds_since(t0));
            }
        }
        if (!pp_rates.empty()) report(("pp" + std::to_string(pp)).c_str(), pp_rates);
        if (!tg_rates.empty()) report(("tg" + std::to_string(tg)).c_str(), tg_rates);
    } catch (const cera::Error& e) {
        std::fprintf(stderr, "model_bench: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
