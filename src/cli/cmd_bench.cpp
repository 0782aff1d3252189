// `cera bench -m FILE [-p 512] [-n 128] [-r 5]`: prefill (pp) and decode (tg) speed in the
// manner of llama-bench. Random token ids; one warm-up run of each test first; median,
// p10 and p90 of tokens/s over the repetitions; peak RSS; and the decode roofline:
// (decode tokens/s x weight bytes read per token) / read bandwidth, the bandwidth measured
// once with a multi-threaded sum over a large array (or given with --bandwidth).
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cera/batcher.h"
#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/parse_args.h"
#include "cli/percentile.h"
#include "cli/progress.h"
#include "cli/spec_flags.h"
#include "core/cpu_features.h"

namespace cera::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Stats {
    double median = 0, p10 = 0, p90 = 0;
};

Stats stats(const std::vector<double>& v) { return {percentile(v, 0.5), percentile(v, 0.1), percentile(v, 0.9)}; }

// Read bandwidth in bytes/s: `threads` threads each sum their share of a `bytes` array of
// u64; the best of `reps` passes (the array is written first, so every page is resident).
double measure_read_bandwidth(size_t bytes, int threads, int reps = 5) {
    const size_t n = bytes / sizeof(uint64_t);
    std::unique_ptr<uint64_t[]> a(new uint64_t[n]);
    auto for_each_share = [&](auto&& fn) {
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] { fn(n * size_t(t) / size_t(threads), n * size_t(t + 1) / size_t(threads)); });
        for (auto& t : ts) t.join();
    };
    for_each_share([&](size_t b, size_t e) {
        for (size_t i = b; i < e; ++i) a[i] = i;
    });
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    const uint64_t* p = a.get();
    double best = 0.0;
    for (int r = 0; r < reps; ++r) {
        const auto t0 = Clock::now();
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] {
                const size_t b = n * size_t(t) / size_t(threads), e = n * size_t(t + 1) / size_t(threads);
                uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                size_t i = b;
                for (; i + 4 <= e; i += 4) s0 += p[i], s1 += p[i + 1], s2 += p[i + 2], s3 += p[i + 3];
                for (; i < e; ++i) s0 += p[i];
                sums[size_t(t)] = s0 + s1 + s2 + s3;
            });
        for (auto& t : ts) t.join();
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        best = std::max(best, double(n * sizeof(uint64_t)) / s);
    }
    uint64_t total = 0;
    for (uint64_t s : sums) total += s;
    const uint64_t expect = n > 0 ? uint64_t(n) * uint64_t(n - 1) / 2 : 0;
    if (total != expect) std::fprintf(stderr, "cera bench: warning: bandwidth checksum mismatch\n");
    return best;
}

double peak_rss_bytes() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return double(u.ru_maxrss) * 1024.0;  // Linux reports KiB
}

struct TestResult {
    std::string name;
    int n_prompt = 0, n_gen = 0, depth = 0;
    std::vector<double> samples;  // tokens/s per repetition
};

// A W x H 24-bit BMP of random pixels (a different image each seed: the engine's cache never hits).
std::vector<uint8_t> random_bmp(int w, int h, uint32_t seed) {
    const size_t stride = (size_t(w) * 3 + 3) / 4 * 4, size = 54 + stride * size_t(h);
    std::vector<uint8_t> f(size, 0);
    auto put32 = [&](size_t off, uint32_t v) {
        for (int i = 0; i < 4; ++i) f[off + size_t(i)] = uint8_t(v >> (8 * i));
    };
    f[0] = 'B', f[1] = 'M';
    put32(2, uint32_t(size)), put32(10, 54), put32(14, 40), put32(18, uint32_t(w)), put32(22, uint32_t(h));
    f[26] = 1, f[28] = 24;
    std::mt19937 rng(seed);
    for (size_t y = 0; y < size_t(h); ++y)
        for (size_t x = 0; x < size_t(w) * 3; ++x) f[54 + y * stride + x] = uint8_t(rng());
    return f;
}

// --mmproj: the encode time of a W x H image (decode, preprocessing, vision tower and projector: what
// Session::append_image spends) and the time to first token of a short prompt with it.
int run_image_bench(const std::shared_ptr<Engine>& engine, const std::string& size, int reps, bool as_json) {
    int w = 0, h = 0;
    if (std::sscanf(size.c_str(), "%dx%d", &w, &h) != 2 || w < 1 || h < 1 || w > 16384 || h > 16384)
        throw Error(ErrorCode::kInvalidArgument, "--image-size '" + size + "': expected WxH, e.g. 1024x768");
    using Clock = std::chrono::steady_clock;
    std::vector<double> encode_ms, ttft_ms;
    double first_encode = 0, first_ttft = 0;  // the first image of the process (the encoder's first use)
    int32_t n_tokens = 0;
    for (int r = 0; r <= reps; ++r) {  // run 0 warms up
        const std::vector<uint8_t> img = random_bmp(w, h, uint32_t(r + 1));
        Session s(engine);
        const auto t0 = Clock::now();
        s.append_image(img);
        const auto t1 = Clock::now();
        s.append_text("Describe this image.", false, true);
        GenerateOptions g;
        g.max_tokens = 1;
        g.sampling.temperature = 0.0f;
        NullSink sink;
        s.generate(g, sink);
        const auto t2 = Clock::now();
        n_tokens = s.position();
        const double e = std::chrono::duration<double, std::milli>(t1 - t0).count(),
                     t = std::chrono::duration<double, std::milli>(t2 - t0).count();
        if (r == 0) {
            first_encode = e, first_ttft = t;
            continue;
        }
        encode_ms.push_back(e);
        ttft_ms.push_back(t);
    }
    const double enc = percentile(encode_ms, 0.5), ttft = percentile(ttft_ms, 0.5);
    if (as_json) {
        nlohmann::json j = {{"image_size", size},  {"prompt_tokens", n_tokens},       {"encode_ms", enc},
                            {"ttft_ms", ttft},     {"first_encode_ms", first_encode}, {"first_ttft_ms", first_ttft},
                            {"repetitions", reps}, {"device", engine->info().device}};
        std::printf("%s\n", j.dump().c_str());
    } else {
        std::printf(
            "image %dx%d (%d prompt tokens, %s): encode %.1f ms (p10 %.1f, p90 %.1f), time to first token "
            "%.1f ms (median of %d); the process's first image: encode %.1f ms, time to first token %.1f ms\n",
            w, h, n_tokens, engine->info().device.c_str(), enc, percentile(encode_ms, 0.1), percentile(encode_ms, 0.9),
            ttft, reps, first_encode, first_ttft);
    }
    return 0;
}

int run_bench(const std::vector<std::string>& args) {
    CLI::App app{"Measures prefill (pp) and decode (tg) tokens/s on random tokens, like llama-bench.", "cera bench"};
    std::string model;
    EngineFlags ef;
    int n_prompt = 512, n_gen = 128, reps = 5, depth = 0;
    double bandwidth_gbps = 0.0, bw_gib = 1.0;
    bool as_json = false, host_sampling = false, no_ahead = false, profile = false, shared_prompt = false;
    std::vector<int> parallel;
    float temp = 0.0f;
    int top_k = 40;
    app.add_option("-m,--model", model, "GGUF model")->required();
    app.add_option("-p,--n-prompt", n_prompt, "prompt tokens of the prefill test (0: skip)")->capture_default_str();
    app.add_option("-n,--n-gen", n_gen, "tokens of the decode test (0: skip)")->capture_default_str();
    app.add_option("-d,--depth", depth,
                   "tokens already in the context when each test starts (prefilled untimed; tests are named "
                   "\"tg128 @ d4096\")")
        ->capture_default_str();
    app.add_option("-r,--repetitions", reps, "repetitions of each test")->capture_default_str();
    ef.add(app, EngineFlags::kCtx | EngineFlags::kKvType | EngineFlags::kBatch | EngineFlags::kLora);
    app.add_option("--bandwidth", bandwidth_gbps, "read bandwidth in GB/s for the roofline (default: measure it)");
    app.add_option("--bandwidth-gib", bw_gib, "array size of the bandwidth measurement, GiB")->capture_default_str();
    app.add_flag("--profile", profile, "CUDA: print the GPU and host time per decode step at the end");
    app.add_flag("--json", as_json, "print one JSON object");
    app.add_option("--temp", temp, "decode test: sampling temperature (0: greedy, as llama-bench)")
        ->capture_default_str();
    app.add_option("--top-k", top_k, "decode test with --temp > 0: top-k (other settings: the defaults)")
        ->capture_default_str();
    app.add_flag("--host-sampling", host_sampling,
                 "decode test: copy the logits and sample on the host (else the device picks the arg-max or "
                 "selects the top-k candidates)");
    app.add_option("--parallel", parallel,
                   "N[,N...]: N sequences at once (continuous batching), each -p prompt and -n generated tokens; "
                   "prints their aggregate prompt and generation tokens/s (tests pp128 x8, tg128 x8)")
        ->delimiter(',');
    app.add_flag("--shared-prompt", shared_prompt, "--parallel: every sequence has the same prompt");
    bool lora_per_seq = false;
    app.add_flag("--lora-per-sequence", lora_per_seq,
                 "--parallel: sequence i takes the (i mod N)-th of the N --lora adapters alone (a batch mixing "
                 "adapters), instead of all of them applying to every sequence");
    app.add_flag(
        "--no-ahead", no_ahead,
        "decode test: wait for each greedy pick before queuing the next step (see GenerateOptions::decode_ahead)");
    SpecFlags sf;
    sf.add(app);
    std::string prompt_file;
    app.add_option("-f,--prompt-file", prompt_file,
                   "decode test: prompt with this text (then the -n tokens generated) instead of one random token; "
                   "with --parallel: every sequence's prompt instead of -p random tokens; for speculative decoding "
                   "on an input-grounded task");
    app.add_option("--mmproj", ef.mmproj, "vision projector GGUF: measure an image's encode instead (--image-size)");
    std::string image_size = "1024x768";
    app.add_option("--image-size", image_size,
                   "with --mmproj: the size WxH of the random image whose encode time and time to first token are "
                   "measured (instead of the pp / tg tests)")
        ->capture_default_str();
    ef.add_image_split(app);
    if (int rc = parse_args(app, args, "bench"); rc >= 0) return rc;
    if (n_prompt < 0 || n_gen < 0 || depth < 0 || reps < 1 || bandwidth_gbps < 0 || bw_gib <= 0)
        throw Error(ErrorCode::kInvalidArgument, "-p, -n, -d and --bandwidth must be >= 0, -r >= 1");
    if (!(temp >= 0.0f) || top_k < 0) throw Error(ErrorCode::kInvalidArgument, "--temp and --top-k must be >= 0");
    for (int n : parallel)
        if (n < 1 || n_prompt < 1 || n_gen < 1 || depth > 0)
            throw Error(ErrorCode::kInvalidArgument, "--parallel needs N >= 1, -p and -n >= 1 and no -d");
    EngineOptions eo = ef.options();
    if (lora_per_seq && (parallel.empty() || eo.lora.empty()))
        throw Error(ErrorCode::kInvalidArgument, "--lora-per-sequence goes with --parallel and --lora");
    // With --lora-per-sequence the adapters are named ones that each request selects.
    std::vector<LoraOptions> per_seq;
    if (lora_per_seq) per_seq = std::exchange(eo.lora, {});
    const int32_t needed =
        parallel.empty() ? std::max(16, depth + std::max(n_prompt, n_gen + 1)) : n_prompt + n_gen + 2;
    // --ctx sizes the session (and its KV cache); by default it is what the tests need.
    if (ef.n_ctx != 0 && ef.n_ctx < needed)
        throw Error(ErrorCode::kInvalidArgument, "--ctx " + std::to_string(ef.n_ctx) + " is less than the " +
                                                     std::to_string(needed) + " tokens the tests need");
    eo.n_ctx = ef.n_ctx != 0 ? ef.n_ctx : needed;
    eo.gpu_profile = profile;
    if (!eo.mmproj.empty()) {
        eo.n_ctx = ef.n_ctx != 0 ? ef.n_ctx : 4096;
        return run_image_bench(Engine::load(model, eo), image_size, reps, as_json);
    }
    auto engine = Engine::load(model, eo);
    for (size_t i = 0; i < per_seq.size(); ++i)
        engine->load_adapter("a" + std::to_string(i), per_seq[i].path, per_seq[i].scale);
    const EngineInfo& info = engine->info();
    const int n_threads = ef.threads > 0 ? ef.threads : std::max(1, cpu_features().physical_cores);
    std::vector<int32_t> prompt_ids;
    if (!prompt_file.empty()) {
        std::ifstream f(prompt_file, std::ios::binary);
        if (!f) throw Error(ErrorCode::kIo, "-f " + prompt_file + ": cannot open the file");
        prompt_ids = engine->tokenize(std::string(std::istreambuf_iterator<char>(f), {}), true);
        if (ef.n_ctx == 0) eo.n_ctx += int32_t(prompt_ids.size());
        if (depth + int64_t(prompt_ids.size()) + n_gen + 1 > eo.n_ctx)
            throw Error(ErrorCode::kInvalidArgument, "--ctx " + std::to_string(eo.n_ctx) + " has no room for the " +
                                                         std::to_string(prompt_ids.size()) + "-token prompt of -f");
    }
    EngineOptions spec_eo = eo;
    const SpeculativeOptions spec = sf.build(spec_eo);
    int64_t drafted = 0, accepted = 0, passes = 0, decoded = 0;

    Session s(engine, eo.n_ctx);
    std::mt19937 rng(42);
    std::uniform_int_distribution<int32_t> tok(0, info.n_vocab - 1);
    auto random_tokens = [&](int n) {
        std::vector<int32_t> v(static_cast<size_t>(n));
        for (auto& t : v) t = tok(rng);
        return v;
    };
    NullSink sink;
    auto fill_depth = [&]() {  // the context the tests start from, prefilled untimed
        s.reset();
        if (depth == 0) return;
        s.append_tokens(random_tokens(depth));
        GenerateOptions g;
        g.max_tokens = 0;
        s.generate(g, sink);
    };
    auto pp_once = [&]() {
        fill_depth();
        s.append_tokens(random_tokens(n_prompt));
        GenerateOptions g;
        g.max_tokens = 0;
        const GenerationResult r = s.generate(g, sink);
        return r.prefill_tokens_per_second();
    };
    auto tg_once = [&](int n) {
        fill_depth();
        s.append_tokens(prompt_ids.empty() ? random_tokens(1) : prompt_ids);
        GenerateOptions g;
        g.speculative = spec;
        g.max_tokens = n + 1;  // the first token comes from the prompt's prefill, then n decode steps
        g.sampling.temperature = temp;
        g.sampling.top_k = top_k;
        g.device_greedy = g.device_sampling = !host_sampling;
        if (no_ahead) g.decode_ahead = 0;
        g.ignore_eos = true;
        const GenerationResult r = s.generate(g, sink);
        drafted += r.drafted_tokens, accepted += r.accepted_tokens, passes += r.decode_steps;
        decoded += r.decode_tokens;
        return r.decode_tokens_per_second();
    };

    std::vector<TestResult> tests;
    const std::string at_depth = depth > 0 ? " @ d" + std::to_string(depth) : "";
    // Progress over the runs (each test's warm-up and repetitions).
    const int n_runs = (reps + 1) * (parallel.empty() ? (n_prompt > 0) + (n_gen > 0) : int(parallel.size()));
    int runs_done = 0;
    Progress bar("bench", 0, stderr, "runs");
    auto ran = [&] { bar.update(uint64_t(++runs_done), uint64_t(n_runs)); };
    // Several sequences at once, like llama-batched-bench: N requests of n_prompt random tokens (one
    // prompt with --shared-prompt) generating n_gen tokens each after the first, submitted together. pp:
    // the N prompts' tokens over the time until every request has its first token; tg: the N x n_gen
    // tokens sampled after that over the time until the last request ends.
    for (int n_seq : parallel) {
        BatcherOptions bo;
        bo.parallel = n_seq;
        bo.n_ctx = eo.n_ctx;
        bo.step_tokens = eo.n_batch;
        bo.speculative = spec;
        auto batcher = Batcher::create(engine, bo);
        const int prompt_len = prompt_ids.empty() ? n_prompt : int(prompt_ids.size());
        int64_t n_drafted = 0, n_accepted = 0, n_passes = 0, n_decoded = 0;  // this N's timed runs
        struct FirstToken : Sink {
            Clock::time_point first{};
            void on_text(std::string_view) override {}
            void on_token(int32_t) override {
                if (first == Clock::time_point{}) first = Clock::now();
            }
        };
        auto once = [&](double& pp, double& tg, bool timed) {
            std::vector<std::vector<int32_t>> prompts;
            for (int i = 0; i < n_seq; ++i)
                prompts.push_back(!prompt_ids.empty()      ? prompt_ids
                                  : shared_prompt && i > 0 ? prompts[0]
                                                           : random_tokens(n_prompt));
            GenerateOptions g;
            g.max_tokens = n_gen + 1;
            g.sampling.temperature = temp;
            g.sampling.top_k = top_k;
            g.ignore_eos = true;
            std::vector<std::shared_ptr<FirstToken>> sinks;
            std::vector<std::shared_ptr<Request>> reqs;
            const auto t0 = Clock::now();
            for (int i = 0; i < n_seq; ++i) {
                sinks.push_back(std::make_shared<FirstToken>());
                if (!per_seq.empty()) g.adapter = "a" + std::to_string(size_t(i) % per_seq.size());
                reqs.push_back(batcher->submit(prompts[size_t(i)], g, sinks.back()));
            }
            for (auto& r : reqs) {
                const GenerationResult res = r->wait();
                if (!timed) continue;
                n_drafted += res.drafted_tokens, n_accepted += res.accepted_tokens;
                n_passes += res.decode_steps, n_decoded += res.decode_tokens;
            }
            const auto t_end = Clock::now();
            Clock::time_point t_first = t0;
            for (auto& k : sinks) t_first = std::max(t_first, k->first);
            pp = double(n_seq) * prompt_len / std::chrono::duration<double>(t_first - t0).count();
            tg = double(n_seq) * n_gen / std::chrono::duration<double>(t_end - t_first).count();
        };
        const std::string x = " x" + std::to_string(n_seq);
        TestResult pp{"pp" + std::to_string(prompt_len) + x, prompt_len, 0, 0, {}};
        TestResult tg{"tg" + std::to_string(n_gen) + x, 0, n_gen, 0, {}};
        double a = 0, b = 0;
        once(a, b, false);  // warm-up
        ran();
        for (int r = 0; r < reps; ++r) {
            once(a, b, true);
            pp.samples.push_back(a), tg.samples.push_back(b);
            ran();
        }
        tests.push_back(std::move(pp)), tests.push_back(std::move(tg));
        const BatcherStats st = batcher->stats();
        const double per_token =
            double(st.kv_bytes) / double(std::max<int64_t>(1, st.kv_blocks_total * st.kv_block_tokens));
        bar.clear_line();
        std::fprintf(stderr, "cera bench: %d sequences: KV pool %.1f MiB, %lld blocks of %d tokens, %.1f KiB a token\n",
                     n_seq, double(st.kv_bytes) / (1 << 20), (long long)st.kv_blocks_total, st.kv_block_tokens,
                     per_token / 1024);
        if (spec.enabled())
            std::fprintf(stderr,
                         "cera bench: %d sequences: speculative: %lld drafted, %lld accepted (%.1f%%), %.2f tokens a "
                         "sequence's pass\n",
                         n_seq, (long long)n_drafted, (long long)n_accepted,
                         n_drafted > 0 ? 100.0 * double(n_accepted) / double(n_drafted) : 0.0,
                         n_passes > 0 ? double(n_decoded) / double(n_passes) : 0.0);
        drafted += n_drafted, accepted += n_accepted, passes += n_passes, decoded += n_decoded;
    }
    if (!parallel.empty()) n_prompt = n_gen = 0;  // the single-sequence tests are not run
    if (n_prompt > 0) {
        TestResult t{"pp" + std::to_string(n_prompt) + at_depth, n_prompt, 0, depth, {}};
        pp_once();  // warm-up
        ran();
        for (int r = 0; r < reps; ++r) {
            t.samples.push_back(pp_once());
            ran();
        }
        tests.push_back(std::move(t));
    }
    if (n_gen > 0) {
        TestResult t{"tg" + std::to_string(n_gen) + at_depth, 0, n_gen, depth, {}};
        tg_once(std::min(n_gen, 16));  // warm-up
        ran();
        drafted = accepted = passes = decoded = 0;
        for (int r = 0; r < reps; ++r) {
            t.samples.push_back(tg_once(n_gen));
            ran();
        }
        tests.push_back(std::move(t));
    }
    const bool speculative = spec.enabled() && passes > 0;
    const double acceptance = drafted > 0 ? double(accepted) / double(drafted) : 0.0;
    const double per_pass = passes > 0 ? double(decoded) / double(passes) : 0.0;
    const double rss = peak_rss_bytes();
    // What the device holds after the tests (KV cache and scratch at their largest).
    const DeviceMemory dm = engine->device_memory();
    const double dm_total = double(dm.weights + dm.buffers + dm.scratch);

    // The decode roofline.
    const bool measured = bandwidth_gbps <= 0.0;
    double bandwidth = bandwidth_gbps * 1e9;
    if (measured && !info.on_gpu) bandwidth = measure_read_bandwidth(size_t(bw_gib * double(1ull << 30)), n_threads);
    const double bytes_per_token = double(info.decode_bytes_per_token);
    const double roofline = bandwidth > 0 ? bandwidth / bytes_per_token : 0.0;
    double tg_median = 0.0;
    for (const auto& t : tests)
        if (t.n_gen > 0 && parallel.empty()) tg_median = stats(t.samples).median;  // one sequence's rate
    const double fraction = roofline > 0 ? tg_median / roofline : 0.0;

    if (as_json) {
        nlohmann::json j;
        j["model"] = model;
        j["architecture"] = info.architecture;
        j["weight_type"] = info.weight_type;
        j["n_params"] = info.n_params;
        j["model_bytes"] = info.weight_bytes;
        j["device"] = info.device;
        j["threads"] = n_threads;
        j["repetitions"] = reps;
        if (!prompt_ids.empty()) j["prompt_tokens"] = prompt_ids.size();  // -f's prompt
        for (const LoraOptions& lo : eo.lora) j["lora"].push_back({{"path", lo.path}, {"scale", lo.scale}});
        for (const auto& t : tests) {
            const Stats st = stats(t.samples);
            j["tests"].push_back({{"name", t.name},
                                  {"n_prompt", t.n_prompt},
                                  {"n_gen", t.n_gen},
                                  {"depth", t.depth},
                                  {"tokens_per_second", {{"median", st.median}, {"p10", st.p10}, {"p90", st.p90}}},
                                  {"samples", t.samples}});
        }
        j["peak_rss_bytes"] = uint64_t(rss);
        if (info.on_gpu)
            j["device_memory"] = {{"weights", dm.weights}, {"buffers", dm.buffers}, {"scratch", dm.scratch}};
        j["decode_bytes_per_token"] = info.decode_bytes_per_token;
        j["bandwidth_gbps"] = bandwidth / 1e9;
        j["bandwidth_measured"] = measured && !info.on_gpu;
        j["decode_roofline_tokens_per_second"] = roofline;
        j["decode_roofline_fraction"] = fraction;
        if (speculative)
            j["speculative"] = {{"drafted", drafted},
                                {"accepted", accepted},
                                {"acceptance_rate", acceptance},
                                {"target_passes", passes},
                                {"tokens_per_pass", per_pass}};
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("model:  %s (%s, %s, %.2f M params, %.2f MiB)\n", model.c_str(), info.architecture.c_str(),
                info.weight_type.c_str(), double(info.n_params) / 1e6, double(info.weight_bytes) / (1 << 20));
    for (const LoraOptions& lo : eo.lora) std::printf("lora:   %s (scale %g)\n", lo.path.c_str(), double(lo.scale));
    std::printf("device: %s; %d repetitions after a warm-up\n\n", info.device.c_str(), reps);
    std::printf("| %-15s | %12s | %12s | %12s |\n", "test", "t/s median", "p10", "p90");
    std::printf("| %-15s | %12s | %12s | %12s |\n", "---------------", "------------", "------------", "------------");
    for (const auto& t : tests) {
        const Stats st = stats(t.samples);
        std::printf("| %-15s | %12.2f | %12.2f | %12.2f |\n", t.name.c_str(), st.median, st.p10, st.p90);
    }
    if (speculative)
        std::printf(
            "\nspeculative decoding: %lld drafted, %lld accepted (%.1f%%), %lld target passes, %.2f tokens a "
            "pass\n",
            (long long)drafted, (long long)accepted, 100 * acceptance, (long long)passes, per_pass);
    std::printf("\npeak RSS: %.1f MiB\n", rss / (1 << 20));
    if (info.on_gpu)
        std::printf(
            "device memory: %.1f MiB = weights %.1f + KV cache, states and outputs %.1f + scratch %.1f "
            "(%.2fx the weights and buffers)\n",
            dm_total / (1 << 20), double(dm.weights) / (1 << 20), double(dm.buffers) / (1 << 20),
            double(dm.scratch) / (1 << 20), dm_total / double(std::max<uint64_t>(1, dm.weights + dm.buffers)));
    if (!parallel.empty()) return 0;  // the roofline is a single sequence's
    std::printf("weights read per decoded token: %.2f MiB\n", bytes_per_token / (1 << 20));
    if (bandwidth > 0) {
        std::printf("read bandwidth: %.1f GB/s (%s)\n", bandwidth / 1e9,
                    measured ? ("measured, " + std::to_string(n_threads) + " threads, " +
                                std::to_string(bw_gib).substr(0, 4) + " GiB sum")
                                   .c_str()
                             : "given");
        std::printf("decode roofline: %.1f tok/s; tg median is %.1f%% of it\n", roofline, 100.0 * fraction);
    } else {
        std::printf("decode roofline: give --bandwidth GBps for a GPU\n");
    }
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(bench, "bench", "prefill and decode speed, peak memory, decode roofline", run_bench);

}  // namespace cera::cli
