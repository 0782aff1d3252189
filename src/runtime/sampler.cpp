// The sampler chain: penalties -> top-k -> top-p -> min-p -> temperature -> draw.
//
// Cost per token is O(n_vocab) (loading the logits, one max, one exp pass) plus a
// partial sort of the survivors: top-k selects with nth_element, min-p partitions
// by a logit threshold, and top-p sorts only as far as it has to (growing chunks),
// so a 150k vocabulary never pays for a full sort in the common settings.
#include "cera/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backends/backend.h"
#include "core/check.h"
#include "core/mmap.h"

namespace cera {
namespace {

// Descending logit, then ascending id: a strict total order (NaN is mapped to -inf on load).
inline bool better(const TokenProb& a, const TokenProb& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

uint64_t splitmix64(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

template <class T>
Sampler::Buffer<T> Sampler::zeroed(size_t n) {
    return Buffer<T>(static_cast<T*>(map_zero_pages(n * sizeof(T))), Unmap{n * sizeof(T)});
}

void Sampler::Unmap::operator()(void* p) const noexcept { unmap_pages(p, bytes); }

Sampler::Sampler(const SamplerParams& params, int32_t n_vocab) : params_(params), n_vocab_(n_vocab) {
    if (n_vocab <= 0) throw_error(ErrorCode::kInvalidArgument, "sampler: n_vocab must be positive, got %d", n_vocab);
    if (std::isnan(params.temperature))
        throw_error(ErrorCode::kInvalidArgument, "sampler: temperature is NaN");
    if (std::isnan(params.top_p) || params.top_p < 0.0f)
        throw_error(ErrorCode::kInvalidArgument, "sampler: top_p must be >= 0, got %g", double(params.top_p));
    if (std::isnan(params.min_p) || params.min_p > 1.0f)
        throw_error(ErrorCode::kInvalidArgument, "sampler: min_p must be <= 1, got %g", double(params.min_p));
    if (!(params.repeat_penalty > 0.0f) || std::isinf(params.repeat_penalty))
        throw_error(ErrorCode::kInvalidArgument, "sampler: repeat penalty must be > 0, got %g",
                    double(params.repeat_penalty));
    if (!std::isfinite(params.frequency_penalty) || !std::isfinite(params.presence_penalty))
        throw_error(ErrorCode::kInvalidArgument, "sampler: frequency and presence penalties must be finite");
    if (params.penalty_last_n < 0)
        throw_error(ErrorCode::kInvalidArgument, "sampler: penalty window must be >= 0, got %d", params.penalty_last_n);
    for (const auto& [id, bias] : params.logit_bias) {
        if (id < 0 || id >= n_vocab)
            throw_error(ErrorCode::kInvalidArgument, "sampler: logit bias for token %d outside [0, %d)", id, n_vocab);
        if (!std::isfinite(bias))
            throw_error(ErrorCode::kInvalidArgument, "sampler: logit bias for token %d is not finite", id);
    }

    greedy_ = params.temperature <= 0.0f;
    penalties_on_ = params.penalty_last_n > 0 && (params.repeat_penalty != 1.0f || params.frequency_penalty != 0.0f ||
                                                  params.presence_penalty != 0.0f);
    cand_ = zeroed<TokenProb>(size_t(n_vocab));
    if (penalties_on_) {
        ring_.assign(size_t(params.penalty_last_n), 0);
        window_.assign(size_t(params.penalty_last_n), 0);
        count_ = zeroed<int32_t>(size_t(n_vocab));
        stamp_ = zeroed<uint32_t>(size_t(n_vocab));
    }
    reset();
}

void Sampler::reset() {
    clear_history();
    uint64_t s = params_.seed;
    for (auto& r : rng_) r = splitmix64(s);
}

void Sampler::clear_history() {
    for (int32_t i = 0; i < ring_size_; ++i) {
        const int32_t t = ring_[size_t((ring_head_ + i) % int32_t(ring_.size()))];
        count_[size_t(t)] = 0;
    }
    ring_head_ = 0;
    ring_size_ = 0;
}

void Sampler::accept(int32_t token) {
    if (!penalties_on_ || token < 0 || token >= n_vocab_) return;
    const int32_t cap = int32_t(ring_.size());
    if (ring_size_ == cap) {  // the oldest token leaves the window
        --count_[size_t(ring_[size_t(ring_head_)])];
        ring_[size_t(ring_head_)] = token;
        ring_head_ = (ring_head_ + 1) % cap;
    } else {
        ring_[size_t((ring_head_ + ring_size_) % cap)] = token;
        ++ring_size_;
    }
    ++count_[size_t(token)];
}

std::vector<int32_t> Sampler::history() const {
    std::vector<int32_t> out;
    for (int32_t i = 0; i < ring_size_; ++i) out.push_back(ring_[size_t((ring_head_ + i) % int32_t(ring_.size()))]);
    return out;
}

uint64_t Sampler::next_u64() {  // xoshiro256**
    const uint64_t result = rotl(rng_[1] * 5, 7) * 9;
    const uint64_t t = rng_[1] << 17;
    rng_[2] ^= rng_[0];
    rng_[3] ^= rng_[1];
    rng_[1] ^= rng_[2];
    rng_[0] ^= rng_[3];
    rng_[2] ^= t;
    rng_[3] = rotl(rng_[3], 45);
    return result;
}

double Sampler::next_uniform() { return double(next_u64() >> 11) * 0x1.0p-53; }

// Candidates for one row. When at most the best `k` can survive (top-k, or greedy with k = 1)
// and k plus the penalty window is small next to the vocabulary, only the raw top (k + window)
// ids are gathered, with a threshold scan, plus the window's own ids: penalties change only
// window tokens, so the penalised top k is always among those. Otherwise every id is loaded.
void Sampler::load(const float* logits, int32_t k) {
    sorted_ = false;
    const int64_t m = int64_t(k) + (penalties_on_ ? ring_size_ : 0);
    // A bias can lift any id into the best k, so a biased row is always loaded whole.
    if (k > 0 && m * 8 < n_vocab_ && params_.logit_bias.empty()) {
        TokenProb* c = cand_.get();
        int32_t cnt = 0;
        float thr = -std::numeric_limits<float>::infinity();
        for (int32_t i = 0; i < n_vocab_; ++i) {
            const float l = logits[i];
            if (!(l > thr) || !allowed(i)) continue;  // also skips NaN
            c[cnt++] = {i, l, 0.0f};
            if (cnt == 2 * m) {  // keep the best m; the m-th becomes the bar to pass
                std::nth_element(c, c + m - 1, c + cnt, better);
                thr = c[m - 1].logit;
                cnt = int32_t(m);
            }
        }
        if (cnt > 0) {
            // Best first: the order does not depend on the scan, so sample_top() (given the same best
            // entries in this order) builds exactly this candidate array.
            std::sort(c, c + cnt, better);
            n_cand_ = cnt;
            add_window(logits, nullptr);
            return;
        }
        // every logit is -inf or NaN: fall through to the full load
    }
    load_all(logits);
}

void Sampler::load_all(const float* logits) {
    TokenProb* c = cand_.get();
    if (allowed_) {  // the allowed tokens only; the penalties then go through the window path
        int32_t cnt = 0;
        for (int32_t i = 0; i < n_vocab_; ++i) {
            if (!allowed(i)) continue;
            const float l = logits[i];
            c[cnt++] = {i, std::isnan(l) ? -std::numeric_limits<float>::infinity() : l, 0.0f};
        }
        for (const auto& [id, bias] : params_.logit_bias) {  // c is in id order
            TokenProb* at = std::lower_bound(c, c + cnt, id, [](const TokenProb& t, int32_t v) { return t.id < v; });
            if (at != c + cnt && at->id == id) at->logit += bias;
        }
        n_cand_ = cnt;
        sorted_ = false;
        add_window(logits, nullptr);
        return;
    }
    for (int32_t i = 0; i < n_vocab_; ++i) {
        const float l = logits[i];
        c[i] = {i, std::isnan(l) ? -std::numeric_limits<float>::infinity() : l, 0.0f};
    }
    for (const auto& [id, bias] : params_.logit_bias) c[id].logit += bias;
    n_cand_ = n_vocab_;
    sorted_ = false;
    if (penalties_on_) apply_penalties();
}

float Sampler::log_probs(const float* logits, int32_t token, int32_t n_top, TokenLogprob* top) {
    load_all(logits);
    TokenProb* c = cand_.get();
    float max_l = -std::numeric_limits<float>::infinity();
    for (int32_t i = 0; i < n_vocab_; ++i) max_l = std::max(max_l, c[i].logit);
    double z = 0.0;
    if (std::isfinite(max_l))
        for (int32_t i = 0; i < n_vocab_; ++i) z += std::exp(double(c[i].logit) - double(max_l));
    // Every logit -inf (or +inf): no distribution to speak of; each id reads as -inf but the best.
    const double lse = std::isfinite(max_l) ? double(max_l) + std::log(z) : double(max_l);
    auto lp = [&](float l) {
        return std::isfinite(max_l) ? float(double(l) - lse)
                                    : (l == max_l ? 0.0f : -std::numeric_limits<float>::infinity());
    };
    const float chosen = token >= 0 && token < n_vocab_ ? lp(c[token].logit) : -std::numeric_limits<float>::infinity();
    n_top = std::clamp(n_top, 0, n_vocab_);
    if (n_top > 0) {
        std::partial_sort(c, c + n_top, c + n_vocab_, better);
        for (int32_t i = 0; i < n_top; ++i) top[i] = {c[i].id, lp(c[i].logit)};
    }
    n_cand_ = 0;
    return chosen;
}

void Sampler::add_window(const float* logits, const float* window_logits) {
    if (!penalties_on_) return;
    TokenProb* c = cand_.get();
    next_epoch();
    for (int32_t i = 0; i < n_cand_; ++i) stamp_[size_t(c[i].id)] = epoch_;
    const int32_t cap = int32_t(ring_.size());
    for (int32_t i = 0; i < ring_size_; ++i) {
        const int32_t t = ring_[size_t((ring_head_ + i) % cap)];
        if (stamp_[size_t(t)] == epoch_ || !allowed(t)) continue;
        stamp_[size_t(t)] = epoch_;
        const float l = window_logits ? window_logits[i] : logits[t];
        c[n_cand_++] = {t, std::isnan(l) ? -std::numeric_limits<float>::infinity() : l, 0.0f};
    }
    for (int32_t i = 0; i < n_cand_; ++i) {
        const int32_t n = count_[size_t(c[i].id)];
        if (n > 0) c[i].logit = penalize(c[i].logit, n);
    }
}

int32_t Sampler::top_needed() const {
    const int64_t k = params_.top_k;
    const int64_t m = k + (penalties_on_ ? int64_t(ring_.size()) : 0);
    // load()'s condition for its top-(k + window) path, for every window fill.
    return !greedy_ && k > 0 && m * 8 < n_vocab_ && params_.logit_bias.empty() ? int32_t(m) : 0;
}

std::span<const int32_t> Sampler::window() {
    if (!penalties_on_) return {};
    const int32_t cap = int32_t(ring_.size());
    for (int32_t i = 0; i < ring_size_; ++i) window_[size_t(i)] = ring_[size_t((ring_head_ + i) % cap)];
    return {window_.data(), size_t(ring_size_)};
}

int32_t Sampler::sample_top(const int32_t* ids, const float* logits, int32_t n, const float* window_logits) {
    // load()'s top path: the best k + (window fill) entries, best first, then the window.
    const int32_t m = params_.top_k + (penalties_on_ ? ring_size_ : 0);
    sorted_ = false;
    n_cand_ = 0;
    // A backend's ids are in range; one that is not is dropped rather than indexing out of bounds.
    for (int32_t i = 0; i < std::min(n, m); ++i)
        if (ids[i] >= 0 && ids[i] < n_vocab_) cand_[size_t(n_cand_++)] = {ids[i], logits[i], 0.0f};
    if (n_cand_ == 0) cand_[size_t(n_cand_++)] = {0, -std::numeric_limits<float>::infinity(), 0.0f};
    add_window(nullptr, window_logits);
    filter(false);
    return draw();
}

void Sampler::next_epoch() {
    if (++epoch_ == 0) {  // wrapped: clear the stamps once every 2^32 passes
        std::fill(stamp_.get(), stamp_.get() + n_vocab_, 0u);
        epoch_ = 1;
    }
}

float Sampler::penalize(float l, int32_t count) const {
    l = l <= 0.0f ? l * params_.repeat_penalty : l / params_.repeat_penalty;
    return l - (float(count) * params_.frequency_penalty + (count > 0 ? params_.presence_penalty : 0.0f));
}

// Penalties on a full load (cand_[id].id == id).
void Sampler::apply_penalties() {
    next_epoch();
    const int32_t cap = int32_t(ring_.size());
    for (int32_t i = 0; i < ring_size_; ++i) {
        const int32_t t = ring_[size_t((ring_head_ + i) % cap)];
        if (stamp_[size_t(t)] == epoch_) continue;
        stamp_[size_t(t)] = epoch_;
        cand_[size_t(t)].logit = penalize(cand_[size_t(t)].logit, count_[size_t(t)]);
    }
}

namespace {

// c[0..n) carry weights in .p. Reorders c so that c[0..r) are the r best candidates (by better())
// for the smallest r whose weights sum to at least target, and returns r. Expected O(n): halving
// selections with nth_element, then a sort of the last few.
int32_t take_mass(TokenProb* c, int32_t n, double target) {
    int32_t lo = 0, hi = n;  // the answer r is in (lo, hi]; [0, lo) holds weight acc < target
    double acc = 0.0;
    while (hi - lo > 32) {
        const int32_t mid = lo + (hi - lo) / 2;
        std::nth_element(c + lo, c + mid, c + hi, better);
        double mass = 0.0;
        for (int32_t i = lo; i <= mid; ++i) mass += c[i].p;
        if (acc + mass >= target) {
            hi = mid + 1;
        } else {
            acc += mass;
            lo = mid + 1;
        }
    }
    std::sort(c + lo, c + hi, better);
    for (int32_t i = lo; i < hi; ++i) {
        acc += c[i].p;
        if (acc >= target) return i + 1;
    }
    return hi;
}

}  // namespace

void Sampler::filter(bool sort_kept) {
    TokenProb* c = cand_.get();
    int32_t n = n_cand_;

    // top-k: the k best, sorted.
    const int32_t k = params_.top_k;
    if (k > 0 && k < n) {
        std::nth_element(c, c + k - 1, c + n, better);
        n = k;
        std::sort(c, c + n, better);
        sorted_ = true;
    } else if (k > 0 && n <= 64) {
        std::sort(c, c + n, better);
        sorted_ = true;
    }

    float max_l = sorted_ ? c[0].logit : -std::numeric_limits<float>::infinity();
    if (!sorted_)
        for (int32_t i = 0; i < n; ++i) max_l = std::max(max_l, c[i].logit);
    if (!std::isfinite(max_l)) {  // every logit is -inf (or +inf): keep the best one
        std::nth_element(c, c, c + n, better);
        n_cand_ = 1;
        c[0].p = 1.0f;
        sorted_ = true;
        return;
    }

    int32_t limit = n;
    if (params_.min_p > 0.0f) {  // keep logit >= max + log(min_p), i.e. p >= min_p * p_max
        const float threshold = max_l + std::log(params_.min_p);
        if (sorted_) {
            while (limit > 1 && c[limit - 1].logit < threshold) --limit;
        } else {
            limit = int32_t(std::partition(c, c + n, [&](const TokenProb& t) { return t.logit >= threshold; }) - c);
        }
        limit = std::max(limit, 1);
    }
    if (params_.top_p < 1.0f) {
        // Top-p looks at the temperature-1 probabilities of all n candidates (after top-k); min-p keeps
        // a best-prefix too, so the survivors are the shorter of the two prefixes.
        // If the candidates within a factor kTau of the best already hold the mass, the cut is among
        // them (they are a best-prefix): a cheap partition first spares the selection most of the
        // vocabulary when the distribution is peaked, as a language model's usually is.
        constexpr float kTau = 1e-4f;
        double z = 0.0, z_limit = 0.0, z_high = 0.0;
        for (int32_t i = 0; i < n; ++i) {
            const float e = std::exp(c[i].logit - max_l);
            c[i].p = e;
            z += e;
            if (i < limit) {
                z_limit += e;
                if (e >= kTau) z_high += e;
            }
        }
        const double target = double(params_.top_p) * z;
        if (!sorted_ && z_high >= target)
            limit = int32_t(std::partition(c, c + limit, [](const TokenProb& t) { return t.p >= kTau; }) - c);
        if (z_limit >= target) {
            if (sorted_) {
                double cum = 0.0;
                int32_t keep = limit;
                for (int32_t i = 0; i < limit; ++i) {
                    cum += c[i].p;
                    if (cum >= target) {
                        keep = i + 1;
                        break;
                    }
                }
                limit = keep;
            } else {
                limit = take_mass(c, limit, target);
            }
        }
    }
    n = limit;
    if (sort_kept && !sorted_) {  // before the temperature, so that its rounding cannot reorder ties
        std::sort(c, c + n, better);
        sorted_ = true;
    }

    // temperature, then the normalised probabilities of the survivors.
    const float inv_t = 1.0f / params_.temperature;
    const float max_t = max_l * inv_t;
    double z = 0.0;
    for (int32_t i = 0; i < n; ++i) {
        c[i].logit *= inv_t;
        const float e = std::exp(c[i].logit - max_t);
        c[i].p = e;
        z += e;
    }
    const float inv_z = float(1.0 / z);
    for (int32_t i = 0; i < n; ++i) c[i].p *= inv_z;
    n_cand_ = n;
}

int32_t Sampler::greedy_pick() const {
    int32_t best = 0;
    for (int32_t i = 1; i < n_cand_; ++i)
        if (better(cand_[size_t(i)], cand_[size_t(best)])) best = i;
    return best;
}

int32_t Sampler::sample(const float* logits) {
    if (greedy_) {
        if (picks_argmax()) {  // the same pick as Backend::argmax on the device
            int32_t id = 0;
            argmax_rows_host(logits, 1, n_vocab_, &id);
            return id;
        }
        load(logits, 1);
        return cand_[size_t(greedy_pick())].id;
    }
    load(logits, params_.top_k > 0 ? params_.top_k : 0);
    filter(false);
    return draw();
}

namespace {
bool any_bit(const uint64_t* words, int32_t n_vocab) {
    for (int32_t w = 0; w < (n_vocab + 63) / 64; ++w)
        if (words[w]) return true;
    return false;
}
}  // namespace

int32_t Sampler::sample(const float* logits, const uint64_t* allowed) {
    if (!allowed || !any_bit(allowed, n_vocab_)) return sample(logits);
    allowed_ = allowed;
    int32_t t;
    if (greedy_) {
        load(logits, 1);
        t = cand_[size_t(greedy_pick())].id;
    } else {
        load(logits, params_.top_k > 0 ? params_.top_k : 0);
        filter(false);
        t = draw();
    }
    allowed_ = nullptr;
    return t;
}

std::span<const TokenProb> Sampler::distribution(const float* logits, const uint64_t* allowed) {
    if (!allowed || !any_bit(allowed, n_vocab_)) return distribution(logits);
    allowed_ = allowed;
    const std::span<const TokenProb> d = distribution(logits);
    allowed_ = nullptr;
    return d;
}

// Draw u in [0, sum p) and walk the cumulative mass; the last candidate absorbs rounding.
int32_t Sampler::draw() {
    double total = 0.0;
    for (int32_t i = 0; i < n_cand_; ++i) total += cand_[size_t(i)].p;
    const double u = next_uniform() * total;
    double cum = 0.0;
    for (int32_t i = 0; i < n_cand_ - 1; ++i) {
        cum += cand_[size_t(i)].p;
        if (u < cum) return cand_[size_t(i)].id;
    }
    return cand_[size_t(n_cand_ - 1)].id;
}

std::span<const TokenProb> Sampler::distribution(const float* logits) {
    if (greedy_) {
        load(logits, 1);
        std::swap(cand_[0], cand_[size_t(greedy_pick())]);
        cand_[0].p = 1.0f;
        n_cand_ = 1;
        return {cand_.get(), 1};
    }
    load(logits, params_.top_k > 0 ? params_.top_k : 0);
    filter(true);
    return {cand_.get(), size_t(n_cand_)};
}

}  // namespace cera
