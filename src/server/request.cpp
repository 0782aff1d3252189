#include "server/request.h"

#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "cera/error.h"
#include "cera/grammar.h"
#include "chat/reasoning.h"

namespace cera {

using json = nlohmann::ordered_json;

void refuse(const std::string& message, const std::string& param, int status, const std::string& type,
            const std::string& code) {
    throw Refusal{status, message, type, param, code};
}

json error_body(const Refusal& r) {
    auto opt = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
    return {{"error", {{"message", r.message}, {"type", r.type}, {"param", opt(r.param)}, {"code", opt(r.code)}}}};
}

namespace {

// Typed fields of a request body; a null field is an absent one.
const json* field(const json& j, const char* key) {
    const auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
}
std::string quoted(const char* key) { return std::string("'") + key + "'"; }
double number(const json& j, const char* key, double def, double lo, double hi) {
    const json* v = field(j, key);
    if (!v) return def;
    if (!v->is_number()) refuse(quoted(key) + " must be a number", key);
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi))
        refuse(quoted(key) + " must be between " + json(lo).dump() + " and " + json(hi).dump(), key);
    return x;
}
int64_t integer(const json& j, const char* key, int64_t def, int64_t lo, int64_t hi) {
    const json* v = field(j, key);
    if (!v) return def;
    if (!v->is_number_integer()) refuse(quoted(key) + " must be an integer", key);
    // An unsigned value above INT64_MAX is out of every range here.
    if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX))
        refuse(quoted(key) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi), key);
    const int64_t x = v->get<int64_t>();
    if (x < lo || x > hi)
        refuse(quoted(key) + " must be between " + std::to_string(lo) + " and " + std::to_string(hi), key);
    return x;
}
bool boolean(const json& j, const char* key, bool def) {
    const json* v = field(j, key);
    if (!v) return def;
    if (!v->is_boolean()) refuse(quoted(key) + " must be a boolean", key);
    return v->get<bool>();
}

// Token ids of the vocabulary, from a JSON array (param names the field for the error).
std::vector<int32_t> token_ids(const json& a, const RequestLimits& limits, const char* param) {
    std::vector<int32_t> ids;
    ids.reserve(a.size());
    for (const json& x : a) {
        if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() >= uint64_t(limits.n_vocab)) ||
            x.get<int64_t>() < 0 || x.get<int64_t>() >= limits.n_vocab)
            refuse(quoted(param) + " token ids must be integers in [0, " + std::to_string(limits.n_vocab) + ")", param);
        ids.push_back(x.get<int32_t>());
    }
    return ids;
}

bool is_id_list(const json& a) { return a.is_array() && !a.empty() && a[0].is_number(); }

std::vector<std::pair<int32_t, float>> logit_bias(const json& j, const RequestLimits& limits) {
    std::vector<std::pair<int32_t, float>> out;
    const json* b = field(j, "logit_bias");
    if (!b) return out;
    if (!b->is_object()) refuse("'logit_bias' must be an object of token ids to biases", "logit_bias");
    for (const auto& [key, value] : b->items()) {
        size_t used = 0;
        long long id = -1;
        try {
            id = std::stoll(key, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (key.empty() || used != key.size() || id < 0 || id >= limits.n_vocab)
            refuse("'logit_bias' keys must be token ids in [0, " + std::to_string(limits.n_vocab) + ")", "logit_bias");
        if (!value.is_number() || !(value.get<double>() >= -100.0 && value.get<double>() <= 100.0))
            refuse("'logit_bias' values must be numbers between -100 and 100", "logit_bias");
        out.emplace_back(int32_t(id), float(value.get<double>()));
    }
    return out;
}

// The grammar a request constrains its output with: OpenAI's response_format (json_object, or
// json_schema with its schema), or llama.cpp's server fields json_schema and grammar (GBNF); null for
// none.
std::shared_ptr<const Grammar> output_grammar(const json& j) {
    int given = 0;
    for (const char* key : {"response_format", "json_schema", "grammar"}) given += field(j, key) ? 1 : 0;
    if (given > 1) refuse("give one of 'response_format', 'json_schema' and 'grammar'", "response_format");
    auto build = [](const char* param, auto&& make) -> std::shared_ptr<const Grammar> {
        try {
            return make();
        } catch (const Error& e) {
            refuse(quoted(param) + ": " + e.what(), param);
        }
        return nullptr;
    };
    if (const json* g = field(j, "grammar")) {
        if (!g->is_string()) refuse("'grammar' must be a string of GBNF", "grammar");
        return build("grammar", [&] { return Grammar::parse(g->get<std::string>()); });
    }
    if (const json* s = field(j, "json_schema")) {
        if (!s->is_object() && !s->is_boolean()) refuse("'json_schema' must be a JSON Schema object", "json_schema");
        return build("json_schema", [&] { return Grammar::from_json_schema(s->dump()); });
    }
    const json* rf = field(j, "response_format");
    if (!rf) return nullptr;
    const json* type = rf->is_object() ? field(*rf, "type") : nullptr;
    if (!type || !type->is_string())
        refuse("'response_format' must be an object with a 'type' (text, json_object or json_schema)",
               "response_format");
    const std::string t = type->get<std::string>();
    if (t == "text") return nullptr;
    if (t == "json_object") return Grammar::json();
    if (t != "json_schema")
        refuse("'response_format' type '" + t + "' is not text, json_object or json_schema", "response_format");
    const json* js = field(*rf, "json_schema");
    const json* schema = js && js->is_object() ? field(*js, "schema") : nullptr;
    if (!schema)
        refuse("'response_format' of type json_schema needs 'json_schema': {'schema': {...}}", "response_format");
    return build("response_format", [&] { return Grammar::from_json_schema(schema->dump()); });
}

// tools, tool_choice and parallel_tool_calls (chat): the definitions checked, and the grammar that
// makes the calls valid (none for tool_choice "none", where the tools are not shown to the model).
void tools(const json& j, const RequestLimits& limits, CompletionRequest& r) {
    const json* t = field(j, "tools");
    const json* choice = field(j, "tool_choice");
    if (!r.chat) {
        for (const char* key : {"tools", "tool_choice", "parallel_tool_calls"})
            if (field(j, key)) refuse(quoted(key) + " is for chat completions only", key);
        return;
    }
    ToolGrammarOptions& o = r.tool_choice;
    o.parallel = boolean(j, "parallel_tool_calls", true);
    o.choice = t ? ToolChoice::kAuto : ToolChoice::kNone;
    if (choice && choice->is_string()) {
        const std::string c = choice->get<std::string>();
        if (c == "none")
            o.choice = ToolChoice::kNone;
        else if (c == "auto")
            o.choice = ToolChoice::kAuto;
        else if (c == "required")
            o.choice = ToolChoice::kRequired;
        else
            refuse(
                "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                "{\"name\": ...}}",
                "tool_choice");
    } else if (choice) {
        const json* fn = choice->is_object() ? field(*choice, "function") : nullptr;
        const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
        if (!name || !name->is_string() || (field(*choice, "type") && (*choice)["type"] != "function"))
            refuse(
                "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                "{\"name\": ...}}",
                "tool_choice");
        o.choice = ToolChoice::kNamed;
        o.function = name->get<std::string>();
    }
    if (!t) {
        if (o.choice != ToolChoice::kNone) refuse("'tool_choice' needs 'tools'", "tool_choice");
        return;
    }
    if (!t->is_array() || t->empty()) refuse("'tools' must be a non-empty list of function definitions", "tools");
    for (size_t i = 0; i < t->size(); ++i) {
        const json& x = (*t)[i];
        const std::string at = "'tools[" + std::to_string(i) + "]'";
        if (!x.is_object()) refuse(at + " must be an object {\"type\": \"function\", \"function\": {...}}", "tools");
        if (const json* type = field(x, "type"); type && *type != "function")
            refuse(at + " has type " + type->dump() + "; only \"function\" tools are supported", "tools");
        const json* fn = field(x, "function");
        if (!fn || !fn->is_object()) refuse(at + " needs a 'function' object", "tools");
        const json* name = field(*fn, "name");
        if (!name || !name->is_string()) refuse(at + " needs a 'function.name' string", "tools");
        ToolDef d{name->get<std::string>(), ""};
        if (const json* params = field(*fn, "parameters")) {
            if (!params->is_object()) refuse(at + " 'function.parameters' must be a JSON Schema object", "tools");
            d.parameters_json = params->dump();
        }
        for (const ToolDef& other : r.tools)
            if (other.name == d.name) refuse(at + " repeats the function name '" + d.name + "'", "tools");
        r.tools.push_back(std::move(d));
    }
    // The grammar checks names and schemas even when tool_choice is "none": a bad tool is a bad request.
    ToolGrammarOptions check = o;
    if (check.choice == ToolChoice::kNone) check.choice = ToolChoice::kRequired;
    std::shared_ptr<const Grammar> g;
    try {
        g = tool_call_grammar(limits.tool_format, r.tools, check);
    } catch (const Error& e) {
        const bool named = std::string(e.what()).rfind("tool_choice", 0) == 0;  // the named function is missing
        refuse(named ? std::string(e.what()) : std::string("'tools': ") + e.what(), named ? "tool_choice" : "tools");
    }
    if (o.choice == ToolChoice::kNone) {
        r.tools.clear();
        return;
    }
    if (r.options.grammar)
        refuse("give either 'tools' or one of 'response_format', 'json_schema' and 'grammar'", "tools");
    r.options.grammar = g;
    r.tools_json = t->dump();
}

// The sampling and stopping fields shared by both completion endpoints.
void generation(const json& j, const RequestLimits& limits, CompletionRequest& r) {
    GenerateOptions& g = r.options;
    SamplerParams& s = g.sampling;
    s.temperature = float(number(j, "temperature", 1.0, 0.0, 2.0));
    s.top_p = float(number(j, "top_p", 1.0, 0.0, 1.0));
    s.top_k = int32_t(integer(j, "top_k", 0, -1, 1 << 30));
    s.min_p = float(number(j, "min_p", 0.0, 0.0, 1.0));
    s.presence_penalty = float(number(j, "presence_penalty", 0.0, -2.0, 2.0));
    s.frequency_penalty = float(number(j, "frequency_penalty", 0.0, -2.0, 2.0));
    s.repeat_penalty = float(number(j, "repeat_penalty", 1.0, 0.01, 10.0));
    s.penalty_last_n = std::max(limits.n_ctx, 1);  // the API's penalties count every token so far
    s.logit_bias = logit_bias(j, limits);
    const json* seed = field(j, "seed");
    if (seed && !seed->is_number_integer()) refuse("'seed' must be an integer", "seed");
    r.seeded = seed != nullptr;
    s.seed = seed ? seed->get<uint64_t>() : (uint64_t(std::random_device{}()) << 32 | std::random_device{}());
    const int64_t max_tokens = integer(j, "max_tokens", -1, 0, int64_t(1) << 30);
    g.max_tokens = int32_t(integer(j, "max_completion_tokens", max_tokens, 0, int64_t(1) << 30));
    if (const json* stop = field(j, "stop")) {
        if (stop->is_string()) {
            g.stop.push_back(stop->get<std::string>());
        } else if (stop->is_array()) {
            for (const json& x : *stop) {
                if (!x.is_string()) refuse("'stop' must be a string or a list of strings", "stop");
                g.stop.push_back(x.get<std::string>());
            }
        } else {
            refuse("'stop' must be a string or a list of strings", "stop");
        }
    }
    g.ignore_eos = boolean(j, "ignore_eos", false);  // as llama.cpp's server: load tools ask for exact lengths
    g.grammar = output_grammar(j);
    r.whole_reply_grammar = g.grammar && field(j, "grammar");
    tools(j, limits, r);
    r.n = int32_t(integer(j, "n", 1, 1, kMaxChoices));
    if (const json* u = field(j, "user")) {
        if (!u->is_string()) refuse("'user' must be a string", "user");
        r.user = u->get<std::string>();
    }
    r.stream = boolean(j, "stream", false);
    if (const json* so = field(j, "stream_options")) {
        if (!so->is_object()) refuse("'stream_options' must be an object", "stream_options");
        r.include_usage = boolean(*so, "include_usage", false);
    }
    if (r.chat) {
        // logprobs: a boolean; top_logprobs: the alternatives, which need logprobs.
        const bool logprobs = boolean(j, "logprobs", false);
        const int64_t top = integer(j, "top_logprobs", -1, 0, kMaxTopLogprobs);
        if (top >= 0 && !logprobs) refuse("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
        g.logprobs = logprobs ? int32_t(std::max<int64_t>(top, 0)) : -1;
    } else {
        g.logprobs = int32_t(integer(j, "logprobs", -1, 0, kMaxTopLogprobs));
    }
}

// An image_url part's URL: a data: URL's bytes, or a file inside the allowed folder.
ImageSource image_source(const json& part, const RequestLimits& limits) {
    if (!limits.vision)
        refuse("this model takes no images (start the server with --mmproj)", "messages");
    const json* iu = field(part, "image_url");
    const json* url = iu && iu->is_object() ? field(*iu, "url") : iu;
    if (!url || !url->is_string()) refuse("an image_url part needs 'image_url': {'url': string}", "messages");
    const std::string u = url->get<std::string>();
    ImageSource src;
    if (u.rfind("data:", 0) == 0) {
        const size_t comma = u.find(',');
        if (comma == std::string::npos || comma < 12 || u.compare(comma - 7, 7, ";base64") != 0)
            refuse("an image data: URL must be data:<type>;base64,<data>", "messages");
        const std::string_view data = std::string_view(u).substr(comma + 1);
        if (data.size() / 4 * 3 > limits.max_image_bytes + 3)
            refuse("an image of over " + std::to_string(limits.max_image_bytes) + " bytes", "messages", 413);
        if (!base64_decode(data, src.bytes)) refuse("an image data: URL whose base64 is malformed", "messages");
        if (src.bytes.empty()) refuse("an empty image", "messages");
        return src;
    }
    std::string path;
    if (u.rfind("file://", 0) == 0)
        path = u.substr(7);
    else if (!u.empty() && u[0] == '/')
        path = u;
    else if (u.find("://") != std::string::npos)
        refuse("image URLs must be data: URLs (or local files with --allow-local-images); '" +
                   u.substr(0, u.find("://")) + "' is not fetched",
               "messages");
    else
        refuse("an image URL must be a data: URL, a file:// URL or an absolute path", "messages");
    if (limits.local_images_dir.empty())
        refuse("local image files are not allowed (start the server with --allow-local-images DIR)", "messages", 403,
               "permission_error");
    std::error_code ec, ec_dir;
    const std::filesystem::path real = std::filesystem::canonical(path, ec);
    const std::filesystem::path dir = std::filesystem::canonical(limits.local_images_dir, ec_dir);
    auto inside = [&] {
        auto d = dir.begin(), r = real.begin();
        for (; d != dir.end(); ++d, ++r)
            if (r == real.end() || *d != *r) return false;
        return true;
    };
    if (ec || ec_dir || !inside())
        refuse("image file " + path + ": not found inside the folder the server allows", "messages", 403,
               "permission_error");
    if (!std::filesystem::is_regular_file(real, ec)) refuse("image file " + path + ": not a file", "messages");
    if (std::filesystem::file_size(real, ec) > limits.max_image_bytes)
        refuse("image file " + path + ": over " + std::to_string(limits.max_image_bytes) + " bytes", "messages", 413);
    src.path = real.string();
    return src;
}

std::vector<ChatMessage> messages(const json& j, const RequestLimits& limits, std::vector<ImageSource>& images) {
    const json* m = field(j, "messages");
    if (!m || !m->is_array() || m->empty()) refuse("'messages' must be a non-empty list", "messages");
    std::vector<ChatMessage> out;
    for (const json& x : *m) {
        if (!x.is_object() || !x.contains("role") || !x["role"].is_string())
            refuse("each message needs a 'role' string", "messages");
        ChatMessage c;
        c.role = x["role"].get<std::string>();
        if (c.role == "developer") c.role = "system";
        if (c.role != "system" && c.role != "user" && c.role != "assistant" && c.role != "tool")
            refuse("unknown message role '" + c.role + "'", "messages");
        const json* content = field(x, "content");
        if (content && content->is_string()) {
            c.content = content->get<std::string>();
        } else if (content && content->is_array()) {
            for (const json& part : *content) {
                const json* type = part.is_object() ? field(part, "type") : nullptr;
                if (type && *type == "image_url") {
                    if (c.role != "user") refuse("only user messages may hold images", "messages");
                    images.push_back(image_source(part, limits));
                    c.content += "<image>";
                    continue;
                }
                if (!type || *type != "text" || !part.contains("text") || !part["text"].is_string())
                    refuse("content parts must be of type 'text' or 'image_url'", "messages");
                c.content += part["text"].get<std::string>();
            }
        } else if (content) {
            refuse("a message's 'content' must be a string or a list of parts", "messages");
        }
        if (const json* id = field(x, "tool_call_id"); id && id->is_string()) c.tool_call_id = id->get<std::string>();
        if (const json* calls = field(x, "tool_calls")) {
            // An assistant's earlier calls, as OpenAI clients send them back.
            if (!calls->is_array()) refuse("a message's 'tool_calls' must be a list", "messages");
            for (const json& tc : *calls) {
                const json* fn = tc.is_object() ? field(tc, "function") : nullptr;
                const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
                if (!name || !name->is_string())
                    refuse("each of a message's 'tool_calls' needs 'function': {'name', 'arguments'}", "messages");
                ToolCall call;
                call.name = name->get<std::string>();
                if (const json* id = field(tc, "id"); id && id->is_string()) call.id = id->get<std::string>();
                const json* args = field(*fn, "arguments");
                if (args && args->is_string())
                    call.arguments_json = args->get<std::string>();
                else if (args && args->is_object())
                    call.arguments_json = args->dump();
                else if (args)
                    refuse("a tool call's 'function.arguments' must be a JSON string", "messages");
                else
                    call.arguments_json = "{}";
                c.tool_calls.push_back(std::move(call));
            }
        }
        if (const json* name = field(x, "name"); name && name->is_string()) c.name = name->get<std::string>();
        // An assistant's earlier thinking, sent back as the server returned it (templates such as Qwen3's
        // render it); "reasoning" is the newer name some clients use.
        for (const char* key : {"reasoning_content", "reasoning"})
            if (const json* r = field(x, key); r && r->is_string() && c.reasoning_content.empty())
                c.reasoning_content = r->get<std::string>();
        out.push_back(std::move(c));
    }
    return out;
}

PromptInput completion_prompt(const json& j, const RequestLimits& limits) {
    const json* p = field(j, "prompt");
    if (!p) refuse("'prompt' is required", "prompt");
    PromptInput in;
    if (p->is_string()) {
        in.text = p->get<std::string>();
        return in;
    }
    if (is_id_list(*p) || (p->is_array() && p->size() == 1 && is_id_list((*p)[0]))) {
        in.ids = token_ids(is_id_list(*p) ? *p : (*p)[0], limits, "prompt");
        in.is_ids = true;
        return in;
    }
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
        in.text = (*p)[0].get<std::string>();
        return in;
    }
    refuse("'prompt' must be a string, a list of one string, or a list of token ids", "prompt");
}

}  // namespace

json parse_body(std::string_view body, const RequestLimits& limits) {
    json j = json::parse(body, nullptr, false);
    if (j.is_discarded())
        refuse(body.empty() ? "the request has no body (a JSON object)" : "the request body is not valid JSON");
    if (!j.is_object()) refuse("the request body must be a JSON object");
    // Writing a value out (a schema, tools, arguments) recurses once a level, so depth is bounded first;
    // the walk here is iterative.
    constexpr size_t kMaxDepth = 256;
    std::vector<std::pair<const json*, size_t>> stack{{&j, 1}};
    while (!stack.empty()) {
        const auto [v, depth] = stack.back();
        stack.pop_back();
        if (depth > kMaxDepth)
            refuse("the request body is nested deeper than " + std::to_string(kMaxDepth) + " levels");
        if (v->is_structured())
            for (const json& c : *v) stack.emplace_back(&c, depth + 1);
    }
    const json* m = field(j, "model");
    // (A value that is not a string is not echoed: dumping a deeply nested one would recurse as deep.)
    if (m && !m->is_string()) refuse("'model' must be a string", "model");
    if (m && m->get<std::string>() != limits.model && m->get<std::string>() != "base" &&
        !(limits.is_adapter && limits.is_adapter(m->get<std::string>())))
        refuse("the model '" + m->get<std::string>() + "' does not exist", "model", 404, "invalid_request_error",
               "model_not_found");
    return j;
}

namespace {
// GenerateOptions::adapter for the body's "model": "" for the base model's id or none, else the name
// ("base" or an adapter's).
std::string adapter_of(const json& j, const RequestLimits& limits) {
    const json* m = field(j, "model");
    if (!m || m->get<std::string>() == limits.model) return "";
    return m->get<std::string>();
}
}  // namespace

CompletionRequest parse_native_completion(std::string_view body, const RequestLimits& limits) {
    json j = parse_body(body, limits);
    // n_probs: each sampled token's log-probability and its n_probs most likely alternatives, as the
    // OpenAI completions' logprobs count them.
    const int64_t n_probs = integer(j, "n_probs", 0, 0, kMaxTopLogprobs);
    for (const char* k : {"n", "logprobs", "top_logprobs", "echo", "suffix", "best_of", "stream_options", "n_probs"})
        j.erase(k);
    if (n_probs > 0) j["logprobs"] = n_probs;
    if (const json* n = field(j, "n_predict")) {
        if (!n->is_number_integer()) refuse("'n_predict' must be an integer", "n_predict");
        if (n->get<int64_t>() >= 0 && !field(j, "max_tokens")) j["max_tokens"] = *n;
        j.erase("n_predict");
    }
    for (const auto& [key, value] :
         {std::pair<const char*, json>{"temperature", 0.8}, {"top_k", 40}, {"top_p", 0.95}, {"min_p", 0.05}})
        if (!field(j, key)) j[key] = value;
    CompletionRequest r;
    r.prompt = completion_prompt(j, limits);
    generation(j, limits, r);
    r.options.adapter = adapter_of(j, limits);
    return r;
}

CompletionRequest parse_native_infill(std::string_view body, const RequestLimits& limits) {
    json j = parse_body(body, limits);
    auto text = [&](const char* key) {
        const json* f = field(j, key);
        if (f && !f->is_string()) refuse(quoted(key) + " must be a string", key);
        return f ? f->get<std::string>() : std::string();
    };
    const std::string prefix = text("input_prefix"), suffix = text("input_suffix"), middle = text("prompt");
    std::vector<InfillFile> context;
    if (const json* x = field(j, "input_extra")) {
        if (!x->is_array()) refuse("'input_extra' must be a list of {\"filename\", \"text\"} objects", "input_extra");
        for (const json& c : *x) {
            const json* name = c.is_object() ? field(c, "filename") : nullptr;
            const json* body = c.is_object() ? field(c, "text") : nullptr;
            if (!body || !body->is_string() || (name && !name->is_string()))
                refuse("'input_extra' must be a list of {\"filename\", \"text\"} objects", "input_extra");
            context.push_back({name ? name->get<std::string>() : std::string(), body->get<std::string>()});
        }
    }
    for (const char* k : {"input_prefix", "input_suffix", "input_extra"}) j.erase(k);
    j["prompt"] = "-";  // the shared fields' parse wants one; the prompt is built from the pieces
    CompletionRequest r = parse_native_completion(j.dump(), limits);
    r.prompt = PromptInput{};
    r.prompt.text = prefix;
    r.suffix = suffix;
    r.middle = middle;
    r.context = std::move(context);
    r.suffix_param = "input_suffix";
    return r;
}

CompletionRequest parse_completion(std::string_view body, bool chat, const RequestLimits& limits) {
    const json j = parse_body(body, limits);
    CompletionRequest r;
    r.chat = chat;
    if (chat) {
        r.messages = messages(j, limits, r.images);
        if (const json* kw = field(j, "chat_template_kwargs")) {
            if (!kw->is_object()) refuse("'chat_template_kwargs' must be an object", "chat_template_kwargs");
            for (const auto& [k, v] : kw->items()) {
                static const std::set<std::string> kOwn = {"messages", "tools", "add_generation_prompt", "bos_token",
                                                           "eos_token"};
                if (kOwn.count(k)) refuse("'chat_template_kwargs' cannot set '" + k + "'", "chat_template_kwargs");
                if (!v.is_boolean() && !v.is_string())
                    refuse("'chat_template_kwargs' values must be booleans or strings", "chat_template_kwargs");
                r.template_kwargs[k] = v.is_boolean() ? (v.get<bool>() ? "true" : "false") : v.get<std::string>();
            }
        }
        if (const json* f = field(j, "reasoning_format")) {
            bool split = false;
            if (!f->is_string() || !parse_reasoning_format(f->get<std::string>(), split))
                refuse("'reasoning_format' must be \"none\", \"auto\" or \"deepseek\"", "reasoning_format");
            r.split_reasoning = split;
        }
    } else {
        r.prompt = completion_prompt(j, limits);
        if (boolean(j, "echo", false)) refuse("'echo' is not supported", "echo");
        if (const json* s = field(j, "suffix"); s && !s->is_null()) {
            if (!s->is_string()) refuse("'suffix' must be a string", "suffix");
            if (r.prompt.is_ids) refuse("'suffix' needs the prompt as text", "suffix");
            r.suffix = s->get<std::string>();
        }
        if (field(j, "best_of") && integer(j, "best_of", 1, 1, kMaxChoices) != 1)
            refuse("'best_of' above 1 is not supported", "best_of");
    }
    generation(j, limits, r);
    r.options.adapter = adapter_of(j, limits);
    return r;
}

EmbeddingRequest parse_embedding(std::string_view body, const RequestLimits& limits) {
    const json j = parse_body(body, limits);
    if (!adapter_of(j, limits).empty() && adapter_of(j, limits) != "base")
        refuse("embeddings come from the base model: a LoRA adapter does not apply to them", "model");
    EmbeddingRequest r;
    const json* in = field(j, "input");
    if (!in) refuse("'input' is required", "input");
    auto text = [&](const json& s) {
        if (s.get<std::string>().empty()) refuse("'input' must not contain empty strings", "input");
        PromptInput p;
        p.text = s.get<std::string>();
        r.inputs.push_back(std::move(p));
    };
    auto ids = [&](const json& a) {
        PromptInput p;
        p.ids = token_ids(a, limits, "input");
        p.is_ids = true;
        r.inputs.push_back(std::move(p));
    };
    if (in->is_string()) {
        text(*in);
    } else if (is_id_list(*in)) {
        ids(*in);
    } else if (in->is_array() && !in->empty()) {
        if (in->size() > 2048) refuse("'input' holds at most 2048 items", "input");
        for (const json& x : *in) {
            if (x.is_string())
                text(x);
            else if (is_id_list(x))
                ids(x);
            else
                refuse("'input' must be a string, a list of strings, or token ids", "input");
        }
    } else {
        refuse("'input' must be a non-empty string, a list of strings, or token ids", "input");
    }
    if (const json* f = field(j, "encoding_format")) {
        if (!f->is_string() || (*f != "float" && *f != "base64"))
            refuse("'encoding_format' must be \"float\" or \"base64\"", "encoding_format");
        r.base64 = *f == "base64";
    }
    if (field(j, "dimensions")) refuse("'dimensions' is not supported", "dimensions");
    if (const json* u = field(j, "user"); u && !u->is_string()) refuse("'user' must be a string", "user");
    return r;
}

TokenizeRequest parse_tokenize(std::string_view body, const RequestLimits& limits) {
    const json j = parse_body(body, limits);
    const json* c = field(j, "content");
    if (!c || !c->is_string()) refuse("'content' must be a string", "content");
    return {c->get<std::string>(), boolean(j, "add_special", false)};
}

std::vector<int32_t> parse_detokenize(std::string_view body, const RequestLimits& limits) {
    const json j = parse_body(body, limits);
    const json* t = field(j, "tokens");
    if (!t || !t->is_array()) refuse("'tokens' must be a list of token ids", "tokens");
    return token_ids(*t, limits, "tokens");
}

bool base64_decode(std::string_view in, std::vector<uint8_t>& out) {
    out.clear();
    while (!in.empty() && in.back() == '=') in.remove_suffix(1);
    if (in.size() % 4 == 1) return false;
    out.reserve(in.size() / 4 * 3 + 2);
    uint32_t acc = 0;
    int bits = 0;
    for (char ch : in) {
        int v;
        if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
        else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
        else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
        else if (ch == '+') v = 62;
        else if (ch == '/') v = 63;
        else return false;
        acc = (acc << 6) | uint32_t(v);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(uint8_t(acc >> bits));
        }
    }
    return true;
}

}  // namespace cera
