// TokenTrie construction: sort the pieces, build the preorder with one pass over the sorted list, then
// lay the children of each node out together.
#include "chat/grammar/token_trie.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace cera::grammar {
namespace {

// Strict UTF-8 (the matcher's step) as eight states: 0 at a boundary; 1 one continuation byte
// (80-BF) to go; 2-4 two to go, the next in A0-BF, 80-9F or 80-BF; 5-7 three to go, the next in
// 90-BF, 80-BF or 80-8F. Returns the state after byte b, or -1.
int utf8_next(int st, uint8_t b) {
    switch (st) {
        case 0:
            if (b < 0x80) return 0;
            if (b >= 0xC2 && b <= 0xDF) return 1;
            if (b == 0xE0) return 2;
            if (b == 0xED) return 3;
            if (b >= 0xE1 && b <= 0xEF) return 4;
            if (b == 0xF0) return 5;
            if (b >= 0xF1 && b <= 0xF3) return 6;
            if (b == 0xF4) return 7;
            return -1;
        case 1:
            return b >= 0x80 && b <= 0xBF ? 0 : -1;
        case 2:
            return b >= 0xA0 && b <= 0xBF ? 1 : -1;
        case 3:
            return b >= 0x80 && b <= 0x9F ? 1 : -1;
        case 4:
            return b >= 0x80 && b <= 0xBF ? 1 : -1;
        case 5:
            return b >= 0x90 && b <= 0xBF ? 4 : -1;
        case 6:
            return b >= 0x80 && b <= 0xBF ? 4 : -1;
        default:
            return b >= 0x80 && b <= 0x8F ? 4 : -1;
    }
}

}  // namespace

TokenTrie::TokenTrie(std::vector<std::string> pieces, std::vector<bool> eog, std::vector<bool> control)
    : pieces_(std::move(pieces)) {
    const size_t n = pieces_.size();
    CERA_CHECK(eog.size() == n && control.size() == n, "token trie: %zu pieces, %zu eog, %zu control", n, eog.size(),
               control.size());
    is_eog_ = eog;
    excluded_.assign(n, false);
    std::vector<int32_t> ids;
    for (size_t i = 0; i < n; ++i) {
        if (eog[i]) {
            eog_.push_back(int32_t(i));
            continue;
        }
        if (control[i] || pieces_[i].empty() || pieces_[i].size() > 255) {
            excluded_[i] = true;
            continue;
        }
        ids.push_back(int32_t(i));
    }
    n_cp_.assign(n, 0);
    for (int32_t id : ids)
        for (char c : pieces_[size_t(id)]) n_cp_[size_t(id)] += (uint8_t(c) & 0xC0) != 0x80;
    by_cp_ = ids;
    std::stable_sort(by_cp_.begin(), by_cp_.end(),
                     [&](int32_t a, int32_t b) { return n_cp_[size_t(a)] > n_cp_[size_t(b)]; });
    cp_count_.assign(256, 0);
    for (int32_t id : ids)
        for (uint32_t c = 0; c < n_cp_[size_t(id)]; ++c) ++cp_count_[c];
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return pieces_[size_t(a)] < pieces_[size_t(b)]; });

    // The trie in preorder first (each piece shares its longest common prefix with the one before it),
    // with the first node past each subtree and a sentinel at the end.
    struct Pre {
        uint32_t end = 0, tok_begin = 0;
        uint8_t byte = 0;
    };
    std::vector<Pre> pre = {{0, 0, 0}};
    std::vector<uint32_t> path = {0};  // node of each depth on the current path
    std::string prev;
    auto close_to = [&](size_t depth) {  // pops nodes deeper than `depth`
        while (path.size() > depth + 1) {
            pre[path.back()].end = uint32_t(pre.size());
            path.pop_back();
        }
    };
    for (int32_t id : ids) {
        const std::string& p = pieces_[size_t(id)];
        size_t lcp = 0;
        while (lcp < prev.size() && lcp < p.size() && prev[lcp] == p[lcp]) ++lcp;
        close_to(lcp);
        for (size_t d = lcp; d < p.size(); ++d) {
            path.push_back(uint32_t(pre.size()));
            pre.push_back({0, uint32_t(order_.size()), uint8_t(p[d])});
        }
        order_.push_back(id);
        prev = p;
    }
    close_to(0);
    const uint32_t n_pre = uint32_t(pre.size());
    pre[0].end = n_pre;
    pre.push_back({n_pre, uint32_t(order_.size()), 0});  // the sentinel
    in_trie_.assign((n + 63) / 64, 0);
    for (int32_t id : ids) in_trie_[size_t(id) >> 6] |= 1ull << (id & 63);

    // Lay the children of each node out together, the groups in the preorder of their parents (a node
    // gets its place with its siblings, before its own children are placed).
    nodes_.assign(n_pre, Node{});
    std::vector<uint32_t> at(n_pre, 0);  // preorder index -> place
    uint32_t next = 1;
    for (uint32_t p = 0; p < n_pre; ++p) {
        Node& nd = nodes_[at[p]];
        nd.byte = pre[p].byte;
        nd.tok_begin = pre[p].tok_begin;
        nd.tok_end = pre[pre[p].end].tok_begin;
        uint32_t last = 0;
        for (uint32_t c = p + 1; c < pre[p].end; c = pre[c].end) {
            if (last == 0) nd.first_child = next;
            at[c] = last = next++;
        }
        if (last) nodes_[last].flags |= Node::kLast;
    }

    // Subtree summaries, children before parents (a child's place is after its parent's). ok[n] has
    // bit st when every path through n's byte and on down is valid UTF-8 from state st.
    std::vector<uint8_t> ok(n_pre, 0);
    for (uint32_t n = n_pre; n-- > 1;) {
        Node& t = nodes_[n];
        const uint8_t b = t.byte;
        uint8_t below_ok = 0xFF;
        uint32_t below_cp = 0;
        bool non_ascii = false;
        for (uint32_t c = t.first_child; c; c = nodes_[c].last() ? 0 : c + 1) {
            const Node& ct = nodes_[c];
            t.ascii[0] |= ct.ascii[0];
            t.ascii[1] |= ct.ascii[1];
            non_ascii |= ct.non_ascii();
            below_ok &= ok[c];
            below_cp = std::max<uint32_t>(below_cp, ct.max_cp);
        }
        if (b < 0x80)
            t.ascii[b >> 6] |= 1ull << (b & 63);
        else
            non_ascii = true;
        for (int st = 0; st < 8; ++st) {
            const int nx = utf8_next(st, b);
            if (nx >= 0 && ((below_ok >> nx) & 1)) ok[n] |= uint8_t(1u << st);
        }
        if (non_ascii) t.flags |= Node::kNonAscii;
        if (ok[n] & 1) t.flags |= Node::kUtf8Ok;
        const bool starts_cp = b < 0x80 || b >= 0xC0;
        t.max_cp = uint8_t(std::min<uint32_t>(255, below_cp + (starts_cp ? 1 : 0)));
    }
}

std::shared_ptr<const TokenTrie> TokenTrie::from_tokenizer(const Tokenizer& tok) {
    const int32_t n = tok.n_vocab();
    std::vector<std::string> pieces(size_t(n), "");
    std::vector<bool> eog(size_t(n), false), control(size_t(n), false);
    for (int32_t id = 0; id < n; ++id) {
        eog[size_t(id)] = tok.is_eog(id);
        pieces[size_t(id)] = tok.token_to_piece(id, /*render_special=*/!eog[size_t(id)] && tok.is_control(id));
    }
    return std::make_shared<const TokenTrie>(std::move(pieces), std::move(eog), std::move(control));
}

}  // namespace cera::grammar
