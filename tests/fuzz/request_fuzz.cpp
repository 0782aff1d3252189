// libFuzzer target for the server's request parser (src/server/request.cpp). The input's first byte
// picks the endpoint (chat, completions, embeddings, tokenize, detokenize, llama.cpp's completion); the
// rest is the body. Any
// body must either parse into options within their documented bounds or be refused with a 4xx status
// and an error body that serializes; nothing else may escape, crash or hang.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "chat/tool_call_stream.h"
#include "server/request.h"

namespace {

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "request_fuzz: property violated: %s\n", what);
    std::abort();
}

void check(const cera::CompletionRequest& r, const cera::RequestLimits& limits) {
    const cera::GenerateOptions& g = r.options;
    if (r.n < 1 || r.n > cera::kMaxChoices) fail("n out of range");
    if (g.logprobs < -1 || g.logprobs > cera::kMaxTopLogprobs) fail("logprobs out of range");
    if (g.max_tokens < -1) fail("max_tokens below -1");
    if (!(g.sampling.temperature >= 0.0f && g.sampling.temperature <= 2.0f)) fail("temperature out of range");
    if (!(g.sampling.top_p >= 0.0f && g.sampling.top_p <= 1.0f)) fail("top_p out of range");
    if (!(g.sampling.repeat_penalty > 0.0f)) fail("repeat_penalty not positive");
    for (const auto& [id, bias] : g.sampling.logit_bias)
        if (id < 0 || id >= limits.n_vocab || !(bias >= -100.0f && bias <= 100.0f)) fail("logit_bias out of range");
    if (r.chat && r.messages.empty()) fail("chat without messages");
    if (!r.tools.empty() && (!g.grammar || r.tool_choice.choice == cera::ToolChoice::kNone))
        fail("tools without a grammar");
    for (int32_t id : r.prompt.ids)
        if (id < 0 || id >= limits.n_vocab) fail("prompt id outside the vocabulary");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const cera::RequestLimits limits{"tiny", 1000, 256};
    const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
    // The body as a model's output, through the tool-call parsers of every format, whole and streamed
    // in pieces: calls or text, never a crash, and no argument fragment before its call's announcement.
    for (cera::ToolCallFormat f : {cera::ToolCallFormat::kLfm2, cera::ToolCallFormat::kHermes,
                                   cera::ToolCallFormat::kLlama3, cera::ToolCallFormat::kGranite}) {
        const cera::ParsedToolCalls whole = cera::parse_tool_calls(body, f);
        cera::ToolCallStream stream(f, "c");
        std::vector<std::string> args;
        auto take = [&](const cera::ToolStreamDelta& d) {
            for (const cera::ToolCallDelta& c : d.calls) {
                if (!c.id.empty()) args.emplace_back();
                if (c.index >= args.size()) fail("tool-call arguments before the call");
                args[c.index] += c.arguments;
            }
        };
        const size_t piece = size_t(data[0] % 7) + 1;
        for (size_t i = 0; i < body.size(); i += piece) take(stream.push(body.substr(i, piece)));
        take(stream.finish());
        if (stream.result().calls.size() != whole.calls.size()) fail("streamed and whole parses differ");
    }
    try {
        switch (data[0] % 7) {
            case 0:
                check(cera::parse_completion(body, true, limits), limits);
                break;
            case 1:
                check(cera::parse_completion(body, false, limits), limits);
                break;
            case 2: {
                const cera::EmbeddingRequest e = cera::parse_embedding(body, limits);
                if (e.inputs.empty()) fail("embedding without inputs");
                for (const cera::PromptInput& in : e.inputs)
                    if (in.is_ids ? in.ids.empty() : in.text.empty()) fail("an empty embedding input");
                break;
            }
            case 3:
                (void)cera::parse_tokenize(body, limits);
                break;
            case 5:
                check(cera::parse_native_completion(body, limits), limits);
                break;
            case 6: {
                const cera::CompletionRequest r = cera::parse_native_infill(body, limits);
                check(r, limits);
                if (!r.suffix || r.prompt.is_ids) fail("infill without its suffix, or with token ids");
                break;
            }
            default:
                for (int32_t id : cera::parse_detokenize(body, limits))
                    if (id < 0 || id >= limits.n_vocab) fail("detokenize id outside the vocabulary");
        }
    } catch (const cera::Refusal& r) {
        if (r.status < 400 || r.status >= 500) fail("a refusal without a 4xx status");
        if (r.message.empty()) fail("a refusal without a message");
        (void)cera::error_body(r).dump();  // throws on invalid UTF-8
    }
    return 0;
}
