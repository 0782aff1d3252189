// Tokenizer: text <-> token ids, matching llama.cpp / Hugging Face tokenizers id for id.
//
//   auto tok = Tokenizer::from_gguf(*file);                 // or from_hf_json("tokenizer.json")
//   std::vector<int32_t> ids = tok->encode("Hello", /*add_bos=*/true, /*parse_special=*/false);
//   std::string text = tok->decode(ids);
//   StreamingDetokenizer d(*tok);  for (id : generated) emit(d.push(id));  emit(d.flush());
//
// Models: SentencePiece-style (`tokenizer.ggml.model` = llama) and BPE (gpt2: byte-level, with the
// pre-tokenizer named by `tokenizer.ggml.pre`; or '▁'-style BPE from a tokenizer.json).
// All methods are const and thread-safe. Bad data or ids throw cera::Error.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace cera {
namespace gguf {
class File;
}

class Tokenizer {
   public:
    explicit Tokenizer(Vocab vocab);

    // Reads the `tokenizer.ggml.*` metadata. Throws kMissing / kInvalidFile / kUnsupported.
    static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& f);
    // Reads a Hugging Face tokenizer.json and, when given (or found next to it), tokenizer_config.json.
    static std::unique_ptr<Tokenizer> from_hf_json(const std::string& tokenizer_json_path,
                                                   const std::string& config_path = "");
    // Opens a .gguf file or a tokenizer.json, by extension.
    static std::unique_ptr<Tokenizer> from_file(const std::string& path);

    // Text to ids. add_bos: prepend BOS (append EOS) when the vocabulary's add_bos (add_eos) says so.
    // parse_special: control tokens written in the text (e.g. "<|im_start|>") become single tokens;
    // when false they are tokenized as plain text. User-defined tokens are always matched (llama.cpp).
    // Invalid UTF-8 in the text is tokenized as U+FFFD.
    std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;

    // Ids to bytes: the concatenated token pieces (see token_to_piece); with a space-prefix vocabulary
    // the first non-control piece loses one leading space. Bytes may be invalid UTF-8 when the ids
    // split a character; StreamingDetokenizer gives valid UTF-8. Throws kOutOfRange on a bad id.
    std::string decode(std::span<const int32_t> ids, bool render_special = false) const;

    // The bytes one token stands for: '▁' -> ' ', <0xNN> -> the byte, GPT-2 characters -> bytes.
    // Control and unknown tokens give "" unless render_special. Throws kOutOfRange on a bad id.
    std::string token_to_piece(int32_t id, bool render_special = false) const;
    // The raw vocabulary text of a token (e.g. "▁Hello", "Ġworld", "<0x0A>"). Throws on a bad id.
    const std::string& token_piece(int32_t id) const;

    int32_t n_vocab() const { return vocab_.n_tokens(); }
    int32_t bos() const { return vocab_.data().bos; }  // kNoToken (-1) when absent
    int32_t eos() const { return vocab_.data().eos; }
    int32_t eot() const { return vocab_.data().eot; }
    int32_t unk() const { return vocab_.data().unk; }
    int32_t pad() const { return vocab_.data().pad; }
    bool add_bos() const { return vocab_.data().add_bos; }
    bool add_eos() const { return vocab_.data().add_eos; }
    bool add_space_prefix() const { return vocab_.data().add_space_prefix; }
    // End of generation: EOS, EOT, EOM and tokens such as <|im_end|>, <|endoftext|>, <|eot_id|>.
    bool is_eog(int32_t id) const { return vocab_.is_eog(id); }
    // Control or unknown token (rendered as "" unless asked).
    bool is_control(int32_t id) const;
    TokenType token_type(int32_t id) const;
    // Id of a token with exactly this vocabulary text.
    std::optional<int32_t> find_token(std::string_view text) const;
    // The chat template from the file (tokenizer.chat_template / tokenizer_config.json), or "".
    const std::string& chat_template() const { return vocab_.data().chat_template; }
    const Vocab& vocab() const { return vocab_; }

   private:
    struct Fragment {
        int32_t token;  // kNoToken for text
        size_t offset, length;
    };
    void partition(std::string_view text, bool parse_special, std::vector<Fragment>& out) const;
    void encode_text(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;
    void check_id(int32_t id) const;

    Vocab vocab_;
};

// Turns generated ids into text as they arrive. Every string returned is valid UTF-8: bytes of a
// character split across tokens are held until the character is complete; bytes that can never
// form a character become U+FFFD as soon as that is certain, and an unfinished character left at
// the end becomes U+FFFD in flush(). The concatenated output equals decode() of the same ids
// whenever that is valid UTF-8.
class StreamingDetokenizer {
   public:
    // rendered: control tokens whose text is kept although render_special is off (a tool-call format's
    // markers, which the caller parses).
    explicit StreamingDetokenizer(const Tokenizer& tok, bool render_special = false,
                                  std::vector<int32_t> rendered = {});
    std::string push(int32_t id);  // text that is now complete (may be ""); throws kOutOfRange
    std::string flush();           // the rest, and starts a new stream
    void reset();                  // drops held bytes, starts a new stream

   private:
    const Tokenizer& tok_;
    bool render_special_;
    std::vector<int32_t> rendered_;
    bool strip_space_;
    std::string pending_;
};

// Replaces every invalid UTF-8 sequence of `bytes` by U+FFFD (one per maximal invalid subpart).
// When !final, an incomplete character at the end is left in `bytes` (removed from the front otherwise).
std::string take_valid_utf8(std::string& bytes, bool final);

}  // namespace cera
