// cera::Engine: one loaded model (weights resident on a device, its tokenizer and
// metadata). Any number of cera::Session objects (session.h) share one Engine; each
// session holds a shared_ptr to it, so the engine lives as long as its last session.
//
//   auto engine = cera::Engine::load("model.gguf", {.device = "cpu", .threads = 2});
//   cera::Session s(engine);
//   s.append_text("Once upon a time");
//   s.generate(options, sink);
//
// Thread-safety: every const member of Engine may be called from any thread at any time.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cera {

// Storage of the attention KV cache: floats, or blocks of 32 with one scale (Q8_0: 8-bit, Q4_0: 4-bit,
// as in GGUF weights); kTq4 stores each head through a fixed random rotation (a signed Walsh-Hadamard
// transform) in Q4_0 blocks, which spreads outlier channels and keeps 4 bits closer to F16; kTq3 stores
// the rotated heads in 3.5 bits an element, a sign and a Gaussian-fitted magnitude (docs/kv-cache.md).
// kKivi4 lays keys and values out as KIVI does: keys 4-bit per channel over groups of 64 tokens (a scale
// and a minimum a channel), values 4-bit per token (Q4_0's codes under a one-byte scale); the CPU runs it.
// The block types and kKivi4 need rows of K and V of a multiple of 32; on CUDA, heads of a multiple of
// 32 (kTq4, kTq3: a power of two).
enum class KvCacheType { kF32, kF16, kBF16, kQ8_0, kQ4_0, kTq4, kTq3, kKivi4 };
// "f32", "f16", "bf16", "q8_0", "q4_0", "tq4", "tq3", "kivi4"; parse_kv_cache_type throws cera::Error
// (kInvalidArgument) for another name.
const char* kv_cache_type_name(KvCacheType t);
KvCacheType parse_kv_cache_type(const std::string& name);

// A LoRA adapter (a llama.cpp GGUF LoRA file or a Hugging Face PEFT folder) and the scale its deltas
// are applied with: y = W x + scale * (alpha / r) * B (A x).
struct LoraOptions {
    std::string path;
    float scale = 1.0f;
};

struct EngineOptions {
    // "auto" (a CUDA GPU when usable, else the CPU), "cpu", "cuda", "cuda:N", or one device a rank of a
    // split model: "cuda:0,cuda:1" (a device named more than once holds several ranks, through device
    // copies: a split simulated on one GPU).
    std::string device = "auto";
    int threads = 0;                          // CPU worker threads; 0 = the physical cores
    // Ranks the model is split over (tensor parallelism, docs/tensor-parallel.md): 1 = none, or as many as
    // `device` lists. CPU ranks share `threads`; CUDA ranks take cuda:N, cuda:N+1, ... unless `device`
    // lists them. No LoRA adapters with a split.
    int tensor_parallel = 1;
    int32_t n_ctx = 0;                        // context length of each session; 0 = the model's, at most 4096
    KvCacheType kv_type_k = KvCacheType::kF32;  // KV cache storage of the keys
    KvCacheType kv_type_v = KvCacheType::kF32;  // and of the values
    int32_t n_batch = 512;                    // prefill chunk (tokens per forward pass)
    // Prefix cache (src/runtime/prefix_cache.h): sessions save their state at the end of each prompt
    // and at n_batch-aligned chunk boundaries, and a later prompt sharing such a prefix restores it.
    size_t prefix_cache_bytes = 0;        // in-memory (warm) tier bound in bytes; 0 = none
    std::string prefix_cache_dir;         // on-disk (cold) tier directory; "" = none
    uint64_t prefix_cache_dir_bytes = 0;  // on-disk tier bound in bytes; 0 = 4 GiB
    bool gpu_profile = false;             // CUDA: print GPU and host time per decode step when the engine goes
    // CUDA: how much of the device's one-time set-up load() pays, so that prompts do not (no effect on the
    // CPU). kFirstUse: a short prefill and a decode step on a scratch sequence (kernels load at their first
    // launch, cuBLAS starts), then every batched product shape of a prompt chunk at a ladder of chunk sizes
    // up to n_batch, four a doubling (cuBLAS loads the kernel it picks for a size when that size first
    // runs, 2-15 ms for a prompt of a new length; it picks one kernel for a range of sizes). kEverySize:
    // every chunk size instead of the ladder; for servers, whose prompts come in every length. It costs
    // load time that grows with the model and with n_batch (0.6 s for lfm2-1.2b at 512). With a vision
    // projector, its encoder runs once and its products are readied for a ladder of patch counts.
    enum class Warmup { kNone, kFirstUse, kEverySize };
    Warmup warmup = Warmup::kFirstUse;
    // LoRA adapters applied together to every session and to every batcher request that names no adapter
    // (GenerateOptions::adapter), each with its scale. Loaded with the model; a bad one fails load().
    std::vector<LoraOptions> lora;
    // Device bytes of adapter weights kept resident while no step uses them (least recently used go
    // first beyond it); 0 = no bound.
    size_t lora_cache_bytes = 0;
    // A vision projector GGUF (llama.cpp's mmproj of an LFM2-VL model), loaded onto the model's device:
    // sessions then take images (Session::append_image). "" = none.
    std::string mmproj;
    // An image larger than one 512-pixel tile is cut into tiles plus a thumbnail (the LFM2-VL processor's
    // default, do_image_splitting). false: one smart-resized piece of at most 256 image tokens instead,
    // fewer prompt tokens and a faster encode, with less detail.
    bool image_splitting = true;
    // Called as the weights go onto the device, with the tensor bytes loaded so far and in all (the last
    // call has them equal); unset = quiet.
    std::function<void(uint64_t done, uint64_t total)> on_load_progress;
};

// A named adapter of an engine (Engine::load_adapter).
struct AdapterInfo {
    std::string name;
    std::string path;
    float scale = 1.0f;
    int64_t n_tensors = 0;  // adapted projections
    int64_t rank = 0;       // the largest rank among them
};

// Device memory an engine's backend holds, in bytes (all zero on the CPU, whose memory is the
// process's).
struct DeviceMemory {
    uint64_t weights = 0;  // the model's weights as stored on the device
    uint64_t buffers = 0;  // KV caches, recurrent states, activations and outputs
    uint64_t scratch = 0;  // the backend's own working memory
};

// Counters of an engine's prefix cache.
struct PrefixCacheStats {
    uint64_t hits_memory = 0, hits_disk = 0, misses = 0;
    uint64_t stores = 0;           // entries added
    uint64_t evictions = 0;        // in-memory entries evicted by the byte bound
    uint64_t disk_evictions = 0;   // files removed by the disk bound
    uint64_t dropped_corrupt = 0;  // torn or corrupt files removed instead of loaded
    uint64_t memory_entries = 0, memory_bytes = 0;
};

// What a loaded model is and where it runs.
// How Session::embed() reduces the per-token hidden states.
enum class Pooling {
    kMean,  // the mean over every token (BOS included): [n_embd]
    kLast,  // the last token's: [n_embd]
    kNone,  // every token's: [n_tokens, n_embd]
};

struct EngineInfo {
    std::string path;           // the GGUF file
    std::string architecture;   // general.architecture, e.g. "lfm2"
    std::string name;           // general.name, or ""
    std::string weight_type;    // the type holding most weight bytes, e.g. "Q8_0"
    std::string device;         // the backend, e.g. "cpu avx512, 2 threads"
    bool on_gpu = false;        // true when the weights live on a CUDA device
    int64_t n_params = 0;       // elements of all weight tensors
    uint64_t weight_bytes = 0;  // bytes of all weight tensors
    // Weight bytes one batch-1 decode step reads: every matrix once, one embedding row,
    // the routed share of MoE experts. The numerator of the decode roofline.
    uint64_t decode_bytes_per_token = 0;
    int32_t n_vocab = 0;
    int32_t n_embd = 0;
    int32_t n_layer = 0;
    int32_t n_ctx_train = 0;  // the context the model was trained with (<arch>.context_length)
    int32_t n_ctx = 0;        // the context of each session
    bool has_chat_template = false;
    // The pooling the model's embeddings are made with (<arch>.pooling_type as llama.cpp writes it):
    // the last token's for embedding models such as Qwen3-Embedding, the mean where the file names
    // none. pooling_unsupported names one Session::embed does not do ("cls", "rank"); then the
    // embedding commands refuse the model.
    Pooling pooling = Pooling::kMean;
    std::string pooling_unsupported;
};

// Another file's text given as context to a fill-in-the-middle prompt (Engine::infill_prompt).
struct InfillFile {
    std::string name;  // its path, or ""
    std::string text;
};

// An image decoded and run through the engine's vision projector (Engine::encode_image): the tokens that
// stand for it in a prompt and the embeddings of its image tokens. Opaque; shared, immutable.
struct EncodedImage;

// An image in a prompt: its tokens (Engine::image_tokens) stand in the prompt from index `begin`, and the
// image's embeddings take the place of its image tokens.
struct PromptImage {
    size_t begin = 0;
    std::shared_ptr<const EncodedImage> image;  // Engine::encode_image
};

class Engine {
 public:
    // Loads a GGUF model and makes its weights resident on the chosen device. Throws cera::Error
    // (kIo, kInvalidFile, kUnsupported, kDevice, kInvalidArgument for bad options).
    static std::shared_ptr<Engine> load(const std::string& path, const EngineOptions& options = {});
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Facts about the model and device (filled at load, never changes).
    const EngineInfo& info() const;
    DeviceMemory device_memory() const;
    const EngineOptions& options() const;

    // A metadata value rendered as text (strings as stored, numbers in decimal, arrays as
    // "[N items]"); "" when the key is absent.
    std::string metadata(std::string_view key) const;
    // All metadata keys, in file order.
    std::vector<std::string> metadata_keys() const;

    // Text -> token ids. add_bos: add BOS (and EOS) where the model's tokenizer settings ask for
    // them; parse_special: special-token text such as "<|im_start|>" becomes its single id.
    std::vector<int32_t> tokenize(std::string_view text, bool add_bos, bool parse_special = true) const;
    // Token ids -> text (special tokens render as their text when render_special).
    std::string detokenize(std::span<const int32_t> tokens, bool render_special = false) const;
    // A fill-in-the-middle prompt for a code model whose vocabulary has FIM tokens (Qwen2.5-Coder's
    // <|fim_prefix|>, CodeLlama's <PRE>, ...): BOS where the model wants it, then FIM-prefix, the
    // prefix, FIM-suffix, the suffix, FIM-middle, after which the model writes the middle (ending with
    // an end-of-generation token such as <|endoftext|> or <|fim_pad|>). The code's text is tokenized
    // as plain text (special-token text in it stays text). Other files' text (`context`) goes before
    // FIM-prefix: with a file-separator token (Qwen2.5-Coder's <|file_sep|>), in the repository layout
    // the model was trained on (a repository-name token and "project", then a separator, the name, a
    // newline and the text for each file); without one, as plain text, each file ending in a newline.
    // Throws kUnsupported for a vocabulary without FIM tokens.
    std::vector<int32_t> infill_prompt(std::string_view prefix, std::string_view suffix,
                                       std::span<const InfillFile> context = {}) const;
    // Whether the model wants BOS at the start of a sequence (tokenizer.ggml.add_bos_token).
    bool add_bos() const;
    int32_t bos_token() const;         // -1 when the model has none
    int32_t eos_token() const;         // -1 when the model has none
    bool is_eog(int32_t token) const;  // end of generation: EOS, EOT, EOM and the like
    // tokenizer.chat_template, or "" when absent.
    std::string chat_template() const;
    // The text of a token id as the vocabulary stores it (special tokens included), e.g. "<|im_end|>".
    std::string token_text(int32_t token) const;
    // The bytes a token adds to a decoded text (a space for a leading '▁', <0xNN> as that byte; control
    // tokens give ""). Part of a UTF-8 character for byte tokens. Throws kOutOfRange on a bad id.
    std::string token_bytes(int32_t token) const;

    // A hash of the GGUF (size, metadata, tensor table, samples of the data): saved states and
    // prefix-cache entries carry it, and load only into an engine with the same fingerprint.
    uint64_t fingerprint() const;
    // Whether a vision projector is loaded (EngineOptions::mmproj): sessions take images.
    bool has_vision() const;
    // Decodes an image file's bytes (PNG, JPEG, WebP, GIF's first frame or BMP) and encodes it with the vision
    // projector, for a batcher prompt (Batcher::submit). The latest few images are kept by content hash,
    // so a repeated one is not encoded again. Thread-safe. Throws kInvalidArgument for a bad image (not an
    // image, truncated, too large) or an engine without a projector.
    std::shared_ptr<const EncodedImage> encode_image(std::span<const uint8_t> file_bytes) const;
    // The tokens that stand for an encoded image in a prompt: <|image_start|>, tile markers, one image
    // token per embedding row, <|image_end|>, as the model's chat template expects.
    std::span<const int32_t> image_tokens(const EncodedImage& image) const;
    // The id of the "<image>" token with which a rendered chat marks where an image goes, or -1.
    int32_t image_marker() const;
    // A prompt with its i-th image marker (image_marker()) replaced by the tokens of images[i]; the images'
    // places go to *placed, for Batcher::submit. Throws kInvalidArgument when the markers and images
    // differ in number.
    std::vector<int32_t> expand_images(std::span<const int32_t> prompt,
                                       std::span<const std::shared_ptr<const EncodedImage>> images,
                                       std::vector<PromptImage>* placed) const;

    // Whether a prefix cache is configured, and its counters (zeros without one).
    bool has_prefix_cache() const;
    PrefixCacheStats prefix_cache_stats() const;

    // Named LoRA adapters, added and removed while the engine runs (any thread): a batcher request or a
    // session's generate() selects one by name (GenerateOptions::adapter). load_adapter() reads and
    // checks the adapter against the model (cera::Error: kIo, kInvalidFile naming the tensor and both
    // shapes for an adapter of another model, kUnsupported) and throws kInvalidArgument for a name in
    // use, "", or "base". unload_adapter() returns false for an unknown name; requests already running
    // with the adapter finish with it.
    void load_adapter(const std::string& name, const std::string& path, float scale = 1.0f);
    bool unload_adapter(const std::string& name);
    std::vector<AdapterInfo> adapters() const;  // by name

    // Internal: the loaded model and tokenizer (src/runtime/engine_impl.h).
    struct Impl;
    Impl& impl() const { return *impl_; }

 private:
    Engine();
    std::unique_ptr<Impl> impl_;
};

}  // namespace cera
