// cera::perplexity: windows of n_ctx tokens, each from an empty cache, scoring the second half; and the
// KL base files that hold the log-probabilities of a run for another run to be compared against.
//
// A KL base file (little-endian):
//   char magic[8] = "CERAKLB1"; u32 version = 1; u32 flags (bit 0: BOS per window); i32 n_vocab, n_ctx,
//   n_chunks, 0; u64 vocab hash (FNV-1a of every token's text); i64 n_tokens; i32 tokens[n_tokens];
//   then per window, per scored position (n_ctx - n_ctx / 2 - 1 of them): f32 log-probabilities [n_vocab].
#include "cera/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/check.h"
#include "runtime/engine_impl.h"

namespace cera {
namespace {

constexpr char kMagic[8] = {'C', 'E', 'R', 'A', 'K', 'L', 'B', '1'};
constexpr uint32_t kVersion = 1;

struct BaseHeader {
    char magic[8];
    uint32_t version;
    uint32_t flags;
    int32_t n_vocab, n_ctx, n_chunks, reserved;
    uint64_t vocab_hash;
    int64_t n_tokens;
};
static_assert(sizeof(BaseHeader) == 48);

// FNV-1a over every token's text: two vocabularies that differ anywhere give different hashes.
uint64_t vocab_hash(const Engine& engine) {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](const void* p, size_t n) {
        const auto* b = static_cast<const uint8_t*>(p);
        for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    };
    for (int32_t t = 0; t < engine.info().n_vocab; ++t) {
        const std::string s = engine.token_text(t);
        mix(s.data(), s.size());
        mix("\0", 1);
    }
    return h;
}

// out = log_softmax(logits), in float; the sum runs in double.
void log_softmax(const float* logits, int64_t n, float* out) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, logits[i]);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - double(mx));
    const double lse = double(mx) + std::log(sum);
    for (int64_t i = 0; i < n; ++i) out[i] = float(double(logits[i]) - lse);
}

int64_t argmax(const float* x, int64_t n) { return std::max_element(x, x + n) - x; }

// Mean and standard error of the mean from a sum and a sum of squares over n values.
void mean_err(double sum, double sum2, int64_t n, double& mean, double& err) {
    mean = sum / double(n);
    const double var = sum2 / double(n) - mean * mean;
    err = n > 1 && var > 0 ? std::sqrt(var / double(n - 1)) : 0.0;
}

}  // namespace

PerplexityResult perplexity(Engine& engine, std::span<const int32_t> tokens_in, const PerplexityOptions& options,
                            const std::function<void(int32_t, const PerplexityResult&)>& on_chunk) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t n_vocab = engine.info().n_vocab;
    if (!options.save_base.empty() && !options.compare_base.empty())
        throw_error(ErrorCode::kInvalidArgument, "perplexity: save a KL base or compare against one, not both");

    std::vector<int32_t> tokens(tokens_in.begin(), tokens_in.end());
    int32_t n_ctx = options.n_ctx;
    bool bos_per_window = options.bos_per_window;
    int32_t n_chunks_base = -1;
    std::ifstream base_in;
    const uint64_t vhash = (options.save_base.empty() && options.compare_base.empty()) ? 0 : vocab_hash(engine);
    if (!options.compare_base.empty()) {
        base_in.open(options.compare_base, std::ios::binary);
        if (!base_in)
            throw_error(ErrorCode::kIo, "KL base '%s': cannot open it: %s", options.compare_base.c_str(),
                        std::strerror(errno));
        BaseHeader hd{};
        if (!base_in.read(reinterpret_cast<char*>(&hd), sizeof hd) || std::memcmp(hd.magic, kMagic, 8) != 0 ||
            hd.version != kVersion)
            throw_error(ErrorCode::kInvalidFile, "KL base '%s': not a cera KL base file (bad magic or version)",
                        options.compare_base.c_str());
        if (hd.n_vocab != n_vocab || hd.vocab_hash != vhash)
            throw_error(ErrorCode::kInvalidFile,
                        "KL base '%s': made with another vocabulary (%d tokens, this model has %lld, or their texts "
                        "differ)",
                        options.compare_base.c_str(), hd.n_vocab, (long long)n_vocab);
        if (hd.n_ctx < 4 || hd.n_chunks < 1 || hd.n_tokens < int64_t(hd.n_ctx) * hd.n_chunks ||
            hd.n_tokens > (int64_t(1) << 31))
            throw_error(ErrorCode::kInvalidFile, "KL base '%s': bad header (n_ctx %d, %d windows, %lld tokens)",
                        options.compare_base.c_str(), hd.n_ctx, hd.n_chunks, (long long)hd.n_tokens);
        std::vector<int32_t> base_tokens(size_t(hd.n_tokens));
        if (!base_in.read(reinterpret_cast<char*>(base_tokens.data()), std::streamsize(hd.n_tokens * 4)))
            throw_error(ErrorCode::kInvalidFile, "KL base '%s': truncated token list", options.compare_base.c_str());
        for (int32_t t : base_tokens)
            if (t < 0 || t >= n_vocab)
                throw_error(ErrorCode::kInvalidFile, "KL base '%s': token id %d outside the vocabulary",
                            options.compare_base.c_str(), t);
        if (!tokens.empty() &&
            (tokens.size() < base_tokens.size() || !std::equal(base_tokens.begin(), base_tokens.end(), tokens.begin())))
            throw_error(ErrorCode::kInvalidArgument,
                        "KL base '%s': its tokens differ from this text's (another text or tokenizer)",
                        options.compare_base.c_str());
        tokens = std::move(base_tokens);
        n_ctx = hd.n_ctx;
        n_chunks_base = hd.n_chunks;
        bos_per_window = (hd.flags & 1u) != 0;
    }

    if (n_ctx < 4) throw_error(ErrorCode::kInvalidArgument, "perplexity: context %d is too small (at least 4)", n_ctx);
    if (int64_t(tokens.size()) < 2 * int64_t(n_ctx))
        throw_error(ErrorCode::kInvalidArgument,
                    "perplexity: the text is %zu tokens; a context of %d needs at least %lld (two windows)",
                    tokens.size(), n_ctx, 2 * (long long)n_ctx);
    for (int32_t t : tokens)
        if (t < 0 || t >= n_vocab)
            throw_error(ErrorCode::kOutOfRange, "perplexity: token id %d outside the vocabulary [0, %lld)", t,
                        (long long)n_vocab);
    int32_t n_chunks = int32_t(tokens.size() / size_t(n_ctx));
    if (options.n_chunks >= 0) n_chunks = std::min(n_chunks, options.n_chunks);
    if (n_chunks_base >= 0) n_chunks = std::min(n_chunks, n_chunks_base);
    if (n_chunks < 1) throw_error(ErrorCode::kInvalidArgument, "perplexity: no window to score (--chunks 0)");

    const int32_t first = n_ctx / 2;
    const int32_t n_score = n_ctx - first - 1;  // scored positions a window
    const int32_t bos = engine.bos_token();
    const bool put_bos = bos_per_window && bos >= 0 && engine.add_bos();

    std::ofstream base_out;
    if (!options.save_base.empty()) {
        base_out.open(options.save_base, std::ios::binary | std::ios::trunc);
        if (!base_out)
            throw_error(ErrorCode::kIo, "KL base '%s': cannot create it: %s", options.save_base.c_str(),
                        std::strerror(errno));
        BaseHeader hd{};
        std::memcpy(hd.magic, kMagic, 8);
        hd.version = kVersion;
        hd.n_vocab = int32_t(n_vocab);
        hd.n_ctx = n_ctx;
        hd.n_chunks = n_chunks;
        hd.flags = bos_per_window ? 1u : 0u;
        hd.vocab_hash = vhash;
        hd.n_tokens = int64_t(n_chunks) * n_ctx;
        base_out.write(reinterpret_cast<const char*>(&hd), sizeof hd);
        base_out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(hd.n_tokens * 4));
    }

    std::unique_ptr<ModelState> state = engine.impl().model->create_state(n_ctx);
    std::vector<float> logits(size_t(n_ctx) * size_t(n_vocab));
    std::vector<float> lp(static_cast<size_t>(n_vocab)), lp_base(static_cast<size_t>(n_vocab));
    std::vector<int32_t> window(static_cast<size_t>(n_ctx));
    PerplexityResult r;
    r.n_ctx = n_ctx;
    r.n_chunks_total = n_chunks;
    double nll = 0, nll2 = 0;
    // KL sums: nll of the base, ln ratio, kld, same top, dp.
    double nll_b = 0, lr = 0, lr2 = 0, kl = 0, kl2 = 0, dp2 = 0, dp4 = 0;
    int64_t same = 0;
    std::vector<float> klds;
    for (int32_t c = 0; c < n_chunks; ++c) {
        std::copy_n(tokens.begin() + int64_t(c) * n_ctx, n_ctx, window.begin());
        if (put_bos) window[0] = bos;
        state->reset();
        state->eval({.tokens = window, .all_logits = true, .logits = logits.data()});
        double chunk_kl = 0;
        int64_t chunk_same = 0;
        for (int32_t i = first; i < n_ctx - 1; ++i) {
            const float* row = logits.data() + size_t(i) * size_t(n_vocab);
            const int32_t next = window[size_t(i) + 1];
            log_softmax(row, n_vocab, lp.data());
            const double v = -double(lp[size_t(next)]);
            nll += v;
            nll2 += v * v;
            if (base_out.is_open())
                base_out.write(reinterpret_cast<const char*>(lp.data()), std::streamsize(n_vocab * 4));
            if (base_in.is_open()) {
                if (!base_in.read(reinterpret_cast<char*>(lp_base.data()), std::streamsize(n_vocab * 4)))
                    throw_error(ErrorCode::kInvalidFile, "KL base '%s': truncated at window %d",
                                options.compare_base.c_str(), c + 1);
                double k = 0;
                for (int64_t j = 0; j < n_vocab; ++j) {
                    const double pb = std::exp(double(lp_base[size_t(j)]));
                    if (pb > 0) k += pb * (double(lp_base[size_t(j)]) - double(lp[size_t(j)]));
                }
                k = std::max(k, 0.0);  // rounding can leave a tiny negative sum
                const double vb = -double(lp_base[size_t(next)]);
                nll_b += vb;
                lr += v - vb;
                lr2 += (v - vb) * (v - vb);
                kl += k;
                kl2 += k * k;
                chunk_kl += k;
                klds.push_back(float(k));
                const bool s = argmax(lp.data(), n_vocab) == argmax(lp_base.data(), n_vocab);
                same += s;
                chunk_same += s;
                const double dp = std::exp(-v) - std::exp(-vb);
                dp2 += dp * dp;
                dp4 += dp * dp * dp * dp;
            }
        }
        r.n_chunks = c + 1;
        r.n_scored += n_score;
        double mean = 0, err = 0;
        mean_err(nll, nll2, r.n_scored, mean, err);
        r.ppl = std::exp(mean);
        r.ppl_err = err * r.ppl;
        r.running.push_back(r.ppl);
        if (base_in.is_open()) {
            r.chunk_kld.push_back(chunk_kl / n_score);
            r.chunk_same_top.push_back(double(chunk_same) / n_score);
        }
        if (on_chunk) on_chunk(c, r);
    }
    if (base_out.is_open() && !base_out.flush())
        throw_error(ErrorCode::kIo, "KL base '%s': write failed", options.save_base.c_str());
    if (base_in.is_open()) {
        const int64_t n = r.n_scored;
        KlStats& s = r.kl;
        r.has_kl = true;
        s.ppl_base = std::exp(nll_b / double(n));
        mean_err(lr, lr2, n, s.ln_ratio, s.ln_ratio_err);
        s.ppl_ratio = std::exp(s.ln_ratio);
        s.ppl_ratio_err = s.ppl_ratio * s.ln_ratio_err;
        mean_err(kl, kl2, n, s.kld, s.kld_err);
        std::sort(klds.begin(), klds.end());
        auto pct = [&](double q) { return double(klds[size_t(std::llround(q * double(klds.size() - 1)))]); };
        s.kld_min = klds.front();
        s.kld_max = klds.back();
        s.kld_median = pct(0.5);
        s.kld_p99 = pct(0.99);
        s.same_top = double(same) / double(n);
        s.same_top_err = n > 1 ? std::sqrt(s.same_top * (1 - s.same_top) / double(n - 1)) : 0.0;
        const double ms = dp2 / double(n);
        s.rms_dp = std::sqrt(ms);
        const double var = dp4 / double(n) - ms * ms;
        // The error of a root mean square: d sqrt(m) = dm / (2 sqrt(m)).
        s.rms_dp_err = ms > 0 && n > 1 && var > 0 ? std::sqrt(var / double(n - 1)) / (2 * s.rms_dp) : 0.0;
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
}

}  // namespace cera
