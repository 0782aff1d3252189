// TokenTrie construction: sort the pieces, then lay out the preorder with one pass over the sorted
// list (each piece shares its longest common prefix with the one before it).
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
    std::stable_sort(ids.begin(), ids.end(),
                     [&](int32_t a, int32_t b) { return pieces_[size_t(a)] < pieces_[size_t(b)]; });

    auto node = [](uint32_t tok_begin, uint8_t byte, uint8_t depth) {
        Node nd{};
        nd.tok_begin = tok_begin;
        nd.byte = byte;
        nd.depth = depth;
        nd.utf8_ok = true;
        return nd;
    };
    nodes_.push_back(node(0, 0, 0));
    std::vector<uint32_t> path = {0};  // node of each depth on the current path
    std::string prev;
    auto close_to = [&](size_t depth) {  // pops nodes deeper than `depth`
        while (path.size() > depth + 1) {
            Node& nd = nodes_[path.back()];
            nd.end = uint32_t(nodes_.size());
            path.pop_back();
        }
    };
    for (int32_t id : ids) {
        const std::string& p = pieces_[size_t(id)];
        size_t lcp = 0;
        while (lcp < prev.size() && lcp < p.size() && prev[lcp] == p[lcp]) ++lcp;
        close_to(lcp);
        for (size_t d = lcp; d < p.size(); ++d) {
            path.push_back(uint32_t(nodes_.size()));
            nodes_.push_back(node(uint32_t(order_.size()), uint8_t(p[d]), uint8_t(d + 1)));
        }
        ++nodes_[path.back()].n_own;
        order_.push_back(id);
        prev = p;
    }
    close_to(0);
    nodes_[0].end = uint32_t(nodes_.size());
    nodes_.push_back(node(uint32_t(order_.size()), 0, 0));  // the sentinel
    nodes_.back().end = uint32_t(nodes_.size() - 1);

    // Subtree summaries, children before parents (a child's index is above its parent's). ok[n] has
    // bit st when every path through n's byte and on down is valid UTF-8 from state st.
    std::vector<uint8_t> ok(nodes_.size(), 0);
    for (size_t n = nodes_.size() - 1; n-- > 1;) {
        Node& t = nodes_[n];
        const uint8_t b = nodes_[n].byte;
        uint8_t below_ok = 0xFF;
        uint32_t below_cp = 0;
        for (uint32_t c = uint32_t(n) + 1; c < nodes_[n].end; c = nodes_[c].end) {
            const Node& ct = nodes_[c];
            t.ascii[0] |= ct.ascii[0];
            t.ascii[1] |= ct.ascii[1];
            t.non_ascii |= ct.non_ascii;
            below_ok &= ok[c];
            below_cp = std::max<uint32_t>(below_cp, ct.max_cp);
        }
        if (b < 0x80)
            t.ascii[b >> 6] |= 1ull << (b & 63);
        else
            t.non_ascii = true;
        for (int st = 0; st < 8; ++st) {
            const int next = utf8_next(st, b);
            if (next >= 0 && ((below_ok >> next) & 1)) ok[n] |= uint8_t(1u << st);
        }
        t.utf8_ok = ok[n] & 1;
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
