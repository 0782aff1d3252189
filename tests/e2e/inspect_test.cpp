// `cera inspect` end to end: its --json output agrees with the reader and the
// fixtures' manifests for every shipped GGUF, and every malformed file makes it
// exit 1 with a single line on stderr.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

using cera::test::cera_bin;
using cera::test::shell_quote;
using Result = cera::test::ShellResult;

Result run_cera(const std::string& args) { return cera::test::run_shell(shell_quote(cera_bin()) + " " + args); }

std::vector<std::string> shipped_gguf_files() {
    std::vector<std::string> out;
    for (const char* dir : {"fixtures", "vocab", "vocab-extra"})
        for (const auto& e : fs::recursive_directory_iterator(cera::test::data_path(dir)))
            if (e.is_regular_file() && e.path().extension() == ".gguf") out.push_back(e.path().string());
    for (const auto& e : fs::directory_iterator(cera::test::source_path("models")))
        if (e.path().extension() == ".gguf") out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

}  // namespace

TEST(InspectE2E, JsonAgreesWithReaderAndManifests) {
    ASSERT_TRUE(fs::exists(cera_bin())) << cera_bin();
    int with_manifest = 0;
    auto files = shipped_gguf_files();
    ASSERT_GE(files.size(), 15u);
    for (const auto& path : files) {
        SCOPED_TRACE(path);
        Result r = run_cera("inspect --json -m " + shell_quote(path));
        ASSERT_EQ(r.code, 0) << r.err;
        EXPECT_EQ(r.err, "");
        auto j = nlohmann::json::parse(r.out);
        auto f = cera::gguf::File::open(path);
        EXPECT_EQ(j.at("version").get<uint32_t>(), f->version());
        ASSERT_EQ(j.at("n_tensors").get<size_t>(), f->tensors().size());
        ASSERT_EQ(j.at("tensors").size(), f->tensors().size());
        EXPECT_EQ(j.at("metadata").size(), f->metadata().size());
        for (size_t i = 0; i < f->tensors().size(); ++i) {
            const auto& jt = j["tensors"][i];
            const auto& t = f->tensors()[i];
            EXPECT_EQ(jt.at("name").get<std::string>(), t.name);
            EXPECT_EQ(jt.at("type").get<std::string>(), cera::type_name(t.type));
            EXPECT_EQ(jt.at("shape").get<std::vector<int64_t>>(), t.ne);
            EXPECT_EQ(jt.at("offset").get<uint64_t>(), t.offset);
            EXPECT_EQ(jt.at("bytes").get<size_t>(), t.n_bytes);
        }
        // Arrays: long ones summarized with their element type and length, short ones in full.
        for (const auto& [key, v] : f->metadata()) {
            if (v.type != cera::gguf::ValueType::kArray) continue;
            const auto& jv = j["metadata"][key];
            if (v.as_array().items.size() > 64) {
                EXPECT_EQ(jv.at("len").get<size_t>(), v.as_array().items.size()) << key;
                EXPECT_EQ(jv.at("type").get<std::string>(), cera::gguf::value_type_name(v.as_array().elem_type));
            } else {
                EXPECT_TRUE(jv.is_array()) << key;
                EXPECT_EQ(jv.size(), v.as_array().items.size()) << key;
            }
        }
        const std::string manifest_path = path + ".manifest.json";
        if (fs::exists(manifest_path)) {
            auto m = nlohmann::json::parse(cera::test::read_text(manifest_path));
            ASSERT_EQ(m.at("tensors").size(), j.at("tensors").size());
            for (size_t i = 0; i < m["tensors"].size(); ++i) {
                EXPECT_EQ(m["tensors"][i].at("name"), j["tensors"][i].at("name"));
                EXPECT_EQ(m["tensors"][i].at("type"), j["tensors"][i].at("type"));
                EXPECT_EQ(m["tensors"][i].at("shape"), j["tensors"][i].at("shape"));
            }
            for (const auto& [key, want] : m.at("kv").items()) {
                const bool summarized = want.is_string() && want.get<std::string>().rfind("<array of", 0) == 0;
                if ((want.is_string() || want.is_boolean() || want.is_number_integer()) && !summarized)
                    EXPECT_EQ(j["metadata"].at(key), want) << key;
            }
            ++with_manifest;
        }
    }
    EXPECT_GE(with_manifest, 7);
}

TEST(InspectE2E, TextViewHasTableTotalsAndSummary) {
    Result r = run_cera("inspect -m " + shell_quote(cera::test::source_path("models/stories260K.gguf")));
    ASSERT_EQ(r.code, 0) << r.err;
    auto f = cera::gguf::File::open(cera::test::source_path("models/stories260K.gguf"));
    int64_t params = 0;
    for (const auto& t : f->tensors()) params += t.n_elements();
    EXPECT_NE(r.out.find("tokenizer.ggml.tokens"), std::string::npos);
    EXPECT_NE(r.out.find("[array of 512 string]"), std::string::npos);
    EXPECT_NE(r.out.find("blk.4.ffn_down.weight"), std::string::npos);
    EXPECT_NE(r.out.find("totals: " + std::to_string(f->tensors().size()) + " tensors, " + std::to_string(params) +
                         " parameters"),
              std::string::npos)
        << r.out;
    EXPECT_NE(r.out.find("n_layer        5"), std::string::npos) << r.out;
}

TEST(InspectE2E, MalformedFilesExitOneWithOneLine) {
    int n = 0;
    for (const auto& e : fs::directory_iterator(cera::test::source_path("tests/data/malformed"))) {
        if (e.path().extension() != ".gguf") continue;
        SCOPED_TRACE(e.path().filename().string());
        for (const char* mode : {"", "--json "}) {
            Result r = run_cera(std::string("inspect ") + mode + "-m " + shell_quote(e.path().string()));
            EXPECT_EQ(r.code, 1);
            EXPECT_EQ(r.out, "");
            ASSERT_FALSE(r.err.empty());
            EXPECT_EQ(r.err.rfind("cera inspect: error: ", 0), 0u) << r.err;
            EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;  // exactly one line
        }
        ++n;
    }
    EXPECT_GE(n, 40);
}

TEST(InspectE2E, BadUsageExitsTwo) {
    for (const char* args : {"inspect", "inspect --bogus", "inspect -m", "inspect a.gguf b.gguf"}) {
        SCOPED_TRACE(args);
        Result r = run_cera(args);
        EXPECT_EQ(r.code, 2);
        EXPECT_EQ(r.err.rfind("cera inspect: error: ", 0), 0u) << r.err;
        EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
    }
    Result missing = run_cera("inspect -m /nonexistent/file.gguf");
    EXPECT_EQ(missing.code, 1);
    EXPECT_NE(missing.err.find("/nonexistent/file.gguf"), std::string::npos);
    Result help = run_cera("inspect --help");
    EXPECT_EQ(help.code, 0);
    EXPECT_NE(help.out.find("--json"), std::string::npos);
}

TEST(InspectE2E, SynthWritesWhatInspectReads) {
    const std::string vocab = cera::test::data_path("fixtures/tiny-lfm2/model.gguf");
    const std::string out = fs::temp_directory_path() / ("cera_synth_e2e_" + std::to_string(::getpid()) + ".gguf");
    for (const char* arch : {"lfm2", "lfm2moe", "llama", "qwen2", "qwen3", "granite"}) {
        SCOPED_TRACE(arch);
        Result r = run_cera(std::string("synth --arch ") + arch + " --preset tiny --type Q8_0 --seed 7 --vocab-from " +
                            shell_quote(vocab) + " -o " + shell_quote(out));
        ASSERT_EQ(r.code, 0) << r.err;
        Result j = run_cera("inspect --json -m " + shell_quote(out));
        ASSERT_EQ(j.code, 0) << j.err;
        auto doc = nlohmann::json::parse(j.out);
        EXPECT_EQ(doc["metadata"]["general.architecture"], arch);
        EXPECT_EQ(doc["summary"]["n_layer"], 4);
        EXPECT_EQ(doc["summary"]["n_embd"], 256);
        EXPECT_EQ(doc["summary"]["n_vocab"], 4096);
        EXPECT_EQ(doc["metadata"]["tokenizer.ggml.tokens"]["len"], 4096);
        bool saw_q8 = false;
        for (const auto& t : doc["tensors"]) saw_q8 |= t["type"] == "Q8_0";
        EXPECT_TRUE(saw_q8);
    }
    // Same seed, same bytes.
    const std::string again = out + ".2";
    const std::string args = " --arch granite --type Q8_0 --seed 7 --vocab-from " + shell_quote(vocab) + " -o ";
    ASSERT_EQ(run_cera("synth" + args + shell_quote(again)).code, 0);
    EXPECT_EQ(cera::test::read_text(out), cera::test::read_text(again));
    fs::remove(out);
    fs::remove(again);

    // Bad usage exits 2 with one line.
    for (const char* bad : {"synth --arch nope --vocab-from x -o y", "synth --arch llama -o y",
                            "synth --arch llama --vocab-from x -o y --type Q9_9", "synth --arch llama --preset big "
                            "--vocab-from x -o y"}) {
        SCOPED_TRACE(bad);
        Result r = run_cera(bad);
        EXPECT_EQ(r.code, 2);
        EXPECT_EQ(r.err.rfind("cera synth: error: ", 0), 0u) << r.err;
        EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
    }
}
