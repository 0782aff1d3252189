// The reader rejects every file of the malformed corpus (tests/data/malformed/,
// written by tools/make_malformed_gguf.py) with a one-line cera::Error, accepts
// the corpus's valid files, rejects every truncation of a valid file, and never
// fails any other way on single-byte corruptions.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "cera/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cera::gguf::File;

namespace {

std::vector<fs::path> corpus(const std::string& sub) {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(cera::test::source_path("tests/data/malformed/" + sub)))
        if (e.is_regular_file() && e.path().extension() == ".gguf") out.push_back(e.path());
    std::sort(out.begin(), out.end());
    return out;
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
    std::string s = cera::test::read_text(p.string());
    return std::vector<uint8_t>(s.begin(), s.end());
}

// Parses a buffer; returns "" on success or the error message; any other exception fails the test.
std::string try_parse(const std::vector<uint8_t>& bytes) {
    try {
        auto f = File::from_memory(bytes.data(), bytes.size(), "buf");
        for (const auto& t : f->tensors()) {  // a file that parses keeps every tensor inside the buffer
            EXPECT_GE(t.data, bytes.data());
            EXPECT_LE(t.data + t.n_bytes, bytes.data() + bytes.size());
        }
        return "";
    } catch (const cera::Error& e) {
        std::string m = e.what();
        EXPECT_FALSE(m.empty());
        EXPECT_EQ(m.find('\n'), std::string::npos) << m;
        return m.empty() ? "?" : m;
    }
}

}  // namespace

TEST(GgufMalformed, EveryCorpusFileIsRejectedWithOneLine) {
    auto files = corpus("");
    ASSERT_GE(files.size(), 40u);
    for (const auto& p : files) {
        SCOPED_TRACE(p.filename().string());
        try {
            File::open(p.string());
            ADD_FAILURE() << "accepted";
        } catch (const cera::Error& e) {
            std::string m = e.what();
            EXPECT_FALSE(m.empty());
            EXPECT_EQ(m.find('\n'), std::string::npos) << m;
            EXPECT_EQ(m.rfind(p.string() + ": ", 0), 0u) << "message should start with the path: " << m;
            EXPECT_TRUE(e.code() == cera::ErrorCode::kInvalidFile || e.code() == cera::ErrorCode::kUnsupported) << m;
        }
        // The same bytes from memory fail the same way.
        EXPECT_NE(try_parse(read_bytes(p)), "");
    }
}

TEST(GgufMalformed, MessagesNameWhatIsWrong) {
    const std::map<std::string, std::string> expect = {
        {"bad_magic", "bad magic"},
        {"version_1", "version 1 is not supported"},
        {"version_99", "version 99"},
        {"big_endian", "big-endian"},
        {"bool_value_2", "'test.flag': bool value 2"},
        {"duplicate_key", "duplicate metadata key 'test.block_count'"},
        {"duplicate_tensor_name", "duplicate tensor name 'a'"},
        {"alignment_zero", "'general.alignment': 0 is not"},
        {"alignment_wrong_type", "'general.alignment': expected u32, got string"},
        {"unknown_value_type", "'test.block_count': unknown value type 13"},
        {"unknown_tensor_type", "tensor 'a': unknown tensor type 4"},
        {"n_dims_5", "tensor 'a': n_dims 5"},
        {"zero_dim", "tensor 'a': dimension 1 is zero"},
        {"element_count_overflow", "tensor 'a': element count overflows"},
        {"ne0_not_block_multiple", "not a multiple of the Q8_0 block size 32"},
        {"data_end_past_eof", "tensor 'c': data [640, 768) lies outside the file (size 672)"},
        {"misaligned_offset", "tensor 'c': data offset 108 is not a multiple of the alignment 32"},
        {"overlapping_tensors", "overlaps tensor 'a'"},
        {"nested_arrays_too_deep", "nested deeper"},
        {"key_not_utf8", "'test.\\xff\\xfe' at offset 101 is not valid UTF-8"},
        {"string_length_past_eof", "string length 5000"},
        {"kv_count_absurd", "metadata count 9223372036854775808"},
        {"empty", "empty file"},
    };
    for (const auto& [name, needle] : expect) {
        SCOPED_TRACE(name);
        std::string m = try_parse(read_bytes(cera::test::source_path("tests/data/malformed/" + name + ".gguf")));
        EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
}

TEST(GgufMalformed, ValidCorpusFilesOpen) {
    auto files = corpus("valid");
    ASSERT_EQ(files.size(), 4u);
    for (const auto& p : files) {
        SCOPED_TRACE(p.filename().string());
        auto f = File::open(p.string());
        EXPECT_EQ(f->architecture(), "test");
        EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "bc", "\xc3\xa9"}));
        const auto& nested = f->find("test.nested")->as_array();
        ASSERT_EQ(nested.items.size(), 2u);
        EXPECT_EQ(nested.items[0].as_array().items[1].as_int(), 2);
        EXPECT_TRUE(nested.items[1].as_array().items.empty());
        EXPECT_EQ(f->get_i64("test.i64"), -5);
        if (p.filename() == "no_tensors.gguf") {
            EXPECT_TRUE(f->tensors().empty());
        } else {
            ASSERT_EQ(f->tensors().size(), 3u);
            EXPECT_EQ(f->find_tensor("b")->type, cera::GgmlType::kQ8_0);
            EXPECT_EQ(f->find_tensor("b")->n_bytes, 68u);
            EXPECT_EQ(f->find_tensor("b")->data[0], 11);  // the generator's byte pattern
        }
    }
    EXPECT_EQ(File::open(cera::test::source_path("tests/data/malformed/valid/base_v2.gguf"))->version(), 2u);
    EXPECT_EQ(File::open(cera::test::source_path("tests/data/malformed/valid/align64.gguf"))->alignment(), 64u);
}

TEST(GgufMalformed, EveryTruncationIsRejected) {
    auto bytes = read_bytes(cera::test::source_path("tests/data/malformed/valid/base.gguf"));
    auto full = File::from_memory(bytes.data(), bytes.size());
    size_t end = 0;  // end of the last tensor's data; the padding after it may go
    for (const auto& t : full->tensors()) end = std::max(end, size_t(t.data + t.n_bytes - bytes.data()));
    for (size_t n = 0; n < end; ++n) {
        std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
        EXPECT_NE(try_parse(cut), "") << "prefix of " << n << " bytes accepted";
    }
    EXPECT_EQ(try_parse(std::vector<uint8_t>(bytes.begin(), bytes.begin() + end)), "");
}

TEST(GgufMalformed, SingleByteCorruptionsNeverCrash) {
    // Writer-made file with every value type; corrupt each byte of the header,
    // metadata and tensor infos in a few ways. Parsing must succeed or throw cera::Error.
    using namespace cera::gguf;
    Writer w;
    w.set_string("general.architecture", "x");
    w.set("n", value_array(ValueType::kArray, {value_i32_array(std::vector<int32_t>{1, 2})}));
    w.set("s", value_string_array({"ab", "c"}));
    w.set("f", value_f64(1.5));
    w.set("b", value_bool(true));
    w.set("u", value_u16(3));
    std::vector<uint8_t> four(4 * 34);
    w.add_tensor("t0", cera::GgmlType::kQ8_0, {32, 4}, four);
    w.add_tensor("t1", cera::GgmlType::kF32, {2, 3}, std::vector<uint8_t>(24));
    auto bytes = w.to_bytes();
    auto f = File::from_memory(bytes.data(), bytes.size());
    const size_t header_end = size_t(f->data_offset());
    int rejected = 0;
    for (size_t i = 0; i < header_end; ++i) {
        for (uint8_t v : {uint8_t(0), uint8_t(0xFF), uint8_t(bytes[i] + 1), uint8_t(bytes[i] ^ 0x80)}) {
            auto copy = bytes;
            if (copy[i] == v) continue;
            copy[i] = v;
            rejected += try_parse(copy) != "";
        }
    }
    EXPECT_GT(rejected, int(header_end));  // most corruptions of the structure are caught
}
