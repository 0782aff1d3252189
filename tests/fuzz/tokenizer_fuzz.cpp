// libFuzzer target for the tokenizers. The input's first byte picks a vocabulary (SentencePiece,
// GPT-2 byte-level BPE, BPE with the DeepSeek-Coder, Falcon, StarCoder, LFM2, Llama-3 and Qwen2
// pre-tokenizers)
// and whether special-token text is parsed; the rest is the text. Any text must encode without an
// exception (invalid UTF-8 becomes U+FFFD) to ids inside the vocabulary, decode, and stream out as
// valid UTF-8; for GPT-2's byte-level BPE, valid UTF-8 text must also come back byte for byte.
// The vocabularies are read from $CERA_FUZZ_VOCAB_DIR (scripts/fuzz extracts them there).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cera/error.h"
#include "core/utf8.h"
#include "tokenizer/tokenizer.h"

namespace {

struct Vocab {
    const char* file;
    bool round_trip;  // decode(encode(text)) == text for valid UTF-8 text without special tokens
};
constexpr Vocab kVocabs[] = {{"ggml-vocab-llama-spm.gguf", false},      {"ggml-vocab-gpt-2.gguf", true},
                             {"ggml-vocab-deepseek-coder.gguf", false}, {"ggml-vocab-falcon.gguf", false},
                             {"ggml-vocab-starcoder.gguf", false},      {"ggml-vocab-phi-3.gguf", false},
                             {"gpt2-vocab-lfm2.gguf", false},           {"gpt2-vocab-llama3.gguf", false},
                             {"qwen3-vocab-qwen2.gguf", false}};
std::vector<std::unique_ptr<cera::Tokenizer>> g_toks;

[[noreturn]] void fail(const char* what, const std::string& text) {
    std::fprintf(stderr, "tokenizer_fuzz: property violated: %s (text of %zu bytes)\n", what, text.size());
    std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const char* dir = std::getenv("CERA_FUZZ_VOCAB_DIR");
    if (!dir) {
        std::fprintf(stderr, "tokenizer_fuzz: set CERA_FUZZ_VOCAB_DIR to the vocabulary directory\n");
        std::exit(2);
    }
    for (const Vocab& v : kVocabs) g_toks.push_back(cera::Tokenizer::from_file(std::string(dir) + "/" + v.file));
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const size_t which = data[0] % (sizeof kVocabs / sizeof kVocabs[0]);
    const bool parse_special = data[0] & 0x80;
    const cera::Tokenizer& tok = *g_toks[which];
    const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
    std::vector<int32_t> ids;
    try {
        ids = tok.encode(text, /*add_bos=*/false, parse_special);
    } catch (const cera::Error&) {
        fail("encode threw", text);
    }
    for (int32_t id : ids)
        if (id < 0 || id >= tok.n_vocab()) fail("id outside the vocabulary", text);
    const std::string back = tok.decode(ids);
    if (kVocabs[which].round_trip && !parse_special && cera::utf8::is_valid(text) && back != text)
        fail("byte-level BPE did not round-trip", text);
    cera::StreamingDetokenizer stream(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (!cera::utf8::is_valid(streamed)) fail("streamed text is not valid UTF-8", text);
    return 0;
}
