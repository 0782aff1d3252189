// TokenTrie construction: sort the pieces, then lay out the preorder with one pass over the sorted
// list (each piece shares its longest common prefix with the one before it).
#include "chat/grammar/token_trie.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace cera::grammar {

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

    nodes_.push_back({0, 0, 0, 0, 0, 0});
    std::vector<uint32_t> path = {0};  // node of each depth on the current path
    std::string prev;
    auto close_to = [&](size_t depth) {  // pops nodes deeper than `depth`
        while (path.size() > depth + 1) {
            Node& nd = nodes_[path.back()];
            nd.end = uint32_t(nodes_.size());
            nd.tok_end = uint32_t(order_.size());
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
            nodes_.push_back({0, uint32_t(order_.size()), 0, 0, uint8_t(p[d]), uint8_t(d + 1)});
        }
        ++nodes_[path.back()].n_own;
        order_.push_back(id);
        prev = p;
    }
    close_to(0);
    nodes_[0].end = uint32_t(nodes_.size());
    nodes_[0].tok_end = uint32_t(order_.size());
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
