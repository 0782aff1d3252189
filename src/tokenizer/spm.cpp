// SentencePiece-style encoder (the BPE variant that llama.cpp calls SPM): score-driven merges over
// UTF-8 characters with a priority queue; each candidate remembers the byte size it was made with,
// so a stale candidate (one side merged since) is recognized and skipped.
#include <algorithm>

#include "tokenizer/encoders.h"
#include "tokenizer/unicode.h"
#include "tokenizer/word_cache.h"

namespace cera::detail {
namespace {

struct Symbol {
    uint32_t start, len;  // bytes of the text; len == 0 once merged into the left neighbour
    int32_t prev, next;
};

struct Candidate {
    float score;
    int32_t left, right;
    uint32_t size;
};

struct Order {
    bool operator()(const Candidate& a, const Candidate& b) const {
        // The heap's top is the "largest": highest score, then leftmost.
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
};

struct SpmScratch {
    std::vector<Symbol> syms;
    std::vector<Candidate> heap;
};

}  // namespace

namespace {

void spm_encode_piece(const Vocab& v, std::string_view text, std::vector<int32_t>& out);

}  // namespace

// When no token has '▁' after another character, no merge can cross the start of a '▁' run that
// follows other text: each such piece is merged on its own (same result, much smaller queues).
void spm_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
    if (!v.spm_splits_at_spaces()) {
        spm_encode_piece(v, text, out);
        return;
    }
    WordCache& cache = WordCache::for_vocab(v.serial());
    auto piece = [&](std::string_view p) {
        if (cache.get(p, out)) return;
        const size_t first = out.size();
        spm_encode_piece(v, p, out);
        cache.put(p, out.data() + first, out.size() - first);
    };
    static constexpr std::string_view kMark = "\xE2\x96\x81";
    size_t start = 0;
    for (size_t p = text.find(kMark, 1); p != std::string_view::npos; p = text.find(kMark, p + kMark.size())) {
        if (p >= start + kMark.size() && text.compare(p - kMark.size(), kMark.size(), kMark) == 0) continue;
        if (p > start) {
            piece(text.substr(start, p - start));
            start = p;
        }
    }
    piece(text.substr(start));
}

namespace {

void spm_encode_piece(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
    if (text.empty()) return;
    thread_local SpmScratch s;
    auto& syms = s.syms;
    syms.clear();
    for (size_t off = 0; off < text.size();) {
        const size_t len = std::min(unicode::utf8_len(uint8_t(text[off])), text.size() - off);
        const int32_t idx = int32_t(syms.size());
        syms.push_back({uint32_t(off), uint32_t(len), idx - 1, off + len == text.size() ? -1 : idx + 1});
        off += len;
    }

    auto& heap = s.heap;
    heap.clear();
    auto try_add = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const Symbol& l = syms[size_t(left)];
        const Symbol& r = syms[size_t(right)];
        const uint32_t size = l.len + r.len;
        const int32_t id = v.find(text.substr(l.start, size));
        if (id == kNoToken) return;
        heap.push_back({v.score(id), left, right, size});
        std::push_heap(heap.begin(), heap.end(), Order{});
    };
    for (int32_t i = 1; i < int32_t(syms.size()); ++i) try_add(i - 1, i);

    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), Order{});
        const Candidate c = heap.back();
        heap.pop_back();
        Symbol& l = syms[size_t(c.left)];
        Symbol& r = syms[size_t(c.right)];
        if (l.len == 0 || r.len == 0 || l.len + r.len != c.size) continue;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) syms[size_t(r.next)].prev = c.left;
        try_add(l.prev, c.left);
        try_add(c.left, l.next);
    }

    for (int32_t i = 0; i != -1; i = syms[size_t(i)].next) {
        const Symbol& sym = syms[size_t(i)];
        const std::string_view piece = text.substr(sym.start, sym.len);
        const int32_t id = v.find(piece);
        if (id != kNoToken) {
            out.push_back(id);
            continue;
        }
        for (char ch : piece) {  // not a token: one byte token per byte
            const int32_t b = v.byte_token(uint8_t(ch));
            if (b != kNoToken) {
                out.push_back(b);
            } else if (v.data().unk != kNoToken) {
                out.push_back(v.data().unk);
            }
        }
    }
}

}  // namespace
}  // namespace cera::detail
