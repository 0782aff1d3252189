// `cera chat [-m FILE] [--system TEXT] [-n N] [sampling options]`: a multi-turn chat.
// Each turn renders the whole conversation with the model's chat template (ChatML when
// the GGUF has none), checks that the tokens already in the session are a prefix of the
// new rendering and prefills only the rest (from the first difference when they are not).
// Commands: /reset, /image FILE, /save FILE, /load FILE, /help, /quit. Ctrl-C stops the reply being
// generated; at the prompt it clears the line. On a terminal the input is read in
// canonical mode (the terminal's own line editing); a line ending in '\' continues on the
// next. When stdin is not a terminal, every line is one user message and every reply is
// printed followed by a newline, so a conversation can be scripted.
#include <editline/readline.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/session.h"
#include "chat/chat_template.h"
#include "cli/command.h"
#include "cli/engine_flags.h"
#include "cli/grammar_flags.h"
#include "cli/model_path.h"
#include "cli/parse_args.h"
#include "cli/spec_flags.h"
#include "server/chat_prompt.h"

namespace cera::cli {
namespace {

// ChatML, for models without a template.
constexpr size_t kChatPrefixCacheBytes = size_t(256) << 20;  // the in-memory tier a chat keeps by default

std::atomic<Session*> g_session{nullptr};  // set only while a reply is being generated
std::atomic<bool> g_interrupted{false};

void on_sigint(int) {
    g_interrupted.store(true);
    if (Session* s = g_session.load()) s->cancel();  // atomic stores only: safe in a signal handler
}

class ReplySink : public Sink {
 public:
    void on_text(std::string_view text) override {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
    }
};

enum class ReadResult { kLine, kEof, kInterrupted };

// One line from stdin without its newline. A read interrupted by Ctrl-C gives kInterrupted.
ReadResult read_line(std::string& line) {
    line.clear();
    for (;;) {
        const int c = std::fgetc(stdin);
        if (c == EOF) {
            if (std::ferror(stdin) && errno == EINTR) {
                std::clearerr(stdin);
                return ReadResult::kInterrupted;
            }
            return line.empty() ? ReadResult::kEof : ReadResult::kLine;
        }
        if (c == '\n') return ReadResult::kLine;
        line.push_back(char(c));
    }
}

// One line from a terminal, with line editing and history (libedit). Ctrl-C at the prompt
// gives kInterrupted, Ctrl-D on an empty line kEof.
ReadResult read_line_edited(std::string& line, const char* prompt) {
    g_interrupted.store(false);
    char* s = readline(prompt);
    if (!s) return g_interrupted.load() ? ReadResult::kInterrupted : ReadResult::kEof;
    line = s;
    if (*s) add_history(s);
    std::free(s);
    return ReadResult::kLine;
}

ChatMessage message_of(const std::string& role, const std::string& content) {
    ChatMessage m;
    m.role = role;
    m.content = content;
    return m;
}

nlohmann::json messages_to_json(const std::vector<ChatMessage>& messages) {
    nlohmann::json a = nlohmann::json::array();
    for (const ChatMessage& m : messages) a.push_back({{"role", m.role}, {"content", m.content}});
    return a;
}

std::vector<ChatMessage> messages_from_json(const nlohmann::json& a) {
    std::vector<ChatMessage> out;
    for (const auto& m : a) {
        ChatMessage c;
        c.role = m.at("role").get<std::string>();
        c.content = m.at("content").get<std::string>();
        out.push_back(std::move(c));
    }
    return out;
}

struct Chat {
    std::shared_ptr<Engine> engine;
    std::unique_ptr<Session> session;
    ChatTemplate tmpl{kChatMlTemplate};
    std::vector<ChatMessage> messages;  // the conversation so far (system message first, if any)
    std::string system;
    GenerateOptions gen;
    bool verbose = false;
    // Images (/image PATH, with --mmproj): those attached to each message, parallel to `messages`, and
    // those waiting for the next user message. A user message with images starts with one <image>
    // marker for each.
    std::vector<std::vector<std::string>> attached;
    std::vector<std::string> pending;
    // The rendering the session holds, images not expanded (its image tokens stand for whole images),
    // then the generated tokens; equal to session->tokens() while no image has been sent.
    std::vector<int32_t> rendered;

    // Renders the conversation, ending with the assistant header, as token ids.
    std::vector<int32_t> render() const { return chat_prompt(*engine, tmpl, messages); }

    void reset() {
        messages.clear();
        attached.clear();
        pending.clear();
        rendered.clear();
        if (!system.empty()) push("system", system);
        session->reset();
    }

    void push(const std::string& role, const std::string& content, std::vector<std::string> images = {}) {
        messages.push_back(message_of(role, content));
        attached.push_back(std::move(images));
    }
    void pop() {
        messages.pop_back();
        attached.pop_back();
    }

    // Brings the session to `ids` (a rendering): keeps the common prefix and appends the rest, each
    // <image> token of a rendering with images becoming that image's tokens and embeddings.
    void sync(const std::vector<int32_t>& ids) {
        std::vector<std::string> images;
        for (const auto& a : attached) images.insert(images.end(), a.begin(), a.end());
        if (images.empty() && rendered.empty()) {
            const std::vector<int32_t>& have = session->tokens();
            size_t common = 0;
            while (common < have.size() && common < ids.size() && have[common] == ids[common]) ++common;
            if (common < have.size()) {
                if (verbose)
                    std::fprintf(stderr, "cera chat: the rendering differs from the session at token %zu of %zu\n",
                                 common, have.size());
                session->truncate(int32_t(common));
            }
            session->append_tokens(std::span<const int32_t>(ids.data() + common, ids.size() - common));
            return;
        }
        const std::vector<int32_t> marker = engine->tokenize("<image>", false, true);
        const int32_t image_id = marker.size() == 1 ? marker[0] : -1;
        size_t common = 0;
        while (common < rendered.size() && common < ids.size() && rendered[common] == ids[common]) ++common;
        size_t from = common;
        if (common < rendered.size()) {  // positions in `rendered` do not map onto the session's: start over
            if (verbose) std::fprintf(stderr, "cera chat: the rendering differs; evaluating it again\n");
            session->reset();
            rendered.clear();
            from = 0;
        }
        size_t next_image = size_t(std::count(ids.begin(), ids.begin() + std::ptrdiff_t(from), image_id));
        size_t i = from;
        while (i < ids.size()) {
            size_t j = i;
            while (j < ids.size() && ids[j] != image_id) ++j;
            session->append_tokens(std::span<const int32_t>(ids.data() + i, j - i));
            if (j == ids.size()) break;
            if (next_image >= images.size())
                throw Error(ErrorCode::kInvalidArgument, "the conversation has more <image> markers than images");
            session->append_image_file(images[next_image++]);
            i = j + 1;
        }
        rendered.assign(ids.begin(), ids.end());
    }

    // Drops the oldest exchange after the system message; false when nothing is left to drop.
    bool drop_oldest_turn() {
        const size_t first = !messages.empty() && messages.front().role == "system" ? 1 : 0;
        if (messages.size() <= first + 1) return false;  // only the newest user message is left
        size_t end = first + 1;                          // the user message and its reply
        while (end < messages.size() - 1 && messages[end].role != "user") ++end;
        messages.erase(messages.begin() + std::ptrdiff_t(first), messages.begin() + std::ptrdiff_t(end));
        attached.erase(attached.begin() + std::ptrdiff_t(first), attached.begin() + std::ptrdiff_t(end));
        return true;
    }

    // One user message -> one streamed reply.
    void turn(const std::string& user) {
        std::string content;
        for (size_t k = 0; k < pending.size(); ++k) content += "<image>";
        push("user", content + user, pending);
        std::vector<int32_t> ids = render();
        const size_t room = size_t(std::max(1, session->n_ctx() / 8));  // leave space for a reply
        while (ids.size() + room > size_t(session->n_ctx()) && drop_oldest_turn()) {
            std::fprintf(stderr, "cera chat: the context is full; dropped the oldest exchange\n");
            ids = render();
        }
        if (ids.size() >= size_t(session->n_ctx())) {
            pop();
            throw Error(ErrorCode::kOutOfRange, "the message does not fit in the context of " +
                                                    std::to_string(session->n_ctx()) + " tokens (see --ctx)");
        }
        // Keep what the session already holds when it is a prefix of the new rendering.
        try {
            sync(ids);
        } catch (...) {
            pop();
            throw;
        }
        pending.clear();

        ReplySink sink;
        g_interrupted.store(false);
        g_session.store(session.get());
        GenerationResult r;
        try {
            r = session->generate(gen, sink);
        } catch (...) {
            g_session.store(nullptr);
            throw;
        }
        g_session.store(nullptr);
        std::fputc('\n', stdout);
        std::fflush(stdout);
        if (!rendered.empty()) {  // the generated tokens follow the rendering
            const std::vector<int32_t>& have = session->tokens();
            rendered.insert(rendered.end(), have.end() - std::min<std::ptrdiff_t>(r.generated_tokens, have.size()),
                            have.end());
        }
        push("assistant", r.text);
        if (verbose) {
            std::fprintf(stderr,
                         "cera chat: prompt %d new tokens (%d from the prefix cache), %.1f tok/s; reply %d tokens, "
                         "%.1f tok/s; finish: %s; context %d/%d\n",
                         r.prompt_tokens, r.cached_tokens, r.prefill_tokens_per_second(), r.generated_tokens,
                         r.decode_tokens_per_second(), finish_reason_name(r.finish), session->position(),
                         session->n_ctx());
            if (gen.speculative.enabled())
                std::fprintf(stderr, "cera chat: speculative: %d drafted, %d accepted (%.1f%%), %.2f tokens a pass\n",
                             r.drafted_tokens, r.accepted_tokens, 100 * r.acceptance_rate(), r.tokens_per_pass());
        } else if (r.finish == FinishReason::kCancelled)
            std::fprintf(stderr, "cera chat: reply stopped\n");
        else if (r.finish == FinishReason::kContextFull)
            std::fprintf(stderr, "cera chat: the context is full (see --ctx, --n-keep)\n");
    }

    // The state file, and next to it the conversation: the messages, the images of each (as absolute
    // paths, read again only if the conversation has to be evaluated anew), the images waiting for the
    // next message, and the rendering the state holds.
    void save(const std::string& path) {
        session->save_state_file(path);
        auto absolute = [](const std::vector<std::string>& paths) {
            std::vector<std::string> out;
            for (const std::string& p : paths) out.push_back(std::filesystem::absolute(p).string());
            return out;
        };
        nlohmann::json images = nlohmann::json::array();
        for (const auto& a : attached) images.push_back(absolute(a));
        nlohmann::json j = {{"system", system},
                            {"messages", messages_to_json(messages)},
                            {"images", images},
                            {"pending_images", absolute(pending)},
                            {"rendered", rendered}};
        std::ofstream f(path + ".chat.json");
        f << j.dump(1) << "\n";
        if (!f) throw Error(ErrorCode::kIo, "cannot write " + path + ".chat.json");
    }

    void load(const std::string& path) {
        std::ifstream f(path + ".chat.json");
        if (!f) throw Error(ErrorCode::kIo, "cannot open " + path + ".chat.json (written by /save next to the state)");
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(f);
        } catch (const nlohmann::json::exception& e) {
            throw Error(ErrorCode::kInvalidFile, path + ".chat.json: " + e.what());
        }
        std::vector<ChatMessage> loaded;
        std::vector<std::vector<std::string>> images;
        std::vector<std::string> waiting;
        std::vector<int32_t> held;
        try {
            loaded = messages_from_json(j.at("messages"));
            if (j.contains("images")) j.at("images").get_to(images);
            if (j.contains("pending_images")) j.at("pending_images").get_to(waiting);
            if (j.contains("rendered")) j.at("rendered").get_to(held);
        } catch (const nlohmann::json::exception& e) {
            throw Error(ErrorCode::kInvalidFile, path + ".chat.json: " + e.what());
        }
        if (!images.empty() && images.size() != loaded.size())
            throw Error(ErrorCode::kInvalidFile, path + ".chat.json: " + std::to_string(images.size()) +
                                                     " image lists for " + std::to_string(loaded.size()) + " messages");
        images.resize(loaded.size());
        session->load_state_file(path);  // throws, leaving the session as it was, on a mismatch
        messages = std::move(loaded);
        attached = std::move(images);
        pending = std::move(waiting);
        rendered = std::move(held);
        system = j.value("system", std::string());
    }
};

void print_help() {
    std::fprintf(stderr,
                 "commands: /reset (new conversation), /image FILE (with --mmproj: attach an image to the next "
                 "message), /save FILE, /load FILE, /help, /quit (or Ctrl-D)\n"
                 "Ctrl-C stops a reply; a line ending in '\\' continues on the next line\n");
}

int run_chat(const std::vector<std::string>& args) {
    CLI::App app{"Multi-turn chat with a model's chat template. Replies stream to stdout.", "cera chat"};
    std::string model;
    int32_t n_predict = 512, n_keep = -1;
    int64_t seed = -1;
    EngineFlags ef;
    ef.cache_mib = double(kChatPrefixCacheBytes >> 20);
    Chat chat;
    GenerateOptions& g = chat.gen;
    g.sampling.temperature = 0.8f;
    app.add_option("-m,--model", model, "GGUF model (default: the bundled models/tiny-lfm2-Q8_0.gguf)");
    app.add_option("-s,--system", chat.system, "system message");
    app.add_option("-n,--n-predict", n_predict, "tokens per reply at most (-1: until an end token or a full context)")
        ->capture_default_str();
    app.add_option("--temp", g.sampling.temperature, "temperature (0: greedy)")->capture_default_str();
    app.add_option("--top-k", g.sampling.top_k, "top-k (0: off)")->capture_default_str();
    app.add_option("--top-p", g.sampling.top_p, "top-p (1: off)")->capture_default_str();
    app.add_option("--min-p", g.sampling.min_p, "min-p (0: off)")->capture_default_str();
    app.add_option("--repeat-penalty", g.sampling.repeat_penalty, "repetition penalty (1: off)")->capture_default_str();
    app.add_option("--seed", seed, "random seed (default: a random one)");
    ef.add(app, EngineFlags::kCtx | EngineFlags::kKvType | EngineFlags::kBatch | EngineFlags::kPrefixCache |
                    EngineFlags::kLora | EngineFlags::kVision);
    app.add_option("--n-keep", n_keep,
                   "when the context fills, keep the first N tokens and drop half of the rest (-1: stop instead)")
        ->capture_default_str();
    app.add_flag("-v,--verbose", chat.verbose, "print the model, and per-reply timings, to stderr");
    GrammarFlags gf;
    gf.add(app);
    SpecFlags sf;
    sf.add(app);
    if (int rc = parse_args(app, args, "chat"); rc >= 0) return rc;
    g.grammar = gf.build();  // every reply follows it
    const EngineOptions eo = ef.options();
    g.speculative = sf.build(eo);
    g.max_tokens = n_predict < 0 ? -1 : n_predict;
    g.n_keep = n_keep;
    g.sampling.seed = seed >= 0 ? uint64_t(seed) : uint64_t(std::random_device{}()) << 32 | std::random_device{}();
    if (model.empty()) model = find_default_model();

    chat.engine = Engine::load(model, eo);
    chat.session = std::make_unique<Session>(chat.engine);
    const Engine& e = *chat.engine;
    const std::string source = e.chat_template();
    if (source.empty())
        std::fprintf(stderr, "cera chat: note: %s has no chat template; using ChatML\n", model.c_str());
    else
        chat.tmpl = ChatTemplate(source);
    chat.reset();
    chat.pending = ef.images;  // --image: with the first message

    const bool tty = isatty(STDIN_FILENO);
    if (chat.verbose || tty)
        std::fprintf(stderr, "cera chat: %s (%s, %s), %s, context %d\n", model.c_str(), e.info().architecture.c_str(),
                     e.info().weight_type.c_str(), e.info().device.c_str(), chat.session->n_ctx());
    if (tty) print_help();

    struct sigaction sa {
    }, old_sa{};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: Ctrl-C at the prompt interrupts the read
    sigaction(SIGINT, &sa, &old_sa);

    int status = 0;
    std::string line, message;
    for (;;) {
        const ReadResult rr = tty ? read_line_edited(line, message.empty() ? "> " : ". ") : read_line(line);
        if (rr == ReadResult::kInterrupted) {
            message.clear();
            if (tty) std::fputc('\n', stdout);
            continue;
        }
        if (rr == ReadResult::kEof) break;
        if (tty && !line.empty() && line.back() == '\\') {  // continued on the next line
            line.pop_back();
            message += line + "\n";
            continue;
        }
        message += line;
        std::string text;
        text.swap(message);
        if (text.empty()) continue;
        try {
            if (text[0] == '/') {
                const size_t sp = text.find(' ');
                const std::string cmd = text.substr(0, sp);
                std::string arg = sp == std::string::npos ? "" : text.substr(sp + 1);
                while (!arg.empty() && arg.back() == ' ') arg.pop_back();
                while (!arg.empty() && arg.front() == ' ') arg.erase(arg.begin());
                if (cmd == "/quit" || cmd == "/exit") break;
                if (cmd == "/help") {
                    print_help();
                } else if (cmd == "/reset") {
                    chat.reset();
                    std::fprintf(stderr, "cera chat: new conversation\n");
                } else if (cmd == "/image") {
                    if (!chat.engine->has_vision())
                        throw Error(ErrorCode::kInvalidArgument, "/image needs a vision projector (--mmproj)");
                    if (arg.empty()) throw Error(ErrorCode::kInvalidArgument, "/image needs a file name");
                    if (!std::ifstream(arg)) throw Error(ErrorCode::kIo, "cannot open " + arg);
                    chat.pending.push_back(arg);
                    std::fprintf(stderr, "cera chat: %s goes with the next message\n", arg.c_str());
                } else if (cmd == "/save" || cmd == "/load") {
                    if (arg.empty()) throw Error(ErrorCode::kInvalidArgument, cmd + " needs a file name");
                    if (cmd == "/save")
                        chat.save(arg);
                    else
                        chat.load(arg);
                    std::fprintf(stderr, "cera chat: %s %s (%d tokens)\n", cmd == "/save" ? "saved" : "loaded",
                                 arg.c_str(), chat.session->position());
                } else {
                    throw Error(ErrorCode::kInvalidArgument, "unknown command " + cmd + " (see /help)");
                }
                continue;
            }
            chat.turn(text);
        } catch (const Error& err) {
            std::fprintf(stderr, "cera chat: error: %s\n", err.what());
            if (!tty) status = 1;  // a scripted conversation reports the failure at exit
        }
    }
    sigaction(SIGINT, &old_sa, nullptr);
    return status;
}

}  // namespace

CERA_CLI_COMMAND(chat, "chat", "multi-turn chat using the model's chat template", run_chat);

}  // namespace cera::cli
