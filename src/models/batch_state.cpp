#include "models/batch_state.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <mutex>
#include <set>

#include "core/check.h"
#include "core/quant/kv_groups.h"
#include "models/arch.h"
#include "models/grouped_keys.h"
#include "models/rank_thread.h"

namespace cera {

BatchState::BatchState(const Model& model, const BatchStateOptions& o)
    : model_(model), be_(model.backend()), arch_(model.arch()) {
    // A split model: the other ranks' states take every call this one takes, so that their blocks, slots
    // and steps are this one's; their steps run beside it, meeting in the collectives. Pipeline stages
    // hold different layers, so what the bookkeeping follows is the whole model's (recurrent_).
    for (int r = 1; r < model.world(); ++r) {
        ranks_.push_back(std::make_unique<BatchState>(model.rank_model(r), o));
        threads_.push_back(std::make_unique<RankThread>());
    }
    if (o.max_seqs < 1 || o.block_size < 1 || !std::has_single_bit(unsigned(o.block_size)) || o.max_step_tokens < 1 ||
        o.kv_tokens < 0 || o.max_step_tokens >= (int64_t(1) << kStepKeyBits) || o.max_draft < 0)
        throw_error(ErrorCode::kInvalidArgument,
                    "batch: %d sequences, blocks of %d tokens (a power of two), %" PRId64
                    " tokens a step, pool %" PRId64 ", drafts of %d",
                    o.max_seqs, o.block_size, o.max_step_tokens, o.kv_tokens, o.max_draft);
    std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
    const ModelOptions& mo = model.options();
    // Q4_CH keys code groups of 64 rows: a block holds whole groups, so a shared (full) block is never
    // coded again.
    block_ = mo.kv_type_k == GgmlType::kQ4_CH ? std::max(o.block_size, kv_groups::kRows) : o.block_size;
    const int64_t kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : int64_t(o.max_seqs) * model.default_n_ctx();
    n_blocks_ = (kv_tokens + block_ - 1) / block_;
    max_blocks_ = o.max_seq_tokens > 0 ? std::min(n_blocks_, (o.max_seq_tokens + block_ - 1) / block_) : n_blocks_;
    max_tokens_ = o.max_step_tokens;
    snapshot_blocks_ = std::max(1, o.snapshot_blocks);
    max_draft_ = o.max_draft;
    verify_rows_ = n_blocks_ / snapshot_blocks_ + 1;
    pool_.resize(arch_.state.size());
    for (size_t il = 0; il < pool_.size(); ++il) {
        const LayerStateSpec& sp = arch_.state[il];
        if (sp.kv_width > 0) {
            pool_[il].k = be_.alloc(mo.kv_type_k, {sp.kv_width, n_blocks_ * block_});
            pool_[il].v = be_.alloc(mo.kv_type_v, {sp.kv_width, n_blocks_ * block_});
            pool_[il].rotated_k = mo.kv_rotate_k;
            pool_[il].rotated_v = mo.kv_rotate_v;
            // Two open groups a sequence slot: the groups its steps fill, and one to spare.
            if (mo.kv_type_k == GgmlType::kQ4_CH)
                pool_[il].k_open = alloc_open_groups(be_, sp.kv_width, 2 * o.max_seqs);
        }
        // A sequence keeps states at every snapshot_blocks-th of its blocks: the sequences' blocks need
        // n_blocks / snapshot_blocks rows at most, cached blocks give theirs up when rows run out. After
        // them, 1 + max_draft rows a slot hold the states after each token of a run of verify entries.
        if (sp.conv_channels > 0)
            pool_[il].conv = be_.alloc(GgmlType::kF32, {sp.conv_channels * sp.conv_rows,
                                                        verify_rows_ + int64_t(o.max_seqs) * (1 + max_draft_)});
    }
    seqs_.resize(size_t(o.max_seqs));
    conv_states_.resize(arch_.state.size());
    for (size_t il = 0; il < conv_states_.size(); ++il)
        if (const LayerStateSpec& sp = arch_.state[il]; sp.conv_channels > 0)
            conv_states_[il] = be_.alloc(GgmlType::kF32, {sp.conv_channels * sp.conv_rows, int64_t(o.max_seqs)});
    for (int64_t b = n_blocks_ - 1; b >= 0; --b) free_.push_back(int32_t(b));
    ref_.assign(size_t(n_blocks_), 0);
    snap_row_.assign(size_t(n_blocks_), -1);
    for (int64_t r = n_blocks_ / snapshot_blocks_; r >= 0; --r) free_snap_rows_.push_back(int32_t(r));
    hash_.assign(size_t(n_blocks_), 0);
    stamp_.assign(size_t(n_blocks_), 0);
    block_tokens_.assign(size_t(n_blocks_ * block_), 0);
    recurrent_ = arch_.info.n_conv_layers > 0;  // the whole model's, also on a pipeline stage without conv layers
    table_.assign(size_t(o.max_seqs * max_blocks_), 0);
    table_t_ = be_.alloc(GgmlType::kI32, {max_blocks_, int64_t(o.max_seqs)});
    const ModelInfo& info = arch_.info;
    const int64_t nt = max_tokens_, ns = o.max_seqs;
    seq_t_ = be_.alloc(GgmlType::kI32, {nt});
    ids_ = be_.alloc(GgmlType::kI32, {nt});
    pos_t_ = be_.alloc(GgmlType::kI32, {nt});
    rows_t_ = be_.alloc(GgmlType::kI32, {nt});
    act_.alloc(be_, arch_, nt);
    // Output rows: one a sequence, and a verify entry's drafted tokens besides.
    const int64_t n_out = std::min(nt, ns * (1 + int64_t(max_draft_)));
    hidden_ = be_.alloc(GgmlType::kF32, {info.n_embd, n_out});
    logits_ = be_.alloc(GgmlType::kF32, {info.n_vocab, n_out});
    if (head_split(arch_.head, info.n_vocab))  // a tensor-parallel rank's rows of the vocabulary
        logits_local_ = be_.alloc(GgmlType::kF32, {arch_.head.output.ne[1], n_out});
    picks_t_ = be_.alloc(GgmlType::kI32, {n_out});
    serial_ = new_step_serial();
    if (recurrent_) {
        // A step's snapshots: one every snapshot_blocks blocks of its tokens, plus one a sequence.
        segs_t_ = be_.alloc(GgmlType::kI32, {kConvSegInts, ns});
        snaps_t_ = be_.alloc(GgmlType::kI32, {2, nt / (int64_t(block_) * snapshot_blocks_) + ns * (2 + max_draft_)});
    }
}

BatchState::~BatchState() {
    std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
    for (LayerCache& c : pool_) be_.free(c.k), be_.free(c.v), be_.free(c.conv), be_.free(c.k_open);
    for (Tensor& t : conv_states_)
        if (t) be_.free(t);
    act_.free(be_);
    for (Tensor* t : {&table_t_, &seq_t_, &ids_, &pos_t_, &rows_t_, &hidden_, &logits_, &logits_local_, &picks_t_,
                      &top_t_, &gather_t_, &segs_t_, &snaps_t_})
        if (*t) be_.free(*t);
}

uint64_t BatchState::pool_bytes() const {
    uint64_t n = 0;
    for (const auto& r : ranks_) n += r->pool_bytes();
    for (const LayerCache& c : pool_)
        for (const Tensor* t : {&c.k, &c.v, &c.conv, &c.k_open})
            if (*t) n += t->n_bytes();
    return n;
}

int BatchState::add_sequence() {
    for (const auto& r : ranks_) r->add_sequence();
    for (size_t i = 0; i < seqs_.size(); ++i) {
        Seq& s = seqs_[i];
        if (s.used) continue;
        std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
        s.used = true;
        s.position = 0;
        s.blocks.clear();
        s.lora.clear();
        s.lora_key = 0;
        for (const Tensor& t : conv_states_)
            if (t) be_.zero(t.row_slice(int64_t(i), 1));
        return int(i);
    }
    return -1;
}

void BatchState::remove_sequence(int seq) {
    CERA_CHECK(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].used, "batch: no sequence %d", seq);
    for (const auto& r : ranks_) r->remove_sequence(seq);
    Seq& s = seqs_[size_t(seq)];
    for (auto b = s.blocks.rbegin(); b != s.blocks.rend(); ++b) release_block(*b);
    s.blocks.clear(), s.tokens.clear(), s.hashes.clear();
    s.verify_n = 0;
    s.lora.clear(), s.lora_key = 0;
    s.content.clear();
    s.used = false;
}

void BatchState::set_lora(int seq, const LoraSet& set) {
    CERA_CHECK(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].used && seqs_[size_t(seq)].position == 0,
               "batch: set_lora needs a new sequence");
    for (const LoraChoice& c : set) CERA_CHECK(c.adapter, "batch: set_lora with an empty adapter");
    if (!set.empty() && model_.world() > 1)
        throw_error(ErrorCode::kUnsupported, "LoRA adapters on a model split over %d ranks are not supported yet",
                    model_.world());
    for (const auto& r : ranks_) r->set_lora(seq, set);  // the same hash seeds: the same cached prefixes
    Seq& s = seqs_[size_t(seq)];
    s.lora = set;
    s.lora_key = lora_set_key(set);
}

void BatchState::set_content_keys(int seq, std::span<const ContentKey> keys) {
    CERA_CHECK(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].used && seqs_[size_t(seq)].position == 0,
               "batch: set_content_keys needs a new sequence");
    for (const auto& r : ranks_) r->set_content_keys(seq, keys);
    seqs_[size_t(seq)].content.assign(keys.begin(), keys.end());
}

int32_t BatchState::take_block() {
    int32_t b;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else {  // the least recently used cached block
        CERA_CHECK(!evictable_.empty(), "batch: no KV block to take");
        b = evictable_.begin()->second;
        evictable_.erase(evictable_.begin());
        cached_.erase(hash_[size_t(b)]);
        hash_[size_t(b)] = 0;
    }
    ref_[size_t(b)] = 1;
    if (snap_row_[size_t(b)] >= 0) free_snap_rows_.push_back(snap_row_[size_t(b)]), snap_row_[size_t(b)] = -1;
    stamp_[size_t(b)] = ++clock_;
    return b;
}

void BatchState::release_block(int32_t b) {
    if (--ref_[size_t(b)] > 0) return;
    if (hash_[size_t(b)] != 0) evictable_.insert({stamp_[size_t(b)], b});
    else free_.push_back(b);
}

namespace {

// The prefix hash of a block: its tokens mixed into the hash of the blocks before it (never 0).
uint64_t block_hash(uint64_t prev, const int32_t* tokens, int n) {
    uint64_t h = prev ^ 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n; ++i) {
        h ^= uint64_t(uint32_t(tokens[i])) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
    }
    h ^= h >> 33;
    return h ? h : 1;
}

}  // namespace

uint64_t BatchState::seq_block_hash(const Seq& s, size_t i, uint64_t prev, const int32_t* tokens) const {
    const int64_t lo = int64_t(i) * block_, hi = lo + block_;
    for (const ContentKey& k : s.content)
        if (k.begin < hi && k.end > lo) prev = block_hash(prev ^ k.hash, nullptr, 0);
    return block_hash(prev, tokens, block_);
}

void BatchState::share_full_blocks(Seq& s) {
    for (size_t i = s.hashes.size(); int64_t(i + 1) * block_ <= s.position; ++i) {
        const int32_t* toks = s.tokens.data() + i * size_t(block_);
        const uint64_t h = seq_block_hash(s, i, i ? s.hashes[i - 1] : s.lora_key, toks);
        s.hashes.push_back(h);
        const int32_t b = s.blocks[i];
        if (hash_[size_t(b)] == 0 && !cached_.count(h)) {
            hash_[size_t(b)] = h;
            cached_[h] = b;
            std::copy(toks, toks + block_, block_tokens_.begin() + int64_t(b) * block_);
        }
    }
}

int64_t BatchState::attach_prefix(int seq, std::span<const int32_t> prompt) {
    CERA_CHECK(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].used && seqs_[size_t(seq)].position == 0,
               "batch: attach_prefix needs a new sequence");
    for (const auto& r : ranks_) r->attach_prefix(seq, prompt);
    Seq& s = seqs_[size_t(seq)];
    const int64_t max_blocks = (int64_t(prompt.size()) - 1) / block_;
    std::vector<int32_t> found;
    std::vector<uint64_t> hashes;
    size_t usable = 0;
    uint64_t h = s.lora_key;  // blocks computed under other adapters never match
    for (int64_t i = 0; i < max_blocks; ++i) {
        const int32_t* toks = prompt.data() + i * block_;
        h = seq_block_hash(s, size_t(i), h, toks);
        const auto it = cached_.find(h);
        if (it == cached_.end() ||
            !std::equal(toks, toks + block_, block_tokens_.begin() + int64_t(it->second) * block_))
            break;
        found.push_back(it->second), hashes.push_back(h);
        if (!recurrent_ || snap_row_[size_t(it->second)] >= 0) usable = found.size();
    }
    if (usable == 0) return 0;
    std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
    for (size_t i = 0; i < usable; ++i) {
        const int32_t b = found[i];
        if (ref_[size_t(b)]++ == 0) evictable_.erase({stamp_[size_t(b)], b});
        stamp_[size_t(b)] = ++clock_;
        s.blocks.push_back(b);
    }
    s.hashes.assign(hashes.begin(), hashes.begin() + int64_t(usable));
    s.tokens.assign(prompt.begin(), prompt.begin() + int64_t(usable) * block_);
    s.position = int32_t(int64_t(usable) * block_);
    if (recurrent_)  // the conv states at the prefix's end
        for (size_t il = 0; il < conv_states_.size(); ++il)
            if (const Tensor& t = conv_states_[il])
                be_.copy(t.row_slice(seq, 1), pool_[il].conv.row_slice(snap_row_[size_t(s.blocks.back())], 1));
    return s.position;
}

int32_t BatchState::position(int seq) const {
    CERA_CHECK(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].used, "batch: no sequence %d", seq);
    return seqs_[size_t(seq)].position;
}

int64_t BatchState::blocks_needed(int seq, int64_t n) const {
    const Seq& s = seqs_[size_t(seq)];
    const int64_t have = int64_t(s.blocks.size()), need = (int64_t(s.position) + n + block_ - 1) / block_;
    return std::max<int64_t>(0, need - have);
}

void BatchState::step(std::span<const Entry> entries, StepOutput& out, const std::function<void()>& meanwhile) {
    if (!ranks_.empty()) {  // every rank's step at once; rank r's outputs go to scratch
        rank_out_.resize(ranks_.size());
        run_on_ranks(threads_, [&](int r) {
            if (r == 0)
                rank_step(entries, out, meanwhile);
            else
                ranks_[size_t(r - 1)]->step(entries, rank_out_[size_t(r - 1)]);
        });
        if (model_.pipeline()) std::swap(out, rank_out_.back());  // the last stage's outputs are the caller's
        return;
    }
    rank_step(entries, out, meanwhile);
}

void BatchState::rank_step(std::span<const Entry> entries, StepOutput& out, const std::function<void()>& meanwhile) {
    const int64_t n_vocab = arch_.info.n_vocab;
    // Checks first: a step that throws changes nothing.
    int64_t n_tokens = 0, n_out = 0, blocks = 0;
    bool has_embd = false;
    std::set<int> seen;
    for (const Entry& e : entries) {
        if (e.seq < 0 || size_t(e.seq) >= seqs_.size() || !seqs_[size_t(e.seq)].used)
            throw_error(ErrorCode::kInvalidArgument, "batch step: no sequence %d", e.seq);
        if (!seen.insert(e.seq).second)
            throw_error(ErrorCode::kInvalidArgument, "batch step: sequence %d appears twice", e.seq);
        if (e.tokens.empty()) throw_error(ErrorCode::kInvalidArgument, "batch step: sequence %d has no tokens", e.seq);
        for (int32_t id : e.tokens)
            if (id < 0 || id >= n_vocab)
                throw_error(ErrorCode::kOutOfRange, "batch step: token id %d outside [0, %" PRId64 ")", id, n_vocab);
        int64_t embd_end = 0;
        for (const EmbdRun& r : e.embd) {
            if (r.n <= 0 || r.begin < embd_end || r.begin + r.n > int64_t(e.tokens.size()) || !r.rows)
                throw_error(ErrorCode::kInvalidArgument,
                            "batch step: sequence %d: embedding rows [%" PRId64 ", %" PRId64
                            ") outside its %zu tokens or out of order",
                            e.seq, r.begin, r.begin + r.n, e.tokens.size());
            embd_end = r.begin + r.n;
        }
        has_embd = has_embd || !e.embd.empty();
        if (e.pick == Pick::kTop && (e.top < 0 || e.top >= n_vocab))
            throw_error(ErrorCode::kInvalidArgument, "batch step: the best %d of %" PRId64 " logits", e.top, n_vocab);
        if (e.verify && ((e.pick != Pick::kArgmax && e.pick != Pick::kLogits) ||
                         int64_t(run_before(seqs_[size_t(e.seq)]) + e.tokens.size()) > 1 + int64_t(max_draft_)))
            throw_error(ErrorCode::kInvalidArgument,
                        "batch step: sequence %d verifies %zu tokens after %d (at most %d), or with a pick other than "
                        "the arg-max or the logits",
                        e.seq, e.tokens.size(), run_before(seqs_[size_t(e.seq)]), 1 + max_draft_);
        n_tokens += int64_t(e.tokens.size());
        n_out += e.verify ? int64_t(e.tokens.size()) : e.pick != Pick::kNone ? 1 : 0;
        blocks += blocks_needed(e.seq, int64_t(e.tokens.size()));
    }
    out.logits.clear(), out.words.clear();
    out.at.assign(entries.size(), 0);
    out.row_at.assign(entries.size(), StepOutput::kNoRow);
    if (n_tokens == 0) return;
    if (n_tokens > max_tokens_ || n_out > logits_.ne[1])
        throw_error(ErrorCode::kOutOfRange,
                    "batch step: %" PRId64 " tokens (%" PRId64 " outputs), at most %" PRId64 " (%" PRId64 ")", n_tokens,
                    n_out, max_tokens_, logits_.ne[1]);
    if (blocks > free_blocks())
        throw_error(ErrorCode::kOutOfRange, "batch step: needs %" PRId64 " KV blocks, %" PRId64 " free", blocks,
                    free_blocks());

    std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
    ids_host_.clear(), pos_host_.clear(), rows_host_.clear(), seq_host_.clear();
    std::vector<int64_t> out_rows;
    std::vector<int32_t> segs, snaps;  // Backend::short_conv_segments's descriptors
    for (const Entry& e : entries) {
        Seq& s = seqs_[size_t(e.seq)];
        for (int64_t b = blocks_needed(e.seq, int64_t(e.tokens.size())); b > 0; --b) s.blocks.push_back(take_block());
        s.tokens.insert(s.tokens.end(), e.tokens.begin(), e.tokens.end());
        std::copy(s.blocks.begin(), s.blocks.end(), table_.begin() + int64_t(e.seq) * max_blocks_);
        const size_t snap_first = snaps.size() / 2;
        // The ends of every snapshot_blocks-th block inside this entry's tokens keep their conv states.
        const int64_t every = int64_t(block_) * snapshot_blocks_;
        for (int64_t p = (s.position / every + 1) * every; recurrent_ && p <= s.position + int64_t(e.tokens.size()); p += every) {
            const int32_t b = s.blocks[size_t(p / block_ - 1)];
            if (snap_row_[size_t(b)] < 0) {
                // No free row: the least recently used cached block that no sequence holds gives up its
                // states (one always has some: the held blocks' states take at most n_blocks / k rows).
                for (auto it = evictable_.begin(); free_snap_rows_.empty() && it != evictable_.end(); ++it)
                    if (int32_t& row = snap_row_[size_t(it->second)]; row >= 0) free_snap_rows_.push_back(row), row = -1;
                CERA_CHECK(!free_snap_rows_.empty(), "batch: no conv state row for block %d", b);
                snap_row_[size_t(b)] = free_snap_rows_.back();
                free_snap_rows_.pop_back();
            }
            snaps.push_back(int32_t(p - s.position)), snaps.push_back(snap_row_[size_t(b)]);
        }
        const int32_t before = e.verify ? run_before(s) : 0;
        if (recurrent_ && e.verify) {
            // The states after each token (the run may go on in a later step), merged by `end` with the
            // block ends'.
            std::vector<std::pair<int32_t, int32_t>> all;
            for (size_t j = snap_first * 2; j < snaps.size(); j += 2) all.push_back({snaps[j], snaps[j + 1]});
            for (int32_t t = 1; t <= int32_t(e.tokens.size()); ++t) all.push_back({t, verify_row(e.seq, before + t)});
            std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
            snaps.resize(snap_first * 2);
            for (const auto& [end, row] : all) snaps.push_back(end), snaps.push_back(row);
        }
        if (before == 0) s.verify_from = s.position;
        s.verify_n = e.verify ? before + int32_t(e.tokens.size()) : 0;
        segs.insert(segs.end(), {int32_t(ids_host_.size()), int32_t(e.tokens.size()), int32_t(e.seq),
                                 int32_t(snap_first), int32_t(snaps.size() / 2 - snap_first), -1});
        for (size_t i = 0; i < e.tokens.size(); ++i) {
            const int32_t p = s.position + int32_t(i);
            ids_host_.push_back(e.tokens[i]);
            pos_host_.push_back(p);
            rows_host_.push_back(s.blocks[size_t(p / block_)] * block_ + p % block_);
            seq_host_.push_back(e.seq);
        }
        if (e.verify)
            for (int64_t r = int64_t(ids_host_.size()) - int64_t(e.tokens.size()); r < int64_t(ids_host_.size()); ++r)
                out_rows.push_back(r);
        else if (e.pick != Pick::kNone)
            out_rows.push_back(int64_t(ids_host_.size()) - 1);
        s.position += int32_t(e.tokens.size());
    }
    const size_t nb = size_t(n_tokens) * sizeof(int32_t);
    be_.write(ids_, ids_host_.data(), nb);
    be_.write(pos_t_, pos_host_.data(), nb);
    be_.write(rows_t_, rows_host_.data(), nb);
    be_.write(seq_t_, seq_host_.data(), nb);
    int max_seq = 0;
    for (const Entry& e : entries) max_seq = std::max(max_seq, e.seq);
    be_.write(table_t_, table_.data(), size_t(max_seq + 1) * size_t(max_blocks_) * sizeof(int32_t));
    if (recurrent_) {
        be_.write(segs_t_, segs.data(), segs.size() * sizeof(int32_t));
        if (!snaps.empty()) be_.write(snaps_t_, snaps.data(), snaps.size() * sizeof(int32_t));
    }

    Step s;
    s.be = &be_;
    s.join(model_);
    s.n_tokens = n_tokens;
    s.ids = ids_.row_slice(0, 1).reshaped(n_tokens);
    s.pos = pos_t_.row_slice(0, 1).reshaped(n_tokens);
    s.kv_rows = rows_t_.row_slice(0, 1).reshaped(n_tokens);
    s.paging.seq = seq_t_.row_slice(0, 1).reshaped(n_tokens);
    s.paging.block_table = table_t_;
    s.paging.block_size = block_;
    std::vector<int32_t> runs;
    for (const Entry& e : entries) runs.push_back(int32_t(e.tokens.size()));
    s.paging.runs = runs;
    act_.view(s, n_tokens);
    s.cache = std::span<LayerCache>(pool_);
    if (recurrent_) {
        s.conv_segs = segs_t_.row_slice(0, int64_t(entries.size()));
        s.conv_snaps = snaps_t_;  // the whole table, so that decode steps of one size record alike
        s.conv_states = conv_states_;
    }
    s.out_rows = out_rows;
    bind_lora(entries, s);
    // A step of one token a sequence has the same ops and tensors as every other of its size: recorded
    // once per size (a CUDA graph), then replayed; with adapters, once per size and grouping of the rows by
    // adapter. Steps with prompt chunks run as they come.
    const bool decode = n_tokens == int64_t(entries.size()) && n_out == n_tokens && !has_embd;
    const uint64_t key = ((serial_ << kStepKeyBits) | uint64_t(n_tokens)) ^ lora_rows_key(lora_rows_, lora_out_);
    const Tensor hid = hidden_.row_slice(0, n_out), lg = logits_.row_slice(0, n_out);
    if (!decode || !be_.step_begin(key)) {
        be_.embed(arch_.head.token_embd, s.ids, arch_.head.embedding_scale, s.x);
        if (has_embd) write_embd(entries, s.x);
        arch_.forward(s);
        if (n_out > 0) {  // keep_output_rows() moved the output rows to the front of s.x
            be_.rms_norm(s.x.row_slice(0, n_out), arch_.head.output_norm, arch_.head.norm_eps, hid);
            lm_head(be_, arch_.head, hid, lg, model_.comm(), model_.rank(), logits_local_);
        }
        if (decode) be_.step_end();
    }
    for (const Entry& e : entries)
        if (!e.verify) share_full_blocks(seqs_[size_t(e.seq)]);
    if (n_out > 0)
        pick(entries, lg, out, meanwhile);
    else
        run_meanwhile(meanwhile);
}

void BatchState::keep(int seq, int32_t n) {
    CERA_CHECK(seq >= 0 && size_t(seq) < seqs_.size() && seqs_[size_t(seq)].used, "batch: no sequence %d", seq);
    for (const auto& r : ranks_) r->keep(seq, n);
    Seq& s = seqs_[size_t(seq)];
    CERA_CHECK(run_before(s) > 0 && n >= 1 && n <= s.verify_n, "batch: keep %d of sequence %d's %d verified tokens", n,
               seq, run_before(s));
    std::lock_guard<FifoMutex> exec_lock(be_.exec_mutex());
    if (recurrent_ && n < s.verify_n)  // the conv states after the n-th token, from the steps' snapshots
        for (size_t il = 0; il < conv_states_.size(); ++il)
            if (const Tensor& t = conv_states_[il])
                be_.copy(t.row_slice(seq, 1), pool_[il].conv.row_slice(verify_row(seq, n), 1));
    s.position = s.verify_from + n;
    s.tokens.resize(size_t(s.position));
    // The blocks past the end go back. A block that ended inside the dropped tokens may keep a conv-state
    // row of theirs; it is not in the prefix cache, and the row is written again when the block fills.
    const size_t n_blocks = size_t((int64_t(s.position) + block_ - 1) / block_);
    while (s.blocks.size() > n_blocks) {
        release_block(s.blocks.back());
        s.blocks.pop_back();
    }
    s.verify_n = 0;
    share_full_blocks(s);
}

void BatchState::write_embd(std::span<const Entry> entries, const Tensor& x) {
    const int64_t n_embd = arch_.info.n_embd;
    int64_t row = 0;  // the entry's first row of x
    for (const Entry& e : entries) {
        for (const EmbdRun& r : e.embd)
            be_.write(x, r.rows, size_t(r.n * n_embd) * sizeof(float), size_t((row + r.begin) * n_embd) * sizeof(float));
        row += int64_t(e.tokens.size());
    }
}

void BatchState::bind_lora(std::span<const Entry> entries, Step& s) {
    lora_rows_.clear(), lora_out_.clear();
    bool any = false;
    for (const Entry& e : entries) any = any || !seqs_[size_t(e.seq)].lora.empty();
    if (!any) return;
    LoraCache& cache = model_.lora_cache();
    cache.begin_step();
    // Rows of one adapter (and scale) that follow each other form one group: a sequence's tokens, and
    // consecutive sequences naming the same adapter.
    auto add = [](std::vector<LoraRows>& groups, const LoraResident* r, float scale, int64_t start, int64_t n) {
        for (auto g = groups.rbegin(); g != groups.rend(); ++g)
            if (g->adapter == r && g->scale == scale && g->start + g->n == start) {
                g->n += n;
                return;
            }
        groups.push_back({r, scale, start, n});
    };
    int64_t row = 0, out_row = 0;
    for (const Entry& e : entries) {
        const int64_t n = int64_t(e.tokens.size());
        for (const LoraChoice& c : seqs_[size_t(e.seq)].lora) {
            const LoraResident* r = &cache.resident(*c.adapter);
            add(lora_rows_, r, c.scale, row, n);
            if (e.pick != Pick::kNone) add(lora_out_, r, c.scale, out_row, e.verify ? n : 1);
        }
        row += n;
        out_row += e.verify ? n : e.pick != Pick::kNone ? 1 : 0;
    }
    s.lora = lora_rows_;
    s.lora_out = lora_out_;
    s.lora_segs = &lora_segs_;
}

void BatchState::pick(std::span<const Entry> entries, const Tensor& lg, StepOutput& out,
                      const std::function<void()>& meanwhile) {
    const int64_t n_vocab = arch_.info.n_vocab;
    // The words each entry takes; the kTop entries' gather ids, one after another.
    size_t n_words = 0, n_gather = 0, n_logits = 0;
    bool argmax = false;
    for (size_t i = 0; i < entries.size(); ++i) {
        const Entry& e = entries[i];
        const size_t rows = e.verify ? e.tokens.size() : 1;
        if (e.pick == Pick::kLogits) out.row_at[i] = n_logits, n_logits += rows * size_t(n_vocab);
        if (e.pick == Pick::kArgmax) out.at[i] = n_words, n_words += rows, argmax = true;
        if (e.pick == Pick::kTop) out.at[i] = n_words, n_words += 1 + 2 * size_t(e.top) + e.gather.size(), n_gather += e.gather.size();
    }
    auto fit = [&](Tensor& t, size_t n) {
        if (t && size_t(t.n_elements()) >= n) return;
        if (t) be_.free(t);
        t = be_.alloc(GgmlType::kI32, {int64_t(std::max<size_t>(n, 64))});
    };
    out.words.assign(n_words, 0);
    out.logits.resize(n_logits);
    if (argmax) be_.argmax(lg, picks_t_);
    if (n_gather) {
        fit(gather_t_, n_gather);
        std::vector<int32_t> g;
        for (const Entry& e : entries)
            if (e.pick == Pick::kTop) g.insert(g.end(), e.gather.begin(), e.gather.end());
        be_.write(gather_t_, g.data(), g.size() * sizeof(int32_t));
    }
    if (n_words) fit(top_t_, n_words);
    std::vector<int32_t> ids;
    size_t gather_at = 0;
    int64_t row = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        const Entry& e = entries[i];
        if (e.pick == Pick::kNone) continue;
        if (e.verify) {  // kArgmax or kLogits: nothing to queue a row
            row += int64_t(e.tokens.size());
            continue;
        }
        const Tensor x = lg.row_slice(row++, 1);
        if (e.pick == Pick::kTop) {
            const int64_t n_g = int64_t(e.gather.size());
            Tensor gs;
            if (n_g) gs = gather_t_, gs.data = gather_t_.as<int32_t>() + gather_at, gs.ne[0] = n_g;
            Tensor o = top_t_;
            o.data = top_t_.as<int32_t>() + out.at[i], o.ne[0] = 1 + 2 * int64_t(e.top) + n_g;
            be_.top_logits(x.reshaped(n_vocab), e.top, gs, o);
            gather_at += size_t(n_g);
        }
    }
    run_meanwhile(meanwhile);  // everything queued, nothing read yet
    if (argmax) {
        ids.resize(size_t(lg.ne[1]));
        be_.read(ids.data(), picks_t_, ids.size() * sizeof(int32_t));
    }
    // Everything queued: the top words at once, then the arg-max ids into their places and the rows asked for.
    if (n_words) be_.read(out.words.data(), top_t_, n_words * sizeof(int32_t));
    row = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        const Entry& e = entries[i];
        if (e.pick == Pick::kNone) continue;
        if (e.verify) {
            const int64_t n = int64_t(e.tokens.size());
            if (e.pick == Pick::kArgmax)
                std::copy_n(ids.begin() + row, n, out.words.begin() + int64_t(out.at[i]));
            else
                be_.read(out.logits.data() + out.row_at[i], lg.row_slice(row, n), size_t(n * n_vocab) * sizeof(float));
            row += n;
            continue;
        }
        if (e.pick == Pick::kArgmax) out.words[out.at[i]] = ids[size_t(row)];
        if (e.pick == Pick::kTop && out.words[out.at[i]] == 0) {
            out.row_at[i] = out.logits.size();
            out.logits.resize(out.logits.size() + size_t(n_vocab));
        }
        if (out.row_at[i] != StepOutput::kNoRow)
            be_.read(out.logits.data() + out.row_at[i], lg.row_slice(row, 1), size_t(n_vocab) * sizeof(float));
        ++row;
    }
}

}  // namespace cera
