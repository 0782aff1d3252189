// Request bodies of the OpenAI-compatible server as plain structs: the JSON of each endpoint is
// checked and turned into options here, without a model (the routes tokenize and submit), so that the
// parser alone can be tested and fuzzed (tests/fuzz/request_fuzz.cpp). Anything a client may send that
// is not a valid request throws Refusal: an HTTP status and the fields of an OpenAI error body.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cera/session.h"
#include "chat/chat_template.h"
#include "chat/tool_calls.h"
#include "chat/tool_grammar.h"

namespace cera {

// A request the server refuses: its HTTP status and the OpenAI error fields ("" is null).
struct Refusal {
    int status = 400;
    std::string message, type = "invalid_request_error", param, code;
};
[[noreturn]] void refuse(const std::string& message, const std::string& param = "", int status = 400,
                         const std::string& type = "invalid_request_error", const std::string& code = "");
// {"error": {"message", "type", "param", "code"}}.
nlohmann::ordered_json error_body(const Refusal& r);

// What the parser checks a request against.
struct RequestLimits {
    std::string model;  // the base model's id; a request naming no model it serves is refused (404)
    int32_t n_vocab = 0;
    int32_t n_ctx = 0;  // the longest sequence; also the penalties' window (they count every token so far)
    // Whether a name is a loaded LoRA adapter, which a request selects with "model" ("base": the base
    // model). Null: no adapters.
    std::function<bool(const std::string&)> is_adapter;
    ToolCallFormat tool_format = ToolCallFormat::kHermes;  // how the model writes tool calls
    // Images: whether the model takes them (a vision projector is loaded), and the folder whose files
    // image_url parts may name (file:// URLs or absolute paths); empty: data: URLs only.
    bool vision = false;
    std::string local_images_dir;
    size_t max_image_bytes = size_t(20) << 20;  // an image's encoded size
};

// An image_url content part: the file's bytes (a data: URL), or a local file inside
// RequestLimits::local_images_dir (canonical path; read when the request runs).
struct ImageSource {
    std::vector<uint8_t> bytes;
    std::string path;
};

// The most top_logprobs (chat) or logprobs (completions) alternatives a request may ask for.
constexpr int32_t kMaxTopLogprobs = 20;
// The most choices a request may ask for (n).
constexpr int32_t kMaxChoices = 128;

// A prompt as the client gave it: text to tokenize, or token ids.
struct PromptInput {
    std::string text;
    std::vector<int32_t> ids;
    bool is_ids = false;
};

// /v1/chat/completions and /v1/completions.
struct CompletionRequest {
    bool chat = false;
    std::vector<ChatMessage> messages;  // chat; an image part is an "<image>" marker in its message's content
    std::vector<ImageSource> images;    // chat: the image parts, in order
    PromptInput prompt;                 // completions
    // Fill in the middle: the text after the insertion (completions' suffix, /infill's input_suffix; the
    // prompt's text is the code before it), the start of the middle (/infill's prompt), and the field
    // a model without FIM tokens is refused against.
    std::optional<std::string> suffix;
    std::string middle;
    std::vector<InfillFile> context;  // /infill's input_extra: other files' text
    const char* suffix_param = "suffix";
    GenerateOptions options;            // sampling, stop, max_tokens, logit_bias, logprobs (-1: none)
    bool seeded = false;                // the client gave a seed; else options.sampling.seed is random
    int32_t n = 1;                      // choices, each its own request with seed + index
    bool stream = false;
    bool include_usage = false;  // stream_options.include_usage
    std::string user;            // accepted and logged, nothing else
    // Chat tools: the definitions as the client sent them (a JSON array, for the template's `tools`;
    // empty for none or tool_choice "none"), and how calls are constrained (options.grammar holds the
    // grammar). The reply's text is parsed into tool calls when tools is non-empty.
    std::string tools_json;
    std::vector<ToolDef> tools;
    ToolGrammarOptions tool_choice;
    // chat_template_kwargs (as vLLM and llama.cpp take them, e.g. {"enable_thinking": false}): more
    // template variables, booleans as "true" / "false".
    std::map<std::string, std::string> template_kwargs;
    // reasoning_format (llama.cpp's): "none" keeps a reply's <think> block in its content, "auto" or
    // "deepseek" splits it into reasoning_content; unset: the server's choice.
    std::optional<bool> split_reasoning;
    // The grammar is the client's GBNF ("grammar"), which describes the whole reply; the others
    // (schemas, tool calls) describe the answer, after any thinking.
    bool whole_reply_grammar = false;
};

// /v1/embeddings.
struct EmbeddingRequest {
    std::vector<PromptInput> inputs;
    bool base64 = false;  // encoding_format "base64": little-endian float32 bytes
};

// The body as a JSON object naming no other model; Refusal otherwise.
nlohmann::ordered_json parse_body(std::string_view body, const RequestLimits& limits);
CompletionRequest parse_completion(std::string_view body, bool chat, const RequestLimits& limits);
// llama.cpp's /completion: n_predict for max_tokens (negative: none), llama.cpp's sampling defaults
// (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05) where the body sets none, one choice; the other
// fields as /v1/completions reads them. n_probs is refused.
CompletionRequest parse_native_completion(std::string_view body, const RequestLimits& limits);
// llama.cpp's /infill: input_prefix and input_suffix around the insertion, prompt the start of the
// middle, input_extra ([{filename, text}]) other files' text, the other fields as /completion reads them.
CompletionRequest parse_native_infill(std::string_view body, const RequestLimits& limits);
EmbeddingRequest parse_embedding(std::string_view body, const RequestLimits& limits);
// /tokenize: {"content": string, "add_special": bool}.
struct TokenizeRequest {
    std::string content;
    bool add_special = false;
};
// Decodes standard base64 (padding optional); false on any other character or a bad length.
bool base64_decode(std::string_view in, std::vector<uint8_t>& out);
TokenizeRequest parse_tokenize(std::string_view body, const RequestLimits& limits);
// /detokenize: {"tokens": [ids]}.
std::vector<int32_t> parse_detokenize(std::string_view body, const RequestLimits& limits);

}  // namespace cera
