// How Session::generate() runs a decode step: evaluate the newest token of the sequence and pick the
// one after it. One strategy per generate() call, chosen from the options and the sampler:
//   HostSampling       the logits come to the host and the Sampler draws from them (the only one under
//                      a grammar: its mask needs every allowed token's logit)
//   DeviceGreedy       the arg-max runs inside the device step; only the id comes back
//   DeviceGreedyAhead  DeviceGreedy with each step queued before the host has read the previous pick
//   DeviceTopK         only the best logits and the penalty window's come back; Sampler::sample_top draws
// Every strategy picks the token the host sampler would pick from the whole logits row.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cera/sampler.h"
#include "cera/session.h"
#include "chat/grammar/matcher.h"
#include "models/model.h"

namespace cera {

// Where a decode step leaves the logits of the token it evaluated.
enum class LogitsAt {
    kHost,    // in the session's host logits
    kDevice,  // in the model state (ModelState::read_last_logits)
};

struct DecodePick {
    int32_t token = -1;  // the next token
    LogitsAt logits = LogitsAt::kHost;
};

class DecodeStrategy {
 public:
    virtual ~DecodeStrategy() = default;
    // Evaluates `token` (the newest of the sequence) and picks the one after it. final_pick: generate()
    // takes no token after this pick, so nothing will evaluate it.
    virtual DecodePick step(int32_t token, bool final_pick) = 0;
};

// Whether greedy steps queue the next step before the host reads the pick (GenerateOptions::decode_ahead:
// -1 when the device runs behind the host, device_async; 0 never; 1 always).
inline bool decodes_ahead(int decode_ahead, bool device_async) {
    return decode_ahead > 0 || (decode_ahead < 0 && device_async);
}

// The strategy for one generate() call. logits: the session's host logits, f32 [n_vocab], written when a
// step brings the logits to the host. device_async: the backend runs behind the host (Backend::asynchronous),
// which is when GenerateOptions::decode_ahead < 0 queues greedy steps ahead. The strategy holds references
// to state, sampler and logits. matcher: the grammar's (or null); each pick is drawn from its mask, and
// the caller advances it by the pick before the next step.
std::unique_ptr<DecodeStrategy> choose_decode_strategy(const GenerateOptions& options, Sampler& sampler,
                                                       ModelState& state, std::vector<float>& logits,
                                                       bool device_async, grammar::Matcher* matcher = nullptr);

}  // namespace cera
