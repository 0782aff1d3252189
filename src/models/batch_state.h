// Several sequences evaluated together on one model: one forward pass a step over the tokens of every
// sequence in it (prompt chunks and single decode tokens side by side). The attention layers keep the
// sequences' K/V in one pool of fixed-size blocks, each sequence a block table over it and blocks
// taken from a free list as it grows and returned when it leaves; the short-conv layers keep a
// rolling state per sequence slot. The batched engine's scheduler drives it.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
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
    int64_t free_blocks() const { return int64_t(free_.size()); }
    int64_t total_blocks() const { return n_blocks_; }
    int block_size() const { return block_; }
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
        std::vector<LayerCache> conv;   // [n_layer]: the short-conv layers' states
    };

    const Model& model_;
    Backend& be_;
    const Architecture& arch_;
    int block_ = 16;
    int64_t n_blocks_ = 0, max_blocks_ = 0, max_tokens_ = 0;
    std::vector<LayerCache> pool_;  // [n_layer]: the attention layers' K/V pools
    std::vector<Seq> seqs_;
    std::vector<int32_t> free_;     // free pool blocks
    std::vector<int32_t> table_;    // [max_seqs, max_blocks] block tables (host copy)
    Tensor table_t_, seq_t_, ids_, pos_t_, rows_t_;
    Tensor x_, h_, y_, q_, k_, v_, attn_, wide0_, wide1_, router_, moe_ids_, moe_w_, hidden_, logits_;
    std::vector<int32_t> ids_host_, pos_host_, rows_host_, seq_host_;
};

}  // namespace cera
