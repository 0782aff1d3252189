// LFM2-VL vision against transformers (float64 references in fixtures/tiny-lfm2vl, from
// ../shared/fixtures/tiny-lfm2vl-random): the processor's pixel values and prompt layout, the
// SigLIP2 tower's last hidden state and the projector's image embeddings (on the CPU, and on CUDA where
// a device is present), and clean errors for bad images.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <thread>

#include "backends/backend.h"
#include "backends/device.h"
#include "cera/engine.h"
#include "cera/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "test_devices.h"
#include "test_util.h"
#include "vision/encoder.h"
#include "vision/image.h"
#include "vision/preprocess.h"

namespace cera {
namespace {

std::string fx(const std::string& rel) { return test::data_path("fixtures/tiny-lfm2vl/" + rel); }

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float m = 0.0f;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
    return m;
}

std::vector<uint8_t> bytes_of(const std::string& path) {
    const std::string s = test::read_text(path);
    return std::vector<uint8_t>(s.begin(), s.end());
}

// decode_image refuses b with kInvalidArgument, saying `says`.
void expect_refused(std::span<const uint8_t> b, const char* what, const char* says) {
    try {
        vision::decode_image(b);
        ADD_FAILURE() << what << ": no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << what << ": " << e.what();
    }
}

// The offset of a PNG's first chunk of the given type (its length field), or the file's size.
size_t png_chunk_at(const std::vector<uint8_t>& b, const char* type) {
    size_t at = 8;
    while (at + 8 < b.size() && std::memcmp(&b[at + 4], type, 4) != 0)
        at += 12 + (size_t(b[at]) << 24 | size_t(b[at + 1]) << 16 | size_t(b[at + 2]) << 8 | b[at + 3]);
    return std::min(at, b.size());
}

struct Case {
    const char* image;       // under fixtures/tiny-lfm2vl/
    const char* embeddings;  // projector output reference
    const char* prompt;      // prompt.json with the processor's ids
};
const Case kCases[] = {
    {"ref/test_image.png", "ref/image_embeddings.f32", "ref/prompt_vl.json"},
    {"images/tall-300x520/image.png", "images/tall-300x520/image_embeddings.f32", "images/tall-300x520/prompt.json"},
    {"images/large-1000x700/image.png", "images/large-1000x700/image_embeddings.f32",
     "images/large-1000x700/prompt.json"},
};

class VisionGolden : public ::testing::Test {
 protected:
    static void SetUpTestSuite() {
        be_ = create_backend({}).release();
        enc_ = vision::VisionEncoder::load(fx("mmproj.gguf"), *be_, 64).release();
    }
    static void TearDownTestSuite() {
        delete enc_;
        delete be_;
    }
    static Backend* be_;
    static vision::VisionEncoder* enc_;
};
Backend* VisionGolden::be_ = nullptr;
vision::VisionEncoder* VisionGolden::enc_ = nullptr;

TEST_F(VisionGolden, ConfigFromMmproj) {
    const vision::VisionConfig& c = enc_->config();
    EXPECT_EQ(c.n_embd, 64);
    EXPECT_EQ(c.n_layer, 2);
    EXPECT_EQ(c.n_head, 2);
    EXPECT_EQ(c.n_ff, 256);
    EXPECT_EQ(c.n_pos_side, 16);
    EXPECT_EQ(c.proc.patch_size, 16);
    EXPECT_EQ(c.proc.downsample, 2);
    EXPECT_EQ(c.proj_hidden, 128);
    EXPECT_EQ(c.n_embd_text, 64);
}

TEST_F(VisionGolden, PixelValuesMatchTheProcessor) {
    const vision::RgbImage img = vision::load_image_file(fx("ref/test_image.png"));
    ASSERT_EQ(img.width, 64);
    ASSERT_EQ(img.height, 48);
    const vision::ProcessedImage p = vision::preprocess(img, enc_->config().proc);
    ASSERT_EQ(p.pieces.size(), 1u);
    EXPECT_EQ(p.pieces[0].grid_h, 14);
    EXPECT_EQ(p.pieces[0].grid_w, 20);
    const std::vector<float> ref = test::read_f32(fx("ref/pixel_values_valid.f32"));
    EXPECT_LE(max_abs_diff(p.pieces[0].patches, ref), 1e-5f);
}

// A backend on the device and the fixture's encoder on it (the encoder goes first).
struct OnDevice {
    explicit OnDevice(DeviceKind device) {
        BackendOptions o;
        o.device = device;
        be = create_backend(o);
        enc = vision::VisionEncoder::load(fx("mmproj.gguf"), *be, 64);
    }
    std::unique_ptr<Backend> be;
    std::unique_ptr<vision::VisionEncoder> enc;
};

class VisionDevice : public ::testing::TestWithParam<DeviceKind> {
 protected:
    void SetUp() override {
        std::string why;
        if (GetParam() == DeviceKind::kCuda && cuda_devices(&why).empty())
            GTEST_SKIP() << "no CUDA device (" << why << ")";
    }
};

TEST_P(VisionDevice, TowerHiddenStateMatches) {
    OnDevice d(GetParam());
    const vision::ProcessedImage p =
        vision::preprocess(vision::load_image_file(fx("ref/test_image.png")), d.enc->config().proc);
    const std::vector<float> hidden = d.enc->tower(p.pieces[0]);
    EXPECT_LE(max_abs_diff(hidden, test::read_f32(fx("ref/vision_last_hidden.f32"))), 1e-3f);
}

TEST_P(VisionDevice, LayoutAndEmbeddingsMatchEveryImage) {
    OnDevice d(GetParam());
    EngineOptions eo;
    eo.device = "cpu";  // the tokenizer
    auto engine = Engine::load(fx("model.gguf"), eo);
    for (const Case& c : kCases) {
        SCOPED_TRACE(c.image);
        const vision::ProcessedImage p = vision::preprocess(vision::load_image_file(fx(c.image)), d.enc->config().proc);
        const nlohmann::json prompt = nlohmann::json::parse(test::read_text(fx(c.prompt)));
        // The processor's expanded prompt, rebuilt from the image's layout.
        std::string text = prompt["prompt_text_before_expansion"];
        const size_t at = text.find("<image>");
        ASSERT_NE(at, std::string::npos);
        text.replace(at, 7, vision::image_prompt_text(p, d.enc->config().proc.downsample));
        const std::vector<int32_t> ids = engine->tokenize(text, false, true);
        EXPECT_EQ(ids, prompt["ids"].get<std::vector<int32_t>>());
        const std::vector<float> emb = d.enc->encode(p);
        EXPECT_LE(max_abs_diff(emb, test::read_f32(fx(c.embeddings))), 1e-3f);
    }
}

// A batch of tiles runs its layers as recorded steps, which a device replays from the third batch of a
// shape on: encodes of a tiled image (a batch of tiles, then the thumbnail) give the same embeddings
// every time.
TEST_P(VisionDevice, RepeatedEncodesGiveTheSameEmbeddings) {
    OnDevice d(GetParam());
    const vision::ProcessedImage p =
        vision::preprocess(vision::load_image_file(fx("images/large-1000x700/image.png")), d.enc->config().proc);
    ASSERT_GT(p.pieces.size(), 2u);
    const std::vector<float> first = d.enc->encode(p);
    for (int i = 0; i < 3; ++i) EXPECT_LE(max_abs_diff(d.enc->encode(p), first), 1e-6f) << "encode " << i + 2;
    // A smaller image between them: its own batch shape, the buffers as they are.
    const vision::ProcessedImage small =
        vision::preprocess(vision::load_image_file(fx("ref/test_image.png")), d.enc->config().proc);
    const std::vector<float> one = d.enc->encode(small);
    EXPECT_LE(max_abs_diff(d.enc->encode(p), first), 1e-6f) << "after another shape";
    EXPECT_LE(max_abs_diff(d.enc->encode(small), one), 1e-6f);
}

// The warm-up at load (an engine's, on a device) leaves buffers at their largest and steps recorded on
// them, but the embeddings of every later image are those of an encoder that never warmed up.
TEST_P(VisionDevice, WarmUpLeavesTheEmbeddingsAsTheyAre) {
    std::vector<std::vector<float>> cold;
    std::vector<vision::ProcessedImage> images;
    {
        OnDevice d(GetParam());
        for (const char* f : {"images/large-1000x700/image.png", "ref/test_image.png"}) {
            images.push_back(vision::preprocess(vision::load_image_file(fx(f)), d.enc->config().proc));
            cold.push_back(d.enc->encode(images.back()));
        }
    }
    ASSERT_GT(images[0].pieces.size(), 2u);
    OnDevice d(GetParam());
    d.enc->warm_up();
    for (int round = 0; round < 2; ++round)
        for (size_t i = 0; i < images.size(); ++i)
            EXPECT_LE(max_abs_diff(d.enc->encode(images[i]), cold[i]), 1e-6f) << "image " << i << ", round " << round;
}

// An encode gives the backend to a thread waiting for it between its layers and batches (a server's
// batch steps do not wait out a whole image), takes it back after that thread's turn, and gives the
// same embeddings. Here the waiter is this thread, which holds the backend first, waits until the
// encode is queued behind it, then queues behind the encode again and again, running a few ops of its
// own each turn. Without the turns it would get the backend once, after the whole image.
TEST_P(VisionDevice, EncodeTakesTurnsWithAWaiter) {
    OnDevice d(GetParam());
    const vision::ProcessedImage p =
        vision::preprocess(vision::load_image_file(fx("images/large-1000x700/image.png")), d.enc->config().proc);
    ASSERT_GT(p.pieces.size(), 2u);
    const std::vector<float> alone = d.enc->encode(p);
    FifoMutex& mu = d.be->exec_mutex();
    std::atomic<bool> done{false};
    std::vector<float> taking_turns;
    int turns = 0;  // turns this thread had while the encode went on
    {
        std::unique_lock<FifoMutex> held(mu);
        std::thread encoder([&] {
            taking_turns = d.enc->encode(p);
            done = true;
        });
        while (!mu.contended()) std::this_thread::yield();  // the encode waits for the backend
        Tensor t = d.be->alloc(GgmlType::kF32, {4});
        const std::vector<float> one = {1.0f, 2.0f, 3.0f, 4.0f};
        for (;;) {
            held.unlock();
            held.lock();  // after the encode's next part, or its end
            // Inside the encode, it queues again at once; at its end, it is done.
            while (!mu.contended() && !done) std::this_thread::yield();
            if (!mu.contended()) break;
            ++turns;
            // A step of another sequence: ops of its own on the backend in the middle of the encode.
            d.be->write(t, one.data(), one.size() * sizeof(float));
            d.be->add(t, t, 1.0f, t);
            std::vector<float> back(4);
            d.be->read(back.data(), t, back.size() * sizeof(float));
            EXPECT_EQ(back, (std::vector<float>{2.0f, 4.0f, 6.0f, 8.0f}));
        }
        d.be->free(t);
        held.unlock();
        encoder.join();
    }
    EXPECT_GE(turns, 2);
    EXPECT_LE(max_abs_diff(taking_turns, alone), 1e-6f);
}

INSTANTIATE_TEST_SUITE_P(Devices, VisionDevice, ::testing::ValuesIn(test::devices()),
                         [](const ::testing::TestParamInfo<DeviceKind>& i) {
                             return std::string(device_kind_name(i.param));
                         });

// A copy of the fixture's mmproj with one key changed (or dropped: `value` empty) and one tensor
// dropped (`drop`), written to a temporary file; the encoder must refuse it naming what is wrong.
std::string expect_mmproj_error(const std::string& key, std::optional<gguf::Value> value, const std::string& drop,
                                ErrorCode code) {
    auto src = gguf::File::open(fx("mmproj.gguf"));
    gguf::Writer w;
    for (const auto& [k, v] : src->metadata())
        if (k != key) w.set(k, v);
    if (value) w.set(key, *value);
    for (const gguf::TensorInfo& t : src->tensors())
        if (t.name != drop) w.add_tensor(t.name, t.type, t.ne, std::span<const uint8_t>(t.data, t.n_bytes));
    const std::string path = (std::filesystem::temp_directory_path() / "cera_bad_mmproj.gguf").string();
    w.write(path);
    auto be = create_backend({});
    std::string what;
    try {
        vision::VisionEncoder::load(path, *be, 64);
        ADD_FAILURE() << key << " / " << drop << ": no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        what = e.what();
    }
    std::filesystem::remove(path);
    return what;
}

TEST(VisionMmproj, MalformedFilesAreRefusedByName) {
    EXPECT_NE(expect_mmproj_error("clip.projector_type", gguf::value_string("mlp"), "", ErrorCode::kUnsupported)
                  .find("projector_type"),
              std::string::npos);
    EXPECT_NE(expect_mmproj_error("clip.vision.block_count", std::nullopt, "", ErrorCode::kMissing).find("block_count"),
              std::string::npos);
    EXPECT_NE(expect_mmproj_error("clip.vision.attention.head_count", gguf::value_u32(3), "", ErrorCode::kInvalidFile)
                  .find("head_count"),
              std::string::npos);
    EXPECT_NE(expect_mmproj_error("", std::nullopt, "v.blk.1.attn_q.weight", ErrorCode::kMissing).find("attn_q"),
              std::string::npos);
    EXPECT_NE(expect_mmproj_error("clip.vision.image_std", gguf::value_f32_array(std::vector<float>{0.5f, 0.0f, 0.5f}),
                                  "", ErrorCode::kInvalidFile)
                  .find("image_std"),
              std::string::npos);
}

TEST(VisionImage, BadImagesFailCleanly) {
    auto expect_error = [](std::span<const uint8_t> b, const char* what) {
        try {
            vision::decode_image(b);
            ADD_FAILURE() << what << ": no error";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
            EXPECT_NE(std::string(e.what()).find("image"), std::string::npos) << what << ": " << e.what();
        }
    };
    const std::vector<uint8_t> png = bytes_of(fx("ref/test_image.png"));
    expect_error({}, "empty");
    const std::string text = "this is a text file, not an image\n";
    expect_error({reinterpret_cast<const uint8_t*>(text.data()), text.size()}, "text");
    for (size_t cut : {size_t(8), size_t(33), png.size() / 2, png.size() - 13})
        expect_error({png.data(), cut}, "truncated png");
    // A valid header claiming 100000 x 100000 pixels: refused before any pixel is decoded.
    std::vector<uint8_t> huge = png;
    const uint8_t dim[4] = {0x00, 0x01, 0x86, 0xA0};
    std::copy(dim, dim + 4, huge.begin() + 16);
    std::copy(dim, dim + 4, huge.begin() + 20);
    expect_error(huge, "huge");
    vision::DecodeLimits small;
    small.max_bytes = 100;
    try {
        vision::decode_image(png, small);
        ADD_FAILURE() << "size cap: no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("limit"), std::string::npos) << e.what();
    }
}

// WebP (libwebp): the fixture's PNG made lossless WebP decodes to the same pixels, a lossy one to the
// same size and nearly the same pixels; broken WebP files are refused like broken PNGs.
TEST(VisionImage, WebpDecodes) {
    const vision::RgbImage png = vision::load_image_file(fx("ref/test_image.png"));
    const vision::RgbImage lossless =
        vision::load_image_file(test::source_path("tests/data/images/test_image_lossless.webp"));
    EXPECT_EQ(lossless.width, png.width);
    EXPECT_EQ(lossless.height, png.height);
    EXPECT_EQ(lossless.rgb, png.rgb);
    const vision::RgbImage lossy =
        vision::load_image_file(test::source_path("tests/data/images/test_image_lossy.webp"));
    ASSERT_EQ(lossy.rgb.size(), png.rgb.size());
    double mean = 0.0;
    for (size_t i = 0; i < png.rgb.size(); ++i) mean += std::abs(int(lossy.rgb[i]) - int(png.rgb[i]));
    EXPECT_LT(mean / double(png.rgb.size()), 12.0);

    const std::vector<uint8_t> webp = bytes_of(test::source_path("tests/data/images/test_image_lossy.webp"));
    for (size_t cut : {size_t(12), size_t(20), webp.size() / 2, webp.size() - 5}) {
        try {
            vision::decode_image(std::span<const uint8_t>(webp.data(), cut));
            ADD_FAILURE() << "truncated webp at " << cut << ": no error";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find("WebP"), std::string::npos) << e.what();
        }
    }
}

TEST(VisionPreprocess, ExtremeAspectRatioIsRefused) {
    // 13569 x 1 (found by the fuzzer): the smart resize would give 2 x 424 x 2 patches, over 1024.
    vision::RgbImage img;
    img.width = 13569;
    img.height = 1;
    img.rgb.assign(size_t(img.width) * 3, 128);
    try {
        vision::preprocess(img, vision::ProcessorConfig{});
        ADD_FAILURE() << "no error";
    } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("aspect ratio"), std::string::npos) << e.what();
    }
    img.width = 1000;  // 10:1, within the budget
    img.height = 100;
    img.rgb.assign(size_t(img.width) * size_t(img.height) * 3, 128);
    EXPECT_NO_THROW(vision::preprocess(img, vision::ProcessorConfig{}));
}

TEST(VisionImage, AlphaAndGrayscaleBecomeRgb) {
    // A 1 x 1 BMP is easy to write by hand; a 2 x 1 gray+alpha image through stb's PNM/TGA is not, so
    // the composite rule is checked on a 32-bit BMP (BGRA) pixel at alpha 0 (white) and 255 (itself).
    auto bmp = [](uint8_t b, uint8_t g, uint8_t r, uint8_t a) {
        std::vector<uint8_t> f(14 + 108 + 4, 0);
        auto put32 = [&](size_t off, uint32_t v) {
            for (int i = 0; i < 4; ++i) f[off + size_t(i)] = uint8_t(v >> (8 * i));
        };
        f[0] = 'B', f[1] = 'M';
        put32(2, uint32_t(f.size()));
        put32(10, 14 + 108);
        put32(14, 108);  // BITMAPV4HEADER
        put32(18, 1), put32(22, 1);
        f[26] = 1, f[28] = 32;
        put32(30, 3);  // BI_BITFIELDS
        put32(34, 4);
        put32(54, 0x00FF0000), put32(58, 0x0000FF00), put32(62, 0x000000FF), put32(66, 0xFF000000);
        f[122] = b, f[123] = g, f[124] = r, f[125] = a;
        return f;
    };
    const vision::RgbImage opaque = vision::decode_image(bmp(10, 20, 30, 255));
    EXPECT_EQ(opaque.rgb, (std::vector<uint8_t>{30, 20, 10}));
    const vision::RgbImage clear = vision::decode_image(bmp(10, 20, 30, 0));
    EXPECT_EQ(clear.rgb, (std::vector<uint8_t>{255, 255, 255}));
}

// A 3 x 2 RGB PNG whose image data starts with a zero-length IDAT chunk (valid PNG); pixel (x, y)
// channel c holds 10 * (3x + c) + y. The second IDAT chunk's length field is at byte 45.
std::vector<uint8_t> png_3x2() {
    return {0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00,
            0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0x12, 0x16, 0xf1, 0x4d, 0x00,
            0x00, 0x00, 0x00, 0x49, 0x44, 0x41, 0x54, 0x35, 0xaf, 0x06, 0x1e, 0x00, 0x00, 0x00, 0x1c, 0x49, 0x44,
            0x41, 0x54, 0x78, 0x9c, 0x63, 0x60, 0xe0, 0x12, 0x91, 0xd3, 0x30, 0xb2, 0x71, 0x0b, 0x60, 0x60, 0xe4,
            0x16, 0x95, 0xd7, 0x34, 0xb6, 0x75, 0x0f, 0x04, 0x00, 0x17, 0xb1, 0x02, 0xda, 0xbc, 0xb4, 0xe3, 0xf4,
            0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};
}

TEST(VisionImage, PngWithAnEmptyFirstIdatChunkDecodes) {
    const vision::RgbImage img = vision::decode_image(png_3x2());
    ASSERT_EQ(img.width, 3);
    ASSERT_EQ(img.height, 2);
    for (int y = 0; y < 2; ++y)
        for (int i = 0; i < 9; ++i) EXPECT_EQ(int(img.rgb[size_t(y * 9 + i)]), 10 * i + y) << y << "," << i;
}

// A chunk length past the end of the file (found by the fuzzer: 900 MB claimed in a 190-byte file made
// the decoder allocate 2 GiB) is refused before decoding, as is one a single byte too long.
TEST(VisionImage, PngChunkPastTheEndIsRefused) {
    for (uint32_t len : {0x35af061eu, 0x1du, 0xffffffffu}) {
        std::vector<uint8_t> png = png_3x2();
        for (int i = 0; i < 4; ++i) png[size_t(45 + i)] = uint8_t(len >> (24 - 8 * i));
        try {
            vision::decode_image(png);
            ADD_FAILURE() << len << ": no error";
        } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
            EXPECT_NE(std::string(e.what()).find("PNG chunk"), std::string::npos) << e.what();
        }
    }
}

// Interlaced PNGs (whose image data is counted per Adam7 pass), PNGs whose image data holds more than
// the pixels need and one with bytes after its zlib stream decode to the pixels of their plain
// siblings, as libpng and Pillow read them (tests/data/images/png/make.py writes them all).
TEST(VisionImage, PngImageDataIsReadUpToItsPixels) {
    const std::string dir = test::source_path("tests/data/images/png/");
    for (const char* name : {"rgba16-13x7", "gray1-5x3", "pal4-9x9", "graya8-1x10", "rgb8-17x2"}) {
        const vision::RgbImage plain = vision::load_image_file(dir + name + "-plain.png");
        EXPECT_GT(plain.width, 0) << name;
        std::vector<std::string> same = {std::string(name) + "-adam7", std::string(name) + "-extra"};
        if (std::string(name) == "rgb8-17x2") same.insert(same.end(), {"rgb8-17x2-adam7-extra", "rgb8-17x2-trailing"});
        for (const std::string& other : same) {
            const vision::RgbImage img = vision::load_image_file(dir + other + ".png");
            EXPECT_EQ(img.width, plain.width) << other;
            EXPECT_EQ(img.height, plain.height) << other;
            EXPECT_EQ(img.rgb, plain.rgb) << other;
        }
    }
    // 16 MiB of image data for one pixel: read up to the pixel (black), the rest never inflated.
    const vision::RgbImage bomb = vision::load_image_file(dir + "bomb-1x1.png");
    EXPECT_EQ(bomb.width, 1);
    EXPECT_EQ(bomb.rgb, (std::vector<uint8_t>{0, 0, 0}));
    // Image data that ends before the pixels, and corrupt image data (a deflate block of a reserved
    // type), are refused by name.
    const std::vector<uint8_t> plain = bytes_of(dir + "rgb8-17x2-plain.png");
    const size_t idat = png_chunk_at(plain, "IDAT");
    ASSERT_LT(idat + 10, plain.size());
    std::vector<uint8_t> cut = plain;
    const size_t len = size_t(cut[idat + 2]) << 8 | cut[idat + 3], keep = len / 2;
    cut.erase(cut.begin() + std::ptrdiff_t(idat + 8 + keep), cut.begin() + std::ptrdiff_t(idat + 8 + len));
    cut[idat + 2] = uint8_t(keep >> 8), cut[idat + 3] = uint8_t(keep);
    expect_refused(cut, "truncated image data", "truncated");
    std::vector<uint8_t> bad = plain;
    bad[idat + 10] = 0x07;  // after the zlib header: final block, type 3
    expect_refused(bad, "corrupt image data", "corrupt");
}

// A binary PPM (P6) or PGM (P5) of 8-bit samples, as RGB.
vision::RgbImage read_pnm(const std::string& path) {
    const std::string b = test::read_text(path);
    char magic[3] = {};
    int w = 0, h = 0, maxval = 0, header = 0;
    if (std::sscanf(b.c_str(), "%2s %d %d %d%n", magic, &w, &h, &maxval, &header) != 4 || maxval != 255)
        throw std::runtime_error(path + ": not an 8-bit PNM");
    const int channels = std::string(magic) == "P6" ? 3 : 1;
    vision::RgbImage img{w, h, {}};
    for (size_t i = 0; i < size_t(w) * size_t(h); ++i)
        for (int c = 0; c < 3; ++c)
            img.rgb.push_back(uint8_t(b[size_t(header) + 1 + i * size_t(channels) + size_t(channels == 3 ? c : 0)]));
    return img;
}

// JPEG (libjpeg-turbo): baseline 4:4:4, progressive 4:2:0 and grayscale files decode to the pixels
// libjpeg-turbo's djpeg gives (gray replicated), near the PNG they were made from; broken ones are
// refused.
TEST(VisionImage, JpegDecodes) {
    const std::string dir = test::source_path("tests/data/images/jpeg/");
    const vision::RgbImage png = vision::load_image_file(test::source_path("tests/fuzz/images/test_image.png"));
    for (const char* name : {"test_image", "test_image_progressive", "test_image_gray"}) {
        const vision::RgbImage jpg = vision::load_image_file(dir + name + ".jpg");
        const vision::RgbImage ref = read_pnm(dir + name + (std::string(name) == "test_image_gray" ? ".pgm" : ".ppm"));
        ASSERT_EQ(jpg.width, png.width) << name;
        ASSERT_EQ(jpg.height, png.height) << name;
        EXPECT_EQ(jpg.rgb, ref.rgb) << name;
        if (std::string(name) == "test_image_gray") continue;
        double mean = 0.0;
        for (size_t i = 0; i < png.rgb.size(); ++i) mean += std::abs(int(jpg.rgb[i]) - int(png.rgb[i]));
        EXPECT_LT(mean / double(png.rgb.size()), 6.0) << name;
    }
    const std::vector<uint8_t> jpg = bytes_of(dir + "test_image.jpg");
    for (size_t cut : {size_t(3), size_t(20), jpg.size() / 2, jpg.size() - 2})
        expect_refused({jpg.data(), cut}, "truncated jpeg", "JPEG");
    // The frame header (SOF0: FF C0, length, precision, then height and width) claiming 16385 x 16385.
    std::vector<uint8_t> huge = jpg;
    size_t sof = 2;
    while (sof + 9 < huge.size() && !(huge[sof] == 0xFF && huge[sof + 1] == 0xC0)) ++sof;
    ASSERT_LT(sof + 9, huge.size());
    for (size_t i : {size_t(5), size_t(7)}) huge[sof + i] = 0x40, huge[sof + i + 1] = 0x01;
    expect_refused(huge, "huge jpeg", "limit");
}

// Orientation and CMYK, against Pillow (tests/data/images/pillow/make.py): EXIF orientations 1-9 in
// JPEG (little- and big-endian TIFF, after an XMP segment), PNG (eXIf before and after the image data)
// and WebP turn the image as ImageOps.exif_transpose does; CMYK JPEGs become Pillow's RGB.
TEST(VisionImage, OrientationAndCmykMatchPillow) {
    const std::string dir = test::source_path("tests/data/images/pillow/");
    std::vector<std::string> names;
    for (int o = 1; o <= 9; ++o) names.push_back("jpeg-o" + std::to_string(o) + ".jpg");
    for (const char* n :
         {"jpeg-o6-mm.jpg", "png-o3.png", "png-o7.png", "webp-o5.webp", "webp-o8.webp", "cmyk.jpg", "cmyk-o6.jpg"})
        names.push_back(n);
    for (const std::string& name : names) {
        const vision::RgbImage img = vision::load_image_file(dir + name);
        const vision::RgbImage ref = read_pnm(dir + name + ".ppm");
        ASSERT_EQ(img.width, ref.width) << name;
        ASSERT_EQ(img.height, ref.height) << name;
        EXPECT_EQ(img.rgb, ref.rgb) << name;
    }
    // The turns themselves, by EXIF's definitions, on exact pixels: stored rows "ABC" / "DEF" (a 3 x 2
    // PNG of six colours), shown as each orientation says.
    const std::map<char, std::array<uint8_t, 3>> colour = {{'A', {255, 0, 0}},   {'B', {0, 255, 0}},
                                                           {'C', {0, 0, 255}},   {'D', {255, 255, 0}},
                                                           {'E', {0, 255, 255}}, {'F', {255, 0, 255}}};
    const std::vector<std::pair<int, std::vector<std::string>>> shown = {
        {1, {"ABC", "DEF"}},     {2, {"CBA", "FED"}},     {3, {"FED", "CBA"}},     {4, {"DEF", "ABC"}},
        {5, {"AD", "BE", "CF"}}, {6, {"DA", "EB", "FC"}}, {7, {"FC", "EB", "DA"}}, {8, {"CF", "BE", "AD"}}};
    for (const auto& [o, rows] : shown) {
        const vision::RgbImage img = vision::load_image_file(dir + "tiny-o" + std::to_string(o) + ".png");
        ASSERT_EQ(img.height, int(rows.size())) << "orientation " << o;
        ASSERT_EQ(img.width, int(rows[0].size())) << "orientation " << o;
        for (int y = 0; y < img.height; ++y)
            for (int x = 0; x < img.width; ++x)
                for (int c = 0; c < 3; ++c)
                    EXPECT_EQ(img.rgb[(size_t(y) * size_t(img.width) + size_t(x)) * 3 + size_t(c)],
                              colour.at(rows[size_t(y)][size_t(x)])[size_t(c)])
                        << "orientation " << o << ", pixel " << x << "," << y;
    }
}

TEST(VisionPreprocess, SmartResizeKeepsTokenBounds) {
    const vision::ProcessorConfig cfg;
    for (auto [h, w] : std::vector<std::pair<int, int>>{{48, 64}, {520, 300}, {1, 1}, {2000, 30}, {512, 512}}) {
        const auto [nh, nw] = vision::smart_resize(h, w, cfg);
        EXPECT_EQ(nh % 32, 0);
        EXPECT_EQ(nw % 32, 0);
        EXPECT_LE(nh / 32 * (nw / 32), 256) << h << "x" << w;
    }
    EXPECT_EQ(vision::smart_resize(48, 64, cfg), (std::array<int, 2>{224, 320}));
    EXPECT_EQ(vision::smart_resize(520, 300, cfg), (std::array<int, 2>{512, 288}));
}

}  // namespace
}  // namespace cera
