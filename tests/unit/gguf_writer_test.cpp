// The GGUF writer round-trips through the reader: every value type, nested
// arrays, alignments other than the default, tensors of several types; and it
// rewrites a real fixture so that the reader sees the same file.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "cera/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "test_util.h"

using namespace cera::gguf;
using cera::GgmlType;

namespace {

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> out(n);
    for (auto& b : out) b = uint8_t(rng());
    return out;
}

std::unique_ptr<File> reread(const std::vector<uint8_t>& bytes) { return File::from_memory(bytes.data(), bytes.size()); }

// Deep comparison of two values, including element types of arrays.
void expect_same(const Value& a, const Value& b, const std::string& where) {
    ASSERT_EQ(a.type, b.type) << where;
    if (a.type == ValueType::kArray) {
        const Array& x = a.as_array();
        const Array& y = b.as_array();
        ASSERT_EQ(x.elem_type, y.elem_type) << where;
        ASSERT_EQ(x.items.size(), y.items.size()) << where;
        for (size_t i = 0; i < x.items.size(); ++i) expect_same(x.items[i], y.items[i], where + "[" + std::to_string(i) + "]");
    } else {
        EXPECT_TRUE(a.v == b.v) << where;
    }
}

}  // namespace

TEST(GgufWriter, EveryValueTypeRoundTrips) {
    Writer w;
    w.set("u8", value_u8(250));
    w.set("i8", value_i8(-100));
    w.set("u16", value_u16(65000));
    w.set("i16", value_i16(-32000));
    w.set("u32", value_u32(4000000000u));
    w.set("i32", value_i32(-2000000000));
    w.set("u64", value_u64(18000000000000000000ull));
    w.set("i64", value_i64(-9000000000000000000ll));
    w.set("f32", value_f32(3.25f));
    w.set("f64", value_f64(-1.0 / 3.0));
    w.set("bool.t", value_bool(true));
    w.set("bool.f", value_bool(false));
    w.set("string", value_string(std::string("héllo\n\0x", 9)));
    w.set("empty", value_string(""));
    w.set("strings", value_string_array({"a", "", "ccc", "\xe4\xbd\xa0"}));
    std::vector<int32_t> ints = {1, -2, 3};
    w.set("ints", value_i32_array(ints));
    std::vector<float> floats = {0.5f, -1e30f};
    w.set("floats", value_f32_array(floats));
    w.set("nested", value_array(ValueType::kArray, {value_array(ValueType::kU8, {value_u8(1), value_u8(2)}),
                                                     value_array(ValueType::kString, {value_string("x")}),
                                                     value_array(ValueType::kArray, {value_array(ValueType::kF64, {})})}));
    w.set("empty.array", value_array(ValueType::kI64, {}));
    w.set("u32", value_u32(7));  // a second set replaces in place

    auto bytes = w.to_bytes();
    auto f = reread(bytes);
    EXPECT_EQ(f->version(), 3u);
    ASSERT_EQ(f->metadata().size(), w.metadata().size());
    for (size_t i = 0; i < w.metadata().size(); ++i) {
        EXPECT_EQ(f->metadata()[i].first, w.metadata()[i].first);
        expect_same(f->metadata()[i].second, w.metadata()[i].second, w.metadata()[i].first);
    }
    EXPECT_EQ(f->metadata()[4].first, "u32");
    EXPECT_EQ(f->get_u32("u32"), 7u);
    EXPECT_EQ(f->get_i64("i64"), -9000000000000000000ll);
    EXPECT_EQ(f->find("u64")->as_uint(), 18000000000000000000ull);
    EXPECT_THROW(f->get_i64("u64"), cera::Error);  // does not fit
    EXPECT_THROW(f->get_u32("i8"), cera::Error);   // negative
    EXPECT_FLOAT_EQ(f->get_f32("f32"), 3.25f);
    EXPECT_DOUBLE_EQ(f->find("f64")->as_double(), -1.0 / 3.0);
    EXPECT_EQ(f->get_string("string"), std::string("héllo\n\0x", 9));
    EXPECT_EQ(f->get_string_array("strings")[3], "\xe4\xbd\xa0");
    EXPECT_EQ(f->get_int_array("ints"), (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(f->get_f32_array("floats"), floats);
    EXPECT_TRUE(f->get_bool("bool.t"));
    EXPECT_FALSE(f->get_bool("bool.f"));
    EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufWriter, TensorsOfSeveralTypesAndAlignments) {
    for (uint32_t alignment : {1u, 8u, 32u, 64u, 4096u}) {
        SCOPED_TRACE(alignment);
        Writer w;
        w.set_string("general.architecture", "test");
        w.set_alignment(alignment);
        struct Spec {
            const char* name;
            GgmlType type;
            std::vector<int64_t> ne;
        };
        std::vector<Spec> specs = {
            {"a.f32", GgmlType::kF32, {3}},
            {"b.f16", GgmlType::kF16, {5, 3}},
            {"c.q8_0", GgmlType::kQ8_0, {64, 3, 2}},
            {"d.q4_k", GgmlType::kQ4_K, {256, 2}},
            {"e.q6_k", GgmlType::kQ6_K, {512, 1, 1, 2}},
            {"f.bf16", GgmlType::kBF16, {7}},
            {"g.i8", GgmlType::kI8, {1}},
        };
        std::vector<std::vector<uint8_t>> data;
        for (size_t i = 0; i < specs.size(); ++i) {
            const auto& s = specs[i];
            int64_t n = 1;
            for (auto d : s.ne) n *= d;
            const auto& ti = cera::type_info(s.type);
            data.push_back(random_bytes(size_t(n / ti.block_size) * ti.type_size, uint32_t(i + 1)));
            if (i % 2 == 0) {
                w.add_tensor(s.name, s.type, s.ne, data.back());
            } else {
                auto copy = data.back();
                w.add_tensor(s.name, s.type, s.ne, [copy](uint8_t* dst, size_t n_bytes) {
                    ASSERT_EQ(n_bytes, copy.size());
                    std::memcpy(dst, copy.data(), n_bytes);
                });
            }
        }
        auto bytes = w.to_bytes();
        EXPECT_EQ(bytes.size() % alignment, 0u);
        auto f = reread(bytes);
        EXPECT_EQ(f->alignment(), alignment);
        EXPECT_EQ(f->get_u32("general.alignment"), alignment);
        ASSERT_EQ(f->tensors().size(), specs.size());
        for (size_t i = 0; i < specs.size(); ++i) {
            const auto& t = f->tensors()[i];
            EXPECT_EQ(t.name, specs[i].name);
            EXPECT_EQ(t.type, specs[i].type);
            EXPECT_EQ(t.ne, specs[i].ne);
            EXPECT_EQ(t.offset % alignment, 0u);
            EXPECT_EQ(uintptr_t(t.data - bytes.data()) % alignment, 0u);
            ASSERT_EQ(t.n_bytes, data[i].size());
            EXPECT_EQ(std::memcmp(t.data, data[i].data(), t.n_bytes), 0) << t.name;
        }
    }
}

TEST(GgufWriter, RejectsBadTensorsAndValues) {
    Writer w;
    EXPECT_THROW(w.set_alignment(0), cera::Error);
    EXPECT_THROW(w.set_alignment(48), cera::Error);
    std::vector<uint8_t> four(4);
    EXPECT_THROW(w.add_tensor("x", GgmlType::kQ4_0, {16}, [](uint8_t*, size_t) {}), cera::Error);  // not a block
    EXPECT_THROW(w.add_tensor("x", GgmlType::kF32, {}, four), cera::Error);
    EXPECT_THROW(w.add_tensor("x", GgmlType::kF32, {1, 1, 1, 1, 1}, four), cera::Error);
    EXPECT_THROW(w.add_tensor("x", GgmlType::kF32, {0}, four), cera::Error);
    EXPECT_THROW(w.add_tensor("x", GgmlType::kF32, {2}, four), cera::Error);  // wrong byte count
    EXPECT_EQ(w.n_tensors(), 0u);
    w.add_tensor("x", GgmlType::kF32, {1}, four);
    EXPECT_THROW(w.add_tensor("x", GgmlType::kF32, {1}, four), cera::Error);
    w.set("bad", value_array(ValueType::kU8, {value_u8(1), value_string("no")}));
    EXPECT_THROW(w.to_bytes(), cera::Error);
}

TEST(GgufWriter, RewritesARealFixture) {
    const std::string src = cera::test::data_path("fixtures/tiny-lfm2/model-Q4_K_M.gguf");
    auto in = File::open(src);
    Writer w;
    for (const auto& [k, v] : in->metadata()) w.set(k, v);
    for (const auto& t : in->tensors()) w.add_tensor(t.name, t.type, t.ne, std::span<const uint8_t>(t.data, t.n_bytes));
    const std::string out_path = std::string(CERA_BINARY_DIR) + "/gguf_writer_test_out.gguf";
    w.write(out_path);
    auto out = File::open(out_path);
    ASSERT_EQ(out->metadata().size(), in->metadata().size());
    for (size_t i = 0; i < in->metadata().size(); ++i) {
        EXPECT_EQ(out->metadata()[i].first, in->metadata()[i].first);
        expect_same(out->metadata()[i].second, in->metadata()[i].second, in->metadata()[i].first);
    }
    ASSERT_EQ(out->tensors().size(), in->tensors().size());
    for (size_t i = 0; i < in->tensors().size(); ++i) {
        const auto& a = in->tensors()[i];
        const auto& b = out->tensors()[i];
        EXPECT_EQ(a.name, b.name);
        EXPECT_EQ(a.type, b.type);
        EXPECT_EQ(a.ne, b.ne);
        EXPECT_EQ(a.offset, b.offset) << a.name;  // gguf-py lays tensors out the same way
        EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
    }
    std::remove(out_path.c_str());
}

TEST(GgufWriter, WriteToBadPathIsIoError) {
    Writer w;
    w.set_u32("x", 1);
    try {
        w.write("/nonexistent-dir/out.gguf");
        FAIL();
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kIo);
    }
}
