// Engine: load a model onto the chosen device, with its tokenizer and the facts
// (sizes, decode bytes per token) the CLI and benchmarks report.
#include "cera/engine.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "backends/device.h"
#include "core/check.h"
#include "gguf/gguf.h"
#include "gguf/keys.h"
#include "runtime/engine_impl.h"

namespace cera {

DeviceChoice parse_device(const std::string& device) {
    DeviceChoice c;
    if (device.empty() || device == "auto") {
        c.automatic = true;
        return c;
    }
    if (device == "cpu") return c;
    if (device.find(',') != std::string::npos) {  // one device a rank
        size_t at = 0;
        for (;;) {
            const size_t end = std::min(device.find(',', at), device.size());
            const std::string one = device.substr(at, end - at);
            if (one.rfind("cuda:", 0) != 0)
                throw_error(ErrorCode::kInvalidArgument, "device '%s': expected a list of cuda:N, one a rank",
                            device.c_str());
            c.gpu_ranks.push_back(parse_device(one).gpu_index);
            if (end == device.size()) break;
            at = end + 1;
        }
        c.kind = DeviceKind::kCuda, c.gpu_index = c.gpu_ranks[0];
        return c;
    }
    if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
        c.kind = DeviceKind::kCuda;
        if (device.size() > 5) {
            const std::string n = device.substr(5);
            char* end = nullptr;
            const long v = std::strtol(n.c_str(), &end, 10);
            if (n.empty() || *end != '\0' || v < 0 || v > 1024)
                throw_error(ErrorCode::kInvalidArgument, "device '%s': expected cuda:N with N a GPU index",
                            device.c_str());
            c.gpu_index = int(v);
        }
        return c;
    }
    throw_error(ErrorCode::kInvalidArgument, "device '%s': expected auto, cpu, cuda, cuda:N or cuda:N,cuda:M,...",
                device.c_str());
}

namespace {

std::string render_value(const gguf::Value& v) {
    using gguf::ValueType;
    switch (v.type) {
        case ValueType::kString:
            return v.as_string();
        case ValueType::kArray:
            return "[" + std::to_string(v.as_array().items.size()) + " items]";
        case ValueType::kBool:
            return std::get<bool>(v.v) ? "true" : "false";
        case ValueType::kF32:
        case ValueType::kF64: {
            char buf[64];
            std::snprintf(buf, sizeof buf, "%.9g", v.as_double());
            return buf;
        }
        default:
            return v.type == ValueType::kU64 || v.type == ValueType::kU32 || v.type == ValueType::kU16 ||
                           v.type == ValueType::kU8
                       ? std::to_string(v.as_uint())
                       : std::to_string(v.as_int());
    }
}

// Sizes of the weights, and the bytes one decode step reads.
void measure_weights(const gguf::File& f, const std::string& arch, EngineInfo& info) {
    std::map<GgmlType, uint64_t> by_type;
    const int64_t n_expert = int64_t(f.get_u32(gguf::keys::arch_key(arch, "expert_count"), 0));
    const int64_t n_used = int64_t(f.get_u32(gguf::keys::arch_key(arch, "expert_used_count"), 0));
    const bool tied = f.find_tensor("output.weight") == nullptr;
    double decode = 0.0;
    for (const auto& t : f.tensors()) {
        info.n_params += t.n_elements();
        info.weight_bytes += t.n_bytes;
        if (t.ne.size() >= 2) by_type[t.type] += t.n_bytes;
        if (t.name == "token_embd.weight" && !tied) {
            decode += double(t.n_bytes) / double(t.rows());  // one row is gathered
        } else if (t.name.find("_exps") != std::string::npos && n_expert > 0 && n_used > 0) {
            decode += double(t.n_bytes) * double(n_used) / double(n_expert);
        } else {
            decode += double(t.n_bytes);
        }
    }
    info.decode_bytes_per_token = uint64_t(decode);
    uint64_t best = 0;
    for (const auto& [type, bytes] : by_type)
        if (bytes > best) best = bytes, info.weight_type = type_name(type);
}

}  // namespace

static GgmlType kv_ggml_type(KvCacheType t, bool key) {
    switch (t) {
        case KvCacheType::kF32: return GgmlType::kF32;
        case KvCacheType::kF16: return GgmlType::kF16;
        case KvCacheType::kBF16: return GgmlType::kBF16;
        case KvCacheType::kQ8_0: return GgmlType::kQ8_0;
        case KvCacheType::kQ4_0: return GgmlType::kQ4_0;
        case KvCacheType::kTq4: return GgmlType::kQ4_0;  // rows rotated first (ModelOptions::kv_rotate_*)
        case KvCacheType::kTq3: return GgmlType::kQ3_KV;  // rows rotated first
        case KvCacheType::kKivi4:
            return key ? GgmlType::kQ4_CH : GgmlType::kQ4_KV;  // KIVI: values per token
    }
    throw_error(ErrorCode::kInvalidArgument, "KV cache type %d is none of f32, f16, bf16, q8_0, q4_0, tq4, tq3, kivi4",
                int(t));
}

std::unique_ptr<Model> load_engine_model(const std::string& path, const EngineOptions& options) {
    if (options.threads < 0)
        throw_error(ErrorCode::kInvalidArgument, "threads = %d: must be >= 0 (0 = the physical cores)",
                    options.threads);
    if (options.n_ctx < 0) throw_error(ErrorCode::kInvalidArgument, "context = %d: must be >= 0", options.n_ctx);
    if (options.n_batch < 1) throw_error(ErrorCode::kInvalidArgument, "batch = %d: must be >= 1", options.n_batch);
    const DeviceChoice dev = parse_device(options.device);

    ModelOptions mo;
    mo.n_threads = options.threads;
    mo.tensor_parallel = options.tensor_parallel;
    mo.n_ctx = options.n_ctx;
    mo.n_batch = options.n_batch;
    mo.kv_type_k = kv_ggml_type(options.kv_type_k, true);
    mo.kv_type_v = kv_ggml_type(options.kv_type_v, false);
    mo.kv_rotate_k = options.kv_type_k == KvCacheType::kTq4 || options.kv_type_k == KvCacheType::kTq3;
    mo.kv_rotate_v = options.kv_type_v == KvCacheType::kTq4 || options.kv_type_v == KvCacheType::kTq3;
    mo.device = dev.kind;
    mo.gpu_index = dev.gpu_index;
    if (!dev.gpu_ranks.empty()) {  // a list of devices: one a rank
        if (options.tensor_parallel != 1 && options.tensor_parallel != int(dev.gpu_ranks.size()))
            throw_error(ErrorCode::kInvalidArgument, "device %s names %zu devices for %d ranks (tensor_parallel)",
                        options.device.c_str(), dev.gpu_ranks.size(), options.tensor_parallel);
        mo.tensor_parallel = int(dev.gpu_ranks.size());
        mo.gpu_ranks = dev.gpu_ranks;
    }
    mo.cuda.profile = options.gpu_profile;
    mo.lora_cache_bytes = options.lora_cache_bytes;
    mo.on_load_progress = options.on_load_progress;
    if (dev.kind == DeviceKind::kCuda) {
        std::string why;
        const auto gpus = cuda_devices(&why);
        if (gpus.empty())
            throw_error(ErrorCode::kDevice, "device %s: no CUDA device (%s)", options.device.c_str(), why.c_str());
        for (int g : dev.gpu_ranks.empty() ? std::vector<int>{dev.gpu_index} : dev.gpu_ranks)
            if (g >= int(gpus.size()))
                throw_error(ErrorCode::kDevice, "device %s: there are only %zu CUDA device(s)", options.device.c_str(),
                            gpus.size());
    }
    if (dev.automatic) {
        // A usable GPU first; a build or machine without one falls back to the CPU.
        std::string why;
        if (cuda_compiled() && !cuda_devices(&why).empty()) {
            mo.device = DeviceKind::kCuda;
            try {
                return load_model(path, mo);
            } catch (const Error& err) {
                if (err.code() != ErrorCode::kDevice) throw;
                mo.device = DeviceKind::kCpu;
            }
        }
    }
    return load_model(path, mo);
}

Engine::Engine() : impl_(std::make_unique<Impl>()) {}
Engine::~Engine() = default;

std::shared_ptr<Engine> Engine::load(const std::string& path, const EngineOptions& options) {
    std::unique_ptr<Model> model = load_engine_model(path, options);
    std::shared_ptr<Engine> e(new Engine());
    Impl& im = *e->impl_;
    im.options = options;
    im.model = std::move(model);

    const gguf::File& f = im.model->file();
    im.tokenizer = Tokenizer::from_gguf(f);

    EngineInfo& info = im.info;
    const ModelInfo& mi = im.model->info();
    info.path = path;
    info.architecture = mi.arch;
    info.name = mi.name;
    info.device = im.model->backend().description();
    info.on_gpu = im.model->backend().kind() == DeviceKind::kCuda;
    info.n_vocab = int32_t(mi.n_vocab);
    info.n_embd = int32_t(mi.n_embd);
    info.n_layer = int32_t(mi.n_layer);
    info.n_ctx_train = int32_t(mi.n_ctx_train);
    info.has_chat_template = f.has(gguf::keys::kChatTemplate);
    switch (f.get_u32(mi.arch + ".pooling_type", 0)) {  // llama.cpp's: 0 none, 1 mean, 2 cls, 3 last, 4 rank
        case 0:
        case 1:
            info.pooling = Pooling::kMean;
            break;
        case 2:
            info.pooling_unsupported = "cls";
            break;
        case 3:
            info.pooling = Pooling::kLast;
            break;
        case 4:
            info.pooling_unsupported = "rank";
            break;
        default:
            info.pooling_unsupported = "type " + std::to_string(f.get_u32(mi.arch + ".pooling_type"));
            break;
    }
    measure_weights(f, mi.arch, info);
    info.n_ctx = im.model->default_n_ctx();  // the context a session gets by default
    im.fingerprint = model_fingerprint(f);
    for (const LoraOptions& lo : options.lora) {
        im.default_lora.push_back({load_lora(lo.path, *im.model), lo.scale});
        // Saved states and prefix-cache entries made under the default adapters load only under them.
        uint32_t bits = 0;
        std::memcpy(&bits, &lo.scale, sizeof bits);
        for (char c : lo.path + ":" + std::to_string(bits))
            im.fingerprint = (im.fingerprint ^ uint8_t(c)) * 0x100000001b3ull;
    }
    if (!options.mmproj.empty()) {
        im.vision = vision::VisionEncoder::load(options.mmproj, im.model->backend(), mi.n_embd);
        im.vision->set_image_splitting(options.image_splitting);
    }
    if (info.on_gpu && options.warmup != EngineOptions::Warmup::kNone) im.warm_up();
    if (options.prefix_cache_bytes > 0 || !options.prefix_cache_dir.empty()) {
        PrefixCacheConfig pc;
        pc.max_bytes = options.prefix_cache_bytes;
        pc.dir = options.prefix_cache_dir;
        pc.max_disk_bytes = options.prefix_cache_dir_bytes;
        pc.device = device_kind_name(im.model->backend().kind());
        im.prefix_cache = std::make_unique<PrefixCache>(pc, im.state_identity());
    }
    return e;
}

void Engine::Impl::warm_up() {
    // 32 tokens take the prefill path of a chunk (GEMMs, tensor-core attention), the next one a decode
    // step. Every product shape the chunk met is then readied for the chunk sizes a prompt brings: all
    // of them up to n_batch for kEverySize, a ladder of them for kFirstUse (not the LM head's: a chunk
    // computes the logits of its last token only).
    const int n_ctx = int(std::min<int64_t>(64, model->default_n_ctx()));
    auto st = model->create_state(n_ctx);
    const int32_t tok = tokenizer->bos() >= 0 ? tokenizer->bos() : 0;
    const std::vector<int32_t> prompt(size_t(std::min(32, n_ctx / 2)), tok);
    st->eval({.tokens = prompt, .head = HeadOutput::kGreedy});
    st->eval({.tokens = {&tok, 1}, .head = HeadOutput::kGreedy});
    std::vector<int64_t> counts;
    if (options.warmup == EngineOptions::Warmup::kEverySize) {
        counts.resize(size_t(options.n_batch));
        std::iota(counts.begin(), counts.end(), int64_t(1));
    } else {
        counts = product_count_ladder(options.n_batch);
    }
    model->backend().warm_up_products(counts);
    if (vision) vision->warm_up();
}

const EngineInfo& Engine::info() const { return impl_->info; }
bool Engine::has_vision() const { return impl_->vision != nullptr; }

LoraSet Engine::Impl::resolve_lora(const std::string& name) const {
    if (name.empty()) return default_lora;
    if (name == "base") return {};
    std::lock_guard<std::mutex> lk(lora_mu);
    auto it = adapters.find(name);
    if (it == adapters.end()) throw_error(ErrorCode::kMissing, "no LoRA adapter named '%s'", name.c_str());
    return {{it->second.adapter, it->second.scale}};
}

void Engine::load_adapter(const std::string& name, const std::string& path, float scale) {
    if (name.empty() || name == "base")
        throw_error(ErrorCode::kInvalidArgument, "adapter name '%s' is reserved", name.c_str());
    if (!std::isfinite(scale))
        throw_error(ErrorCode::kInvalidArgument, "adapter %s: scale must be finite", name.c_str());
    {
        std::lock_guard<std::mutex> lk(impl_->lora_mu);
        if (impl_->adapters.count(name))
            throw_error(ErrorCode::kInvalidArgument, "an adapter named '%s' is already loaded", name.c_str());
    }
    auto a = load_lora(path, *impl_->model);  // outside the lock: reads the files
    std::lock_guard<std::mutex> lk(impl_->lora_mu);
    if (!impl_->adapters.emplace(name, Impl::NamedAdapter{std::move(a), path, scale}).second)
        throw_error(ErrorCode::kInvalidArgument, "an adapter named '%s' is already loaded", name.c_str());
}

bool Engine::unload_adapter(const std::string& name) {
    std::shared_ptr<const LoraAdapter> gone;  // released after the lock: its destructor takes the cache's
    std::lock_guard<std::mutex> lk(impl_->lora_mu);
    auto it = impl_->adapters.find(name);
    if (it == impl_->adapters.end()) return false;
    gone = std::move(it->second.adapter);
    impl_->adapters.erase(it);
    return true;
}

std::vector<AdapterInfo> Engine::adapters() const {
    std::lock_guard<std::mutex> lk(impl_->lora_mu);
    std::vector<AdapterInfo> out;
    for (const auto& [name, a] : impl_->adapters)
        out.push_back({name, a.path, a.scale, int64_t(a.adapter->tensors().size()), a.adapter->max_rank()});
    return out;
}

DeviceMemory Engine::device_memory() const {
    std::lock_guard<FifoMutex> lock(impl_->model->backend().exec_mutex());
    const MemoryUse m = impl_->model->backend().memory_use();
    return {m.weights, m.buffers, m.scratch};
}
const EngineOptions& Engine::options() const { return impl_->options; }

std::string Engine::metadata(std::string_view key) const {
    const gguf::Value* v = impl_->model->file().find(key);
    return v ? render_value(*v) : std::string();
}

std::vector<std::string> Engine::metadata_keys() const {
    std::vector<std::string> out;
    for (const auto& kv : impl_->model->file().metadata()) out.push_back(kv.first);
    return out;
}

std::vector<int32_t> Engine::tokenize(std::string_view text, bool add_bos, bool parse_special) const {
    return impl_->tokenizer->encode(text, add_bos, parse_special);
}

std::string Engine::detokenize(std::span<const int32_t> tokens, bool render_special) const {
    return impl_->tokenizer->decode(tokens, render_special);
}

std::string Engine::token_bytes(int32_t token) const { return impl_->tokenizer->token_to_piece(token, false); }

std::vector<int32_t> Engine::infill_prompt(std::string_view prefix, std::string_view suffix,
                                           std::span<const InfillFile> context) const {
    const auto& d = impl_->tokenizer->vocab().data();
    if (d.fim_pre < 0 || d.fim_suf < 0 || d.fim_mid < 0)
        throw Error(ErrorCode::kUnsupported, "this model's vocabulary has no fill-in-the-middle tokens");
    std::vector<int32_t> ids;
    auto text = [&](std::string_view s) {
        for (int32_t t : tokenize(s, false, false)) ids.push_back(t);
    };
    if (add_bos() && bos_token() >= 0) ids.push_back(bos_token());
    const bool repo = d.fim_sep >= 0;  // the files as a repository's, else as plain text before the prefix
    if (repo && !context.empty() && d.fim_rep >= 0) ids.push_back(d.fim_rep), text("project\n");
    for (const InfillFile& f : context) {
        if (repo) ids.push_back(d.fim_sep);
        text((repo ? f.name + "\n" : std::string()) + f.text + (f.text.empty() || f.text.back() == '\n' ? "" : "\n"));
    }
    ids.push_back(d.fim_pre);
    text(prefix);
    ids.push_back(d.fim_suf);
    text(suffix);
    ids.push_back(d.fim_mid);
    return ids;
}

bool Engine::add_bos() const { return impl_->tokenizer->add_bos(); }
int32_t Engine::bos_token() const { return impl_->tokenizer->bos(); }
int32_t Engine::eos_token() const { return impl_->tokenizer->eos(); }
bool Engine::is_eog(int32_t token) const { return impl_->tokenizer->is_eog(token); }
std::string Engine::chat_template() const { return impl_->model->file().get_string(gguf::keys::kChatTemplate, ""); }
std::string Engine::token_text(int32_t token) const { return impl_->tokenizer->token_piece(token); }

uint64_t Engine::fingerprint() const { return impl_->fingerprint; }
bool Engine::has_prefix_cache() const { return impl_->prefix_cache != nullptr; }
PrefixCacheStats Engine::prefix_cache_stats() const {
    PrefixCacheStats s;
    if (!impl_->prefix_cache) return s;
    const PrefixCacheCounters c = impl_->prefix_cache->counters();
    s.hits_memory = c.hits_memory, s.hits_disk = c.hits_disk, s.misses = c.misses, s.stores = c.stores;
    s.evictions = c.evictions, s.disk_evictions = c.disk_evictions, s.dropped_corrupt = c.dropped_corrupt;
    s.memory_entries = c.memory_entries, s.memory_bytes = c.memory_bytes;
    return s;
}

namespace {
constexpr std::pair<KvCacheType, const char*> kKvNames[] = {
    {KvCacheType::kF32, "f32"},   {KvCacheType::kF16, "f16"},    {KvCacheType::kBF16, "bf16"},
    {KvCacheType::kQ8_0, "q8_0"}, {KvCacheType::kQ4_0, "q4_0"},  {KvCacheType::kTq4, "tq4"},
    {KvCacheType::kTq3, "tq3"},   {KvCacheType::kKivi4, "kivi4"}};
}  // namespace

const char* kv_cache_type_name(KvCacheType t) {
    for (const auto& [k, n] : kKvNames)
        if (k == t) return n;
    return "unknown";
}

KvCacheType parse_kv_cache_type(const std::string& name) {
    for (const auto& [k, n] : kKvNames)
        if (name == n) return k;
    throw_error(ErrorCode::kInvalidArgument,
                "KV cache type '%s': expected f32, f16, bf16, q8_0, q4_0, tq4, tq3 or kivi4", name.c_str());
}

}  // namespace cera
