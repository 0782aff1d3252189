// Helpers shared by the tests: where the unpacked test data lives, file reading, running the cera
// binary.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace cera::test {

// Root of the unpacked test data (tests/data/archives/*.tar.xz), e.g.
// data_path("fixtures/tiny-lfm2/model.gguf").
inline std::string data_path(const std::string& rel) { return std::string(CERA_TESTDATA_DIR) + "/" + rel; }
// A file of the source tree, e.g. source_path("models/stories260K.gguf").
inline std::string source_path(const std::string& rel) { return std::string(CERA_SOURCE_DIR) + "/" + rel; }

inline std::string read_text(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open " + path);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

// The largest |a[i] - b[i]|; a failure when the sizes differ.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
    return d;
}

inline std::vector<float> read_f32(const std::string& path) {
    std::string bytes = read_text(path);
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
}

// The cera binary under test: $CERA_BIN, else the build tree's.
inline std::string cera_bin() {
    const char* env = std::getenv("CERA_BIN");
    return env && *env ? env : std::string(CERA_BINARY_DIR) + "/bin/cera";
}

// s as one single-quoted shell word.
inline std::string shell_quote(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
}

struct ShellResult {
    int code = -1;  // exit status (-1: did not exit normally)
    std::string out, err;
};

// Runs a shell command line, capturing stdout and, when capture_err, stderr (through a temporary file).
inline ShellResult run_shell(const std::string& cmd, bool capture_err = true) {
    static int counter = 0;
    const std::string err_path = (std::filesystem::temp_directory_path() /
                                  ("cera_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".err"))
                                     .string();
    ShellResult r;
    FILE* p = ::popen((capture_err ? cmd + " 2>" + shell_quote(err_path) : cmd).c_str(), "r");
    if (!p) return r;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = ::pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (capture_err) {
        r.err = read_text(err_path);
        std::filesystem::remove(err_path);
    }
    return r;
}

}  // namespace cera::test
