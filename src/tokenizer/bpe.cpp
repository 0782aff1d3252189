// BPE encoder: pre-tokenize, then merge within each word by rank with a priority queue over
// adjacent symbol pairs. Symbols carry ids (tokens, or merge parts that are not tokens), so a merge
// lookup is one probe of the (left, right) table; a queued pair is stale once either side changed.
#include <algorithm>

#include "tokenizer/encoders.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/unicode.h"
#include "tokenizer/word_cache.h"

namespace cera::detail {
namespace {

struct Symbol {
    int32_t id;           // symbol id, or kNoToken for a character that is neither token nor merge part
    uint32_t start, len;  // bytes of the (encoded) word; len == 0 once merged away
    int32_t prev, next;
};

struct Candidate {
    int32_t rank;
    int32_t left, right;
    int32_t left_id, right_id, result;
};

struct Order {
    // The heap's top is the "largest": lowest rank, then leftmost.
    bool operator()(const Candidate& a, const Candidate& b) const {
        return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
};

struct BpeScratch {
    std::vector<uint32_t> cps, ends, split_scratch, offsets;
    std::string fixed, encoded;
    std::vector<Symbol> syms;
    std::vector<Candidate> heap;
};

// raw: the word's bytes; w: the text the symbols index (the GPT-2 encoding of raw when byte_encode).
void merge_word(const Vocab& v, std::string_view raw, std::string_view w, std::vector<int32_t>& out,
                BpeScratch& s) {
    const VocabData& d = v.data();
    const int32_t n_tokens = v.n_tokens();
    auto& syms = s.syms;
    syms.clear();

    if (d.byte_encode) {
        for (size_t i = 0, off = 0; i < raw.size(); ++i) {
            const uint8_t b = uint8_t(raw[i]);
            const uint32_t len = uint32_t(unicode::byte_to_unicode(b).size());
            syms.push_back({v.byte_symbol(b), uint32_t(off), len, int32_t(syms.size()) - 1, int32_t(syms.size()) + 1});
            off += len;
        }
    } else {
        for (size_t off = 0; off < w.size();) {
            const size_t len = std::min(unicode::utf8_len(uint8_t(w[off])), w.size() - off);
            int32_t id = v.find_symbol(w.substr(off, len));
            if (d.byte_fallback && (id < 0 || id >= n_tokens)) {
                bool all = true;
                for (size_t k = 0; k < len; ++k) all = all && v.byte_token(uint8_t(w[off + k])) != kNoToken;
                if (all) {
                    for (size_t k = 0; k < len; ++k) {
                        syms.push_back({v.byte_token(uint8_t(w[off + k])), uint32_t(off + k), 1,
                                        int32_t(syms.size()) - 1, int32_t(syms.size()) + 1});
                    }
                    off += len;
                    continue;
                }
                id = d.unk;
                if (d.fuse_unk && id != kNoToken && !syms.empty() && syms.back().id == id) {
                    syms.back().len += uint32_t(len);
                    off += len;
                    continue;
                }
            }
            syms.push_back({id, uint32_t(off), uint32_t(len), int32_t(syms.size()) - 1, int32_t(syms.size()) + 1});
            off += len;
        }
    }
    if (syms.empty()) return;
    syms.back().next = -1;

    auto& heap = s.heap;
    heap.clear();
    auto try_add = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const int32_t lid = syms[size_t(left)].id, rid = syms[size_t(right)].id;
        Vocab::Merge m;
        if (!v.find_merge(lid, rid, m)) return;
        heap.push_back({m.rank, left, right, lid, rid, m.result});
        std::push_heap(heap.begin(), heap.end(), Order{});
    };
    for (int32_t i = 1; i < int32_t(syms.size()); ++i) try_add(i - 1, i);

    while (!heap.empty()) {
        std::pop_heap(heap.begin(), heap.end(), Order{});
        const Candidate c = heap.back();
        heap.pop_back();
        Symbol& l = syms[size_t(c.left)];
        Symbol& r = syms[size_t(c.right)];
        if (l.len == 0 || r.len == 0 || l.next != c.right || l.id != c.left_id || r.id != c.right_id) continue;
        l.id = c.result;
        l.len += r.len;
        r.len = 0;
        l.next = r.next;
        if (r.next >= 0) syms[size_t(r.next)].prev = c.left;
        try_add(l.prev, c.left);
        try_add(c.left, l.next);
    }

    for (int32_t i = 0; i != -1; i = syms[size_t(i)].next) {
        const Symbol& sym = syms[size_t(i)];
        if (sym.id >= 0 && sym.id < n_tokens) {
            out.push_back(sym.id);
        } else if (!d.byte_fallback) {
            // Not a token (llama.cpp): each byte of its text that is a one-byte token.
            for (size_t k = 0; k < sym.len; ++k) {
                const int32_t id = v.find(w.substr(sym.start + k, 1));
                if (id != kNoToken) out.push_back(id);
            }
        }
    }
}

// One pre-tokenized word: whole-word lookup when merges are ignored, else byte encoding and merges.
void encode_word(const Vocab& v, std::string_view word, std::vector<int32_t>& out, BpeScratch& s) {
    const VocabData& d = v.data();
    std::string_view encoded = word;
    if (d.byte_encode) {
        s.encoded.clear();
        for (char ch : word) s.encoded += unicode::byte_to_unicode(uint8_t(ch));
        encoded = s.encoded;
    }
    if (d.ignore_merges) {
        const int32_t id = v.find(encoded);
        if (id != kNoToken) {
            out.push_back(id);
            return;
        }
    }
    merge_word(v, word, encoded, out, s);
}

}  // namespace

void bpe_encode(const Vocab& v, std::string_view text, std::vector<int32_t>& out) {
    if (text.empty()) return;
    thread_local BpeScratch s;
    const VocabData& d = v.data();

    // Invalid UTF-8 is tokenized as U+FFFD, like llama.cpp.
    if (!unicode::decode_utf8(text, s.cps)) {
        s.fixed.clear();
        for (uint32_t cp : s.cps) unicode::append_utf8(s.fixed, cp);
        text = s.fixed;
    }
    const size_t n = s.cps.size();
    s.offsets.resize(n + 1);
    s.offsets[0] = 0;
    for (size_t i = 0; i < n; ++i) {
        const uint32_t cp = s.cps[i];
        s.offsets[i + 1] = s.offsets[i] + (cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
    }

    pre_tokenize(d.pre, s.cps, s.ends, s.split_scratch);

    WordCache& cache = WordCache::for_vocab(v.serial());
    size_t start = 0;
    for (uint32_t end : s.ends) {
        std::string_view word = text.substr(s.offsets[start], s.offsets[end] - s.offsets[start]);
        start = end;
        if (cache.get(word, out)) continue;
        const size_t first = out.size();
        encode_word(v, word, out, s);
        cache.put(word, out.data() + first, out.size() - first);
    }
}

}  // namespace cera::detail