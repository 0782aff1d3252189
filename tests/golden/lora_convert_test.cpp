// `cera convert --peft`: the fixtures' PEFT adapters become, byte for byte, the GGUF LoRA files that
// llama.cpp's convert_lora_to_gguf.py made of them (lora/lora.gguf beside each); an adapter of another
// model or a missing folder fails with one line and leaves no file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "cera/error.h"
#include "quantize/lora_gguf.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

std::string tmp_path(const std::string& name) {
    return (fs::temp_directory_path() / ("cera_lora_convert_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string fixture(const std::string& model, const std::string& rel) {
    return cera::test::data_path("fixtures/" + model + "/" + rel);
}

cera::ErrorCode error_of(const cera::quantize::PeftConvertOptions& o) {
    try {
        cera::quantize::convert_peft_lora(o);
    } catch (const cera::Error& e) {
        return e.code();
    }
    ADD_FAILURE() << "no cera::Error";
    return cera::ErrorCode::kInvalidArgument;
}

}  // namespace

TEST(LoraConvert, PeftBecomesLlamaCppsGgufLora) {
    for (const char* model : {"tiny-lfm2", "tiny-qwen3"}) {
        SCOPED_TRACE(model);
        const std::string out = tmp_path("lora.gguf");
        const size_t n =
            cera::quantize::convert_peft_lora({fixture(model, "lora/peft"), fixture(model, "model.gguf"), out});
        EXPECT_GT(n, 0u);
        EXPECT_TRUE(cera::test::read_text(out) == cera::test::read_text(fixture(model, "lora/lora.gguf")))
            << "the file differs from llama.cpp's conversion";
        fs::remove(out);
    }
}

TEST(LoraConvert, BadInputFailsWithOneLineAndNoFile) {
    const std::string out = tmp_path("bad.gguf");
    // tiny-qwen3's adapter on tiny-lfm2: its pairs do not fit lfm2's weights.
    EXPECT_EQ(error_of({fixture("tiny-qwen3", "lora/peft"), fixture("tiny-lfm2", "model.gguf"), out}),
              cera::ErrorCode::kInvalidFile);
    EXPECT_EQ(error_of({"/nonexistent/peft", fixture("tiny-lfm2", "model.gguf"), out}), cera::ErrorCode::kIo);
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    // The command line: the same bytes, and a one-line error.
    const std::string bin = cera::test::cera_bin();
    auto r = cera::test::run_shell(bin + " convert --peft " + fixture("tiny-lfm2", "lora/peft") + " -m " +
                                   fixture("tiny-lfm2", "model.gguf") + " -o " + out);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(cera::test::read_text(out) == cera::test::read_text(fixture("tiny-lfm2", "lora/lora.gguf")));
    fs::remove(out);
    r = cera::test::run_shell(bin + " convert --peft " + fixture("tiny-lfm2", "lora/peft") + " -o " + out);
    EXPECT_NE(r.code, 0);
    EXPECT_NE(r.err.find("--peft needs -m"), std::string::npos) << r.err;
}
