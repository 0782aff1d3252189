// TokenTrie: the bytes of every token of a vocabulary in one prefix tree, for walking a grammar over
// all tokens at once (tokens that share a prefix share its matching work).
//
// The children of a node are consecutive in memory (the last one is marked), and the groups of
// children are laid out in the preorder of their parents, so a walk that scans siblings and skips
// most subtrees reads memory in runs rather than chasing one node to the next. Node 0 is the root
// (the empty prefix). The tokens of a subtree are a contiguous run of `order` ([tok_begin, tok_end),
// the preorder of the tokens); those ending exactly at the node come first.
// Immutable after construction; shared by every matcher of one vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cera {
class Tokenizer;

namespace grammar {

class TokenTrie {
 public:
    // A node and the summary of its subtree, in one half cache line. The summary says what the bytes of
    // the subtree (the node's own byte included) hold, so that a walk can settle the subtree in one
    // step when a repeated character class takes all of it: the ASCII bytes, whether a byte is past
    // ASCII, whether every path is strict UTF-8 when it starts at a code point boundary (a path may
    // end inside a code point), and the most code points a path starts (at most 255).
    struct alignas(32) Node {
        uint64_t ascii[2];
        uint32_t tok_begin, tok_end;  // subtree's tokens: order[tok_begin, tok_end)
        uint32_t first_child;         // 0: none
        uint8_t byte;                 // the byte that leads here from the parent
        uint8_t max_cp;
        uint8_t flags;
        uint8_t pad;
        static constexpr uint8_t kNonAscii = 1, kUtf8Ok = 2, kLast = 4;  // kLast: the last of its siblings
        bool non_ascii() const { return flags & kNonAscii; }
        bool utf8_ok() const { return flags & kUtf8Ok; }
        bool last() const { return flags & kLast; }
    };
    static_assert(sizeof(Node) == 32);

    // pieces[id]: the bytes of token id; eog[id]: an end-of-generation token; control[id]: a token
    // that never stands for text in a grammar (it is never allowed, unless it ends generation).
    TokenTrie(std::vector<std::string> pieces, std::vector<bool> eog, std::vector<bool> control);
    // From a tokenizer: pieces as generated text renders them (token_to_piece), and control tokens that
    // do not end generation as their vocabulary text ("<|tool_call_start|>"): a grammar that spells that
    // text allows the one token, as the model writes it, and a lazy grammar's trigger can be one.
    static std::shared_ptr<const TokenTrie> from_tokenizer(const Tokenizer& tok);

    int32_t n_vocab() const { return int32_t(pieces_.size()); }
    const std::vector<Node>& nodes() const { return nodes_; }
    uint32_t n_nodes() const { return uint32_t(nodes_.size()); }
    // The end of the run of tokens whose bytes end exactly at n.
    uint32_t own_end(const Node& n) const { return n.first_child ? nodes_[n.first_child].tok_begin : n.tok_end; }
    const std::vector<int32_t>& order() const { return order_; }
    // The tokens of the trie (those of order()) as a bitset over the vocabulary.
    const std::vector<uint64_t>& in_trie() const { return in_trie_; }
    const std::string& piece(int32_t id) const { return pieces_[size_t(id)]; }
    const std::vector<int32_t>& eog_tokens() const { return eog_; }
    // The code points a token's bytes start (its bytes that are not UTF-8 continuation bytes).
    uint32_t n_cp(int32_t id) const { return n_cp_[size_t(id)]; }
    // The tokens of the trie, most code points first; the first longer_than(c) of them have more than c.
    const std::vector<int32_t>& by_cp() const { return by_cp_; }
    size_t longer_than(uint32_t c) const { return c < cp_count_.size() ? cp_count_[c] : 0; }
    bool is_eog(int32_t id) const { return is_eog_[size_t(id)]; }
    // A token outside the trie that is not an end of generation (control, empty or too long).
    bool is_excluded(int32_t id) const { return excluded_[size_t(id)]; }

 private:
    std::vector<std::string> pieces_;
    std::vector<Node> nodes_;
    std::vector<int32_t> order_;
    std::vector<uint64_t> in_trie_;
    std::vector<int32_t> eog_;
    std::vector<bool> is_eog_, excluded_;
    std::vector<uint8_t> n_cp_;
    std::vector<int32_t> by_cp_;
    std::vector<uint32_t> cp_count_;  // [c]: how many tokens of the trie start more than c code points
};

}  // namespace grammar
}  // namespace cera
