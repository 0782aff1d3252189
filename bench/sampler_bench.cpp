// Sampler cost per token for real vocabulary sizes and the common settings, in
// microseconds (median of 5 runs). Logits are Gaussian (sd 3), "flat", or the same with
// a few tokens far above the rest, "peaked", as a language model's usually are. The chain's cost should stay small next to a decode step (~1-10 ms on CPU).
//   usage: sampler_bench [draws per run, default 200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cera/sampler.h"

namespace {

struct Config {
    const char* name;
    cera::SamplerParams p;
};

}  // namespace

int main(int argc, char** argv) {
    const int draws = argc > 1 ? std::atoi(argv[1]) : 200;
    std::vector<Config> configs;
    {
        cera::SamplerParams p;
        p.temperature = 0.0f;
        configs.push_back({"greedy", p});
        p.repeat_penalty = 1.1f;
        configs.push_back({"greedy+penalty64", p});
        configs.push_back({"default(k40,p.95,minp.05,T.8)", cera::SamplerParams{}});
        p = cera::SamplerParams{};
        p.top_k = 0;
        p.min_p = 0.0f;
        configs.push_back({"top-p .95 only", p});
        p.top_p = 1.0f;
        configs.push_back({"plain T=1 (no filter)", p});
        p = cera::SamplerParams{};
        p.top_k = 0;
        configs.push_back({"top-p .95 + min-p .05", p});
    }
    std::printf("%-32s %-7s %8s %12s\n", "config", "logits", "n_vocab", "us/token");
    for (bool peaked : {false, true})
    for (int n_vocab : {2048, 50257, 65536, 151936}) {
        std::mt19937 g(1);
        std::normal_distribution<float> nd(0.0f, 3.0f);
        std::vector<std::vector<float>> rows(2, std::vector<float>(size_t(n_vocab)));
        for (auto& r : rows)
            for (auto& x : r) x = nd(g);
        if (peaked)  // a language model's shape: a few likely tokens far above the rest
            for (auto& r : rows)
                for (int j = 0; j < 8; ++j) r[size_t(j * 977 % n_vocab)] += 25.0f - float(j);
        for (const Config& c : configs) {
            cera::Sampler s(c.p, n_vocab);
            for (int i = 0; i < 64; ++i) s.accept(i * 7 % n_vocab);
            std::vector<double> us;
            int32_t sink = 0;
            for (int run = 0; run < 5; ++run) {
                const auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < draws; ++i) sink += s.sample(rows[size_t(i) % rows.size()].data());
                us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                             draws);
            }
            std::sort(us.begin(), us.end());
            std::printf("%-32s %-7s %8d %12.1f%s\n", c.name, peaked ? "peaked" : "flat", n_vocab, us[2],
                        sink == -1 ? " " : "");
        }
    }
    return 0;
}
