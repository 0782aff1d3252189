// `cera bench-serve` against a `cera serve` (server/server.h, on a free port in this process) on the
// bundled tiny LFM2 model: the JSON output counts every request, every output token (ignore_eos
// makes each request generate exactly --max-tokens) and the prompts' exact token lengths; random
// cancels are counted as cancels and leave the server serving; bad input ends with one stderr line.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cera/engine.h"
#include "server/server.h"
#include "test_util.h"

namespace cera {
namespace {

using json = nlohmann::json;
using test::shell_quote;

std::shared_ptr<Engine> engine() {
    static std::shared_ptr<Engine> e = [] {
        EngineOptions o;
        o.device = "cpu";
        o.threads = 2;
        o.n_ctx = 512;
        return Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), o);
    }();
    return e;
}

struct Running {
    explicit Running(const std::string& api_key = "") {
        ServeOptions o;
        o.port = 0;
        o.alias = "tiny";
        o.api_key = api_key;
        o.batch.parallel = 4;
        server = std::make_unique<Server>(engine(), o);
        EXPECT_TRUE(server->bind());
        thread = std::thread([this] { server->run(); });
        url = "http://127.0.0.1:" + std::to_string(server->port());
        httplib::Client c("127.0.0.1", server->port());
        for (int i = 0; i < 100 && !c.Get("/health"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ~Running() {
        server->stop();
        thread.join();
    }
    std::unique_ptr<Server> server;
    std::thread thread;
    std::string url;
};

test::ShellResult bench(const std::string& args) {
    return test::run_shell(shell_quote(test::cera_bin()) + " bench-serve " + args + " </dev/null");
}

json parse(const test::ShellResult& r) {
    json j = json::parse(r.out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out << r.err;
    return j.is_discarded() ? json::object() : j;
}

TEST(BenchServe, CountsEveryRequestAndToken) {
    Running s;
    const auto r = bench("--url " + s.url + " -c 3 --requests 7 -p 24 -n 9 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = parse(r);
    EXPECT_EQ(j["model"], "tiny");
    EXPECT_EQ(j["endpoint"], "chat");
    EXPECT_EQ(j["requests"]["total"], 7);
    EXPECT_EQ(j["requests"]["ok"], 7);
    EXPECT_EQ(j["requests"]["cancelled"], 0);
    EXPECT_EQ(j["requests"]["errors"], 0);
    EXPECT_EQ(j["output_tokens"], 7 * 9);
    EXPECT_TRUE(j["prompt_tokens_exact"].get<bool>());
    EXPECT_GT(j["input_tokens_mean"].get<double>(), 24.0);  // the message, and the chat template's tokens
    EXPECT_EQ(j["ttft_ms"]["n"], 7);
    EXPECT_GT(j["ttft_ms"]["p50"].get<double>(), 0.0);
    EXPECT_LE(j["ttft_ms"]["p50"].get<double>(), j["ttft_ms"]["p99"].get<double>());
    EXPECT_GT(j["itl_ms"]["n"].get<int>(), 0);
    EXPECT_GT(j["output_tokens_per_s"].get<double>(), 0.0);
    EXPECT_GT(j["requests_per_s"].get<double>(), 0.0);
    EXPECT_EQ(j["latency_s"]["n"], 7);
}

TEST(BenchServe, CompletionPromptsHaveTheirExactLength) {
    Running s;
    const auto r = bench("--url " + s.url + "/v1 --endpoint completions -c 2 --requests 4 -p 40 -n 5 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = parse(r);
    EXPECT_EQ(j["requests"]["ok"], 4);
    EXPECT_EQ(j["output_tokens"], 20);
    EXPECT_EQ(j["input_tokens_mean"].get<double>(), 40.0 + (engine()->add_bos() ? 1 : 0));
}

TEST(BenchServe, CancelsAreCountedAndTheServerGoesOn) {
    Running s;
    const auto r = bench("--url " + s.url + " -c 4 --requests 8 -n 200 --cancel-rate 1 --json");
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = parse(r);
    EXPECT_EQ(j["requests"]["cancelled"], 8);
    EXPECT_EQ(j["requests"]["ok"], 0);
    EXPECT_EQ(j["requests"]["errors"], 0);
    EXPECT_LT(j["output_tokens"].get<int>(), 8 * 200);
    const auto after = bench("--url " + s.url + " -c 2 --requests 2 -n 4 --json");
    ASSERT_EQ(after.code, 0) << after.err;
    EXPECT_EQ(parse(after)["requests"]["ok"], 2);
}

TEST(BenchServe, PromptsFromAFileAndTheTextReport) {
    Running s("k1");
    const std::string path = (std::filesystem::temp_directory_path() / "cera_bench_serve_prompts.txt").string();
    std::ofstream(path) << "Once upon a time\n\nThe little dog ran\n";
    const auto r = bench("--url " + s.url + " --api-key k1 --requests 3 -n 4 --prompts " + shell_quote(path));
    std::filesystem::remove(path);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("3 ok, 0 cancelled, 0 errors of 3"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("output tokens/s"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("TTFT:"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("ITL:"), std::string::npos) << r.out;
}

TEST(BenchServe, ExtraBodyMembersReachEveryRequest) {
    Running s;
    // The extra max_tokens overrides -n; the server stops every request there.
    const auto inline_text =
        bench("--url " + s.url + " -c 2 --requests 4 -n 9 --extra-body '{\"max_tokens\": 3}' --json");
    ASSERT_EQ(inline_text.code, 0) << inline_text.err;
    EXPECT_EQ(parse(inline_text)["output_tokens"], 4 * 3);
    const std::string path = (std::filesystem::temp_directory_path() / "cera_bench_serve_extra.json").string();
    std::ofstream(path) << R"({"max_tokens": 2, "top_k": 1})";
    const auto from_file = bench("--url " + s.url + " --requests 3 -n 9 --extra-body " + shell_quote(path) + " --json");
    std::filesystem::remove(path);
    ASSERT_EQ(from_file.code, 0) << from_file.err;
    EXPECT_EQ(parse(from_file)["output_tokens"], 3 * 2);
}

// A server that answers the first request of each connection and then, keeping the connection open
// without saying so, reads the next request and closes it unanswered: what a server that ends kept-alive
// connections at its own limit looks like to a client that sends on one just as it goes.
class OneAnswerServer {
 public:
    OneAnswerServer() {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(a);
        EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), len), 0);
        EXPECT_EQ(::listen(fd_, 16), 0);
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] {
            for (int c; (c = ::accept(fd_, nullptr, nullptr)) >= 0;) {
                ++open_;  // before the thread starts, so that the destructor waits for it
                std::thread([this, c] { serve(c); }).detach();
            }
        });
    }
    ~OneAnswerServer() {
        ::shutdown(fd_, SHUT_RDWR);
        ::close(fd_);
        thread_.join();
        while (open_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
    int unanswered() const { return unanswered_; }

 private:
    // The request's head and body; false when the peer closed first.
    static bool read_request(int c, std::string& head) {
        std::string buf;
        char b[4096];
        size_t end = std::string::npos;
        while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
            const ssize_t n = ::recv(c, b, sizeof b, 0);
            if (n <= 0) return false;
            buf.append(b, size_t(n));
        }
        head = buf.substr(0, end);
        size_t body = 0;
        if (const size_t p = head.find("Content-Length: "); p != std::string::npos)
            body = std::stoul(head.substr(p + 16));
        while (buf.size() < end + 4 + body) {
            const ssize_t n = ::recv(c, b, sizeof b, 0);
            if (n <= 0) return false;
            buf.append(b, size_t(n));
        }
        return true;
    }
    void serve(int c) {
        std::string head;
        if (read_request(c, head)) {
            const bool models = head.rfind("GET /v1/models", 0) == 0;
            const std::string body =
                models ? R"({"object":"list","data":[{"id":"one"}]})"
                       : "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":null}]}\n\n"
                         "data: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}],"
                         "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
            const std::string res = std::string("HTTP/1.1 200 OK\r\nContent-Type: ") +
                                    (models ? "application/json" : "text/event-stream") +
                                    "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
            ::send(c, res.data(), res.size(), MSG_NOSIGNAL);
            if (read_request(c, head)) ++unanswered_;
        }
        ::close(c);
        --open_;
    }
    int fd_ = -1, port_ = 0;
    std::atomic<int> open_{0}, unanswered_{0};
    std::thread thread_;
};

TEST(BenchServe, ARequestOnAConnectionTheServerClosedGoesAgain) {
    OneAnswerServer s;
    const std::string path = (std::filesystem::temp_directory_path() / "cera_bench_serve_one.txt").string();
    std::ofstream(path) << "one\ntwo\n";
    const auto r = bench("--url " + s.url() + " --endpoint completions -c 2 --requests 6 -n 2 --prompts " +
                         shell_quote(path) + " --json");
    std::filesystem::remove(path);
    ASSERT_EQ(r.code, 0) << r.err;
    const json j = parse(r);
    EXPECT_EQ(j["requests"]["ok"], 6);
    EXPECT_EQ(j["requests"]["errors"], 0);
    EXPECT_EQ(j["output_tokens"], 12);
    EXPECT_GE(s.unanswered(), 1);  // the client did send on connections that the server then closed
}

TEST(BenchServe, BadInputIsOneLine) {
    Running s("k2");
    auto one_line = [](const test::ShellResult& r) {
        EXPECT_NE(r.code, 0);
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_EQ(r.err.rfind("cera bench-serve: error: ", 0), 0u) << r.err;
    };
    one_line(bench("--url " + s.url + " --requests 1"));                            // no key
    one_line(bench("--url " + s.url + " --api-key k2 --requests 1 --model nope"));  // every request fails
    one_line(bench("--url ftp://x"));
    one_line(bench("--url http://127.0.0.1:1 --requests 1"));
    one_line(bench("--url " + s.url + " --api-key k2 --endpoint embeddings"));
    one_line(bench("--url " + s.url + " --api-key k2 --cancel-rate 2"));
    one_line(bench("--url " + s.url + " --api-key k2 --prompts /nonexistent/prompts.txt"));
    one_line(bench("--url " + s.url + " --api-key k2 --extra-body '[1]'"));
    one_line(bench("--url " + s.url + " --api-key k2 --extra-body '{\"stream\": false}'"));
    one_line(bench("--url " + s.url + " --api-key k2 --extra-body /nonexistent/extra.json"));
}

}  // namespace
}  // namespace cera
