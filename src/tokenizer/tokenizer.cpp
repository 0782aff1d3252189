// Tokenizer: special-token partition, dispatch to the SPM or BPE encoder, and decoding.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>

#include "core/check.h"
#include "core/utf8.h"
#include "gguf/gguf.h"
#include "tokenizer/encoders.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_io.h"

namespace cera {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 '▁'

void append_escaped_spaces(std::string& out, std::string_view text) {
    for (char c : text) {
        if (c == ' ') {
            out += kSpaceMark;
        } else {
            out.push_back(c);
        }
    }
}

void append_unescaped_spaces(std::string& out, std::string_view text) {
    size_t i = 0;
    while (i < text.size()) {
        const size_t p = text.find(kSpaceMark, i);
        if (p == std::string_view::npos) {
            out.append(text.substr(i));
            break;
        }
        out.append(text.substr(i, p - i));
        out.push_back(' ');
        i = p + kSpaceMark.size();
    }
}

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

bool is_c_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

}  // namespace

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
    // The codepoint category table (a pass over all of Unicode, milliseconds) is built here, with the
    // vocabulary, rather than inside the first encode: a server's first request does not wait for it.
    (void)unicode::cp_flags(0);
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& f) {
    return std::make_unique<Tokenizer>(Vocab(vocab_data_from_gguf(f)));
}

std::unique_ptr<Tokenizer> Tokenizer::from_hf_json(const std::string& tokenizer_json_path,
                                                   const std::string& config_path) {
    return std::make_unique<Tokenizer>(Vocab(vocab_data_from_hf_json(tokenizer_json_path, config_path)));
}

std::unique_ptr<Tokenizer> Tokenizer::from_file(const std::string& path) {
    if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) return from_hf_json(path);
    auto f = gguf::File::open(path);
    return from_gguf(*f);
}

void Tokenizer::check_id(int32_t id) const {
    if (!vocab_.valid(id))
        throw_error(ErrorCode::kOutOfRange, "token id %d is out of range (vocabulary of %d tokens)", id,
                    vocab_.n_tokens());
}

bool Tokenizer::is_control(int32_t id) const {
    if (!vocab_.valid(id)) return false;
    const TokenType t = vocab_.type(id);
    return t == TokenType::kControl || t == TokenType::kUnknown;
}

TokenType Tokenizer::token_type(int32_t id) const {
    check_id(id);
    return vocab_.type(id);
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
    const int32_t id = vocab_.find(text);
    if (id == kNoToken) return std::nullopt;
    return id;
}

const std::string& Tokenizer::token_piece(int32_t id) const {
    check_id(id);
    return vocab_.text(id);
}

// Splits the text at special tokens, longest token first (llama.cpp's tokenizer_st_partition).
void Tokenizer::partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const {
    out.clear();
    out.push_back({kNoToken, 0, text.size()});
    if (vocab_.special_tokens().empty()) return;
    thread_local std::vector<uint8_t> present;
    if (vocab_.find_special_tokens(text, present) == 0) return;
    thread_local std::vector<Fragment> next;
    for (int32_t id : vocab_.special_tokens()) {
        if (!present[size_t(id)]) continue;
        const TokenType type = vocab_.type(id);
        if (!parse_special && (type == TokenType::kControl || type == TokenType::kUnknown)) continue;
        const std::string_view s = vocab_.text(id);
        const bool lstrip = vocab_.lstrip(id), rstrip = vocab_.rstrip(id);
        next.clear();
        for (const Fragment& f : out) {
            if (f.token != kNoToken) {
                next.push_back(f);
                continue;
            }
            size_t off = f.offset, len = f.length;
            while (len > 0) {
                const size_t m = text.substr(0, off + len).find(s, off);
                if (m == std::string_view::npos) {
                    next.push_back({kNoToken, off, len});
                    break;
                }
                size_t left = m - off;
                if (lstrip) {
                    while (left > 0 && is_c_space(text[off + left - 1])) --left;
                }
                if (left > 0) next.push_back({kNoToken, off, left});
                next.push_back({id, 0, 0});
                size_t r_off = m + s.size();
                size_t r_len = off + len - r_off;
                if (rstrip) {
                    while (r_len > 0 && is_c_space(text[r_off])) {
                        ++r_off;
                        --r_len;
                    }
                }
                off = r_off;
                len = r_len;
            }
        }
        out.swap(next);
    }
}

void Tokenizer::encode_text(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const {
    const VocabData& d = vocab_.data();
    thread_local std::string buf;
    if (d.model == VocabModel::kSpm) {
        buf.clear();
        if (d.add_space_prefix && prefix_space) buf += kSpaceMark;
        append_escaped_spaces(buf, text);
        detail::spm_encode(vocab_, buf, out);
        return;
    }
    std::string normalized;
    if (d.nfc) {
        normalized = unicode::nfc(text);
        text = normalized;
    }
    if (d.escape_whitespace || d.add_space_prefix) {
        buf.clear();
        if (d.add_space_prefix && prefix_space) buf += kSpaceMark;
        if (d.escape_whitespace) {
            append_escaped_spaces(buf, text);
        } else {
            buf.append(text);
        }
        detail::bpe_encode(vocab_, buf, out);
        return;
    }
    detail::bpe_encode(vocab_, text, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
    const VocabData& d = vocab_.data();
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 2);
    if (add_bos && d.add_bos) out.push_back(d.bos);
    if (!text.empty()) {
        thread_local std::vector<Fragment> frags;
        partition(text, parse_special, frags);
        bool prev_special = true;  // the first fragment gets the space prefix
        for (const Fragment& f : frags) {
            if (f.token != kNoToken) {
                out.push_back(f.token);
                prev_special = true;
                continue;
            }
            encode_text(text.substr(f.offset, f.length), prev_special, out);
            prev_special = false;
        }
    }
    if (add_bos && d.add_eos) out.push_back(d.eos);
    return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool render_special) const {
    check_id(id);
    const VocabData& d = vocab_.data();
    const std::string& text = vocab_.text(id);
    std::string out;
    switch (vocab_.type(id)) {
        case TokenType::kControl:
        case TokenType::kUnknown:
            if (render_special) out = text;
            return out;
        case TokenType::kUserDefined: return text;
        case TokenType::kByte:
            if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>' && hex_digit(text[3]) >= 0 &&
                hex_digit(text[4]) >= 0) {
                out.push_back(char(hex_digit(text[3]) * 16 + hex_digit(text[4])));
                return out;
            }
            [[fallthrough]];
        case TokenType::kNormal:
            if (d.model == VocabModel::kSpm || !d.byte_encode) {
                append_unescaped_spaces(out, text);
            } else {
                thread_local std::vector<uint32_t> cps;  // per generated token: no allocation
                unicode::decode_utf8(text, cps);
                for (uint32_t cp : cps) {
                    const int b = unicode::unicode_to_byte(cp);
                    if (b >= 0) {
                        out.push_back(char(b));
                    } else {
                        unicode::append_utf8(out, cp);
                    }
                }
            }
            return out;
        case TokenType::kUnused:
        case TokenType::kUndefined: return out;
    }
    return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
    std::string out;
    bool strip = add_space_prefix();
    for (int32_t id : ids) {
        std::string piece = token_to_piece(id, render_special);
        if (strip && !is_control(id)) {
            strip = false;
            if (!piece.empty() && piece[0] == ' ') {
                out.append(piece, 1);
                continue;
            }
        }
        out += piece;
    }
    return out;
}

std::string take_valid_utf8(std::string& bytes, bool final) {
    static constexpr std::string_view kFffd = "\xEF\xBF\xBD";
    std::string out;
    out.reserve(bytes.size());
    const size_t n = bytes.size();
    size_t i = 0;
    while (i < n) {
        const utf8::Match m = utf8::match(std::string_view(bytes).substr(i));
        if (m.len == 0) {  // not a lead byte
            out += kFffd;
            ++i;
            continue;
        }
        if (m.matched == m.len) {
            out.append(bytes, i, m.len);
            i += m.len;
            continue;
        }
        if (i + m.matched == n && !final) break;  // may still complete: hold it
        out += kFffd;                             // the maximal invalid subpart becomes one U+FFFD
        i += m.matched;
    }
    bytes.erase(0, i);
    return out;
}

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tok, bool render_special, std::vector<int32_t> rendered)
    : tok_(tok), render_special_(render_special), rendered_(std::move(rendered)), strip_space_(tok.add_space_prefix()) {}

std::string StreamingDetokenizer::push(int32_t id) {
    const bool render = render_special_ || std::find(rendered_.begin(), rendered_.end(), id) != rendered_.end();
    std::string piece = tok_.token_to_piece(id, render);
    if (strip_space_ && !tok_.is_control(id)) {
        strip_space_ = false;
        if (!piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    }
    pending_ += piece;
    return take_valid_utf8(pending_, false);
}

std::string StreamingDetokenizer::flush() {
    std::string out = take_valid_utf8(pending_, true);
    reset();
    return out;
}

void StreamingDetokenizer::reset() {
    pending_.clear();
    strip_space_ = tok_.add_space_prefix();
}

}  // namespace cera
