// The decode strategies of Session::generate(): one ModelState::eval() head each.
#include "runtime/decode_strategy.h"

#include <algorithm>

#include "core/check.h"

namespace cera {
namespace {

class HostSampling final : public DecodeStrategy {
 public:
    HostSampling(ModelState& state, Sampler& sampler, std::vector<float>& logits, grammar::Matcher* matcher)
        : state_(state), sampler_(sampler), logits_(logits), matcher_(matcher) {}

    DecodePick step(int32_t token, bool /*final_pick*/) override {
        // A grammar's mask for the next token is computed while the device computes its logits (into the
        // matcher's cache, where mask() finds it again).
        EvalRequest rq{.tokens = {&token, 1}, .logits = logits_.data()};
        if (matcher_) rq.meanwhile = [m = matcher_] { m->mask(); };
        state_.eval(rq);
        return {sampler_.sample(logits_.data(), matcher_ ? matcher_->mask() : nullptr), LogitsAt::kHost};
    }

 private:
    ModelState& state_;
    Sampler& sampler_;
    std::vector<float>& logits_;
    grammar::Matcher* matcher_;
};

// For a sampler that picks the plain arg-max (Sampler::picks_argmax).
class DeviceGreedy final : public DecodeStrategy {
 public:
    explicit DeviceGreedy(ModelState& state) : state_(state) {}

    DecodePick step(int32_t token, bool /*final_pick*/) override {
        return {state_.eval({.tokens = {&token, 1}, .head = HeadOutput::kGreedy}).token, LogitsAt::kDevice};
    }

 private:
    ModelState& state_;
};

// DeviceGreedy, queueing the step that evaluates each pick before the host reads the pick.
class DeviceGreedyAhead final : public DecodeStrategy {
 public:
    explicit DeviceGreedyAhead(ModelState& state) : state_(state) {}

    DecodePick step(int32_t token, bool final_pick) override {
        // The final pick queues nothing: no step would take it, and an untaken step is device work undone.
        const EvalRequest rq{.tokens = {&token, 1}, .head = HeadOutput::kGreedy, .ahead = !final_pick};
        return {state_.eval(rq).token, LogitsAt::kDevice};
    }

 private:
    ModelState& state_;
};

// For a sampler whose chain leaves only the best top_k logits in the running (Sampler::top_needed).
class DeviceTopK final : public DecodeStrategy {
 public:
    DeviceTopK(ModelState& state, Sampler& sampler, std::vector<float>& logits, int32_t top_k, int32_t window_cap)
        : state_(state),
          sampler_(sampler),
          logits_(logits),
          ids_(size_t(top_k)),
          top_logits_(size_t(top_k)),
          window_logits_(size_t(std::max(window_cap, 1))) {}

    DecodePick step(int32_t token, bool /*final_pick*/) override {
        const EvalRequest rq{.tokens = {&token, 1},
                             .head = HeadOutput::kTopK,
                             .top_k = int32_t(ids_.size()),
                             .gather = sampler_.window(),
                             .top_ids = ids_.data(),
                             .top_logits = top_logits_.data(),
                             .gathered = window_logits_.data()};
        const int32_t c = state_.eval(rq).n_top;
        if (c > 0)
            return {sampler_.sample_top(ids_.data(), top_logits_.data(), c, window_logits_.data()), LogitsAt::kDevice};
        // No logit above -inf: the host sampler takes the whole row.
        const bool held = state_.read_last_logits(logits_.data());
        CERA_CHECK(held, "a top-k step left no logits in the model state");
        return {sampler_.sample(logits_.data()), LogitsAt::kHost};
    }

 private:
    ModelState& state_;
    Sampler& sampler_;
    std::vector<float>& logits_;
    std::vector<int32_t> ids_;          // [top_k]
    std::vector<float> top_logits_;     // [top_k]
    std::vector<float> window_logits_;  // [max(penalty_last_n, 1)]: the raw logits of Sampler::window()
};

}  // namespace

std::unique_ptr<DecodeStrategy> choose_decode_strategy(const GenerateOptions& options, Sampler& sampler,
                                                       ModelState& state, std::vector<float>& logits,
                                                       bool device_async, grammar::Matcher* matcher) {
    // A grammar's mask and log-probabilities need the whole row on the host.
    if (matcher || options.logprobs >= 0) return std::make_unique<HostSampling>(state, sampler, logits, matcher);
    // Greedy on the device is exactly the host sampler's pick whenever that is a plain arg-max.
    if (options.device_greedy && sampler.picks_argmax()) {
        if (decodes_ahead(options.decode_ahead, device_async))
            return std::make_unique<DeviceGreedyAhead>(state);
        return std::make_unique<DeviceGreedy>(state);
    }
    if (const int32_t top_k = options.device_sampling ? sampler.top_needed() : 0; top_k > 0)
        return std::make_unique<DeviceTopK>(state, sampler, logits, top_k, options.sampling.penalty_last_n);
    return std::make_unique<HostSampling>(state, sampler, logits, nullptr);
}

}  // namespace cera
