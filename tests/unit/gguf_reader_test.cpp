// The GGUF reader against real files: every GGUF in the test data opens, and the
// fixtures' tensors and metadata match their manifests (written by gguf-py).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cera/error.h"
#include "gguf/gguf.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cera::gguf::File;
using cera::gguf::Value;
using cera::gguf::ValueType;

namespace {

// Every *.gguf the tests ship: fixtures, vocabularies and the bundled models.
std::vector<std::string> all_gguf_files() {
    std::vector<std::string> out;
    for (const char* dir : {"fixtures", "vocab", "vocab-extra", "models"}) {
        fs::path root = cera::test::data_path(dir);
        if (!fs::exists(root)) continue;
        for (const auto& e : fs::recursive_directory_iterator(root))
            if (e.is_regular_file() && e.path().extension() == ".gguf") out.push_back(e.path().string());
    }
    for (const auto& e : fs::directory_iterator(cera::test::source_path("models")))
        if (e.path().extension() == ".gguf") out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

void expect_value_matches(const std::string& key, const Value& v, const nlohmann::json& want) {
    SCOPED_TRACE(key);
    if (want.is_string() && v.type == ValueType::kArray) {
        // The manifest summarizes long arrays as "<array of N>".
        const std::string s = want.get<std::string>();
        ASSERT_EQ(s.rfind("<array of ", 0), 0u) << s;
        EXPECT_EQ(std::stoull(s.substr(10)), v.as_array().items.size());
    } else if (want.is_string()) {
        EXPECT_EQ(v.as_string(), want.get<std::string>());
    } else if (want.is_boolean()) {
        ASSERT_EQ(v.type, ValueType::kBool);
        EXPECT_EQ(std::get<bool>(v.v), want.get<bool>());
    } else if (want.is_number_integer()) {
        ASSERT_TRUE(v.is_integer()) << cera::gguf::value_type_name(v.type);
        EXPECT_EQ(v.as_int(), want.get<int64_t>());
    } else if (want.is_number_float()) {
        ASSERT_TRUE(v.is_float()) << cera::gguf::value_type_name(v.type);
        EXPECT_NEAR(v.as_double(), want.get<double>(), 1e-6 * std::abs(want.get<double>()));
    } else if (want.is_array()) {
        ASSERT_EQ(v.type, ValueType::kArray);
        const auto& items = v.as_array().items;
        ASSERT_EQ(items.size(), want.size());
        for (size_t i = 0; i < items.size(); ++i) expect_value_matches(key + "[" + std::to_string(i) + "]", items[i], want[i]);
    } else {
        ADD_FAILURE() << "unexpected manifest value " << want.dump();
    }
}

}  // namespace

TEST(GgufReader, EveryShippedFileOpens) {
    auto files = all_gguf_files();
    ASSERT_GE(files.size(), 15u);
    for (const auto& path : files) {
        SCOPED_TRACE(path);
        std::unique_ptr<File> f;
        ASSERT_NO_THROW(f = File::open(path));
        EXPECT_TRUE(f->version() == 2 || f->version() == 3);
        EXPECT_FALSE(f->metadata().empty());
        EXPECT_EQ(f->data_offset() % f->alignment(), 0u);
        for (const auto& t : f->tensors()) {
            EXPECT_EQ(f->find_tensor(t.name), &t);
            EXPECT_NE(t.data, nullptr);
            EXPECT_EQ(t.n_bytes, cera::row_size(t.type, t.ne[0]) * size_t(t.rows()));
            EXPECT_LE(f->data_offset() + t.offset + t.n_bytes, f->file_size());
        }
    }
}

TEST(GgufReader, FixturesMatchManifests) {
    int checked = 0;
    for (const auto& path : all_gguf_files()) {
        const std::string manifest_path = path + ".manifest.json";
        if (!fs::exists(manifest_path)) continue;
        SCOPED_TRACE(path);
        auto manifest = nlohmann::json::parse(cera::test::read_text(manifest_path));
        auto f = File::open(path);
        const auto& want_tensors = manifest.at("tensors");
        ASSERT_EQ(f->tensors().size(), want_tensors.size());
        for (size_t i = 0; i < want_tensors.size(); ++i) {
            const auto& t = f->tensors()[i];
            EXPECT_EQ(t.name, want_tensors[i].at("name").get<std::string>());
            EXPECT_STREQ(cera::type_name(t.type), want_tensors[i].at("type").get<std::string>().c_str());
            EXPECT_EQ(t.ne, want_tensors[i].at("shape").get<std::vector<int64_t>>()) << t.name;
        }
        const auto& kv = manifest.at("kv");
        EXPECT_EQ(f->metadata().size(), kv.size());
        for (const auto& [key, want] : kv.items()) {
            const Value* v = f->find(key);
            ASSERT_NE(v, nullptr) << key;
            expect_value_matches(key, *v, want);
        }
        ++checked;
    }
    EXPECT_GE(checked, 7);
}

TEST(GgufReader, TypedGetters) {
    auto f = File::open(cera::test::data_path("fixtures/tiny-lfm2/model.gguf"));
    EXPECT_EQ(f->architecture(), "lfm2");
    EXPECT_EQ(f->get_u32("lfm2.block_count"), 8u);
    EXPECT_EQ(f->get_i64("lfm2.embedding_length"), 256);
    EXPECT_FLOAT_EQ(f->get_f32("lfm2.rope.freq_base"), 1e6f);
    EXPECT_TRUE(f->get_bool("tokenizer.ggml.add_bos_token"));
    EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 4096u);
    EXPECT_EQ(f->get_int_array("lfm2.attention.head_count_kv"), (std::vector<int64_t>{0, 0, 2, 0, 0, 2, 0, 2}));
    EXPECT_EQ(f->get_u32("no.such.key", 7u), 7u);
    EXPECT_EQ(f->get_string("no.such.key", "x"), "x");

    try {
        f->get_u32("general.architecture");
        FAIL() << "no throw";
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kInvalidFile);
        std::string m = e.what();
        EXPECT_NE(m.find("general.architecture"), std::string::npos) << m;
        EXPECT_NE(m.find("u32"), std::string::npos) << m;
        EXPECT_NE(m.find("string"), std::string::npos) << m;
    }
    try {
        f->get_string("lfm2.nope");
        FAIL() << "no throw";
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kMissing);
        EXPECT_NE(std::string(e.what()).find("lfm2.nope"), std::string::npos);
    }
    EXPECT_THROW(f->get_bool("lfm2.block_count"), cera::Error);
    EXPECT_THROW(f->get_string_array("lfm2.attention.head_count_kv"), cera::Error);
    EXPECT_THROW(f->get_f32("tokenizer.ggml.model"), cera::Error);
}

TEST(GgufReader, TensorDataPointsIntoTheMapping) {
    auto f = File::open(cera::test::data_path("fixtures/tiny-lfm2/model.gguf"));
    const auto* t = f->find_tensor("token_embd.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, cera::GgmlType::kF32);
    EXPECT_EQ(t->ne, (std::vector<int64_t>{256, 4096}));
    EXPECT_EQ(t->n_elements(), 256 * 4096);
    EXPECT_EQ(t->rows(), 4096);
    EXPECT_EQ(t->n_bytes, size_t(256) * 4096 * 4);
    // The norm of an embedding row is finite and non-zero: the pointer is the real data.
    const float* row = reinterpret_cast<const float*>(t->data);
    double s = 0;
    for (int i = 0; i < 256; ++i) s += double(row[i]) * row[i];
    EXPECT_GT(s, 0.0);
    EXPECT_TRUE(std::isfinite(s));
    EXPECT_EQ(f->find_tensor("nope"), nullptr);
}

TEST(GgufReader, OpenMissingFileIsIoError) {
    try {
        File::open("/nonexistent/x.gguf");
        FAIL();
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kIo);
    }
}
