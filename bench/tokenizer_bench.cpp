// Tokenizer throughput: encode 1 MiB of mixed text (English stories, code, CJK, Cyrillic, Arabic,
// emoji, digits, whitespace runs) with one SPM and several BPE vocabularies; also vocabulary load
// time, decode and streaming-decode throughput. One result line per vocabulary. encode_MB_s is the
// first pass over the text (empty word cache); encode_warm_MB_s the best of three more.
// Usage: tokenizer_bench [TESTDATA_DIR] (default: <build>/testdata, found from the executable).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

using namespace cera;

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string mixed_text(const std::string& data_dir, size_t bytes) {
    std::string stories = read_file(data_dir + "/fixtures/tokenizer/corpus_sample.jsonl");
    const std::string extra[] = {
        "for (size_t i = 0; i < n; ++i) {\n    acc += x[i] * w[i];  // dot product\n}\n",
        "\xE4\xBB\x8A\xE5\xA4\xA9\xE5\xA4\xA9\xE6\xB0\x94\xE5\xBE\x88\xE5\xA5\xBD\xEF\xBC\x8C\xE6\x88\x91\xE4\xBB\xAC"
        "\xE5\x8E\xBB\xE5\x85\xAC\xE5\x9B\xAD\xE6\x95\xA3\xE6\xAD\xA5\xE3\x80\x82",
        "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80! "
        "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85 ",
        "Prices: $1,234.56 on 2024-03-15 at 10:45; id=0x7fffa3b2 \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD\n",
        "    indented    text\twith\t\ttabs   and    spaces\n\n\n",
    };
    std::string out;
    size_t k = 0, pos = 0;
    while (out.size() < bytes) {
        const size_t chunk = std::min<size_t>(2000, stories.size() - pos);
        out.append(stories, pos, chunk);
        pos = (pos + chunk) % stories.size();
        out += extra[k++ % 5];
    }
    out.resize(bytes);
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();  // whole chars
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xC0) out.pop_back();
    return out;
}

void bench(const std::string& name, const std::string& path, const std::string& text) {
    const double t0 = now_s();
    std::unique_ptr<Tokenizer> tok;
    if (path.size() > 5 && path.substr(path.size() - 5) == ".json") {
        tok = Tokenizer::from_hf_json(path);
    } else {
        auto f = gguf::File::open(path);
        tok = Tokenizer::from_gguf(*f);
    }
    const double load_s = now_s() - t0;

    // The first encode starts with an empty word cache (cold); the next ones reuse it (warm).
    double t = now_s();
    std::vector<int32_t> ids = tok->encode(text, false, false);
    const double cold = now_s() - t;
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
        t = now_s();
        ids = tok->encode(text, false, false);
        best = std::min(best, now_s() - t);
    }
    double dec_best = 1e30, stream_best = 1e30;
    size_t decoded = 0;
    for (int rep = 0; rep < 3; ++rep) {
        t = now_s();
        decoded = tok->decode(ids).size();
        dec_best = std::min(dec_best, now_s() - t);
        t = now_s();
        StreamingDetokenizer d(*tok);
        size_t n = 0;
        for (int32_t id : ids) n += d.push(id).size();
        n += d.flush().size();
        stream_best = std::min(stream_best, now_s() - t);
        decoded = std::max(decoded, n);
    }
    const double mb = double(text.size()) / (1 << 20);
    std::printf(
        "tokenizer %-16s n_vocab=%-6d load_s=%.3f bytes=%zu tokens=%zu bytes_per_token=%.2f encode_MB_s=%.2f "
        "encode_warm_MB_s=%.2f decode_MB_s=%.1f stream_MB_s=%.1f\n",
        name.c_str(), tok->n_vocab(), load_s, text.size(), ids.size(), double(text.size()) / double(ids.size()),
        mb / cold, mb / best, double(decoded) / (1 << 20) / dec_best, double(decoded) / (1 << 20) / stream_best);
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    std::string dir;
    if (argc > 1) {
        dir = argv[1];
    } else {
        std::error_code ec;
        const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
        dir = (exe.parent_path().parent_path() / "testdata").string();
    }
    if (!std::filesystem::exists(dir + "/vocab")) {
        std::fprintf(stderr, "tokenizer_bench: no test data under %s (pass the testdata directory)\n", dir.c_str());
        return 1;
    }
    const std::string text = mixed_text(dir, 1 << 20);
    std::printf("# encode %zu bytes of mixed text, one thread\n", text.size());
    bench("llama-spm", dir + "/vocab/ggml-vocab-llama-spm.gguf", text);
    bench("qwen2", dir + "/vocab-extra/qwen3-vocab-qwen2.gguf", text);
    bench("llama3", dir + "/vocab-extra/gpt2-vocab-llama3.gguf", text);
    bench("gpt-2", dir + "/vocab/ggml-vocab-gpt-2.gguf", text);
    bench("deepseek-llm", dir + "/vocab/ggml-vocab-deepseek-llm.gguf", text);
    bench("qwen3-json", dir + "/models/qwen3-tokenizer/tokenizer.json", text);
    return 0;
}
