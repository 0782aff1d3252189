// /v1/chat/completions and /v1/completions: each of the n choices is its own batcher request (seed +
// index); the answer is one JSON body, or server-sent events with the choices' chunks interleaved as
// they come. Log-probabilities come in the API's shape of each endpoint: chat's
// {"content": [{token, logprob, bytes, top_logprobs}]} and completions' {tokens, token_logprobs,
// top_logprobs, text_offset}.
#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <fstream>
#include <iterator>

#include "cera/error.h"
#include "chat/reasoning.h"
#include "chat/tool_call_stream.h"
#include "server/server_impl.h"

namespace cera {
namespace {

using json = nlohmann::ordered_json;

const char* finish_name(FinishReason f) {
    switch (f) {
        case FinishReason::kLength:
        case FinishReason::kContextFull:
            return "length";
        default:
            return "stop";
    }
}

bool valid_utf8(const std::string& s) {
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = uint8_t(s[i]);
        const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (n == 0 || i + n > s.size()) return false;
        for (size_t k = 1; k < n; ++k)
            if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
        i += n;
    }
    return true;
}

// What the batcher streams for one HTTP request, all choices together, for the HTTP thread to send.
struct Channel {
    struct Event {
        int index = 0;
        std::string text;
        std::vector<SampledLogprobs> logprobs;  // the tokens sampled since the choice's previous event
        bool done = false;
        GenerationResult result;
    };
    explicit Channel(Clock::time_point t) : t0(t) {}
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> events;
    const Clock::time_point t0;
    Clock::time_point first_token{};
    int64_t tokens_out = 0;
    int64_t reasoning_tokens = 0;  // the choices' tokens inside their thinking (usage's reasoning_tokens)
    std::atomic<bool> logged{false};
};

// One choice's Sink (called on the batcher's thread): its events into the channel, its token times into
// the metrics.
struct ChoiceSink final : Sink {
    ChoiceSink(std::shared_ptr<Channel> c, int i, const Engine& e, Metrics& m)
        : ch(std::move(c)), index(i), engine(e), metrics(m) {}
    void on_token(int32_t id) override {
        const auto now = Clock::now();
        bool first = false;
        int64_t reasoning = 0;
        if (thinking) {
            // A token counts as reasoning if the reply is inside its thinking before or after it, the
            // tags included: the tokens of a reply still deciding (blanks, a beginning of <think>) count
            // once it opens the block, and the answer's tokens never.
            const bool deciding = thinking->deciding(), before = thinking->thinking();
            std::string text = engine.token_bytes(id);
            if (text.empty() && std::find(rendered.begin(), rendered.end(), id) != rendered.end())
                text = engine.token_text(id);
            (void)thinking->push(text);
            if (thinking->deciding()) {
                ++undecided;
            } else {
                reasoning = before || thinking->thinking() || (deciding && thinking->opened()) ? 1 + undecided : 0;
                undecided = 0;
            }
        }
        {
            std::lock_guard<std::mutex> lk(ch->mu);
            ++ch->tokens_out;
            ch->reasoning_tokens += reasoning;
            if (ch->first_token == Clock::time_point{}) first = true, ch->first_token = now;
        }
        if (first) metrics.time_to_first_token.observe(seconds_between(ch->t0, now));
        if (last != Clock::time_point{}) metrics.inter_token.observe(seconds_between(last, now));
        last = now;
    }
    void on_logprobs(const SampledLogprobs& lp) override {
        // The end-of-generation token is no part of the content, unless ignore_eos made it text.
        if (ignore_eos || !engine.is_eog(lp.token.id)) pending.push_back(lp);
    }
    void on_text(std::string_view t) override { push(std::string(t), false, nullptr); }
    void on_done(const GenerationResult& r) override { push("", true, &r); }
    void push(std::string text, bool done, const GenerationResult* r) {
        std::lock_guard<std::mutex> lk(ch->mu);
        Channel::Event e{index, std::move(text), std::move(pending), done, r ? *r : GenerationResult{}};
        pending.clear();
        ch->events.push_back(std::move(e));
        ch->cv.notify_all();
    }
    const std::shared_ptr<Channel> ch;
    const int index;
    const Engine& engine;
    Metrics& metrics;
    Clock::time_point last{};
    std::vector<SampledLogprobs> pending;
    bool ignore_eos = false;
    std::unique_ptr<ReasoningStream> thinking;  // a split reply: where its thinking ends, token by token
    std::vector<int32_t> rendered;              // control tokens whose text is part of the reply
    int64_t undecided = 0;                      // tokens since the start while `thinking` is deciding
};

// Log-probabilities in the API's shapes. -inf (a banned token) reads as -9999, as OpenAI writes it.
struct LogprobWriter {
    const Engine& engine;
    bool chat;

    static double value(float lp) { return std::isfinite(lp) ? double(lp) : -9999.0; }
    // A token's text, and its bytes; a token that is part of a UTF-8 character reads "bytes:\xNN...".
    std::pair<std::string, std::string> text(int32_t id) const {
        std::string bytes = engine.token_bytes(id);
        if (valid_utf8(bytes)) return {bytes, bytes};
        std::string t = "bytes:";
        for (unsigned char c : bytes) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            t += buf;
        }
        return {t, bytes};
    }
    json entry(const TokenLogprob& t) const {
        const auto [s, bytes] = text(t.id);
        json b = json::array();
        for (unsigned char c : bytes) b.push_back(int(c));
        return {{"token", s}, {"logprob", value(t.logprob)}, {"bytes", std::move(b)}};
    }
    // Each token's entry with its top_logprobs alike (with_id: each with its "id" too): a chat choice's
    // logprobs content, and llama.cpp's completion_probabilities.
    json entries(const std::vector<SampledLogprobs>& lps, bool with_id) const {
        auto one = [&](const TokenLogprob& t) {
            json e = entry(t);
            if (with_id) e["id"] = t.id;
            return e;
        };
        json out = json::array();
        for (const SampledLogprobs& lp : lps) {
            json e = one(lp.token);
            json top = json::array();
            for (const TokenLogprob& t : lp.top) top.push_back(one(t));
            e["top_logprobs"] = std::move(top);
            out.push_back(std::move(e));
        }
        return out;
    }
    json native(const std::vector<SampledLogprobs>& lps) const { return entries(lps, true); }
    // The "logprobs" value of a choice (or a chunk) for these tokens; offset: completions' text_offset of
    // the first, advanced past them.
    json operator()(const std::vector<SampledLogprobs>& lps, size_t* offset) const {
        if (chat) return {{"content", entries(lps, false)}, {"refusal", nullptr}};
        json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
        for (const SampledLogprobs& lp : lps) {
            const std::string s = text(lp.token.id).first;
            tokens.push_back(s);
            values.push_back(value(lp.token.logprob));
            json top = json::object();
            for (const TokenLogprob& t : lp.top) top[text(t.id).first] = value(t.logprob);
            tops.push_back(std::move(top));
            offsets.push_back(*offset);
            // In characters of the text, as clients slice it (a character's continuation bytes add none).
            for (unsigned char c : engine.token_bytes(lp.token.id)) *offset += (c & 0xC0) != 0x80;
        }
        return {{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
    }
};

// A reply's tool calls in the API's shape.
json tool_calls_json(const std::vector<ToolCall>& calls) {
    json a = json::array();
    for (const ToolCall& c : calls)
        a.push_back(
            {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments_json}}}});
    return a;
}

// A streamed chunk's delta.tool_calls: a call's first delta has its id, type and name.
json tool_call_deltas(const std::vector<ToolCallDelta>& calls) {
    json a = json::array();
    for (const ToolCallDelta& c : calls) {
        json d = {{"index", c.index}};
        if (!c.id.empty()) {
            d["id"] = c.id;
            d["type"] = "function";
            d["function"] = {{"name", c.name}, {"arguments", c.arguments}};
        } else {
            d["function"] = {{"arguments", c.arguments}};
        }
        a.push_back(std::move(d));
    }
    return a;
}

std::vector<SampledLogprobs> without_eog(const Engine& engine, const std::vector<SampledLogprobs>& lps) {
    std::vector<SampledLogprobs> out;
    for (const SampledLogprobs& lp : lps)
        if (!engine.is_eog(lp.token.id)) out.push_back(lp);
    return out;
}

// The chat prompt with each <image> marker replaced by its image's tokens (the images decoded and
// encoded here, on the request's thread); a bad image or a marker count that differs is the client's
// error.
std::vector<int32_t> with_images(const Engine& engine, const std::vector<int32_t>& prompt,
                                 const std::vector<ImageSource>& sources, std::vector<PromptImage>& placed) {
    std::vector<std::shared_ptr<const EncodedImage>> images;
    try {
        for (const ImageSource& src : sources) {
            if (!src.path.empty()) {
                std::ifstream f(src.path, std::ios::binary);
                const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
                if (!f.good() && !f.eof()) refuse("image file " + src.path + ": cannot be read", "messages");
                images.push_back(engine.encode_image(bytes));
            } else {
                images.push_back(engine.encode_image(src.bytes));
            }
        }
        return engine.expand_images(prompt, images, &placed);
    } catch (const Error& e) {
        if (e.code() != ErrorCode::kInvalidArgument) throw;
        refuse(e.what(), "messages");
    }
    return {};
}

// llama.cpp's stop_type of a finished generation.
const char* native_stop_type(FinishReason f) {
    switch (f) {
        case FinishReason::kEos:
            return "eos";
        case FinishReason::kStop:
            return "word";
        case FinishReason::kLength:
        case FinishReason::kContextFull:
            return "limit";
        default:
            return "none";
    }
}

}  // namespace

void Server::Impl::complete(const httplib::Request& req, httplib::Response& res, bool chat, Exchange& x, bool native,
                            bool infill) {
    const CompletionRequest cr = infill   ? parse_native_infill(req.body, limits)
                                 : native ? parse_native_completion(req.body, limits)
                                          : parse_completion(req.body, chat, limits);
    std::vector<int32_t> prompt;
    std::vector<PromptImage> placed;
    std::string prompt_text;
    if (chat) {
        prompt = chat_prompt(*engine, tmpl, cr.messages, cr.tools_json, cr.template_kwargs, &prompt_text);
        if (engine->has_vision()) prompt = with_images(*engine, prompt, cr.images, placed);
    } else if (cr.suffix) {
        // Fill in the middle: the prompt is the code before the insertion, the suffix the code after it.
        try {
            prompt = engine->infill_prompt(cr.prompt.text, *cr.suffix, cr.context);
        } catch (const Error& e) {
            if (e.code() != ErrorCode::kUnsupported) throw;
            refuse("'" + std::string(cr.suffix_param) + "': " + e.what(), cr.suffix_param);
        }
        for (int32_t t : engine->tokenize(cr.middle, false, false)) prompt.push_back(t);
    } else if (cr.prompt.is_ids)
        prompt = cr.prompt.ids;
    else
        prompt = engine->tokenize(cr.prompt.text, engine->add_bos(), true);

    // A chat reply's thinking, split from its content unless the request or the server says not to.
    const bool split = chat && cr.split_reasoning.value_or(o.split_reasoning);
    const bool in_thinking = split && prompt_opens_thinking(prompt_text);
    // A constrained answer (a schema, tool calls) of a model that may think first: the grammar lets it
    // think, and the split keeps the thinking out of the answer. It may think where the prompt opened
    // <think>, or where the template knows thinking and the prompt did not close it already.
    GenerateOptions options = cr.options;
    const bool may_think = in_thinking || (split && tmpl.source().find("<think>") != std::string::npos &&
                                           !prompt_closes_thinking(prompt_text));
    if (may_think && options.grammar && !cr.whole_reply_grammar)
        options.grammar = grammar_after_thinking(*options.grammar, in_thinking);
    // The thinking tags and, with tools, the format's markers that the vocabulary holds as control tokens
    // stay in a chat reply's text, so that the reply parses into reasoning and calls.
    std::vector<int32_t> rendered;
    std::vector<std::string> markers;
    if (chat) markers = {"<think>", "</think>"};
    if (chat && !cr.tools.empty())
        for (const std::string& m : tool_call_markers(limits.tool_format)) markers.push_back(m);
    for (const std::string& marker : markers) {
        const std::vector<int32_t> ids = engine->tokenize(marker, false, true);
        if (ids.size() == 1 && engine->token_bytes(ids[0]).empty() && engine->token_text(ids[0]) == marker)
            rendered.push_back(ids[0]);
    }

    auto ch = std::make_shared<Channel>(x.t0);
    std::vector<std::shared_ptr<Request>> reqs;
    try {
        for (int32_t i = 0; i < cr.n; ++i) {
            GenerateOptions g = options;
            g.sampling.seed += uint64_t(i);
            g.rendered_tokens = rendered;
            auto sink = std::make_shared<ChoiceSink>(ch, i, *engine, metrics);
            sink->ignore_eos = g.ignore_eos;
            if (split) sink->thinking = std::make_unique<ReasoningStream>(in_thinking), sink->rendered = rendered;
            reqs.push_back(submit(prompt, g, std::move(sink), placed, chat ? "messages" : "prompt"));
        }
    } catch (...) {  // a choice refused: the others go too
        for (auto& r : reqs) r->cancel();
        throw;
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(x.id);
    // With tools, each choice's text is parsed into content and tool calls (ids call_<request>_<choice>_<i>).
    const bool with_tools = chat && !cr.tools.empty();
    const ToolCallFormat tool_format = limits.tool_format;
    auto tool_stream = [id = x.id, tool_format](size_t choice) {
        return std::make_shared<ToolCallStream>(tool_format,
                                                "call_" + std::to_string(id) + "_" + std::to_string(choice) + "_");
    };
    const int64_t created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    const LogprobWriter logprobs{*engine, chat};
    const bool want_logprobs = cr.options.logprobs >= 0;
    const int64_t n_prompt = int64_t(prompt.size());
    // usage: the prompt once (as OpenAI counts it), the choices' tokens summed; the metrics and the log.
    auto account = [this, n_prompt, ch, split](const std::vector<GenerationResult>& results, const Exchange& x,
                                               int status, const std::string& outcome) {
        int64_t out = 0, cached = 0;
        for (const GenerationResult& g : results) out += g.generated_tokens, cached += g.cached_tokens;
        json usage = {{"prompt_tokens", n_prompt},
                      {"completion_tokens", out},
                      {"total_tokens", n_prompt + out},
                      {"prompt_tokens_details", {{"cached_tokens", results.empty() ? 0 : results[0].cached_tokens}}}};
        if (split) {
            std::lock_guard<std::mutex> lk(ch->mu);
            usage["completion_tokens_details"] = {{"reasoning_tokens", ch->reasoning_tokens}};
        }
        if (ch->logged.exchange(true)) return usage;
        Clock::time_point first;
        int64_t seen = 0;
        {
            std::lock_guard<std::mutex> lk(ch->mu);
            first = ch->first_token;
            seen = ch->tokens_out;
        }
        metrics.tokens(n_prompt * int64_t(std::max<size_t>(results.size(), 1)), cached, std::max(out, seen));
        int64_t drafted = 0, accepted = 0;
        for (const GenerationResult& g : results) drafted += g.drafted_tokens, accepted += g.accepted_tokens;
        finish(x, {status, n_prompt, std::max(out, seen),
                   first == Clock::time_point{} ? -1.0 : seconds_between(x.t0, first), outcome, drafted, accepted});
        return usage;
    };
    auto outcome = [](const std::vector<GenerationResult>& results) {
        std::string s;
        for (const GenerationResult& g : results) {
            if (!s.empty()) s += ',';
            s += finish_reason_name(g.finish);
        }
        return s;
    };
    // llama.cpp's /completion: the last object of a stream, or the whole answer.
    auto native_final = [this, n_prompt](const GenerationResult& g, const std::string& content) {
        return json{{"index", 0},
                    {"content", content},
                    {"stop", true},
                    {"model", o.alias},
                    {"tokens_predicted", g.generated_tokens},
                    {"tokens_evaluated", n_prompt},
                    {"tokens_cached", g.cached_tokens},
                    {"truncated", false},
                    {"stop_type", native_stop_type(g.finish)},
                    {"stopping_word", g.finish == FinishReason::kStop ? g.stop_string : ""}};
    };
    x.deferred = true;

    if (!cr.stream) {
        std::vector<GenerationResult> results;
        try {
            for (auto& r : reqs) results.push_back(r->wait());
        } catch (...) {
            for (auto& r : reqs) r->cancel();
            x.deferred = false;
            throw;
        }
        json choices = json::array();
        for (size_t i = 0; i < results.size(); ++i) {
            const GenerationResult& g = results[i];
            json c = {{"index", i}, {"finish_reason", finish_name(g.finish)}, {"logprobs", nullptr}};
            const ReasoningDelta parts = split ? split_reasoning(g.text, in_thinking) : ReasoningDelta{"", g.text};
            if (with_tools) {
                // The same parse as a stream's, so that both give the same content and calls.
                auto ts = tool_stream(i);
                std::string content = ts->push(parts.content).content;
                content += ts->finish().content;
                const auto& calls = ts->result().calls;
                c["message"] = {{"role", "assistant"},
                                {"content", calls.empty() || !content.empty() ? json(content) : json(nullptr)},
                                {"refusal", nullptr}};
                if (!calls.empty()) {
                    c["message"]["tool_calls"] = tool_calls_json(calls);
                    c["finish_reason"] = "tool_calls";
                }
            } else if (chat)
                c["message"] = {{"role", "assistant"}, {"content", parts.content}, {"refusal", nullptr}};
            else
                c["text"] = g.text;
            if (!parts.reasoning.empty()) c["message"]["reasoning_content"] = parts.reasoning;
            size_t offset = 0;
            if (want_logprobs) c["logprobs"] = logprobs(without_eog(*engine, g.logprobs), &offset);
            choices.push_back(std::move(c));
        }
        const json usage = account(results, x, 200, outcome(results));
        if (native) {
            json f = native_final(results[0], results[0].text);
            if (want_logprobs)
                f["completion_probabilities"] = logprobs.native(without_eog(*engine, results[0].logprobs));
            send_json(res, 200, f);
            return;
        }
        send_json(res, 200,
                  {{"id", id},
                   {"object", chat ? "chat.completion" : "text_completion"},
                   {"created", created},
                   {"model", o.alias},
                   {"choices", std::move(choices)},
                   {"usage", usage}});
        return;
    }

    // Server-sent events: a chunk per text piece of a choice, its finish reason, the usage when asked,
    // [DONE]. A client that goes away cancels every choice at once.
    const std::string object = chat ? "chat.completion.chunk" : "text_completion";
    auto chunk = [=, this](int index, const json& delta_or_text, const json& finish, const json& lp) {
        if (native) {  // llama.cpp's: the piece (with its tokens' probabilities), stop false until the last object
            json c = {{"index", index}, {"content", delta_or_text}, {"stop", false}};
            if (!lp.is_null()) c["completion_probabilities"] = lp;
            return "data: " + c.dump() + "\n\n";
        }
        json c = {{"index", index}, {"finish_reason", finish}, {"logprobs", lp}};
        if (chat)
            c["delta"] = delta_or_text;
        else
            c["text"] = delta_or_text;
        return "data: " +
               json{{"id", id},
                    {"object", object},
                    {"created", created},
                    {"model", o.alias},
                    {"choices", json::array({c})}}
                   .dump() +
               "\n\n";
    };
    struct Progress {
        bool started = false;
        std::vector<GenerationResult> results;
        std::vector<bool> done;
        std::vector<size_t> offsets;                         // completions' text_offset of each choice's next token
        std::vector<std::shared_ptr<ToolCallStream>> tools;  // with tools: each choice's parse
        std::vector<ReasoningStream> thinking;               // split: each choice's reasoning
        size_t n_done = 0;
    };
    auto p = std::make_shared<Progress>();
    if (split) p->thinking.assign(reqs.size(), ReasoningStream(in_thinking));
    if (with_tools)
        for (size_t i = 0; i < reqs.size(); ++i) p->tools.push_back(tool_stream(i));
    p->results.resize(reqs.size());
    p->done.assign(reqs.size(), false);
    p->offsets.assign(reqs.size(), 0);
    const Exchange xs = x;
    const bool usage_chunk = cr.include_usage;
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, this](size_t, httplib::DataSink& out) {
            auto write = [&](const std::string& s) { return out.write(s.data(), s.size()); };
            if (!p->started) {
                p->started = true;
                if (chat)
                    for (size_t i = 0; i < reqs.size(); ++i)
                        if (!write(chunk(int(i), {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr)))
                            return false;
            }
            std::unique_lock<std::mutex> lk(ch->mu);
            ch->cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return !ch->events.empty(); });
            while (!ch->events.empty()) {
                Channel::Event e = std::move(ch->events.front());
                ch->events.pop_front();
                lk.unlock();
                json lp = !want_logprobs || e.logprobs.empty() ? json(nullptr)
                          : native                             ? logprobs.native(e.logprobs)
                                                               : logprobs(e.logprobs, &p->offsets[size_t(e.index)]);
                std::string text = e.text;
                if (split) {
                    // Reasoning deltas first (with the logprobs), then the content's.
                    ReasoningStream& rs = p->thinking[size_t(e.index)];
                    ReasoningDelta d = rs.push(e.text);
                    if (e.done) {
                        const ReasoningDelta rest = rs.finish();
                        d.reasoning += rest.reasoning, d.content += rest.content;
                    }
                    if (!d.reasoning.empty()) {
                        if (!write(chunk(e.index, {{"reasoning_content", d.reasoning}}, nullptr, lp))) return false;
                        lp = nullptr;
                    }
                    text = std::move(d.content);
                }
                if (with_tools) {
                    // Content and tool-call deltas as the parse finds them; the logprobs ride on the first chunk.
                    ToolCallStream& ts = *p->tools[size_t(e.index)];
                    ToolStreamDelta d = ts.push(text);
                    if (e.done) {
                        ToolStreamDelta rest = ts.finish();
                        d.content += rest.content;
                        d.calls.insert(d.calls.end(), rest.calls.begin(), rest.calls.end());
                    }
                    if ((!d.content.empty() || !lp.is_null()) &&
                        !write(chunk(e.index, {{"content", d.content}}, nullptr, lp)))
                        return false;
                    if (!d.calls.empty() &&
                        !write(chunk(e.index, {{"tool_calls", tool_call_deltas(d.calls)}}, nullptr, nullptr)))
                        return false;
                } else if ((!text.empty() || !lp.is_null()) &&
                           !write(chunk(e.index, chat ? json{{"content", text}} : json(text), nullptr, lp))) {
                    return false;
                }
                if (e.done) {
                    p->results[size_t(e.index)] = e.result;
                    p->done[size_t(e.index)] = true;
                    ++p->n_done;
                    const json reason = with_tools && !p->tools[size_t(e.index)]->result().calls.empty()
                                            ? json("tool_calls")
                                            : json(finish_name(e.result.finish));
                    if (native ? !write("data: " + native_final(e.result, "").dump() + "\n\n")
                               : !write(chunk(e.index, chat ? json::object() : json(""), reason, nullptr)))
                        return false;
                }
                lk.lock();
            }
            lk.unlock();
            if (p->n_done < reqs.size()) {
                // A choice that failed (a batcher error) finishes without on_done: the stream ends with an error.
                for (size_t i = 0; i < reqs.size(); ++i) {
                    if (p->done[i] || !reqs[i]->done()) continue;
                    std::lock_guard<std::mutex> again(ch->mu);
                    if (!ch->events.empty()) break;  // its end is queued after all
                    std::string why = "generation failed";
                    try {
                        reqs[i]->wait();
                    } catch (const std::exception& e) {
                        why = e.what();
                    }
                    for (auto& r : reqs) r->cancel();
                    write("data: " + error_body({500, why, "server_error", "", ""}).dump() + "\n\n");
                    out.done();
                    account(p->results, xs, 500, why);
                    return true;
                }
                return out.is_writable();
            }
            const json usage = account(p->results, xs, 200, outcome(p->results));
            if (native) {  // llama.cpp's stream ends with its last object, no [DONE]
                out.done();
                return true;
            }
            bool ok = !usage_chunk || write("data: " +
                                            json{{"id", id},
                                                 {"object", object},
                                                 {"created", created},
                                                 {"model", o.alias},
                                                 {"choices", json::array()},
                                                 {"usage", usage}}
                                                .dump() +
                                            "\n\n");
            if (ok) ok = write("data: [DONE]\n\n");
            out.done();
            return ok;
        },
        [=](bool success) {
            if (success) return;
            account(p->results, xs, 499, "client gone");
            for (auto& r : reqs) r->cancel();  // the client went away
        });
}

}  // namespace cera
