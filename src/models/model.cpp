// Loading: the architecture registry, the common head tensors, load_model.
#include "models/model.h"

#include <algorithm>
#include <cinttypes>

#include "core/check.h"
#include "core/cpu_features.h"
#include "core/rotation.h"
#include "gguf/gguf.h"
#include "models/arch.h"

namespace cera {

// One factory per architecture file.
std::unique_ptr<Architecture> make_lfm2(LoadContext& ctx);
std::unique_ptr<Architecture> make_lfm2moe(LoadContext& ctx);
std::unique_ptr<Architecture> make_llama(LoadContext& ctx);
std::unique_ptr<Architecture> make_qwen2(LoadContext& ctx);
std::unique_ptr<Architecture> make_qwen3(LoadContext& ctx);
std::unique_ptr<Architecture> make_granite(LoadContext& ctx);

namespace {

struct ArchEntry {
    const char* name;  // general.architecture
    ArchFactory make;
};

constexpr ArchEntry kArchitectures[] = {
    {"lfm2", make_lfm2},   {"lfm2moe", make_lfm2moe}, {"llama", make_llama},
    {"qwen2", make_qwen2}, {"qwen3", make_qwen3},     {"granite", make_granite},
};

}  // namespace

ArchFactory find_architecture(const std::string& arch) {
    for (const ArchEntry& e : kArchitectures)
        if (arch == e.name) return e.make;
    return nullptr;
}

std::vector<std::string> supported_architectures() {
    std::vector<std::string> out;
    for (const ArchEntry& e : kArchitectures) out.emplace_back(e.name);
    return out;
}

void load_common(LoadContext& ctx, Architecture& a, int64_t n_embd, int64_t n_layer, const std::string& norm_name,
                 float norm_eps) {
    const gguf::TensorInfo* te = ctx.file.find_tensor("token_embd.weight");
    if (!te)
        throw_error(ErrorCode::kMissing, "missing tensor token_embd.weight (expected ne {%" PRId64 ", n_vocab})",
                    n_embd);
    const int64_t n_vocab = te->ne.size() >= 2 ? te->ne[1] : 1;
    if (ctx.hp.has("vocab_size")) {
        const int64_t v = ctx.hp.u32("vocab_size");
        if (v != n_vocab)
            throw_error(ErrorCode::kInvalidFile, "%s = %" PRId64 " but token_embd.weight has %" PRId64 " rows",
                        ctx.hp.key("vocab_size").c_str(), v, n_vocab);
    }
    a.head.token_embd = ctx.wl.matrix("token_embd.weight", {n_embd, n_vocab});
    const Shard& sh = ctx.wl.shard();
    if (sh.split() > 1) {  // a tensor-parallel rank computes its rows of the vocabulary
        const bool tied = !ctx.file.find_tensor("output.weight");
        a.head.output = ctx.wl.matrix(tied ? "token_embd.weight" : "output.weight", {n_embd, n_vocab}, Split::kVocab);
        a.head.vocab_begin = sh.begin(n_vocab);
    } else {
        a.head.output = ctx.wl.matrix_optional("output.weight", {n_embd, n_vocab});
        if (!a.head.output) a.head.output = a.head.token_embd;
    }
    a.head.output_norm = ctx.wl.f32(norm_name, {n_embd});
    a.head.norm_eps = norm_eps;
    a.info.arch = ctx.hp.arch();
    a.info.name = ctx.file.get_string("general.name", "");
    a.info.n_vocab = n_vocab;
    a.info.n_embd = n_embd;
    a.info.n_layer = n_layer;
    a.info.n_ctx_train = ctx.hp.u32("context_length");
}

Model::~Model() = default;

const std::string& Model::weight_name(const Tensor& w) const {
    static const std::string kNone;
    auto it = weight_names_.find(w.data);
    return it == weight_names_.end() ? kNone : it->second;
}

// One rank's model: the backend, the architecture over its share of the weights.
std::unique_ptr<Model> load_rank(const std::string& path, const ModelOptions& opts, Shard shard);

std::unique_ptr<Model> load_model(const std::string& path, const ModelOptions& opts) {
    for (GgmlType t : {opts.kv_type_k, opts.kv_type_v}) {
        if (t != GgmlType::kF32 && t != GgmlType::kF16 && t != GgmlType::kBF16 && t != GgmlType::kQ8_0 &&
            t != GgmlType::kQ4_0 && t != GgmlType::kQ3_KV && t != GgmlType::kQ4_KV && t != GgmlType::kQ4_CH)
            throw_error(ErrorCode::kInvalidArgument,
                        "KV cache type %s: expected F32, F16, BF16, Q8_0, Q4_0, Q3_KV, Q4_KV or (keys) Q4_CH",
                        type_name(t));
        if ((t == GgmlType::kQ4_CH || t == GgmlType::kQ4_KV) && opts.device != DeviceKind::kCpu)
            throw_error(ErrorCode::kUnsupported, "KV cache type kivi4 (%s): the CPU runs it, not %s", type_name(t),
                        device_kind_name(opts.device));
    }
    if (opts.kv_type_v == GgmlType::kQ4_CH)
        throw_error(ErrorCode::kInvalidArgument, "KV cache type Q4_CH holds keys only (kivi4 keeps values in Q4_KV)");
    if (opts.n_batch < 1) throw_error(ErrorCode::kInvalidArgument, "n_batch = %d: must be at least 1", opts.n_batch);
    if (opts.n_ctx < 0) throw_error(ErrorCode::kInvalidArgument, "n_ctx = %d: must not be negative", opts.n_ctx);
    const int world = opts.tensor_parallel;
    if (world < 1 || world > 64)
        throw_error(ErrorCode::kInvalidArgument, "tensor_parallel = %d: expected 1 to 64 ranks", world);
    if (world == 1) return load_rank(path, opts, Shard{});
    if (opts.observer) throw_error(ErrorCode::kUnsupported, "tensor parallel: a matmul observer sees one rank only");
    // One CPU backend a rank, the threads shared out; one CUDA backend a rank, on its device.
    ModelOptions ro = opts;
    ro.n_threads = std::max(1, (opts.n_threads > 0 ? opts.n_threads : cpu_features().physical_cores) / world);
    std::vector<int> gpus = opts.gpu_ranks;
    if (opts.device == DeviceKind::kCuda) {
        if (gpus.empty())
            for (int r = 0; r < world; ++r) gpus.push_back(opts.gpu_index + r);
        if (int(gpus.size()) != world)
            throw_error(ErrorCode::kInvalidArgument, "tensor parallel: %zu devices for %d ranks", gpus.size(), world);
        // Ranks that share a device meet on the host inside their steps, which a graph cannot hold.
        if (std::count(gpus.begin(), gpus.end(), gpus[0]) > 1) ro.cuda.graphs = false;
    }
    auto load_ranks = [&](bool pipeline) {
        ModelOptions first = ro;
        if (!gpus.empty()) first.gpu_index = gpus[0];
        std::unique_ptr<Model> m = load_rank(path, first, Shard{0, world, pipeline});
        m->opts_ = opts;
        if (pipeline && m->info_.n_layer < world)
            throw_error(ErrorCode::kUnsupported, "pipeline parallel: %d ranks for %lld layers", world,
                        (long long)m->info_.n_layer);
        ModelOptions rest = ro;
        rest.on_load_progress = nullptr;
        std::vector<Backend*> backends{m->backend_.get()};
        for (int r = 1; r < world; ++r) {
            if (!gpus.empty()) rest.gpu_index = gpus[size_t(r)];
            m->ranks_.push_back(load_rank(path, rest, Shard{r, world, pipeline}));
            backends.push_back(m->ranks_.back()->backend_.get());
        }
        m->comm_ = make_communicator(backends);
        m->pipeline_ = pipeline;
        for (int r = 1; r < world; ++r) {
            Model& rm = *m->ranks_[size_t(r - 1)];
            rm.rank_ = r, rm.comm_ = m->comm_, rm.pipeline_ = pipeline;
        }
        return m;
    };
    // A shape whose heads, channels or columns do not divide among the ranks runs as pipeline stages of
    // whole layers instead.
    try {
        return load_ranks(false);
    } catch (const SplitError&) {
    }
    return load_ranks(true);
}

std::unique_ptr<Model> load_rank(const std::string& path, const ModelOptions& opts, Shard shard) {
    std::unique_ptr<Model> m(new Model());
    m->opts_ = opts;
    m->file_ = gguf::File::open(path);
    const std::string arch = m->file_->architecture();
    if (arch.empty()) throw_error(ErrorCode::kMissing, "%s: missing key general.architecture", path.c_str());
    const ArchFactory make = find_architecture(arch);
    if (!make) {
        std::string known;
        for (const std::string& a : supported_architectures()) known += (known.empty() ? "" : ", ") + a;
        throw_error(ErrorCode::kUnsupported, "%s: unknown architecture '%s' (supported: %s)", path.c_str(),
                    arch.c_str(), known.c_str());
    }
    BackendOptions bo;
    bo.device = opts.device;
    bo.n_threads = opts.n_threads;
    bo.gpu_index = opts.gpu_index;
    bo.cuda = opts.cuda;
    bo.observer = opts.observer;
    m->backend_ = create_backend(bo);
    LoadContext ctx{*m->file_, *m->backend_, HParams(*m->file_, arch),
                    WeightLoader(*m->file_, *m->backend_, opts.on_load_progress, shard)};
    m->arch_ = make(ctx);
    m->owned_ = ctx.wl.take_owned();
    if (opts.on_load_progress) {  // tensors the model does not use count as done
        uint64_t total = 0;
        for (const auto& t : m->file_->tensors()) total += t.n_bytes;
        opts.on_load_progress(total, total);
    }
    m->lora_ = std::make_shared<LoraCache>(*m->backend_, ctx.wl.matrices(), opts.lora_cache_bytes, opts.lora_type);
    m->weight_names_ = ctx.wl.weight_names();
    m->info_ = m->arch_->info;
    // The rotation runs over whole heads of a power of two.
    if (opts.kv_rotate_k || opts.kv_rotate_v)
        for (const LayerStateSpec& sp : m->arch_->state)
            if (sp.kv_width > 0 && !rotation_fits(sp.head_dim))
                throw_error(ErrorCode::kUnsupported,
                            "rotated KV caches (tq4, tq3) need heads of a power of two up to 1024, this model's are %lld",
                            (long long)sp.head_dim);
    // Block types hold 32 elements of a token's row; on CUDA every head starts a block.
    for (GgmlType t : {opts.kv_type_k, opts.kv_type_v}) {
        const int64_t block = type_info(t).block_size;
        if (block <= 1) continue;
        for (const LayerStateSpec& sp : m->arch_->state) {
            if (sp.kv_width == 0) continue;
            if (opts.device == DeviceKind::kCuda && sp.head_dim % block != 0)
                throw_error(ErrorCode::kUnsupported,
                            "KV cache type %s on CUDA needs heads of a multiple of %lld, this model's are %lld",
                            type_name(t), (long long)block, (long long)sp.head_dim);
            if (sp.kv_width % block != 0)
                throw_error(ErrorCode::kUnsupported,
                            "KV cache type %s needs rows of K and V of a multiple of %lld, this model's are %lld",
                            type_name(t), (long long)block, (long long)sp.kv_width);
        }
    }
    return m;
}

}  // namespace cera
