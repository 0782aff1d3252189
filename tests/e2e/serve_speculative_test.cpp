// `cera serve` with speculative decoding, as processes over real HTTP: a greedy completion from
// `cera serve --lookup-ngram 3` (and with a draft model) is the one plain `cera serve` gives, /metrics counts
// the drafted and accepted tokens, and the request log line reports them; bad flags end with one line.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "test_util.h"

namespace {

using cera::test::data_path;
using cera::test::shell_quote;
using json = nlohmann::json;

const std::string kModel = data_path("fixtures/tiny-lfm2/model.gguf");
const std::string kDraft = data_path("fixtures/tiny-qwen3/model.gguf");

// A `cera serve` process on a free port, stopped (SIGTERM) at the end; its stderr kept in a file.
struct ServeProcess {
    explicit ServeProcess(const std::string& flags) {
        static int counter = 0;
        err_path = (std::filesystem::temp_directory_path() /
                    ("cera_serve_spec_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".err"))
                       .string();
        const auto r = cera::test::run_shell(
            shell_quote(cera::test::cera_bin()) + " serve --device cpu -t 2 --port 0 --max-seqs 2 -m " +
                shell_quote(kModel) + " " + flags + " </dev/null >/dev/null 2>" + shell_quote(err_path) + " & echo $!",
            false);
        pid = std::atoi(r.out.c_str());
        const std::regex listening("listening on http://127\\.0\\.0\\.1:([0-9]+)");
        for (int i = 0; i < 600 && port == 0; ++i) {
            std::smatch m;
            const std::string err = log();
            if (std::regex_search(err, m, listening))
                port = std::stoi(m[1]);
            else
                std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        EXPECT_GT(port, 0) << log();
    }
    ~ServeProcess() {
        if (pid > 0) ::kill(pid, SIGTERM);
        for (int i = 0; i < 200 && pid > 0 && ::kill(pid, 0) == 0; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        std::filesystem::remove(err_path);
    }
    std::string log() const {
        try {
            return cera::test::read_text(err_path);
        } catch (...) {
            return {};
        }
    }
    json complete(const json& body) const {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(60, 0);
        auto res = c.Post("/v1/completions", body.dump(), "application/json");
        EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no answer");
        return res ? json::parse(res->body, nullptr, false) : json{};
    }
    double metric(const std::string& name) const {
        httplib::Client c("127.0.0.1", port);
        auto res = c.Get("/metrics");
        if (!res) return -1;
        std::istringstream lines(res->body);
        for (std::string line; std::getline(lines, line);)
            if (line.rfind(name + " ", 0) == 0) return std::stod(line.substr(name.size() + 1));
        return -1;
    }
    int pid = -1, port = 0;
    std::string err_path;
};

std::string story_prompt() {
    const std::string s = json::parse(cera::test::read_text(data_path("fixtures/tiny-lfm2/ref/prompt_2.json")))["text"]
                              .get<std::string>();
    return s + "\n" + s.substr(0, s.size() / 2);
}

TEST(ServeSpeculative, LookupAndDraftModelGiveThePlainGreedyCompletion) {
    const json body = {{"prompt", story_prompt()}, {"max_tokens", 40}, {"temperature", 0}};
    std::string plain;
    {
        ServeProcess p("");
        plain = p.complete(body)["choices"][0]["text"].get<std::string>();
        EXPECT_EQ(p.metric("cera_speculative_drafted_tokens_total"), 0);
    }
    ASSERT_FALSE(plain.empty());
    for (const std::string flags : {std::string("--lookup-ngram 3"),
                                    "--lookup-ngram 2 --draft-model " + shell_quote(kDraft) + " --draft-max 4"}) {
        ServeProcess p(flags);
        const json a = p.complete(body), b = p.complete(body);  // the second from the prefix cache
        EXPECT_EQ(a["choices"][0]["text"].get<std::string>(), plain) << flags;
        EXPECT_EQ(b["choices"][0]["text"].get<std::string>(), plain) << flags;
        const double drafted = p.metric("cera_speculative_drafted_tokens_total");
        const double accepted = p.metric("cera_speculative_accepted_tokens_total");
        EXPECT_GT(drafted, 0) << flags;
        EXPECT_GT(accepted, 0) << flags;
        EXPECT_LE(accepted, drafted) << flags;
        EXPECT_GT(p.metric("cera_speculative_verifications_total"), 0) << flags;
        // The request log line reports them.
        for (int i = 0; i < 100 && p.log().find(", drafted ") == std::string::npos; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        EXPECT_NE(p.log().find(", drafted "), std::string::npos) << p.log();
    }
}

TEST(ServeSpeculative, BadFlagsEndWithOneLine) {
    for (const std::string& extra :
         {std::string(" --draft-max 99 --lookup-ngram 3"), std::string(" --lookup-ngram -2"),
          " --draft-model " + shell_quote(data_path("fixtures/tiny-lfm2vl-random/model.gguf"))}) {
        const auto r =
            cera::test::run_shell(shell_quote(cera::test::cera_bin()) + " serve --device cpu -t 2 --port 0 -m " +
                                  shell_quote(kModel) + extra + " </dev/null");
        EXPECT_NE(r.code, 0) << extra;
        EXPECT_NE(r.err.find("error"), std::string::npos) << extra << ": " << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << extra << ": " << r.err;
    }
}

}  // namespace
