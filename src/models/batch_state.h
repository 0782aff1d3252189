// Several sequences evaluated together on one model: one forward pass a step over the tokens of every
// sequence in it (prompt chunks and single decode tokens side by side). The attention layers keep the
// sequences' K/V in one pool of fixed-size blocks, each sequence a block table over it and blocks
// taken from a free list as it grows and returned when it leaves; the short-conv layers keep a
// rolling state per sequence slot. The batched engine's scheduler drives it.
//
// Prefix sharing: a full block is known by a hash of its tokens and of everything before them. Blocks
// stay in the pool after their sequence leaves, until the pool needs them (least recently used
// first), and a new sequence whose prompt starts with such blocks takes them (reference-counted; a
// full block is never written again) instead of evaluating those tokens. The short-conv layers'
// states are kept (in a few slots, least recently used reused first) where a step ended exactly at a
// block's end: on models with such layers, a shared prefix ends at one of those.
#pragma once
#include <cstdint>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "models/arch.h"
#include "models/model.h"

namespace cera {

struct BatchStateOptions {
    int max_seqs = 8;               // sequence slots
    int64_t kv_tokens = 0;          // pool size in tokens (0: max_seqs times the model's default context)
    int block_size = 16;            // tokens a block (a power of two)
    int64_t max_step_tokens = 512;  // tokens of one step, all sequences together
};

class BatchState {
 public:
    BatchState(const Model& model, const BatchStateOptions& options);
    ~BatchState();
    BatchState(const BatchState&) = delete;
    BatchState& operator=(const BatchState&) = delete;

    // A free slot with an empty sequence, or -1 when every slot is taken.
    int add_sequence();
    // The sequence leaves: its blocks go back to the pool, its slot to the free ones.
    void remove_sequence(int seq);
    int32_t position(int seq) const;  // tokens the sequence holds
    // Blocks a step can take: free ones and cached ones no sequence holds.
    int64_t free_blocks() const { return int64_t(free_.size() + evictable_.size()); }
    // A new (empty) sequence takes the longest cached prefix of `prompt` that leaves at least one of
    // its tokens to evaluate; returns the tokens it now holds (a multiple of the block size).
    int64_t attach_prefix(int seq, std::span<const int32_t> prompt);
    int64_t total_blocks() const { return n_blocks_; }
    int block_size() const { return block_; }
    // Whether the model has short-conv layers: prefixes are shared only where a step ended at a block's end.
    bool recurrent() const { return recurrent_; }
    // Blocks a sequence at `position` needs to take n more tokens.
    int64_t blocks_needed(int seq, int64_t n) const;

    struct Entry {
        int seq = -1;
        std::span<const int32_t> tokens;  // appended at the sequence's position
        bool logits = false;              // the last token's logits are wanted
    };
    // Evaluates every entry's tokens in one pass (a sequence at most once). The logits of the last
    // token of each entry with `logits` go to `logits`, n_vocab floats each, in entry order. Throws
    // (changing nothing) on a bad entry, a step over max_step_tokens or a pool without the blocks.
    void step(std::span<const Entry> entries, float* logits);

 private:
    struct Seq {
        bool used = false;
        int32_t position = 0;
        std::vector<int32_t> blocks;    // pool blocks, in position order
        std::vector<int32_t> tokens;    // the tokens at positions 0 .. position - 1
        std::vector<uint64_t> hashes;   // the prefix hash of each full block
        std::vector<LayerCache> conv;   // [n_layer]: the short-conv layers' states
    };
    struct Snapshot {  // the conv states of a sequence at the end of block `hash`
        uint64_t hash = 0, stamp = 0;
        std::vector<Tensor> conv;  // [n_layer], empty for layers without a conv
    };
    int32_t take_block();
    void release_block(int32_t b);
    void share_full_blocks(Seq& s);  // after a step: hashes, cache entries, a conv snapshot

    const Model& model_;
    Backend& be_;
    const Architecture& arch_;
    int block_ = 16;
    int64_t n_blocks_ = 0, max_blocks_ = 0, max_tokens_ = 0;
    std::vector<LayerCache> pool_;  // [n_layer]: the attention layers' K/V pools
    std::vector<Seq> seqs_;
    std::vector<int32_t> free_;     // free pool blocks (no sequence, no cache entry)
    std::vector<int32_t> ref_;      // [n_blocks]: the sequences holding each block
    std::vector<uint64_t> hash_, stamp_;  // [n_blocks]: the cached prefix hash (0: none), last use
    std::vector<int32_t> block_tokens_;   // [n_blocks, block]: the tokens of each cached block
    std::set<std::pair<uint64_t, int32_t>> evictable_;  // (stamp, block): cached, held by no sequence
    std::unordered_map<uint64_t, int32_t> cached_;      // prefix hash -> block
    uint64_t clock_ = 0;
    bool recurrent_ = false;             // the model has short-conv layers
    std::vector<Snapshot> snaps_;
    std::vector<int32_t> table_;    // [max_seqs, max_blocks] block tables (host copy)
    Tensor table_t_, seq_t_, ids_, pos_t_, rows_t_;
    Tensor x_, h_, y_, q_, k_, v_, attn_, wide0_, wide1_, router_, moe_ids_, moe_w_, hidden_, logits_;
    std::vector<int32_t> ids_host_, pos_host_, rows_host_, seq_host_;
};

}  // namespace cera
