// Importance matrices against llama.cpp: `cera imatrix` measures what llama-imatrix measures
// (tests/data/imatrix holds llama-imatrix b10470's files for three fixture models over the 50 stories
// of the tokenizer corpus, -c 128); quantizing under such a file reproduces llama-quantize --imatrix
// (b10470) bit for bit for every type that takes one; the matrix lowers the perplexity gap of Q4_K
// against F32 on text it was not measured on; bad files and inputs fail with one line.
#include "quantize/imatrix.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cera/engine.h"
#include "cera/error.h"
#include "cera/perplexity.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "quantize/quantize.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cera::ErrorCode;
using cera::quantize::Imatrix;
using cera::quantize::ImatrixEntry;

namespace {

std::string tmp_path(const std::string& name) {
    return (fs::temp_directory_path() / ("cera_imatrix_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string fixture(const std::string& model) { return cera::test::data_path("fixtures/" + model + "/model.gguf"); }
std::string reference(const std::string& model) {
    return cera::test::source_path("tests/data/imatrix/" + model + ".imatrix.gguf");
}

// Stories [begin, end) of the tokenizer corpus, one per line (the text llama-imatrix was given, for 0..50).
std::string stories(size_t begin, size_t end) {
    std::istringstream lines(cera::test::read_text(cera::test::data_path("fixtures/tokenizer/corpus_sample.jsonl")));
    std::string line, text;
    for (size_t i = 0; std::getline(lines, line); ++i) {
        if (line.empty() || i < begin || i >= end) continue;
        if (!text.empty()) text += '\n';
        text += nlohmann::json::parse(line).get<std::string>();
    }
    return text;
}

template <class F>
ErrorCode error_of(F&& f) {
    try {
        f();
    } catch (const cera::Error& e) {
        return e.code();
    }
    ADD_FAILURE() << "no cera::Error";
    return ErrorCode::kInvalidArgument;
}

cera::quantize::ImatrixRun run(const std::string& model, const std::string& text) {
    cera::quantize::ImatrixOptions o;
    o.model = fixture(model);
    o.n_ctx = 128;
    o.n_threads = 2;
    return cera::quantize::compute_imatrix(o, text);
}

double max_rel(const ImatrixEntry& a, const ImatrixEntry& b) {
    double worst = 0;
    for (size_t i = 0; i < a.sums.size(); ++i)
        worst = std::max(worst, std::fabs(a.sums[i] - b.sums[i]) / std::max(std::fabs(b.sums[i]), 1e-30));
    return worst;
}

}  // namespace

// Dense layers (short convolutions and attention): the same entries, row counts and chunking, and sums
// within the float rounding of two forward passes (llama-imatrix also sums in float).
TEST(Imatrix, MatchesLlamaImatrix) {
    const auto mine = run("tiny-lfm2", stories(0, 50));
    const Imatrix ref = cera::quantize::read_imatrix(reference("tiny-lfm2"));
    EXPECT_EQ(mine.imatrix.chunk_count, 67u);
    EXPECT_EQ(mine.imatrix.chunk_count, ref.chunk_count);
    EXPECT_EQ(mine.imatrix.chunk_size, ref.chunk_size);
    EXPECT_EQ(mine.n_tokens, 67 * 128);
    ASSERT_EQ(mine.imatrix.entries.size(), ref.entries.size());
    for (const auto& [name, r] : ref.entries) {
        SCOPED_TRACE(name);
        auto it = mine.imatrix.entries.find(name);
        ASSERT_NE(it, mine.imatrix.entries.end());
        EXPECT_EQ(it->second.ne0, r.ne0);
        EXPECT_EQ(it->second.counts, r.counts);
        EXPECT_LT(max_rel(it->second, r), 5e-3);
    }
}

// --process-output adds the LM head's input (a model with its own output.weight).
TEST(Imatrix, ProcessOutputMatchesLlamaImatrix) {
    cera::quantize::ImatrixOptions o;
    o.model = fixture("tiny-qwen2-random");
    o.n_ctx = 128;
    o.n_threads = 2;
    o.process_output = true;
    const auto mine = cera::quantize::compute_imatrix(o, stories(0, 50));
    const Imatrix ref = cera::quantize::read_imatrix(
        cera::test::source_path("tests/data/imatrix/tiny-qwen2-random.process-output.imatrix.gguf"));
    ASSERT_EQ(mine.imatrix.entries.size(), ref.entries.size());
    ASSERT_TRUE(mine.imatrix.entries.count("output.weight"));
    for (const auto& [name, r] : ref.entries) {
        SCOPED_TRACE(name);
        auto it = mine.imatrix.entries.find(name);
        ASSERT_NE(it, mine.imatrix.entries.end());
        EXPECT_EQ(it->second.counts, r.counts);
        EXPECT_LT(max_rel(it->second, r), 5e-3);
    }
}

// An MoE model: per-expert rows. Near-ties in the router may send a token to another expert than
// llama.cpp's run does, so expert rows are compared as counts within a few and totals.
TEST(Imatrix, MatchesLlamaImatrixMoe) {
    const auto mine = run("tiny-lfm2moe", stories(0, 50));
    const Imatrix ref = cera::quantize::read_imatrix(reference("tiny-lfm2moe"));
    ASSERT_EQ(mine.imatrix.entries.size(), ref.entries.size());
    int experts = 0;
    for (const auto& [name, r] : ref.entries) {
        SCOPED_TRACE(name);
        auto it = mine.imatrix.entries.find(name);
        ASSERT_NE(it, mine.imatrix.entries.end());
        const ImatrixEntry& m = it->second;
        ASSERT_EQ(m.ne0, r.ne0);
        ASSERT_EQ(m.counts.size(), r.counts.size());
        if (r.counts.size() == 1) {
            EXPECT_EQ(m.counts, r.counts);
            EXPECT_LT(max_rel(m, r), 5e-3);
            continue;
        }
        ++experts;
        int64_t total = 0, total_ref = 0;
        double sum = 0, sum_ref = 0;
        for (size_t e = 0; e < r.counts.size(); ++e) {
            EXPECT_LE(std::llabs(m.counts[e] - r.counts[e]), std::max<int64_t>(3, r.counts[e] / 100)) << "expert " << e;
            total += m.counts[e];
            total_ref += r.counts[e];
        }
        for (size_t i = 0; i < r.sums.size(); ++i) sum += m.sums[i], sum_ref += r.sums[i];
        EXPECT_EQ(total, total_ref);  // every token goes to k experts
        EXPECT_LT(std::fabs(sum - sum_ref) / sum_ref, 1e-2);
    }
    EXPECT_EQ(experts, 3 * 5);  // gate, up and down of the five MoE layers
}

TEST(Imatrix, WritesWhatItReads) {
    const Imatrix ref = cera::quantize::read_imatrix(reference("tiny-lfm2moe"));
    const std::string out = tmp_path("rw.gguf");
    cera::quantize::write_imatrix(ref, out);
    // llama-imatrix's file, byte for byte: the same keys, tensor names, shapes (trailing 1s dropped) and values.
    EXPECT_TRUE(cera::test::read_text(out) == cera::test::read_text(reference("tiny-lfm2moe")));
    fs::remove(out);
}

namespace {

// The tensor bytes of a GGUF, in file order, as one SHA-256.
std::string tensor_sha256(const std::string& path) {
    auto f = cera::gguf::File::open(path);
    const std::string flat = tmp_path("flat.bin");
    {
        std::ofstream o(flat, std::ios::binary);
        for (const auto& t : f->tensors()) o.write(reinterpret_cast<const char*>(t.data), std::streamsize(t.n_bytes));
    }
    const auto r = cera::test::run_shell("sha256sum " + cera::test::shell_quote(flat));
    fs::remove(flat);
    return r.out.substr(0, 64);
}

struct Case {
    const char* model;
    const char* type;
    const char* sha256;  // of the tensor bytes of `llama-quantize --imatrix REF model.gguf OUT TYPE`
};
const Case kCases[] = {
    {"tiny-lfm2", "Q2_K", "f43e97f89d1fc45a9e9ec4ea4bc47627b63406bbdbe66c87e28edfe8af809787"},
    {"tiny-lfm2", "Q3_K_S", "0e9a77691ace2108b4474f669b8c7442b6e52033e019109a26cf345c0aba0fde"},
    {"tiny-lfm2", "Q3_K_M", "eafd14cd5c452dbb5faf64b52ba041acd01bda4e90db7d27d4780ab2a8be83c4"},
    {"tiny-lfm2", "Q4_K_S", "38dafda7706bd1b4cb578cc1d88da0f1bf37307c8d343a23d78a1a9e5eacaae6"},
    {"tiny-lfm2", "Q4_K_M", "4db2f66594b61410df6db32aed381d3907e42a73444736ff4cd58a48f579b68a"},
    {"tiny-lfm2", "Q5_K_S", "f5f31069f9ad0151836cc9e4a7238f7e4a1ef204398b6efc01e9579c3b3115f5"},
    {"tiny-lfm2", "Q5_K_M", "18c88c2a655c3db6d7596b76e23fc67699d7f04b59fe97238049fa291a0295ea"},
    {"tiny-lfm2", "Q6_K", "2702ad4cef65a186e187adc10abf5a5ca948b322388311fc1612b844afcaad37"},
    {"tiny-lfm2", "Q4_0", "41cc34d49fb6970e05f99bb1171b586022dd7264df544f223bbfdd1ec6a2c569"},
    {"tiny-lfm2", "Q4_1", "3e9d2653a90df9380c9f23f2a55c7fe58b4daa8766039ae4872aa7111f7854e5"},
    {"tiny-lfm2", "Q5_0", "a33bb48dd52a98f749a42704d45e233fa56ee14733f4556787a60730a6792438"},
    {"tiny-lfm2", "Q5_1", "86f338c4294ac9ea0b01b432abfd89ef1fdce707885efdcd388d7b18be4fcdf4"},
    {"tiny-lfm2moe", "Q2_K", "35af7fae4a830860c20f6b5c9b2b4143c34dbb5bc39079010e9ea2d814af24a3"},
    {"tiny-lfm2moe", "Q3_K_S", "35af7fae4a830860c20f6b5c9b2b4143c34dbb5bc39079010e9ea2d814af24a3"},
    {"tiny-lfm2moe", "Q3_K_M", "8f16dbc94b04694d064037d0aa2cf6aa38a9974883c26abc9de48e8df40944f0"},
    {"tiny-lfm2moe", "Q4_K_S", "784aeb1c4ca6eb24d26871e4d8141056318cb61f47b78b6c5599a6121a024149"},
    {"tiny-lfm2moe", "Q4_K_M", "ac876390e49567bf0f4fe9bed0bb376dbb230c5ec93a6afd16fab3a0fba4f2e8"},
    {"tiny-lfm2moe", "Q5_K_S", "50b668e71d5e0f91c9ccd35b826c560e369a51dad1f20091ec7d0afd75388fba"},
    {"tiny-lfm2moe", "Q5_K_M", "f81be3fed56eb7eeba45b2ad42e5e2155036223b60c075ae79f88b0793be3dad"},
    {"tiny-lfm2moe", "Q6_K", "301261bfb2bf0b4a2856392b0a8780ed53bdc74a2b58a80e08e983e7ef7f85a0"},
    {"tiny-lfm2moe", "Q4_0", "8ea9922ff8e30cf97cc7dbc06828315cd251e2620b367493d3d62fbecc6b0951"},
    {"tiny-lfm2moe", "Q4_1", "368907fca67fe761a62ea2d40caf9cf0bb81c20643532351d86eccdd3f31a6f5"},
    {"tiny-lfm2moe", "Q5_0", "373b923161f10123d3e4ca490eebfcc7570b1acf9edb5c6fd344274e553cd943"},
    {"tiny-lfm2moe", "Q5_1", "a571d6cb0c781d51c4ab8bb6067b0ac9dca6daf505e83ff647ae1db5b2d63561"},
    {"tiny-lfm2", "IQ4_NL", "71d871b1f905ba91eff0fbf16b5c88b0677535317e730f10b1dd0678587a2ae7"},
    {"tiny-lfm2", "IQ4_XS", "d704cb88508577d0bd82e7063593243c86883b845d1b6cc2163375d2bb411c98"},
    {"tiny-lfm2moe", "IQ4_NL", "accb51c696d565a9520b89c98aca16a4c8132d9a5099b431c7c5cf1104d00e24"},
    {"tiny-lfm2moe", "IQ4_XS", "7e90f3d4d500b2f409a919e3bbd82655c019afa4dd26e7d80c61807696d637f0"},
};

cera::quantize::QuantizeSummary quantize(const std::string& in, const std::string& out, const std::string& type,
                                         const std::string& imatrix) {
    cera::quantize::QuantizeOptions o;
    o.input = in;
    o.output = out;
    o.file_type = cera::quantize::parse_file_type(type);
    o.imatrix = imatrix;
    o.n_threads = 2;
    return cera::quantize::quantize_model(o);
}

}  // namespace

TEST(Imatrix, QuantizeEqualsLlamaQuantize) {
    for (const Case& c : kCases) {
        SCOPED_TRACE(std::string(c.model) + " " + c.type);
        const std::string out = tmp_path("q.gguf");
        const auto s = quantize(fixture(c.model), out, c.type, reference(c.model));
        EXPECT_EQ(tensor_sha256(out), c.sha256);
        EXPECT_GT(s.n_imatrix, 0u);  // (tiny-lfm2moe Q6_K: the 192-column rows fall back to Q8_0)
        auto f = cera::gguf::File::open(out);
        EXPECT_EQ(f->get_string("quantize.imatrix.file"), reference(c.model).substr(0, 127));
        EXPECT_EQ(f->get_string("quantize.imatrix.dataset"), "/tmp/stories.txt");
        EXPECT_EQ(f->get_u32("quantize.imatrix.entries_count"), std::string(c.model) == "tiny-lfm2" ? 46u : 39u);
        EXPECT_EQ(f->get_u32("quantize.imatrix.chunks_count"), 67u);
        fs::remove(out);
    }
}

// llama-imatrix's older .dat format (its --output-format dat of the same run): the same bytes as
// llama-quantize --imatrix with that file.
TEST(Imatrix, DatFileQuantizesAsLlamaQuantize) {
    const std::string dat = cera::test::source_path("tests/data/imatrix/tiny-lfm2moe.imatrix.dat");
    const Imatrix m = cera::quantize::read_imatrix(dat);
    EXPECT_EQ(m.entries.size(), 39u);
    EXPECT_EQ(m.chunk_count, 67u);
    EXPECT_EQ(m.datasets, std::vector<std::string>{"/tmp/stories.txt"});
    for (const auto& [type, sha] : {std::pair<const char*, const char*>{
                                        "Q4_K_M", "cd387f1c45fbb41045530a11f258d74e412743d37a85a9225beab0692e3a9e43"},
                                    {"Q4_0", "1efc7d58305c9419b1d6a3659752aac869e0b68414fdfb95a88c471f7467d991"}}) {
        SCOPED_TRACE(type);
        const std::string out = tmp_path("dat.gguf");
        quantize(fixture("tiny-lfm2moe"), out, type, dat);
        EXPECT_EQ(tensor_sha256(out), sha);
        fs::remove(out);
    }
    // Cut short: one line naming the file.
    const std::string bytes = cera::test::read_text(dat), cut = tmp_path("cut.dat");
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    EXPECT_EQ(error_of([&] { cera::quantize::read_imatrix(cut); }), ErrorCode::kInvalidFile);
    fs::remove(cut);
}

// Measured on the first half of the stories, judged on the second: Q4_K_M under the matrix is closer
// to F32 than without it, in perplexity and in KL divergence.
TEST(Imatrix, LowersTheQ4KGap) {
    const std::string im = tmp_path("train.gguf");
    cera::quantize::write_imatrix(run("tiny-lfm2", stories(0, 25)).imatrix, im);
    const std::string plain = tmp_path("plain.gguf"), weighted = tmp_path("weighted.gguf"), base = tmp_path("base.kl");
    quantize(fixture("tiny-lfm2"), plain, "Q4_K_M", "");
    quantize(fixture("tiny-lfm2"), weighted, "Q4_K_M", im);
    const std::string eval = stories(25, 50);
    auto ppl = [&](const std::string& model, bool save) {
        cera::EngineOptions eo;
        eo.device = "cpu";
        eo.threads = 2;
        eo.n_ctx = 128;
        auto engine = cera::Engine::load(model, eo);
        cera::PerplexityOptions po;
        po.n_ctx = 128;
        (save ? po.save_base : po.compare_base) = base;
        return cera::perplexity(*engine, save ? engine->tokenize(eval, true) : std::vector<int32_t>{}, po);
    };
    const auto f32 = ppl(fixture("tiny-lfm2"), true);
    const auto p = ppl(plain, false), w = ppl(weighted, false);
    std::printf("PPL F32 %.4f, Q4_K_M %.4f (KLD %.5f), with the imatrix %.4f (KLD %.5f)\n", f32.ppl, p.ppl, p.kl.kld,
                w.ppl, w.kl.kld);
    EXPECT_LT(std::fabs(w.ppl - f32.ppl), std::fabs(p.ppl - f32.ppl));
    EXPECT_LT(w.kl.kld, p.kl.kld);
    for (const std::string& f : {im, plain, weighted, base}) fs::remove(f);
}

TEST(Imatrix, BadInputFailsWithOneLine) {
    // Not an importance matrix.
    EXPECT_EQ(error_of([] { cera::quantize::read_imatrix(fixture("tiny-lfm2")); }), ErrorCode::kInvalidFile);
    EXPECT_EQ(error_of([] { cera::quantize::read_imatrix("/nonexistent/imatrix.gguf"); }), ErrorCode::kIo);
    auto write = [](const std::string& path, bool with_counts, float value, int64_t ne0) {
        cera::gguf::Writer w;
        w.set_string("general.type", "imatrix");
        std::vector<float> sums(size_t(ne0), value), counts = {10};
        w.add_tensor("blk.0.ffn_down.weight.in_sum2", cera::GgmlType::kF32, {ne0},
                     {reinterpret_cast<const uint8_t*>(sums.data()), sums.size() * 4});
        if (with_counts)
            w.add_tensor("blk.0.ffn_down.weight.counts", cera::GgmlType::kF32, {1},
                         {reinterpret_cast<const uint8_t*>(counts.data()), 4});
        w.write(path);
    };
    const std::string bad = tmp_path("bad.gguf"), out = tmp_path("bad_out.gguf");
    write(bad, false, 1.0f, 256);
    EXPECT_EQ(error_of([&] { cera::quantize::read_imatrix(bad); }), ErrorCode::kInvalidFile);  // sums, no counts
    write(bad, true, NAN, 256);
    EXPECT_EQ(error_of([&] { cera::quantize::read_imatrix(bad); }), ErrorCode::kInvalidFile);  // not finite
    write(bad, true, 1.0f, 100);  // 100 values: not the columns of blk.0.ffn_down
    EXPECT_EQ(error_of([&] { quantize(fixture("tiny-lfm2"), out, "Q4_K_M", bad); }), ErrorCode::kInvalidArgument);
    EXPECT_FALSE(fs::exists(out));
    // Too little text for two chunks.
    EXPECT_EQ(error_of([] { run("tiny-lfm2", "Once upon a time"); }), ErrorCode::kInvalidArgument);
    fs::remove(bad);
}

// The command line: `cera imatrix` writes the file `cera quantize --imatrix` reads.
TEST(Imatrix, CommandLine) {
    const std::string text = tmp_path("text.txt"), im = tmp_path("cli.gguf"), out = tmp_path("cli_q.gguf");
    std::ofstream(text) << stories(0, 50);
    const std::string bin = cera::test::cera_bin();
    auto r =
        cera::test::run_shell(bin + " imatrix -m " + fixture("tiny-lfm2") + " -f " + text + " -c 128 -t 2 -o " + im);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("46 matrices, 67 chunks of 128 tokens"), std::string::npos) << r.out;
    const Imatrix m = cera::quantize::read_imatrix(im);
    EXPECT_EQ(m.datasets, std::vector<std::string>{text});
    r = cera::test::run_shell(bin + " quantize --imatrix " + im + " " + fixture("tiny-lfm2") + " " + out + " Q4_K_M");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("importance matrix: 46 tensors quantized under it"), std::string::npos) << r.out;
    r = cera::test::run_shell(bin + " imatrix -m " + fixture("tiny-lfm2") + " -f /nonexistent.txt");
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
    for (const std::string& f : {text, im, out}) fs::remove(f);
}
