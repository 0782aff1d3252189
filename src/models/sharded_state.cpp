#include "models/sharded_state.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "core/check.h"
#include "models/lora.h"
#include "models/rank_thread.h"

namespace cera {
namespace {

class ShardedState final : public ModelState {
 public:
    ShardedState(const Model& model, int n_ctx)
        : n_vocab_(model.info().n_vocab), n_embd_(model.info().n_embd), out_(model.pipeline() ? model.world() - 1 : 0) {
        for (int r = 0; r < model.world(); ++r) states_.push_back(make_sequence_state(model.rank_model(r), n_ctx));
        scratch_.resize(states_.size());
        threads_.resize(states_.size() - 1);
        for (auto& t : threads_) t = std::make_unique<RankThread>();
    }

    EvalResult eval(const EvalRequest& rq) override {
        // The other ranks run the same step into scratch outputs of their own: the same rows, so that
        // their passes make the same collectives as the output rank's.
        const size_t n_out = rq.all_logits ? rq.tokens.size() : 1;
        EvalResult result;
        on_every_rank([&](int r, ModelState& s) {
            if (r == out_) {
                result = s.eval(rq);
                return;
            }
            Scratch& b = scratch_[size_t(r)];
            auto buf = [n_out](auto* p, auto& v, size_t width) {
                v.resize(p ? n_out * width : 0);
                return p ? v.data() : nullptr;
            };
            EvalRequest other = rq;
            other.meanwhile = nullptr;
            other.logits = buf(rq.logits, b.logits, size_t(n_vocab_));
            other.hidden = buf(rq.hidden, b.hidden, size_t(n_embd_));
            other.argmax = buf(rq.argmax, b.argmax, 1);
            b.top_ids.resize(size_t(std::max(rq.top_k, 0))), b.top_logits.resize(b.top_ids.size());
            b.gathered.resize(rq.gather.size());
            other.top_ids = rq.top_ids ? b.top_ids.data() : nullptr;
            other.top_logits = rq.top_logits ? b.top_logits.data() : nullptr;
            other.gathered = rq.gathered ? b.gathered.data() : nullptr;
            s.eval(other);
        });
        return result;
    }
    bool read_last_logits(float* logits_out) override { return states_[size_t(out_)]->read_last_logits(logits_out); }
    int32_t position() const override { return states_[0]->position(); }
    int32_t n_ctx() const override { return states_[0]->n_ctx(); }
    void reset() override {
        on_every_rank([](int, ModelState& s) { s.reset(); });
    }

    // The ranks' states one after another, each behind its byte count.
    size_t state_size() const override {
        size_t n = 0;
        for (const auto& s : states_) n += sizeof(uint64_t) + s->state_size();
        return n;
    }
    void save_state(std::vector<uint8_t>& out) const override {
        out.clear();
        std::vector<uint8_t> part;
        for (const auto& s : states_) {
            s->save_state(part);
            const uint64_t n = part.size();
            const auto* p = reinterpret_cast<const uint8_t*>(&n);
            out.insert(out.end(), p, p + sizeof n);
            out.insert(out.end(), part.begin(), part.end());
        }
    }
    void restore_state(std::span<const uint8_t> bytes) override {
        std::vector<std::span<const uint8_t>> parts;
        size_t at = 0;
        for (size_t r = 0; r < states_.size(); ++r) {
            uint64_t n = 0;
            if (bytes.size() - at < sizeof n)
                throw_error(ErrorCode::kInvalidFile, "saved state: %zu bytes is too short for %zu ranks", bytes.size(),
                            states_.size());
            std::memcpy(&n, bytes.data() + at, sizeof n);
            at += sizeof n;
            if (n > bytes.size() - at)
                throw_error(ErrorCode::kInvalidFile, "saved state: rank %zu's %llu bytes run past the end", r,
                            (unsigned long long)n);
            parts.push_back(bytes.subspan(at, size_t(n)));
            at += size_t(n);
        }
        if (at != bytes.size())
            throw_error(ErrorCode::kInvalidFile, "saved state: %zu bytes after the last rank's", bytes.size() - at);
        // A rank that refuses its part puts the ranks before it back as they were.
        std::vector<std::vector<uint8_t>> before(states_.size());
        for (size_t r = 0; r < states_.size(); ++r) {
            states_[r]->save_state(before[r]);
            try {
                states_[r]->restore_state(parts[r]);
            } catch (...) {
                for (size_t q = 0; q < r; ++q) states_[q]->restore_state(before[q]);
                throw;
            }
        }
    }

    void shift(int32_t n_keep, int32_t n_discard) override {
        on_every_rank([&](int, ModelState& s) { s.shift(n_keep, n_discard); });
    }
    // Pipeline stages hold different layers: the sequence is recurrent if any stage is.
    bool has_recurrent_state() const override {
        for (const auto& s : states_)
            if (s->has_recurrent_state()) return true;
        return false;
    }
    int32_t rewind_floor() const override {
        int32_t f = 0;
        for (const auto& s : states_) f = std::max(f, s->rewind_floor());
        return f;
    }
    void truncate(int32_t n) override {
        if (n >= 0 && n <= position() && n < rewind_floor())  // refused before any stage moves
            throw_error(ErrorCode::kInvalidArgument,
                        "truncate to %d tokens: the recurrent state goes back to %d at most", n, rewind_floor());
        on_every_rank([&](int, ModelState& s) { s.truncate(n); });
    }
    void set_lora(const LoraSet& set) override {
        if (!set.empty())
            throw_error(ErrorCode::kUnsupported, "LoRA adapters on a model split over %zu ranks are not supported yet",
                        states_.size());
        on_every_rank([&](int, ModelState& s) { s.set_lora(set); });
    }

 private:
    // f(r, state r) on every rank at once. The ranks check their inputs alike before any collective, so
    // they throw alike.
    void on_every_rank(const std::function<void(int, ModelState&)>& f) {
        run_on_ranks(threads_, [&](int r) { f(r, *states_[size_t(r)]); });
    }

    std::vector<std::unique_ptr<ModelState>> states_;
    std::vector<std::unique_ptr<RankThread>> threads_;
    int64_t n_vocab_, n_embd_;
    int out_;         // the rank whose outputs are the caller's: 0, or the last pipeline stage
    struct Scratch {  // a rank's outputs that nobody reads
        std::vector<float> logits, hidden, top_logits, gathered;
        std::vector<int32_t> argmax, top_ids;
    };
    std::vector<Scratch> scratch_;  // [world]
};

}  // namespace

std::unique_ptr<ModelState> make_sharded_state(const Model& model, int n_ctx) {
    return std::make_unique<ShardedState>(model, n_ctx);
}

}  // namespace cera
