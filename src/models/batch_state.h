// Several sequences evaluated together on one model: one forward pass a step over the tokens of every
// sequence in it (prompt chunks and single decode tokens side by side). The attention layers keep the
// sequences' K/V in one pool of fixed-size blocks, each sequence a block table over it and blocks
// taken from a free list as it grows and returned when it leaves; the short-conv layers keep a
// rolling state per sequence slot. The batched engine's scheduler drives it.
//
// Prefix sharing: a full block is known by a hash of its tokens and of everything before them. Blocks
// stay in the pool after their sequence leaves, until the pool needs them (least recently used
// first), and a new sequence whose prompt starts with such blocks takes them (reference-counted; a
// full block is never written again) instead of evaluating those tokens. On models with short-conv
// layers, the conv states at the end of every snapshot_blocks-th block are kept beside the block, and a
// shared prefix ends at one of those.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "models/arch.h"
#include "models/model.h"

namespace cera {

class RankThread;

struct BatchStateOptions {
    int max_seqs = 8;               // sequence slots
    int64_t kv_tokens = 0;          // pool size in tokens (0: max_seqs times the model's default context)
    int block_size = 16;            // tokens a block (a power of two)
    int64_t max_step_tokens = 512;  // tokens of one step, all sequences together
    int snapshot_blocks = 4;        // short-conv models: conv states kept at the end of every n-th block
    int64_t max_seq_tokens = 0;     // the longest sequence (0: the whole pool); sizes the block tables
    int max_draft = 0;              // a run of verify entries carries 1 + max_draft tokens at most (Entry::verify)
};

// What a step gives back for the last token of an entry.
enum class Pick {
    kNone,    // nothing (a prompt chunk with more to come)
    kLogits,  // its row of logits
    kArgmax,  // the arg-max of its logits only (Backend::argmax: a greedy sampler's pick)
    kTop,     // the best `top` logits and those at `gather` (Backend::top_logits: Sampler::sample_top's input)
};

// A step's outputs, by entry i: kArgmax: the id words[at[i]]; kTop: Backend::top_logits's
// 1 + 2 top + gather.size() words from words[at[i]]; the row of logits (n_vocab floats from
// logits[row_at[i]]) of kLogits entries and of kTop entries whose logits are all -inf or NaN (no
// candidate: a sampler takes the whole row); row_at[i] is kNoRow for the others.
struct StepOutput {
    static constexpr size_t kNoRow = SIZE_MAX;
    std::vector<float> logits;
    std::vector<int32_t> words;
    std::vector<size_t> at, row_at;
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
    // The LoRA adapters of a new (empty) sequence, before attach_prefix(): its steps apply them, and it
    // shares cached blocks only with sequences under the same set.
    void set_lora(int seq, const LoraSet& set);
    // The input embeddings of a new (empty) sequence, before attach_prefix(): the content hash of each run of
    // positions whose input comes as embeddings (an image's), so that its blocks share a cached prefix only
    // with sequences holding the same content there (their token ids alone do not tell images apart).
    struct ContentKey {
        int64_t begin = 0, end = 0;  // positions [begin, end)
        uint64_t hash = 0;
    };
    void set_content_keys(int seq, std::span<const ContentKey> keys);
    int64_t total_blocks() const { return n_blocks_; }
    int block_size() const { return block_; }
    uint64_t pool_bytes() const;  // the K/V pools and kept conv states
    // Blocks a sequence at `position` needs to take n more tokens.
    int64_t blocks_needed(int seq, int64_t n) const;

    struct Entry {
        int seq = -1;
        std::span<const int32_t> tokens;  // appended at the sequence's position
        Pick pick = Pick::kNone;          // what comes back for the last token
        int32_t top = 0;                  // kTop: how many of the best logits
        std::span<const int32_t> gather;  // kTop: token ids whose logits come back too
        std::span<const EmbdRun> embd;    // runs of `tokens` (indices into it) whose input is given as embeddings
        // Verification of a draft (speculative decoding): `pick` (kArgmax or kLogits) comes back for every
        // token, the state after each token is kept until keep() says how many stay, and the blocks that
        // fill up enter the prefix cache only then. Verify entries of a sequence in consecutive steps form
        // one run (a draft model drafting a token a step); a run holds 1 + max_draft tokens at most.
        bool verify = false;
    };
    // Evaluates every entry's tokens in one pass (a sequence at most once) and fills `out` as the entries'
    // picks ask; the selections (arg-max, best logits) run where the logits are, so a device backend
    // copies back only what is asked. Throws (changing nothing) on a bad entry, a step over
    // max_step_tokens or a pool without the blocks.
    // For a verify entry j of n tokens, out.words[out.at[j] + t] (kArgmax) or the row at
    // out.row_at[j] + t * n_vocab (kLogits) is the output after its token t.
    // `meanwhile` (if any) runs once, after the step is queued and before its outputs are waited for, as
    // EvalRequest::meanwhile does (what it throws is dropped).
    void step(std::span<const Entry> entries, StepOutput& out, const std::function<void()>& meanwhile = {});
    // After a run of verify entries (its latest in the sequence's latest step): the sequence keeps the
    // run's first n tokens (1..its length) and drops the others, as if they had never been evaluated: its
    // position, its K/V blocks past the end (back to the pool), its conv states (those after its n-th
    // token) and its prefix-cache entries (only blocks full of kept tokens are shared). Ends the run.
    void keep(int seq, int32_t n);

 private:
    struct Seq {
        bool used = false;
        int32_t position = 0;
        std::vector<int32_t> blocks;    // pool blocks, in position order
        std::vector<int32_t> tokens;    // the tokens at positions 0 .. position - 1
        std::vector<uint64_t> hashes;   // the prefix hash of each full block
        LoraSet lora;                   // its adapters
        uint64_t lora_key = 0;          // lora_set_key(lora): the seed of its blocks' hashes
        std::vector<ContentKey> content;  // set_content_keys(), by position
        int32_t verify_from = 0, verify_n = 0;  // the open run of verify entries: its first position, tokens (0: none)
    };
    // The tokens of s's open run of verify entries (0: none).
    static int32_t run_before(const Seq& s) { return s.position == s.verify_from + s.verify_n ? s.verify_n : 0; }
    // The row of pool_[il].conv holding the states after the t-th token (1..1 + max_draft) of seq's run.
    int64_t verify_row(int seq, int32_t t) const { return verify_rows_ + int64_t(seq) * (1 + max_draft_) + t - 1; }
    // The prefix hash of block i of a sequence whose tokens are `tokens`, after the hash `prev` of those before.
    uint64_t seq_block_hash(const Seq& s, size_t i, uint64_t prev, const int32_t* tokens) const;
    int32_t take_block();
    void release_block(int32_t b);
    void share_full_blocks(Seq& s);  // after a step: the new full blocks' hashes and cache entries
    // The outputs the entries ask for, from the step's logits lg (a row an entry with a pick).
    void pick(std::span<const Entry> entries, const Tensor& lg, StepOutput& out, const std::function<void()>& meanwhile);
    // Overwrites the rows of x (the step's tokens, entry after entry) that the entries give as embeddings.
    void write_embd(std::span<const Entry> entries, const Tensor& x);
    // Step::lora and lora_out for the entries' sequences' adapters (nothing when none has any).
    void bind_lora(std::span<const Entry> entries, Step& s);
    // step() on this rank alone.
    void rank_step(std::span<const Entry> entries, StepOutput& out, const std::function<void()>& meanwhile);

    const Model& model_;
    Backend& be_;
    const Architecture& arch_;
    // A model split over ranks (models/shard.h): the other ranks' states, fed every call this one takes,
    // a thread each for their steps, and their steps' outputs (unread).
    std::vector<std::unique_ptr<BatchState>> ranks_;
    std::vector<std::unique_ptr<RankThread>> threads_;
    std::vector<StepOutput> rank_out_;
    int block_ = 16;
    int64_t n_blocks_ = 0, max_blocks_ = 0, max_tokens_ = 0;
    std::vector<LayerCache> pool_;  // [n_layer]: K/V pools; short-conv layers: their states at block ends
    std::vector<Seq> seqs_;
    std::vector<int32_t> free_;     // free pool blocks (no sequence, no cache entry)
    std::vector<int32_t> ref_;      // [n_blocks]: the sequences holding each block
    std::vector<int32_t> snap_row_;  // [n_blocks]: the row of pool_[il].conv holding the conv states at the
                                     // block's end, or -1
    std::vector<int32_t> free_snap_rows_;
    std::vector<uint64_t> hash_, stamp_;  // [n_blocks]: the cached prefix hash (0: none), last use
    std::vector<int32_t> block_tokens_;   // [n_blocks, block]: the tokens of each cached block
    std::set<std::pair<uint64_t, int32_t>> evictable_;  // (stamp, block): cached, held by no sequence
    std::unordered_map<uint64_t, int32_t> cached_;      // prefix hash -> block
    uint64_t clock_ = 0;
    bool recurrent_ = false;             // the model has short-conv layers
    uint64_t serial_ = 0;                // recorded-step keys: (serial_ << kStepKeyBits) | n_tokens
    int snapshot_blocks_ = 4;
    int max_draft_ = 0;
    int64_t verify_rows_ = 0;       // the first row of pool_[il].conv kept for verify runs: 1 + max_draft a slot
    std::vector<int32_t> table_;    // [max_seqs, max_blocks] block tables (host copy)
    Tensor table_t_, seq_t_, ids_, pos_t_, rows_t_;
    StepBuffers act_;        // the activations of max_step_tokens tokens
    Tensor hidden_, logits_;  // [max_seqs, n_embd], [max_seqs, n_vocab]
    Tensor logits_local_;     // a tensor-parallel rank's rows of the vocabulary (lm_head's scratch), or empty
    Tensor picks_t_;          // i32 [max_seqs]: arg-max ids
    std::vector<Tensor> conv_states_;  // [n_layer]: short-conv layers: f32 [max_seqs, (L - 1) * n_embd], a row a slot
    Tensor segs_t_, snaps_t_;  // i32 [max_seqs, kConvSegInts], [.., 2]: Backend::short_conv_segments's descriptors
    Tensor top_t_, gather_t_;  // i32: the kTop entries' top_logits words and gather ids, one after another
    std::vector<int32_t> ids_host_, pos_host_, rows_host_, seq_host_;
    std::vector<LoraRows> lora_rows_, lora_out_;
    std::vector<LoraSegment> lora_segs_;
};

}  // namespace cera
