#include "models/sharded_state.h"

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
    ShardedState(const Model& model, int n_ctx) : n_vocab_(model.info().n_vocab), n_embd_(model.info().n_embd) {
        for (int r = 0; r < model.world(); ++r) states_.push_back(make_sequence_state(model.rank_model(r), n_ctx));
        threads_.resize(states_.size() - 1);
        for (auto& t : threads_) t = std::make_unique<RankThread>();
    }

    EvalResult eval(const EvalRequest& rq) override {
        // The other ranks run the same step into scratch outputs: the same rows, so that their passes
        // make the same collectives as rank 0's.
        EvalRequest other = rq;
        other.meanwhile = nullptr;
        const size_t n_out = rq.all_logits ? rq.tokens.size() : 1;
        auto scratch = [n_out](auto* p, auto& buf, int64_t width) {
            buf.resize(p ? n_out * size_t(width) : 0);
            return p ? buf.data() : nullptr;
        };
        other.logits = scratch(rq.logits, logits_, n_vocab_);
        other.hidden = scratch(rq.hidden, hidden_, n_embd_);
        other.argmax = scratch(rq.argmax, argmax_, 1);
        top_ids_.resize(size_t(std::max(rq.top_k, 0)));
        top_logits_.resize(top_ids_.size());
        gathered_.resize(rq.gather.size());
        other.top_ids = rq.top_ids ? top_ids_.data() : nullptr;
        other.top_logits = rq.top_logits ? top_logits_.data() : nullptr;
        other.gathered = rq.gathered ? gathered_.data() : nullptr;
        EvalResult result;
        on_every_rank([&](int r, ModelState& s) {
            if (r == 0)
                result = s.eval(rq);
            else
                s.eval(other);
        });
        return result;
    }
    bool read_last_logits(float* logits_out) override { return states_[0]->read_last_logits(logits_out); }
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
    bool has_recurrent_state() const override { return states_[0]->has_recurrent_state(); }
    int32_t rewind_floor() const override { return states_[0]->rewind_floor(); }
    void truncate(int32_t n) override {
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
    std::vector<int32_t> top_ids_, argmax_;
    std::vector<float> top_logits_, gathered_, logits_, hidden_;
};

}  // namespace

std::unique_ptr<ModelState> make_sharded_state(const Model& model, int n_ctx) {
    return std::make_unique<ShardedState>(model, n_ctx);
}

}  // namespace cera
