// Prefix cache benchmark: time to first token of a long prompt (default 2,000 tokens on the
// bundled model, whose context is 2,048) that extends a cached prompt by a short question:
//   none  - no prefix cache at all (the baseline prefill)
//   miss  - a cache that holds nothing for it (the prefill plus saving its entries)
//   warm  - the shared prefix restored from the in-memory tier
//   exact - the same prompt again: everything (logits included) restored from memory
//   cold  - the shared prefix restored from the on-disk tier (a new engine: files only; the
//           OS page cache is warm, so this is the decode-and-upload cost, not the disk's)
// Prints one table row per case and, with --json, one JSON object.
//   prefix_cache_bench [--model FILE] [--tokens N] [--reps N] [--threads N] [--json]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "cera/session.h"

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

struct Case {
    std::string name;
    std::vector<double> ms;
    int32_t cached = 0, prefilled = 0;
    double median() const {
        std::vector<double> v = ms;
        std::sort(v.begin(), v.end());
        return v.empty() ? 0 : v[v.size() / 2];
    }
};

// Milliseconds from the start of generate() to the first sampled token.
class FirstToken : public cera::Sink {
   public:
    explicit FirstToken(Clock::time_point t0) : t0_(t0) {}
    void on_text(std::string_view) override {}
    void on_token(int32_t) override {
        if (ms_ < 0) ms_ = std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
    }
    double ms() const { return ms_; }

   private:
    Clock::time_point t0_;
    double ms_ = -1;
};

void ttft(const std::shared_ptr<cera::Engine>& e, const std::vector<int32_t>& prompt, Case& c) {
    cera::Session s(e);
    s.append_tokens(prompt);
    cera::GenerateOptions g;
    g.max_tokens = 1;
    g.sampling.temperature = 0.0f;
    const auto t0 = Clock::now();
    FirstToken sink(t0);
    const cera::GenerationResult r = s.generate(g, sink);
    c.ms.push_back(sink.ms());
    c.cached = r.cached_tokens;
    c.prefilled = r.prompt_tokens;
}

}  // namespace

int main(int argc, char** argv) {
    // Default: the bundled model, from $CERA_MODEL_DIR or the source tree next to the build tree.
    std::string model;
    if (const char* env = std::getenv("CERA_MODEL_DIR"); env && *env) {
        model = std::string(env) + "/tiny-lfm2-Q8_0.gguf";
    } else {
        std::error_code ec;
        const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
        model = (exe.parent_path() / ".." / ".." / "models" / "tiny-lfm2-Q8_0.gguf").lexically_normal().string();
    }
    int n_tokens = 2000, reps = 5, threads = 0;
    bool json = false;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> const char* {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "prefix_cache_bench: %s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--model") model = next();
        else if (a == "--tokens") n_tokens = std::atoi(next());
        else if (a == "--reps") reps = std::max(1, std::atoi(next()));
        else if (a == "--threads") threads = std::atoi(next());
        else if (a == "--json") json = true;
        else {
            std::fprintf(stderr, "usage: prefix_cache_bench [--model FILE] [--tokens N] [--reps N] [--threads N] [--json]\n");
            return 2;
        }
    }
    const fs::path dir = fs::temp_directory_path() / ("cera_prefix_bench_" + std::to_string(::getpid()));
    try {
        cera::EngineOptions base;
        base.device = "cpu";
        base.threads = threads;
        auto plain = cera::Engine::load(model, base);
        const int32_t n_ctx = plain->info().n_ctx;
        // The shared prefix: sentences repeated to n_tokens - 16 tokens; the question: a few more.
        std::string text;
        std::vector<int32_t> shared;
        while (int(shared.size()) < n_tokens - 16) {
            text += "The little dog ran to the park and saw a big red ball under the old tree. ";
            shared = plain->tokenize(text, true);
        }
        shared.resize(size_t(n_tokens - 16));
        std::vector<int32_t> prompt = shared;
        const std::vector<int32_t> q = plain->tokenize(" Where did the dog find the ball? Under the tree.", false);
        for (size_t i = 0; prompt.size() < size_t(n_tokens); ++i) prompt.push_back(q[i % q.size()]);
        if (int32_t(prompt.size()) >= n_ctx) {
            std::fprintf(stderr, "prefix_cache_bench: %zu tokens do not fit the context of %d\n", prompt.size(), n_ctx);
            return 1;
        }

        Case none{"none"}, miss{"miss"}, warm{"warm"}, exact{"exact"}, cold{"cold"}, scratch{"scratch"};
        for (int r = 0; r < reps; ++r) ttft(plain, prompt, none);

        cera::EngineOptions mem = base;
        mem.prefix_cache_bytes = size_t(1) << 30;
        for (int r = 0; r < reps; ++r) {
            auto e = cera::Engine::load(model, mem);  // an empty cache
            ttft(e, prompt, miss);
            ttft(e, prompt, exact);  // the same prompt again: everything restored
            auto f = cera::Engine::load(model, mem);
            ttft(f, shared, scratch);  // caches the shared prefix only
            ttft(f, prompt, warm);
        }
        {
            cera::EngineOptions disk = base;
            disk.prefix_cache_dir = dir.string();
            auto writer = cera::Engine::load(model, disk);
            ttft(writer, shared, scratch);
            for (int r = 0; r < reps; ++r) {
                // A new engine with files only; the whole-prompt entry is removed after each run so
                // that every run restores the shared prefix, as in the warm case.
                auto e = cera::Engine::load(model, disk);
                ttft(e, prompt, cold);
                for (const auto& it : fs::recursive_directory_iterator(dir))
                    if (it.path().filename().string().rfind(std::to_string(prompt.size()) + "-", 0) == 0)
                        fs::remove(it.path());
            }
        }
        std::error_code ec;
        fs::remove_all(dir, ec);

        const cera::EngineInfo& info = plain->info();
        std::printf("prefix cache: %s (%s), %s, prompt %zu tokens, shared prefix %zu, %d reps (median)\n",
                    model.c_str(), info.weight_type.c_str(), info.device.c_str(), prompt.size(), shared.size(), reps);
        std::printf("%-6s %12s %14s %14s\n", "case", "ttft_ms", "cached_tokens", "prefilled");
        for (const Case* c : {&none, &miss, &warm, &exact, &cold})
            std::printf("%-6s %12.2f %14d %14d\n", c->name.c_str(), c->median(), c->cached, c->prefilled);
        if (json) {
            std::printf("{\"bench\":\"prefix_cache\",\"model\":\"%s\",\"device\":\"%s\",\"prompt_tokens\":%zu,"
                        "\"shared_tokens\":%zu",
                        model.c_str(), info.device.c_str(), prompt.size(), shared.size());
            for (const Case* c : {&none, &miss, &warm, &exact, &cold})
                std::printf(",\"%s_ttft_ms\":%.3f,\"%s_cached\":%d", c->name.c_str(), c->median(), c->name.c_str(),
                            c->cached);
            std::printf("}\n");
        }
    } catch (const std::exception& e) {
        std::error_code ec;
        fs::remove_all(dir, ec);
        std::fprintf(stderr, "prefix_cache_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
