// `cera chat` end to end with stdin not a terminal: one user message per line, each reply
// followed by a newline; the first reply equals the library's greedy generation from the
// rendered template; later turns prefill only the new tokens; /reset, /save, /load, /quit;
// a model without a template falls back to ChatML with a note; SIGINT stops a reply, not
// the program.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>

#include "cera/engine.h"
#include "cera/session.h"
#include "chat/chat_template.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kModel = cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");

using cera::test::cera_bin;

std::string temp_path(const std::string& name) {
    return (fs::temp_directory_path() / ("cera_chat_" + std::to_string(::getpid()) + "_" + name)).string();
}

using Result = cera::test::ShellResult;

// Runs `cera chat ARGS` with `input` on stdin.
Result chat(const std::string& args, const std::string& input) {
    static int counter = 0;
    const std::string in = temp_path("in" + std::to_string(counter++));
    {
        FILE* f = std::fopen(in.c_str(), "wb");
        std::fwrite(input.data(), 1, input.size(), f);
        std::fclose(f);
    }
    Result r = cera::test::run_shell("'" + cera_bin() + "' chat " + args + " <'" + in + "'");
    fs::remove(in);
    return r;
}

const std::string kArgs = "-m '" + kModel + "' --temp 0 -n 24 --threads 1";

// The first reply, computed with the library: render, tokenize, generate.
std::string library_first_reply(const std::string& user, const std::string& system = "") {
    auto e = cera::Engine::load(kModel, {.device = "cpu", .threads = 1});
    cera::ChatTemplate t(e->chat_template());
    std::vector<cera::ChatMessage> messages;
    if (!system.empty()) messages.push_back({"system", system, {}, "", "", ""});
    messages.push_back({"user", user, {}, "", "", ""});
    cera::ChatTemplateOptions o;
    o.bos_token = e->token_text(e->bos_token());
    o.eos_token = e->token_text(e->eos_token());
    std::vector<int32_t> ids = e->tokenize(t.render(messages, o), false, true);
    if (e->add_bos() && ids.front() != e->bos_token()) ids.insert(ids.begin(), e->bos_token());
    cera::Session s(e);
    s.append_tokens(ids);
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 24;
    cera::NullSink sink;
    return s.generate(g, sink).text;
}

// "prompt N new tokens" of each -v turn line.
std::vector<int> new_tokens_per_turn(const std::string& err) {
    std::vector<int> out;
    const std::regex re("prompt (\\d+) new tokens");
    for (auto it = std::sregex_iterator(err.begin(), err.end(), re); it != std::sregex_iterator(); ++it)
        out.push_back(std::stoi((*it)[1]));
    return out;
}

TEST(CeraChat, FirstReplyMatchesTheLibraryAndRepliesEndWithANewline) {
    const std::string want = library_first_reply("Tell me a story about a cat.");
    const Result r = chat(kArgs, "Tell me a story about a cat.\n");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, want + "\n");

    const std::string want_sys = library_first_reply("Hi!", "You are a storyteller.");
    const Result s = chat(kArgs + " --system 'You are a storyteller.'", "Hi!\n");
    ASSERT_EQ(s.code, 0) << s.err;
    EXPECT_EQ(s.out, want_sys + "\n");
}

TEST(CeraChat, LaterTurnsPrefillOnlyTheNewTokens) {
    const std::string input = "Tell me a story.\nWhat happened next?\nAnd then?\n";
    const Result a = chat(kArgs + " -v", input), b = chat(kArgs + " -v", input);
    ASSERT_EQ(a.code, 0) << a.err;
    EXPECT_EQ(a.out, b.out);  // deterministic
    const std::vector<int> n = new_tokens_per_turn(a.err);
    ASSERT_EQ(n.size(), 3u) << a.err;
    // Turn 2 evaluates the end of reply 1, the end-of-turn marker and the new message, not the
    // whole conversation again (well under the first prompt plus a 24-token reply).
    EXPECT_LT(n[1], 20) << a.err;
    EXPECT_LT(n[2], 20) << a.err;
    EXPECT_EQ(a.err.find("differs"), std::string::npos) << a.err;
}

TEST(CeraChat, ResetStartsOver) {
    const Result r = chat(kArgs, "Tell me a story.\n/reset\nTell me a story.\n");
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string first = library_first_reply("Tell me a story.");
    EXPECT_EQ(r.out, first + "\n" + first + "\n");
    EXPECT_NE(r.err.find("new conversation"), std::string::npos);
}

TEST(CeraChat, SaveAndLoadContinueTheConversation) {
    const std::string state = temp_path("state.bin");
    const Result whole = chat(kArgs, "Tell me a story.\nWhat happened next?\n");
    const Result saved = chat(kArgs, "Tell me a story.\n/save " + state + "\n");
    ASSERT_EQ(saved.code, 0) << saved.err;
    EXPECT_TRUE(fs::exists(state));
    EXPECT_TRUE(fs::exists(state + ".chat.json"));
    const Result loaded = chat(kArgs, "/load " + state + "\nWhat happened next?\n");
    ASSERT_EQ(loaded.code, 0) << loaded.err;
    EXPECT_EQ(saved.out + loaded.out, whole.out);

    // A state of another KV type is refused with one line; the chat goes on.
    const Result f16 = chat(kArgs + " --kv-type f16", "/load " + state + "\nHello\n");
    EXPECT_NE(f16.code, 0);
    EXPECT_NE(f16.err.find("KV cache type"), std::string::npos) << f16.err;
    EXPECT_EQ(std::count(f16.out.begin(), f16.out.end(), '\n') >= 1, true);
    fs::remove(state);
    fs::remove(state + ".chat.json");
}

TEST(CeraChat, QuitUnknownCommandsAndNoTemplate) {
    const Result q = chat(kArgs, "Hello\n/quit\nNot read\n");
    ASSERT_EQ(q.code, 0) << q.err;
    EXPECT_EQ(q.out, library_first_reply("Hello") + "\n");

    const Result u = chat(kArgs, "/frobnicate\n");
    EXPECT_EQ(u.code, 1);
    EXPECT_NE(u.err.find("unknown command /frobnicate"), std::string::npos) << u.err;

    const Result m = chat("-m '" + cera::test::source_path("models/stories260K.gguf") + "' --temp 0 -n 8 --threads 1",
                          "Hello\n");
    ASSERT_EQ(m.code, 0) << m.err;
    EXPECT_NE(m.err.find("no chat template; using ChatML"), std::string::npos) << m.err;
    EXPECT_FALSE(m.out.empty());

    const Result bad = chat("-m /nonexistent.gguf", "Hello\n");
    EXPECT_NE(bad.code, 0);
}

// SIGINT during a reply stops that reply; the program reads the next message and answers it.
TEST(CeraChat, SigintStopsTheReplyNotTheProgram) {
    int in_pipe[2], out_pipe[2];
    ASSERT_EQ(::pipe(in_pipe), 0);
    ASSERT_EQ(::pipe(out_pipe), 0);
    const std::string err_path = temp_path("sigint_err");
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ::dup2(in_pipe[0], 0);
        ::dup2(out_pipe[1], 1);
        const int fd = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(fd, 2);
        ::close(in_pipe[1]);
        ::close(out_pipe[0]);
        const std::string bin = cera_bin();
        ::execl(bin.c_str(), bin.c_str(), "chat", "-m", kModel.c_str(), "--temp", "0", "-n", "1500", "--threads",
                "1", "-c", "2048", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(in_pipe[0]);
    ::close(out_pipe[1]);
    const std::string first = "Tell me a very long story.\n";
    ASSERT_EQ(::write(in_pipe[1], first.data(), first.size()), ssize_t(first.size()));
    // Wait for the reply to start, then interrupt it.
    std::string out;
    char buf[4096];
    ssize_t n = ::read(out_pipe[0], buf, sizeof buf);
    ASSERT_GT(n, 0);
    out.append(buf, size_t(n));
    ::kill(pid, SIGINT);
    const std::string second = "Hello\n";
    ASSERT_EQ(::write(in_pipe[1], second.data(), second.size()), ssize_t(second.size()));
    ::close(in_pipe[1]);
    while ((n = ::read(out_pipe[0], buf, sizeof buf)) > 0) out.append(buf, size_t(n));
    ::close(out_pipe[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    const std::string err = cera::test::read_text(err_path);
    fs::remove(err_path);
    ASSERT_TRUE(WIFEXITED(status)) << "killed by a signal: " << err;
    EXPECT_EQ(WEXITSTATUS(status), 0) << err;
    EXPECT_NE(err.find("reply stopped"), std::string::npos) << err;
    // Both replies ended with a newline: the second one was answered.
    ASSERT_FALSE(out.empty());
    EXPECT_EQ(out.back(), '\n');
    EXPECT_GE(std::count(out.begin(), out.end(), '\n'), 2);
}

}  // namespace
