#include "cli/engine_flags.h"

#include <cmath>
#include <cstdlib>
#include <memory>

#include "cera/error.h"
#include "cli/progress.h"

namespace cera::cli {

void EngineFlags::add(CLI::App& app, unsigned parts) {
    app.add_option("-t,--threads", threads, "CPU threads (0: the physical cores)")->capture_default_str();
    app.add_option("--device,--devices", device,
                   "auto, cpu, cuda, cuda:N, or one device a rank of a split model: cuda:0,cuda:1")
        ->capture_default_str();
    app.add_option("--tensor-parallel", tensor_parallel,
                   "split the model over N ranks (CPU ranks sharing the threads, CUDA ranks on cuda:0..N-1; "
                   "no LoRA yet)")
        ->capture_default_str();
    app.add_flag("--no-warmup", no_warmup, "CUDA: skip the warm-up run at load (the first prompt then pays the device's set-up)");
    if (parts & kCtx)
        app.add_option("-c,--ctx", n_ctx, "context length (0: the model's, at most 4096)")->capture_default_str();
    if (parts & kKvType) {
        app.add_option("--kv-type", kv_type,
                       "KV cache type of keys and values: f32, f16, bf16, q8_0, q4_0, tq4, tq3 or kivi4")
            ->capture_default_str();
        app.add_option("--cache-type-k", kv_type_k, "KV cache type of the keys (default: --kv-type)");
        app.add_option("--cache-type-v", kv_type_v, "KV cache type of the values (default: --kv-type)");
    }
    if (parts & kBatch)
        app.add_option("-b,--batch", n_batch, "prefill chunk (tokens per forward pass)")->capture_default_str();
    if (parts & kPrefixCache) {
        app.add_option("--prompt-cache", cache_dir,
                       "prefix cache directory: a prompt sharing a prefix with a saved one resumes from its state, "
                       "and its own state is saved (default: none)");
        app.add_option("--cache-mib", cache_mib, "in-memory prefix cache size in MiB (0: none)")->capture_default_str();
    }
    if (parts & kVision) {
        app.add_option("--mmproj", mmproj, "vision projector GGUF (llama.cpp mmproj) of an LFM2-VL model");
        app.add_option("--image", images,
                       "image file (repeatable; needs --mmproj): <image> in the prompt marks where each goes, "
                       "else they come before the text");
        add_image_split(app);
    }
    if (parts & kLora) {
        app.add_option("--lora", lora,
                       "LoRA adapter PATH[:SCALE] (a GGUF LoRA file or a PEFT folder; scale 1 by default), applied "
                       "unmerged; repeat for several at once");
        app.add_option("--lora-cache-mib", lora_cache_mib,
                       "device memory for adapters not in use, in MiB (least recently used go first; 0: no bound)")
            ->capture_default_str();
    }
}

void EngineFlags::add_image_split(CLI::App& app) {
    app.add_flag("--no-image-split", no_image_split,
                 "an image larger than one 512-pixel tile becomes one smart-resized piece instead of tiles and a "
                 "thumbnail: fewer image tokens and a faster encode, less detail");
}

LoraOptions parse_lora_flag(const std::string& text) {
    LoraOptions lo;
    lo.path = text;
    const size_t colon = text.rfind(':');
    if (colon != std::string::npos && colon + 1 < text.size()) {
        const std::string tail = text.substr(colon + 1);
        char* end = nullptr;
        const double v = std::strtod(tail.c_str(), &end);
        if (end && *end == '\0') {
            if (!std::isfinite(v))
                throw Error(ErrorCode::kInvalidArgument, "--lora " + text + ": the scale must be finite");
            lo.path = text.substr(0, colon);
            lo.scale = float(v);
        }
    }
    if (lo.path.empty()) throw Error(ErrorCode::kInvalidArgument, "--lora " + text + ": no path");
    return lo;
}

EngineOptions EngineFlags::options() const {
    if (threads < 0) throw Error(ErrorCode::kInvalidArgument, "--threads must be >= 0");
    if (n_ctx < 0) throw Error(ErrorCode::kInvalidArgument, "--ctx must be >= 0");
    if (n_batch < 1) throw Error(ErrorCode::kInvalidArgument, "--batch must be >= 1");
    if (!(cache_mib >= 0)) throw Error(ErrorCode::kInvalidArgument, "--cache-mib must be >= 0");
    if (!(lora_cache_mib >= 0)) throw Error(ErrorCode::kInvalidArgument, "--lora-cache-mib must be >= 0");
    if (tensor_parallel < 1) throw Error(ErrorCode::kInvalidArgument, "--tensor-parallel must be >= 1");
    EngineOptions eo;
    eo.device = device;
    eo.threads = threads;
    eo.tensor_parallel = tensor_parallel;
    eo.warmup = no_warmup ? EngineOptions::Warmup::kNone : EngineOptions::Warmup::kFirstUse;
    eo.n_ctx = n_ctx;
    eo.kv_type_k = parse_kv_cache_type(kv_type_k.empty() ? kv_type : kv_type_k);
    eo.kv_type_v = parse_kv_cache_type(kv_type_v.empty() ? kv_type : kv_type_v);
    eo.n_batch = n_batch;
    eo.prefix_cache_dir = cache_dir;
    eo.prefix_cache_bytes = size_t(cache_mib * 1024 * 1024);
    for (const std::string& l : lora) eo.lora.push_back(parse_lora_flag(l));
    eo.lora_cache_bytes = size_t(lora_cache_mib * 1024 * 1024);
    if (!images.empty() && mmproj.empty()) throw Error(ErrorCode::kInvalidArgument, "--image needs --mmproj");
    if (no_image_split && mmproj.empty()) throw Error(ErrorCode::kInvalidArgument, "--no-image-split needs --mmproj");
    eo.mmproj = mmproj;
    eo.image_splitting = !no_image_split;
    // A load that takes over a second shows its progress.
    auto bar = std::make_shared<Progress>("load", 1.0);
    eo.on_load_progress = [bar](uint64_t done, uint64_t total) { bar->update(done, total); };
    return eo;
}

}  // namespace cera::cli
