// Helpers shared by the tests: where the unpacked test data lives, file reading.
#pragma once
#include <cstdint>
#include <cstring>
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

inline std::vector<float> read_f32(const std::string& path) {
    std::string bytes = read_text(path);
    std::vector<float> out(bytes.size() / sizeof(float));
    std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
    return out;
}

}  // namespace cera::test
