// `cera quantize` against llama-quantize: quantizing each F32 fixture reproduces the
// quantized fixture llama-quantize wrote from it, byte for byte (tensor types, tensor
// bytes, tensor order, every metadata key and value); the output does not depend on the
// thread count; a quantized or BF16 input is requantized through f32; bad input fails
// with one line and leaves no file behind.
#include "quantize/quantize.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cera/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using cera::GgmlType;
using cera::gguf::File;
using cera::gguf::Value;
using cera::quantize::FileType;
using cera::quantize::QuantizeOptions;

namespace {

std::string tmp_path(const std::string& name) {
    return (fs::temp_directory_path() / ("cera_quantize_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string fixture(const std::string& model, const std::string& file) {
    return cera::test::data_path("fixtures/" + model + "/" + file);
}

std::string quantize(const std::string& in, const std::string& type, int threads, const std::string& name) {
    QuantizeOptions o;
    o.input = in;
    o.output = tmp_path(name);
    o.file_type = cera::quantize::parse_file_type(type);
    o.n_threads = threads;
    cera::quantize::quantize_model(o);
    return o.output;
}

// Two metadata values are the same: type and value, arrays item by item.
bool same_value(const Value& a, const Value& b) {
    if (a.type != b.type) return false;
    if (a.type != cera::gguf::ValueType::kArray) return a.v == b.v;
    const auto &x = a.as_array(), &y = b.as_array();
    if (x.elem_type != y.elem_type || x.items.size() != y.items.size()) return false;
    for (size_t i = 0; i < x.items.size(); ++i)
        if (!same_value(x.items[i], y.items[i])) return false;
    return true;
}

// Everything of `mine` equals `ref`: metadata key for key in order, tensors in order with
// the same type, shape and bytes, then the files byte for byte.
void expect_same_model(const std::string& mine_path, const std::string& ref_path) {
    auto mine = File::open(mine_path), ref = File::open(ref_path);
    ASSERT_EQ(mine->metadata().size(), ref->metadata().size());
    for (size_t i = 0; i < ref->metadata().size(); ++i) {
        const auto& [rk, rv] = ref->metadata()[i];
        const auto& [mk, mv] = mine->metadata()[i];
        EXPECT_EQ(mk, rk) << "key #" << i;
        EXPECT_TRUE(same_value(mv, rv)) << rk;
    }
    ASSERT_EQ(mine->tensors().size(), ref->tensors().size());
    for (size_t i = 0; i < ref->tensors().size(); ++i) {
        const auto &r = ref->tensors()[i], &m = mine->tensors()[i];
        ASSERT_EQ(m.name, r.name) << "tensor #" << i;
        EXPECT_EQ(m.type, r.type) << r.name << ": " << cera::type_name(m.type) << " vs " << cera::type_name(r.type);
        EXPECT_EQ(m.ne, r.ne) << r.name;
        if (m.type == r.type && m.n_bytes == r.n_bytes)
            EXPECT_EQ(std::memcmp(m.data, r.data, r.n_bytes), 0) << r.name << ": tensor bytes differ";
    }
    EXPECT_EQ(cera::test::read_text(mine_path) == cera::test::read_text(ref_path), true) << "file bytes differ";
}

std::string sha256(const std::string& path) {
    const auto r = cera::test::run_shell("sha256sum " + cera::test::shell_quote(path));
    return r.out.substr(0, 64);
}

// llama-quantize model.gguf model-<T>.gguf <T> at llama.cpp 34af94cd9, by the sha256 of the file
// it wrote (fixtures/SHA256SUMS and fixtures/README.md "Not shipped"). Where the file itself is
// in the test data (or models/), it is compared in detail too, so a difference names the tensor.
struct Case {
    const char* model;
    const char* type;
    const char* sha256;
};
const Case kCases[] = {
    {"tiny-lfm2", "Q8_0", "0f5c86ea748ae1e72f68c00e634b3929dd506aa067ea819b77e243ee5459caae"},
    {"tiny-lfm2", "Q6_K", "d0dbe8ff5403acbf89ca419c97c341f06517e08c9a1da83062c052e1c0676855"},
    {"tiny-lfm2", "Q4_K_M", "a3c337bfa9a72794dd4df51315f5816ced0289d13c38949b88094a5e5dcd5e4b"},
    {"tiny-lfm2", "Q4_0", "0b0dbece5388273a565f2b9a116bf6ed850a5645e3e5cae035308fef600b0040"},
    {"tiny-qwen3", "Q8_0", "d946b79cdd11fb71eeece66671ce4ee2687bda3a3890b5daf947902a4eedf0bc"},
    {"tiny-qwen3", "Q4_0", "6343d84930552bb10a12f8c91fbbc4176351923326d685cfb5f68e39995c0a24"},
    {"tiny-qwen3", "Q4_K_M", "02f9021314bdc60d5115c132ba176ef004304000ce060a011f554d0d33a70ab1"},
    {"tiny-lfm2moe", "Q8_0", "37b5d069bdb607cbd805294798be21386a4264bd63f21d260841c4ee9ef10a84"},
    {"tiny-lfm2moe", "Q4_K_M", "8a1fca9d31ea94c07306bc8671426997206bf2f0b6eb4c7bd91ba5009999f178"},
    {"tiny-lfm2moe", "Q4_0", "8e8fbabce6b9e77a2837eb0c0b3bba1b163738530903a47e9c1c955abafed56d"},
    {"tiny-llama-random", "Q8_0", "293c652662b1eb5c58017bd1e43f89807cbe2ea11109c076697f1c2e6563e254"},
    {"tiny-llama-random", "Q4_0", "eefeae93c3b6d45d145c5139b83223d16987649e2472957efab1ceb5671bdd91"},
    {"tiny-llama-random", "Q4_K_M", "e7d89779b3dd181b4e24e0f05ea50270df59c1685791e0cb48ac56da583de274"},
    {"tiny-qwen2-random", "Q8_0", "874c877e46ec8c5d7c5466c1674ccbbafe2a2aded9747a73915a5adb29dfc67c"},
    {"tiny-qwen2-random", "Q4_0", "8f99152a2c4e95a3279defa2fd5d7250b999d3b80f270901d4aeeb8c27edc562"},
    {"tiny-qwen2-random", "Q4_K_M", "9dadb9e381c9a65aa4b8d7e88031ced6d7a09d73555a4d647db31fbd052b56d7"},
    {"tiny-granite-random", "Q8_0", "d025ebbb4e98be76657bbab40144874a158bd3980227db1e681996ea8be56115"},
    {"tiny-granite-random", "Q4_0", "2bb25d1f0a06dc69a53079920f18efd833c94ad5a55c228c458c1bf98a278891"},
    {"tiny-granite-random", "Q4_K_M", "830cc0a363dba5cac73e2c169a32ba319919efd5919f5980ed483931121bce8a"},
    {"tiny-lfm2vl-random", "Q8_0", "d6e269fe0e52d3237cab8591ecfb2f02a60bab36746d95f7a8d45730f96725bc"},
    {"tiny-lfm2vl-random", "Q4_0", "f67522b3053ac92c0587b4f3ff86b92d3ae169c4a4569519ea65a60501cb2978"},
    {"tiny-lfm2vl-random", "Q4_K_M", "c1a92f15b9e00873bf9d2b19db401bfbb5e3d9de358cd0381f32eba96dedcaa9"},
    // Q2_K and the Q3_K mixtures (llama-quantize b10470's outputs on the same fixtures).
    {"tiny-lfm2", "Q2_K", "ad8dd1b3206cf42d330620eb3b75604adef0dd463e537a3af2d82e791f6c9751"},
    {"tiny-lfm2", "Q3_K_S", "1f5bbf31782d47b9d5305bc9de469024e5ed30b09526cddf7229c5a302d8613b"},
    {"tiny-lfm2", "Q3_K_M", "0c055296f706425ab79dff4509aeddaa176c0779d266fbd4a0cd4d050d3abc27"},
    {"tiny-lfm2", "Q3_K_L", "72408f8317a54a5dac037a952874c6c4f21a29f286142601d177b84b7b3cfd68"},
    {"tiny-qwen3", "Q2_K", "7bcab3532acc2696183e04bbd29632264d45ffe526f70c68aa363f4723360891"},
    {"tiny-qwen3", "Q3_K_M", "315a1dc08b40ae5648e4700434bd13e57affd2823cf6dec27a2574f732694d1a"},
    {"tiny-lfm2moe", "Q2_K", "a06fb11b45c8fec03ef7180c092588516c7f7d6599f3707da98d8f2323c49aed"},
    {"tiny-lfm2moe", "Q3_K_M", "d30b4886500e90a69540d0c8e4b7da3750b135085ef40127737c98119f952004"},
    {"tiny-llama-random", "Q2_K", "962534fd43b7c6317fde04eccfa4bd74c9c063ce6783bf0d3bcfb49376fa70a7"},
    {"tiny-llama-random", "Q3_K_S", "cbf944f02d6916b7898d5d339130a5eb1999fca765b9d84cd5ddf9556d9b3e04"},
    {"tiny-llama-random", "Q3_K_M", "c7e76dac0cc849abd50b20adcedfd771daeeaad1864551cc8985eb6ca5f8b2bf"},
    {"tiny-llama-random", "Q3_K_L", "b1ea793e070736c57d7ebc81c87de0bfb139426f3af46d9b2527e54aa2a478c9"},
    {"tiny-qwen2-random", "Q2_K", "9129f018e7be33d3e058655a49dd65dd43544224328d1afe7ff00be9f974566b"},
    {"tiny-qwen2-random", "Q3_K_M", "de05cd7461eae450f97942058195e649f5d392c024020afe1849cae0796d0452"},
    {"tiny-granite-random", "Q2_K", "d5e8314a3dfae3fa36f8f1ec0d36f2a436a5565799bfd4ae4c3d0a223388be6f"},
    {"tiny-granite-random", "Q3_K_M", "49a6a813cb23c4c8f98b5556cbf57aab785f65cdd65ece6e346bb63eb30c2230"},
    {"tiny-lfm2vl-random", "Q2_K", "2ed21df90c54db6f8ae2b2b4abb7a85570d39eb5973497a21ceb9e68d0aef475"},
    {"tiny-lfm2vl-random", "Q3_K_L", "5b148027cb4a99141e5179d149fcc9cfa551c6f9eb1ecb7c3688ccaabb83d76e"},
    // IQ4_NL and IQ4_XS (llama-quantize b10470); IQ4_XS falls back to IQ4_NL for rows of 128 (tiny-qwen3).
    {"tiny-lfm2", "IQ4_NL", "83ab8fe525439924e7940fe691e0793bf87109e6dc84d66fb5e7dfaff5f931b4"},
    {"tiny-lfm2", "IQ4_XS", "bdbea9b7d793ba5c90b263c2470e307f5498903a2241006f45106e9de61f06f8"},
    {"tiny-qwen3", "IQ4_NL", "c48431611c8f26a10d0efe02d60c74a0a679e6655372d38480ebb66c5e9bbfae"},
    {"tiny-qwen3", "IQ4_XS", "565bddf174fbdc581c712ae41dcb1681903b9ddf775af809f688d00c01ae29f8"},
    {"tiny-lfm2moe", "IQ4_NL", "83df995a70918636ce6d9993edda6dc6466a336327d9940d3e708844818c666e"},
    {"tiny-lfm2moe", "IQ4_XS", "f03afdf768818cc569ebabf2a5aead2105a33b7759f8ccd66c020d8ad0347417"},
    {"tiny-llama-random", "IQ4_NL", "cfc0be2294b6c24ededc5137d10d0cfbc74ab9c25f0d71405ca0d07208ac4fc3"},
    {"tiny-llama-random", "IQ4_XS", "61e9d1a3c63cf1830d3098e0ec25d389f4c2c8311ea3ea785b4702d9e164fcab"},
    {"tiny-qwen2-random", "IQ4_NL", "90bd7e31361dd178f177d5ee8a81deb572211cc85fc153a8f0c61a2b785092ac"},
    {"tiny-qwen2-random", "IQ4_XS", "439046af9d84d767652cb6be2a314038000b0ff8e5fe60123021092995fdec6c"},
    {"tiny-granite-random", "IQ4_NL", "6259312ec4cdc598c149153b9eb9742d8a2d671f905a874e1915060a5cc02851"},
    {"tiny-granite-random", "IQ4_XS", "5c3502090f03c9de686aa38440741a649dfa5af5fd809ac00fe451c5b84823ad"},
};

// The quantized twin of a fixture where the test data has it.
std::string twin(const Case& c) {
    const std::string p = fixture(c.model, std::string("model-") + c.type + ".gguf");
    if (fs::exists(p)) return p;
    if (std::string(c.model) == "tiny-lfm2" && std::string(c.type) == "Q8_0")
        return cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");
    return "";
}

}  // namespace

TEST(Quantize, FixturesEqualLlamaQuantize) {
    int compared = 0;
    for (const Case& c : kCases) {
        SCOPED_TRACE(std::string(c.model) + " " + c.type);
        const std::string out = quantize(fixture(c.model, "model.gguf"), c.type, 2, "fx.gguf");
        EXPECT_EQ(sha256(out), c.sha256);
        if (const std::string ref = twin(c); !ref.empty()) {
            expect_same_model(out, ref);
            ++compared;
        }
        fs::remove(out);
    }
    EXPECT_GE(compared, 5);  // the twins the test data holds: tiny-lfm2 Q8_0 Q4_K_M Q4_0, qwen3 Q4_0, lfm2moe Q4_K_M
}

// Rows are converted independently, so one thread and several write the same bytes.
TEST(Quantize, ThreadCountDoesNotChangeTheOutput) {
    for (const char* type : {"Q4_K_M", "Q5_K_S", "Q4_1"}) {
        SCOPED_TRACE(type);
        const std::string in = fixture("tiny-lfm2moe", "model.gguf");
        const std::string a = quantize(in, type, 1, "t1.gguf"), b = quantize(in, type, 2, "t2.gguf"),
                          c = quantize(in, type, 3, "t3.gguf");
        const std::string bytes = cera::test::read_text(a);
        EXPECT_TRUE(bytes == cera::test::read_text(b));
        EXPECT_TRUE(bytes == cera::test::read_text(c));
        for (const auto& p : {a, b, c}) fs::remove(p);
    }
}

// The fixtures' weights are bf16-exact, so F32 -> BF16 loses nothing and BF16 -> Q4_0 goes
// through the same f32 values: the result is llama-quantize's Q4_0 of the F32 file. Q8_0 ->
// F32 -> Q8_0 gives back the Q8_0 file: a block's dequantized values requantize to the same
// block, and F32 -> Q8_0 rewrites general.file_type to 7 again.
TEST(Quantize, RequantizesThroughF32) {
    const std::string bf16 = quantize(fixture("tiny-lfm2", "model.gguf"), "BF16", 2, "bf16.gguf");
    {
        auto f = File::open(bf16);
        EXPECT_EQ(f->find_tensor("blk.0.ffn_down.weight")->type, GgmlType::kBF16);
        EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->type, GgmlType::kF32);  // 1-D stays
        EXPECT_EQ(f->get_u32("general.file_type"), 32u);
    }
    const std::string q4 = quantize(bf16, "Q4_0", 2, "q4.gguf");
    auto mine = File::open(q4), ref = File::open(fixture("tiny-lfm2", "model-Q4_0.gguf"));
    for (const auto& r : ref->tensors()) {
        const auto* m = mine->find_tensor(r.name);
        ASSERT_NE(m, nullptr) << r.name;
        EXPECT_EQ(m->type, r.type) << r.name;
        if (m->type == r.type) EXPECT_EQ(std::memcmp(m->data, r.data, r.n_bytes), 0) << r.name;
    }
    const std::string q8_ref = cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");
    const std::string f32 = quantize(q8_ref, "F32", 2, "f32.gguf");
    const std::string q8 = quantize(f32, "Q8_0", 2, "q8.gguf");
    expect_same_model(q8, q8_ref);
    for (const auto& p : {bf16, q4, f32, q8}) fs::remove(p);
}

// The mixtures' choices on the shapes the fixtures do not cover: Q4_K_S / Q5_K_S / Q5_K_M at a
// width of 256 (tiny-lfm2) and --keep.
TEST(Quantize, MixturesAndKeep) {
    QuantizeOptions o;
    o.input = fixture("tiny-lfm2", "model.gguf");
    auto f = File::open(o.input);
    auto type_of = [&](const std::vector<GgmlType>& types, const std::string& name) {
        for (size_t i = 0; i < f->tensors().size(); ++i)
            if (f->tensors()[i].name == name) return types[i];
        ADD_FAILURE() << name;
        return GgmlType::kF32;
    };
    // 8 layers, attention in 2, 5, 7: attn_v #0 of 3 is in the first eighth? no (3/8 = 0); the
    // rules give Q6_K to the last (#2) in the _M mixtures and Q5_K to the first four in Q4_K_S.
    o.file_type = FileType::kQ4_K_S;
    auto t = cera::quantize::plan_types(*f, o);
    EXPECT_EQ(type_of(t, "blk.2.attn_v.weight"), GgmlType::kQ5_K);
    EXPECT_EQ(type_of(t, "blk.0.ffn_down.weight"), GgmlType::kQ5_K);  // first eighth of ffn_down
    EXPECT_EQ(type_of(t, "blk.1.ffn_down.weight"), GgmlType::kQ4_K);
    EXPECT_EQ(type_of(t, "token_embd.weight"), GgmlType::kQ6_K);  // tied: the LM head
    EXPECT_EQ(type_of(t, "blk.0.shortconv.conv.weight"), GgmlType::kF32);
    o.file_type = FileType::kQ5_K_M;
    t = cera::quantize::plan_types(*f, o);
    EXPECT_EQ(type_of(t, "blk.7.attn_v.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(type_of(t, "blk.2.attn_v.weight"), GgmlType::kQ5_K);
    EXPECT_EQ(type_of(t, "blk.3.ffn_down.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(type_of(t, "blk.3.ffn_up.weight"), GgmlType::kQ5_K);
    o.file_type = FileType::kF16;
    t = cera::quantize::plan_types(*f, o);
    EXPECT_EQ(type_of(t, "token_embd.weight"), GgmlType::kF16);  // no mixture for float types
    o.file_type = FileType::kQ4_0;
    o.keep = {"token_embd.weight", "blk.1.ffn_up.weight"};
    t = cera::quantize::plan_types(*f, o);
    EXPECT_EQ(type_of(t, "token_embd.weight"), GgmlType::kF32);
    EXPECT_EQ(type_of(t, "blk.1.ffn_up.weight"), GgmlType::kF32);
    EXPECT_EQ(type_of(t, "blk.0.ffn_up.weight"), GgmlType::kQ4_0);
}

TEST(Quantize, BadInputFailsWithOneLineAndNoFile) {
    const std::string out = tmp_path("bad.gguf");
    const std::string in = fixture("tiny-qwen3", "model.gguf");
    // A model with a tensor type cera cannot dequantize (IQ2_XXS) that Q8_0 would convert.
    const std::string iq = tmp_path("iq2xxs.gguf");
    {
        cera::gguf::Writer w;
        w.set_string("general.architecture", "llama");
        w.set_u32("llama.block_count", 1);
        w.add_tensor("blk.0.attn_q.weight", GgmlType::kIQ2_XXS, {256, 2}, std::vector<uint8_t>(2 * 66, 0));
        w.write(iq);
    }
    struct Bad {
        std::string args, needle;
    };
    const Bad cases[] = {
        {cera::test::shell_quote(in) + " OUT Q9_9", "unknown type 'Q9_9'"},
        {cera::test::shell_quote(in) + " OUT Q2_K_S", "importance matrix"},
        {cera::test::shell_quote(in) + " OUT Q8_K", "activations"},
        {"/nonexistent/model.gguf OUT Q8_0", "/nonexistent/model.gguf"},
        {cera::test::shell_quote(iq) + " OUT Q8_0", "IQ2_XXS"},
        {cera::test::shell_quote(in) + " OUT Q4_0 --keep nope.weight", "nope.weight"},
        {cera::test::shell_quote(in) + " OUT Q4_0 --threads -1", "--threads"},
        {cera::test::shell_quote(in), "required"},
    };
    for (const Bad& b : cases) {
        std::string args = b.args;
        if (auto p = args.find(" OUT "); p != std::string::npos)
            args.replace(p, 5, " " + cera::test::shell_quote(out) + " ");
        const auto r = cera::test::run_shell(cera::test::cera_bin() + " quantize " + args);
        SCOPED_TRACE(args);
        EXPECT_NE(r.code, 0);
        EXPECT_NE(r.err.find(b.needle), std::string::npos) << r.err;
        EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
        EXPECT_FALSE(fs::exists(out));
        EXPECT_FALSE(fs::exists(out + ".tmp"));
    }
    // The library says the same as the command.
    QuantizeOptions o;
    o.input = iq;
    o.output = out;
    try {
        cera::quantize::quantize_model(o);
        ADD_FAILURE() << "accepted an IQ2_XXS tensor";
    } catch (const cera::Error& e) {
        EXPECT_EQ(e.code(), cera::ErrorCode::kUnsupported) << e.what();
    }
    EXPECT_FALSE(fs::exists(out));
    fs::remove(iq);
}

TEST(Quantize, CommandWritesTheFile) {
    const std::string out = tmp_path("cmd.gguf");
    const auto r = cera::test::run_shell(cera::test::cera_bin() + " quantize " +
                                         cera::test::shell_quote(fixture("tiny-qwen3", "model.gguf")) + " " +
                                         cera::test::shell_quote(out) + " q4_0 --threads 2");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("Q4_0"), std::string::npos) << r.out;
    expect_same_model(out, fixture("tiny-qwen3", "model-Q4_0.gguf"));
    fs::remove(out);
}
