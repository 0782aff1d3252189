// The per-sequence state (KV caches of the attention layers, rolling conv
// states of the short-conv layers, scratch activations) and the generic
// forward: embed -> architecture layers -> final norm -> LM head, in chunks of
// n_batch tokens. Every buffer is allocated when the state is created; eval()
// allocates nothing.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstring>
#include <mutex>
#include <utility>

#include "core/check.h"
#include "models/arch.h"
#include "models/context_shift.h"
#include "models/grouped_keys.h"
#include "models/sharded_state.h"

namespace cera {
namespace {

constexpr int64_t kLogitRows = 32;            // LM-head rows per pass when every position's logits are wanted
constexpr uint32_t kStateMagic = 0x53524543;  // "CERS"
constexpr uint32_t kStateVersion = 2;  // 2: Q4_CH keys' open group saved as Q8_0 rows (f16 before)

std::atomic<uint64_t> g_state_serial{1};

// Recorded-step keys: (serial << kStepKeyBits) | flags. A step's op sequence depends on the state's
// buffers (the serial) and on these choices only; each distinct combination gets its own recording.
constexpr int kKeyBits = kStepKeyBits;
constexpr uint64_t kKeyStep = 1;    // always set: a key is never 0
constexpr uint64_t kKeyLmHead = 2;  // the LM head runs inside the step
constexpr uint64_t kKeyOutput = 4;  // the final norm of the output row runs inside the step
constexpr uint64_t kKeyArgmax = 8;  // the greedy arg-max of the logits runs inside the step
constexpr uint64_t kKeyRow1 = 16;   // the step's logits go to row 1 of logits_ (greedy_ahead())
constexpr uint64_t kKeyKeep = 32;   // the step keeps every token's conv states (run_keeping())
constexpr uint64_t kKeyPicks = 64;  // the arg-max of every output row runs inside the step (EvalRequest::argmax)
// Steps of up to kGraphTokens tokens are recorded too (speculative verifications, short prompt chunks):
// their token count and output rows go into the key, 5 bits each from bit 7.
constexpr int64_t kGraphTokens = 16;
constexpr int kKeyTokensShift = 7;
static_assert(kKeyTokensShift + 15 <= kKeyBits && kGraphTokens <= 16, "step keys: tokens, first and count of rows");

Tensor first_rows(const Tensor& t, int64_t n) { return t ? t.row_slice(0, n) : t; }

// The cache types in the header: the GgmlType when keys and values share it (F32 0, F16 1), else both.
// Rotated caches (tq4, tq3) add bits 28 (keys) and 29 (values): their rows differ from plain ones.
uint32_t kv_code(const ModelOptions& o) {
    const uint32_t types = o.kv_type_k == o.kv_type_v ? uint32_t(o.kv_type_k)
                                                       : 0x80000000u | uint32_t(o.kv_type_k) << 8 | uint32_t(o.kv_type_v);
    return types | (o.kv_rotate_k ? 1u << 28 : 0u) | (o.kv_rotate_v ? 1u << 29 : 0u);
}

struct SavedHeader {
    uint32_t magic, version;
    uint32_t n_layer, kv_type;  // kv_code()
    int32_t position, reserved;
    int64_t n_vocab, n_embd;
};

class SequenceState final : public ModelState {
 public:
    SequenceState(const Model& model, int n_ctx) : model_(model), be_(model.backend()), arch_(model.arch()) {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        const ModelInfo& info = arch_.info;
        n_ctx_ = n_ctx > 0 ? n_ctx : model.default_n_ctx();
        n_batch_ = std::min(model.options().n_batch, n_ctx_);
        serial_ = new_step_serial();
        const ModelOptions& mo = model.options();
        cache_.resize(arch_.state.size());
        for (size_t il = 0; il < cache_.size(); ++il) {
            const LayerStateSpec& sp = arch_.state[il];
            if (sp.kv_width > 0) {
                cache_[il].k = be_.alloc(mo.kv_type_k, {sp.kv_width, key_cache_rows(mo.kv_type_k, n_ctx_)});
                // Two open groups: a rollback into the group before the one being filled stays exact.
                if (mo.kv_type_k == GgmlType::kQ4_CH) cache_[il].k_open = alloc_open_groups(be_, sp.kv_width, 2);
                cache_[il].v = be_.alloc(mo.kv_type_v, {sp.kv_width, n_ctx_});
                cache_[il].rotated_k = mo.kv_rotate_k;
                cache_[il].rotated_v = mo.kv_rotate_v;
            }
            if (sp.conv_channels > 0) {
                cache_[il].conv = be_.alloc(GgmlType::kF32, {sp.conv_channels, sp.conv_rows});
                cache_[il].conv_prev = be_.alloc(GgmlType::kF32, {sp.conv_channels, sp.conv_rows});
            }
        }
        if (has_recurrent_state()) {
            // Kept states (EvalRequest::keep_states): a step whose conv layers run as one segment with a
            // snapshot after each token, into rows of kept_[il].conv.
            kept_rows_ = std::min<int32_t>(kKeptStates, n_batch_);
            kept_ = cache_;
            conv_rows_.resize(cache_.size());
            for (size_t il = 0; il < cache_.size(); ++il) {
                const LayerStateSpec& sp = arch_.state[il];
                if (sp.conv_channels == 0) continue;
                const int64_t w = sp.conv_channels * sp.conv_rows;
                kept_[il].conv = be_.alloc(GgmlType::kF32, {w, kept_rows_});
                conv_rows_[il] = cache_[il].conv.reshaped(w, 1);
            }
        }
        const int64_t nb = n_batch_, n_embd = info.n_embd;
        // A step's inputs in one buffer, written with one copy: a kept run's conv descriptors, then the
        // ids and the positions, each from a fixed place (a greedy step feeds the next one's first).
        ids_off_ = kept_rows_ > 0 ? kConvSegInts + 2 * int64_t(kept_rows_) : 0;
        inputs_ = be_.alloc(GgmlType::kI32, {ids_off_ + 2 * nb});
        inputs_host_.resize(size_t(inputs_.n_elements()));
        if (kept_rows_ > 0) {
            segs_t_ = input_ints(0, kConvSegInts).reshaped(kConvSegInts, 1);
            snaps_t_ = input_ints(kConvSegInts, 2 * int64_t(kept_rows_)).reshaped(2, kept_rows_);
        }
        act_.alloc(be_, arch_, nb);
        hidden_ = be_.alloc(GgmlType::kF32, {n_embd, nb});
        logits_ = be_.alloc(GgmlType::kF32, {info.n_vocab, std::max<int64_t>(2, std::min<int64_t>(kLogitRows, nb))});
        if (head_split(arch_.head, info.n_vocab))  // a tensor-parallel rank's rows of the vocabulary
            logits_local_ = be_.alloc(GgmlType::kF32, {arch_.head.output.ne[1], logits_.rows()});
        next_id_ = be_.alloc(GgmlType::kI32, {1});
        picks_t_ = be_.alloc(GgmlType::kI32, {logits_.rows()});
    }

    ~SequenceState() override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        for (LayerCache& c : cache_) {
            be_.free(c.k);
            be_.free(c.v);
            if (c.k_open) be_.free(c.k_open);
            be_.free(c.conv);
            be_.free(c.conv_prev);
        }
        for (LayerCache& c : kept_)
            if (c.conv) be_.free(c.conv);
        act_.free(be_);
        for (Tensor* t : {&inputs_, &hidden_, &logits_, &next_id_, &picks_t_, &top_out_, &top_gather_, &logits_local_})
            if (*t) be_.free(*t);
    }

    EvalResult eval(const EvalRequest& rq) override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        CERA_CHECK(rq.head == HeadOutput::kLogits || (!rq.logits && !rq.hidden && !rq.all_logits),
                   "eval: logits and hidden rows come back with HeadOutput::kLogits only");
        CERA_CHECK(!rq.ahead || rq.head == HeadOutput::kGreedy, "eval: ahead needs HeadOutput::kGreedy");
        CERA_CHECK(!rq.argmax || rq.head == HeadOutput::kLogits, "eval: arg-max rows come with HeadOutput::kLogits only");
        EvalResult res;
        check_embd(rq);
        CERA_CHECK(!rq.meanwhile || rq.head == HeadOutput::kLogits, "eval: meanwhile needs HeadOutput::kLogits");
        embd_ = rq.embd;
        argmax_out_ = rq.argmax;
        meanwhile_ = rq.meanwhile ? &rq.meanwhile : nullptr;
        struct Clear {
            std::span<const EmbdRun>& e;
            int32_t*& a;
            const std::function<void()>*& m;
            ~Clear() { e = {}, a = nullptr, m = nullptr; }
        } clear{embd_, argmax_out_, meanwhile_};
        switch (rq.head) {
            case HeadOutput::kLogits:
                settle();
                if (rq.keep_states && kept_rows_ > 0)
                    run_keeping(rq);
                else
                    run(rq.tokens, rq.logits, rq.all_logits, rq.hidden, /*greedy=*/false);
                do_meanwhile();  // when no chunk had outputs to wait for
                break;
            case HeadOutput::kGreedy:
                if (rq.tokens.empty()) throw_error(ErrorCode::kInvalidArgument, "eval: a greedy head needs tokens");
                res.token = rq.ahead ? greedy_ahead(rq.tokens) : greedy(rq.tokens);
                break;
            case HeadOutput::kTopK:
                res.n_top = top(rq);
                break;
        }
        return res;
    }

    bool read_last_logits(float* logits_out) override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        settle();
        if (!logits_held_) return false;
        be_.read(logits_out, logits_, size_t(arch_.info.n_vocab) * sizeof(float),
                 size_t(held_row_) * size_t(arch_.info.n_vocab) * sizeof(float));
        return true;
    }

    int32_t position() const override { return position_; }
    int32_t n_ctx() const override { return n_ctx_; }

    void reset() override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        settle();
        position_ = 0;
        logits_held_ = false;
        kept_base_ = -1;
        rewind_row_ = -1;  // the conv states are written anew
        for (LayerCache& c : cache_)
            if (c.conv) be_.zero(c.conv);
    }

    size_t state_size() const override {
        size_t n = sizeof(SavedHeader);
        for (const LayerCache& c : cache_) {
            if (c.k) n += saved_key_bytes(c, position_) + c.v.row_bytes() * size_t(position_);
            if (c.conv) n += c.conv.n_bytes();
        }
        return n;
    }

    void save_state(std::vector<uint8_t>& out) const override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        settle();
        rewind();
        out.resize(state_size());
        SavedHeader hd{
            kStateMagic, kStateVersion,      uint32_t(cache_.size()), kv_code(model_.options()), position_,
            0,           arch_.info.n_vocab, arch_.info.n_embd};
        std::memcpy(out.data(), &hd, sizeof hd);
        size_t off = sizeof hd;
        for (const LayerCache& c : cache_) {
            if (c.k) {
                const size_t kb = saved_key_bytes(c, position_), vb = c.v.row_bytes() * size_t(position_);
                save_keys(be_, c, position_, out.data() + off);
                be_.read(out.data() + off + kb, c.v, vb);
                off += kb + vb;
            }
            if (c.conv) {
                be_.read(out.data() + off, c.conv, c.conv.n_bytes());
                off += c.conv.n_bytes();
            }
        }
    }

    void restore_state(std::span<const uint8_t> bytes) override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        settle();
        SavedHeader hd{};
        if (bytes.size() < sizeof hd)
            throw_error(ErrorCode::kInvalidFile, "saved state: %zu bytes is too short", bytes.size());
        std::memcpy(&hd, bytes.data(), sizeof hd);
        if (hd.magic != kStateMagic || hd.version != kStateVersion)
            throw_error(ErrorCode::kInvalidFile, "saved state: bad magic or version %u", hd.version);
        if (hd.n_layer != cache_.size() || hd.kv_type != kv_code(model_.options()) ||
            hd.n_vocab != arch_.info.n_vocab || hd.n_embd != arch_.info.n_embd)
            throw_error(ErrorCode::kInvalidFile, "saved state: made by a different model or KV cache type");
        if (hd.position < 0 || hd.position > n_ctx_)
            throw_error(ErrorCode::kInvalidFile, "saved state: position %d does not fit the context of %d", hd.position,
                        n_ctx_);
        const int32_t saved_pos = position_;
        position_ = hd.position;
        if (bytes.size() != state_size()) {
            position_ = saved_pos;
            throw_error(ErrorCode::kInvalidFile, "saved state: %zu bytes, expected %zu", bytes.size(), state_size());
        }
        logits_held_ = false;
        kept_base_ = -1;
        rewind_row_ = -1;  // the conv states are written anew
        size_t off = sizeof hd;
        for (const LayerCache& c : cache_) {
            if (c.k) {
                const size_t kb = saved_key_bytes(c, position_), vb = c.v.row_bytes() * size_t(position_);
                restore_keys(be_, c, position_, bytes.data() + off);
                be_.write(c.v, bytes.data() + off + kb, vb);
                off += kb + vb;
            }
            if (c.conv) {
                be_.write(c.conv, bytes.data() + off, c.conv.n_bytes());
                off += c.conv.n_bytes();
            }
        }
    }

    void shift(int32_t n_keep, int32_t n_discard) override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        settle();
        shift_kv_cache(be_, arch_.state, cache_, position_, n_keep, n_discard);
        position_ -= n_discard;
        kept_base_ = -1;
    }

    bool has_recurrent_state() const override {
        for (const LayerCache& c : cache_)
            if (c.conv) return true;
        return false;
    }

    void truncate(int32_t n) override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        settle();
        if (n < 0 || n > position_)
            throw_error(ErrorCode::kOutOfRange, "truncate to %d tokens: the state holds %d", n, position_);
        if (n < rewind_floor())
            throw_error(ErrorCode::kInvalidArgument,
                        "truncate to %d of %d tokens: the conv state cannot be rewound past %d", n, position_,
                        rewind_floor());
        if (n < position_ && has_recurrent_state()) {
            // The state after token n: the one before the kept run, or the snapshot after its token n. The
            // snapshot is not copied yet: the next step of the run starts from it (run_keeping()), any
            // other use of the conv states copies it first (rewind()).
            rewind_row_ = -1;
            if (n == kept_base_) {
                for (const LayerCache& c : cache_)
                    if (c.conv) be_.copy(c.conv, c.conv_prev);
            } else {
                rewind_row_ = n - kept_base_ - 1;
            }
            kept_count_ = n - kept_base_;
        }
        position_ = n;
        logits_held_ = false;
    }

    int32_t rewind_floor() const override {
        if (!has_recurrent_state()) return 0;
        return kept_base_ >= 0 ? kept_base_ : position_;
    }

    void set_lora(const LoraSet& set) override {
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        settle();
        for (const LoraChoice& c : set) CERA_CHECK(c.adapter, "set_lora: an empty adapter");
        lora_ = set;
        logits_held_ = false;
    }

 private:
    // HeadOutput::kLogits with keep_states on a state with conv layers, with the exec mutex held: one step
    // whose conv layers keep the state after each token in kept_[il].conv rows kept_count_ on.
    void run_keeping(const EvalRequest& rq) {
        const int64_t n = int64_t(rq.tokens.size());
        if (n == 0) return;
        if (n > kept_rows_)
            throw_error(ErrorCode::kInvalidArgument, "eval: %lld tokens keeping their states, at most %d", (long long)n,
                        kept_rows_);
        if (kept_base_ < 0 || kept_base_ + kept_count_ != position_ || kept_count_ + n > kept_rows_) {
            // A new run of kept states starts here; conv_prev holds the state before it.
            rewind();
            for (const LayerCache& c : cache_)
                if (c.conv) be_.copy(c.conv_prev, c.conv);
            kept_base_ = position_;
            kept_count_ = 0;
        }
        // The descriptors go to the device with the step's ids (run()): one segment that starts from the
        // rewound-to kept state if a truncate() left one, snapshots after each token in the rows after it.
        int32_t* host = inputs_host_.data();
        const int32_t seg[kConvSegInts] = {0, int32_t(n), 0, 0, int32_t(n), rewind_row_};
        std::copy_n(seg, kConvSegInts, host);
        for (int32_t i = 0; i < int32_t(n); ++i)
            host[kConvSegInts + 2 * i] = i + 1, host[kConvSegInts + 2 * i + 1] = kept_count_ + i;
        rewind_row_ = -1;  // the step writes the state it ends with into cache_'s conv rows
        const int32_t base = kept_base_, count = kept_count_;
        run(rq.tokens, rq.logits, rq.all_logits, rq.hidden, /*greedy=*/false, 0, false, /*keeping=*/n);
        kept_base_ = base;
        kept_count_ = count + int32_t(n);
    }

    // HeadOutput::kGreedy, with the exec mutex held.
    int32_t greedy(std::span<const int32_t> tokens) {
        if (!take_pending(tokens)) {
            settle();
            run(tokens, nullptr, false, nullptr, /*greedy=*/true);
        }
        int32_t id = 0;
        be_.read(&id, next_id_, sizeof id);
        logits_held_ = true;
        return id;
    }

    // When the step greedy_ahead() queued evaluates exactly `tokens`, it stands: true.
    bool take_pending(std::span<const int32_t> tokens) {
        if (!pending_ || !embd_.empty() || tokens.size() != 1 || tokens[0] != pending_token_) return false;
        pending_ = false;
        position_ += 1;
        held_row_ = pending_row_;
        logits_held_ = true;
        return true;
    }

    // HeadOutput::kGreedy with `ahead`, with the exec mutex held.
    int32_t greedy_ahead(std::span<const int32_t> tokens) {
        if (!take_pending(tokens)) {
            settle();
            run(tokens, nullptr, false, nullptr, /*greedy=*/true);
            logits_held_ = true;
        }
        // The pick is in next_id_ (and fed into the next step's id and position). Its read (a copy, or the
        // backend's mailbox) is queued before the step that evaluates it, which runs while the host waits.
        const int ticket = be_.read_fed_async(next_id_);
        if (position_ < n_ctx_) {
            const int row = 1 - held_row_;
            run_fed(row);
            pending_ = true;
            pending_row_ = row;
        }
        int32_t id = 0;
        be_.read_wait(ticket, &id);
        pending_token_ = id;
        return id;
    }

    // HeadOutput::kTopK, with the exec mutex held. Returns the candidates written.
    int32_t top(const EvalRequest& rq) {
        const int32_t m = rq.top_k;
        if (rq.tokens.empty()) throw_error(ErrorCode::kInvalidArgument, "eval: a top-k head needs tokens");
        if (m < 1) throw_error(ErrorCode::kInvalidArgument, "eval: top_k = %d, needs >= 1", m);
        settle();
        run(rq.tokens, nullptr, false, nullptr, /*greedy=*/true);
        logits_held_ = true;
        // The buffers grow (outside any recorded step) geometrically from 256 entries: freeing a device
        // buffer can drop recorded steps, and the gather list grows by one a token while the window fills.
        const int64_t n_g = int64_t(rq.gather.size()), out_n = 1 + 2 * int64_t(m) + n_g;
        auto ensure = [&](Tensor& t, int64_t n) {
            if (t && t.n_elements() >= n) return;
            const int64_t cap = std::max<int64_t>({n, 256, t ? 2 * t.n_elements() : 0});
            be_.free(t);
            t = be_.alloc(GgmlType::kI32, {cap});
        };
        ensure(top_out_, out_n);
        if (n_g > 0) ensure(top_gather_, n_g);
        Tensor g;
        if (n_g > 0) {
            g = top_gather_.reshaped(n_g);
            be_.write(g, rq.gather.data(), size_t(n_g) * sizeof(int32_t));
        }
        be_.top_logits(logits_.row_slice(held_row_, 1).reshaped(arch_.info.n_vocab), m, g, top_out_.reshaped(out_n));
        top_host_.resize(size_t(out_n));
        be_.read(top_host_.data(), top_out_, size_t(out_n) * sizeof(int32_t));
        const int32_t c = top_host_[0];
        std::memcpy(rq.top_ids, &top_host_[1], size_t(c) * sizeof(int32_t));
        std::memcpy(rq.top_logits, &top_host_[size_t(1 + m)], size_t(c) * sizeof(float));
        if (n_g > 0) std::memcpy(rq.gathered, &top_host_[size_t(1 + 2 * m)], size_t(n_g) * sizeof(float));
        return c;
    }

    // A rewind that truncate() left pending: the kept snapshot into cache_'s conv states.
    void rewind() const {
        if (rewind_row_ < 0) return;
        for (size_t il = 0; il < cache_.size(); ++il)
            if (cache_[il].conv) be_.copy(conv_rows_[il], kept_[il].conv.row_slice(rewind_row_, 1));
        rewind_row_ = -1;
    }

    // Undoes the step greedy_ahead() queued last and nobody took: its position, conv states and logits
    // row go back to what they were before it (its KV rows lie past the position, unread).
    void settle() const {
        if (!pending_) return;
        pending_ = false;
        fed_ = false;  // the inputs hold what the undone step fed back
        for (const LayerCache& c : cache_)
            if (c.conv) be_.copy(c.conv, c.conv_prev);
    }

    // One greedy single-token step on what the last greedy step fed back (its id and position on the device):
    // its logits go to logits_ row `row`, its pick to next_id_ (and fed back again). The position does
    // not move: the caller owns the step until it stands or is undone.
    void run_fed(int row) {
        CERA_CHECK(fed_ && position_ < n_ctx_);
        const bool held = logits_held_;
        const int held_row = held_row_;
        const int32_t unused = 0;
        run(std::span<const int32_t>(&unused, 1), nullptr, false, nullptr, /*greedy=*/true, row, /*fed=*/true);
        position_ -= 1;
        logits_held_ = held;
        held_row_ = held_row;
    }

    // Every head of eval() and the steps of greedy_ahead(), with the exec mutex held. greedy: the last
    // token's logits stay in logits_ row `row` (0 or 1, single-token steps only) and their arg-max goes to
    // next_id_ and is fed back as the next step's input (Backend::argmax_feed), all inside the step. fed: one
    // token that is already on the device (run_fed()).
    void run(std::span<const int32_t> tokens, float* logits_out, bool all_logits, float* hidden_out, bool greedy,
             int row = 0, bool fed = false, int64_t keeping = 0) {
        const int64_t n = int64_t(tokens.size());
        if (n == 0) return;
        kept_base_ = -1;  // any evaluation but run_keeping()'s (which sets it again) ends a run of kept states
        CERA_CHECK(row == 0 || (n == 1 && greedy), "logits row %d: greedy single-token steps only", row);
        if (position_ + n > n_ctx_)
            throw_error(ErrorCode::kOutOfRange, "%" PRId64 " tokens at position %d exceed the context of %d tokens", n,
                        position_, n_ctx_);
        const int64_t n_vocab = arch_.info.n_vocab;
        for (int64_t i = 0; i < n && !fed; ++i)
            if (tokens[size_t(i)] < 0 || tokens[size_t(i)] >= n_vocab)
                throw_error(ErrorCode::kOutOfRange, "token id %d at index %" PRId64 " outside [0, %" PRId64 ")",
                            tokens[size_t(i)], i, n_vocab);
        logits_held_ = false;  // logits_ is about to be overwritten (or the position moves past its row)
        held_row_ = row;
        fed_ = false;
        int32_t* const argmax_out = argmax_out_;
        const bool want_out = logits_out || hidden_out || greedy || argmax_out;
        int64_t out_row = 0;  // next row of logits_out / hidden_out
        if (keeping == 0) rewind();
        for (int64_t off = 0; off < n; off += n_batch_) {
            const int64_t nt = std::min<int64_t>(n_batch_, n - off);
            const bool last = off + nt == n;
            // Output rows of this chunk: all, or only the very last token.
            int64_t r0 = 0, nr = 0;
            if (want_out && all_logits)
                r0 = 0, nr = nt;
            else if (want_out && last)
                r0 = nt - 1, nr = 1;
            if (!fed) {  // the ids, the positions and (run_keeping()) the conv descriptors before them
                int32_t* host = inputs_host_.data();
                std::copy_n(tokens.data() + off, nt, host + ids_off_);
                for (int64_t i = 0; i < nt; ++i) host[ids_off_ + n_batch_ + i] = int32_t(position_ + off + i);
                const int64_t from = keeping > 0 ? 0 : ids_off_;
                be_.write(inputs_, host + from, size_t(ids_off_ + n_batch_ + nt - from) * sizeof(int32_t),
                          size_t(from) * sizeof(int32_t));
            }
            const bool lm_in_step = (logits_out || greedy || argmax_out) && nr > 0 && nr <= kLogitRows;
            Step s = make_step(nt);
            s.out_begin = r0;
            s.out_count = nr;
            bind_lora(s, nt, nr);
            if (keeping > 0) {  // one chunk: run_keeping() caps n at n_batch
                s.conv_segs = segs_t_;
                s.conv_snaps = snaps_t_.row_slice(0, keeping);
                s.conv_states = conv_rows_;
                s.cache = std::span<LayerCache>(kept_);
            }
            // A step of a given size and output rows is the same op sequence every time (positions and ids
            // are read on the device): a backend may record and replay it. With adapters, the recording also
            // holds their segments, so the key names them.
            const bool has_embd = !fed && chunk_has_embd(off, nt);
            const bool graphable = nt <= kGraphTokens && !has_embd;
            const bool argmax_in_step = greedy && nr > 0;  // greedy: nr == 1 on the last chunk only
            const bool picks_in_step = argmax_out && lm_in_step;
            const uint64_t shape = uint64_t(nt - 1) | uint64_t(r0) << 5 | uint64_t(nr) << 10;
            const uint64_t key =
                ((serial_ << kKeyBits) | kKeyStep | (lm_in_step ? kKeyLmHead : 0) | (nr > 0 ? kKeyOutput : 0) |
                 (argmax_in_step ? kKeyArgmax : 0) | (row ? kKeyRow1 : 0) | (keeping > 0 ? kKeyKeep : 0) |
                 (picks_in_step ? kKeyPicks : 0) | shape << kKeyTokensShift) ^
                lora_rows_key(lora_rows_, lora_out_);
            if (!graphable || !be_.step_begin(key)) {
                be_.embed(arch_.head.token_embd, s.ids, arch_.head.embedding_scale, s.x);
                if (has_embd) write_embd(s.x, off, nt);
                arch_.forward(s);
                // keep_output_rows() moved the output rows to the front of s.x (out_begin = 0).
                if (nr > 0)
                    be_.rms_norm(s.x.row_slice(s.out_begin, nr), arch_.head.output_norm, arch_.head.norm_eps,
                                 hidden_.row_slice(0, nr));
                if (lm_in_step) lm_head(0, nr, row);
                if (argmax_in_step)
                    be_.argmax_feed(logits_.row_slice(row, 1), next_id_, s.ids.row_slice(0, 1).reshaped(1), s.pos);
                if (picks_in_step) be_.argmax(logits_.row_slice(0, nr), picks_t_.reshaped(nr));
                if (graphable) be_.step_end();
            }
            if (nr > 0) {
                if (last && lm_in_step) do_meanwhile();  // everything queued, nothing read yet
                if (hidden_out)
                    be_.read(hidden_out + out_row * arch_.info.n_embd, hidden_, size_t(nr * arch_.info.n_embd) * 4);
                if (logits_out || argmax_out) {
                    for (int64_t j = 0; j < nr; j += kLogitRows) {
                        const int64_t m = std::min(kLogitRows, nr - j);
                        if (!lm_in_step) lm_head(j, m);
                        if (argmax_out) {
                            if (!picks_in_step) be_.argmax(logits_.row_slice(0, m), picks_t_.reshaped(m));
                            be_.read(argmax_out + out_row + j, picks_t_, size_t(m) * sizeof(int32_t));
                        }
                        if (logits_out) be_.read(logits_out + (out_row + j) * n_vocab, logits_, size_t(m * n_vocab) * 4);
                    }
                }
                out_row += nr;
            }
        }
        position_ += int32_t(n);
        fed_ = greedy;  // argmax_feed() wrote the next step's id and position
    }

    // EvalRequest::meanwhile, once.
    void do_meanwhile() {
        if (const std::function<void()>* f = std::exchange(meanwhile_, nullptr)) run_meanwhile(*f);
    }

    // The request's embedding runs must lie inside its tokens, in order, without overlaps.
    void check_embd(const EvalRequest& rq) const {
        int64_t end = 0;
        for (const EmbdRun& r : rq.embd) {
            if (r.n < 0 || r.begin < end || r.begin + r.n > int64_t(rq.tokens.size()) || (r.n > 0 && !r.rows))
                throw_error(ErrorCode::kInvalidArgument,
                            "eval: embedding rows [%" PRId64 ", %" PRId64 ") outside the %zu tokens or out of order",
                            r.begin, r.begin + r.n, rq.tokens.size());
            end = r.begin + r.n;
        }
    }

    bool chunk_has_embd(int64_t off, int64_t nt) const {
        for (const EmbdRun& r : embd_)
            if (r.n > 0 && r.begin < off + nt && r.begin + r.n > off) return true;
        return false;
    }

    // Overwrites the rows of x (the chunk's tokens [off, off + nt)) that the request gives as embeddings.
    void write_embd(const Tensor& x, int64_t off, int64_t nt) {
        const int64_t n_embd = arch_.info.n_embd;
        for (const EmbdRun& r : embd_) {
            const int64_t b = std::max(r.begin, off), e = std::min(r.begin + r.n, off + nt);
            if (b >= e) continue;
            be_.write(x, r.rows + (b - r.begin) * n_embd, size_t((e - b) * n_embd) * sizeof(float),
                      size_t((b - off) * n_embd) * sizeof(float));
        }
    }

    // The adapters of this step: every row, and after keep_output_rows() the nr output rows.
    void bind_lora(Step& s, int64_t nt, int64_t nr) {
        lora_rows_.clear(), lora_out_.clear();
        if (lora_.empty()) return;
        LoraCache& cache = model_.lora_cache();
        cache.begin_step();
        for (const LoraChoice& c : lora_) {
            const LoraResident* r = &cache.resident(*c.adapter);
            lora_rows_.push_back({r, c.scale, 0, nt});
            lora_out_.push_back({r, c.scale, 0, nr});
        }
        s.lora = lora_rows_;
        s.lora_out = lora_out_;
        s.lora_segs = &lora_segs_;
    }

    Step make_step(int64_t nt) {
        Step s;
        s.be = &be_;
        s.join(model_);
        s.n_tokens = nt;
        s.ids = input_ints(ids_off_, nt).reshaped(nt);
        s.pos = input_ints(ids_off_ + n_batch_, nt).reshaped(nt);
        act_.view(s, nt);
        s.cache = std::span<LayerCache>(cache_);
        s.kv_rows = s.pos;
        return s;
    }

    // logits_[row..row+m) = output · hidden_[j..j+m) / logit_scale
    void lm_head(int64_t j, int64_t m, int64_t row = 0) {
        cera::lm_head(be_, arch_.head, hidden_.row_slice(j, m), logits_.row_slice(row, m), model_.comm(), model_.rank(),
                      logits_local_);
    }

    const Model& model_;
    Backend& be_;
    const Architecture& arch_;
    int n_ctx_ = 0;
    int n_batch_ = 0;
    int32_t position_ = 0;
    uint64_t serial_ = 0;
    std::vector<LayerCache> cache_;  // [n_layer]
    // i32: [segs_t_ (kConvSegInts), snaps_t_ (2 kept_rows_)] when conv states are kept, then from
    // ids_off_ n_batch ids and n_batch positions (make_step()). inputs_host_: its host copy.
    Tensor inputs_;
    int64_t ids_off_ = 0;
    std::vector<int32_t> inputs_host_;
    Tensor input_ints(int64_t from, int64_t n) const { return inputs_.reshaped(1, inputs_.ne[0]).row_slice(from, n); }
    Tensor top_out_, top_gather_;    // top(): i32 [1 + 2 m + n_gather], i32 [n_gather]
    std::vector<int32_t> top_host_;
    StepBuffers act_;           // the activations of n_batch tokens
    Tensor hidden_;             // f32 [n_batch, n_embd] after the final norm
    Tensor logits_;             // f32 [kLogitRows, n_vocab]
    Tensor logits_local_;       // a tensor-parallel rank's rows of the vocabulary (lm_head's scratch), or empty
    Tensor next_id_;            // i32 [1]: the greedy head's arg-max
    Tensor picks_t_;            // i32 [kLogitRows]: EvalRequest::argmax of logits_' rows
    int32_t* argmax_out_ = nullptr;  // the current eval()'s EvalRequest::argmax
    const std::function<void()>* meanwhile_ = nullptr;  // the current eval()'s EvalRequest::meanwhile, until run
    bool logits_held_ = false;  // logits_ row held_row_ holds the last token's logits of a greedy or top-k head
    int held_row_ = 0;          // 0, or 1 after steps of greedy_ahead()
    mutable bool fed_ = false;  // the first id and position hold the last greedy step's pick and the next position
    // greedy_ahead(): a step queued on the device that evaluates pending_token_, logits in pending_row_;
    // it stands when the next call evaluates that token; any other call first undoes it (settle()).
    mutable bool pending_ = false;
    int32_t pending_token_ = -1;
    int pending_row_ = 0;
    // Kept states (EvalRequest::keep_states), on states with conv layers: kept_ is cache_ with each conv
    // layer's `conv` replaced by f32 [kept_rows_, (L - 1) * n_embd] snapshots; row i holds the state after
    // position kept_base_ + i + 1, for i < kept_count_; conv_prev holds the one at kept_base_ (-1: none).
    int32_t kept_rows_ = 0, kept_base_ = -1, kept_count_ = 0;
    std::vector<LayerCache> kept_;
    std::vector<Tensor> conv_rows_;  // [n_layer]: cache_[il].conv seen as f32 [1, (L - 1) * n_embd]
    Tensor segs_t_, snaps_t_;        // views of inputs_: Backend::short_conv_segments's descriptors
    // After a truncate() inside a kept run: the conv states are kept_ row rewind_row_, not yet copied
    // into cache_ (rewind()); -1: cache_ holds them.
    mutable int32_t rewind_row_ = -1;
    LoraSet lora_;                   // the adapters applied (set_lora)
    std::span<const EmbdRun> embd_;  // during eval(): the request's embedding runs
    std::vector<LoraRows> lora_rows_, lora_out_;
    std::vector<LoraSegment> lora_segs_;
};

}  // namespace

uint64_t new_step_serial() { return g_state_serial.fetch_add(1); }

void StepBuffers::alloc(Backend& be, const Architecture& arch, int64_t rows) {
    const ScratchSpec& sc = arch.scratch;
    const int64_t n_embd = arch.info.n_embd;
    x = be.alloc(GgmlType::kF32, {n_embd, rows});
    h = be.alloc(GgmlType::kF32, {n_embd, rows});
    y = be.alloc(GgmlType::kF32, {n_embd, rows});
    q = be.alloc(GgmlType::kF32, {std::max<int64_t>(sc.q_width, 1), rows});
    k = be.alloc(GgmlType::kF32, {std::max<int64_t>(sc.kv_width, 1), rows});
    v = be.alloc(GgmlType::kF32, {std::max<int64_t>(sc.kv_width, 1), rows});
    attn = be.alloc(GgmlType::kF32, {std::max(sc.q_width, n_embd), rows});
    wide0 = be.alloc(GgmlType::kF32, {std::max<int64_t>(sc.wide, 1), rows});
    wide1 = be.alloc(GgmlType::kF32, {std::max<int64_t>(sc.wide, 1), rows});
    if (sc.n_expert > 0) {
        router = be.alloc(GgmlType::kF32, {sc.n_expert, rows});
        moe_ids = be.alloc(GgmlType::kI32, {sc.n_expert_used, rows});
        moe_w = be.alloc(GgmlType::kF32, {sc.n_expert_used, rows});
    }
}

void StepBuffers::free(Backend& be) {
    for (Tensor* t : {&x, &h, &y, &q, &k, &v, &attn, &wide0, &wide1, &router, &moe_ids, &moe_w}) be.free(*t);
}

void StepBuffers::view(Step& s, int64_t n) const {
    for (auto [to, from] : {std::pair{&s.x, &x},
                            {&s.h, &h},
                            {&s.y, &y},
                            {&s.q, &q},
                            {&s.k, &k},
                            {&s.v, &v},
                            {&s.attn, &attn},
                            {&s.wide0, &wide0},
                            {&s.wide1, &wide1},
                            {&s.router, &router},
                            {&s.moe_ids, &moe_ids},
                            {&s.moe_w, &moe_w}})
        *to = first_rows(*from, n);
}

void lm_head(Backend& be, const HeadWeights& head, const Tensor& hidden, const Tensor& logits, Communicator* comm,
             int rank, const Tensor& local) {
    if (!head_split(head, logits.ne[0])) {
        be.matmul(head.output, hidden, Tensor{}, logits);
        if (head.logit_scale != 1.0f) be.scale(logits, 1.0f / head.logit_scale);
        return;
    }
    CERA_CHECK(comm && local && local.ne[0] == head.output.ne[1] && local.rows() >= hidden.rows(),
               "lm_head: a rank's %lld rows of the vocabulary need the group and a scratch",
               (long long)head.output.ne[1]);
    const Tensor part = local.row_slice(0, hidden.rows());
    be.matmul(head.output, hidden, Tensor{}, part);
    if (head.logit_scale != 1.0f) be.scale(part, 1.0f / head.logit_scale);
    comm->all_gather_cols(rank, be, part, logits, head.vocab_begin);
}

bool Step::keep_output_rows() {
    if (!out_rows.empty()) {
        // Row out_rows[i] >= i moves to row i: no source is overwritten before it is read.
        for (size_t i = 0; i < out_rows.size(); ++i)
            if (out_rows[i] != int64_t(i)) be->copy(x.row_slice(int64_t(i), 1), x.row_slice(out_rows[i], 1));
        out_count = int64_t(out_rows.size());
        out_rows = {};
    } else {
        if (out_count == n_tokens) return true;
        if (out_count == 0) return false;
        CERA_CHECK(out_begin >= out_count, "output rows %lld..%lld would overlap their destination",
                   (long long)out_begin, (long long)(out_begin + out_count));
        be->copy(x.row_slice(0, out_count), x.row_slice(out_begin, out_count));
    }
    if (out_count == 0) return false;
    lora = lora_out;
    n_tokens = out_count;
    out_begin = 0;
    for (Tensor* t : {&x, &h, &y, &q, &k, &v, &attn, &wide0, &wide1, &router, &moe_ids, &moe_w})
        *t = first_rows(*t, out_count);
    return true;
}

int Model::default_n_ctx() const {
    if (opts_.n_ctx > 0) return opts_.n_ctx;
    const int64_t train = arch_->info.n_ctx_train;
    return int(std::min<int64_t>(train > 0 ? train : 2048, ModelOptions::kDefaultMaxCtx));
}

std::unique_ptr<ModelState> make_sequence_state(const Model& model, int n_ctx) {
    return std::make_unique<SequenceState>(model, n_ctx);
}

std::unique_ptr<ModelState> Model::create_state(int n_ctx) const {
    return world() > 1 ? make_sharded_state(*this, n_ctx) : make_sequence_state(*this, n_ctx);
}

}  // namespace cera
