// LoRA adapters: the GGUF reader, the checks against the base model, the device cache, and the
// projection that adds the deltas (Step::linear). The PEFT reader is lora_peft.cpp.
#include "models/lora.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <functional>
#include <regex>

#include "core/check.h"
#include "core/fp16.h"
#include "core/quant/quant.h"
#include "gguf/gguf.h"
#include "models/arch.h"
#include "models/lora_read.h"

namespace cera {
namespace {

std::atomic<uint64_t> g_lora_id{1};

std::string ne_list(const std::vector<int64_t>& ne) {
    std::string s = "{";
    for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
    return s + "}";
}

bool is_directory(const std::string& path) {
    struct stat st{};
    return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// A GGUF tensor's values as f32 (F32, F16, BF16 and the quantized types the reference dequantizes).
std::vector<float> tensor_f32(const gguf::TensorInfo& ti, const std::string& path) {
    if (!can_dequantize(ti.type))
        throw_error(ErrorCode::kUnsupported, "%s: tensor %s has type %s, which this build cannot read", path.c_str(),
                    ti.name.c_str(), type_name(ti.type));
    std::vector<float> out(size_t(ti.n_elements()));
    const int64_t n0 = ti.ne.empty() ? 1 : ti.ne[0];
    const size_t rb = row_size(ti.type, n0);
    for (int64_t r = 0; r < ti.rows(); ++r) dequantize_row_ref(ti.type, ti.data + size_t(r) * rb, out.data() + r * n0, n0);
    return out;
}

// llama.cpp's GGUF LoRA: general.type = adapter, adapter.type = lora, adapter.lora.alpha, and for each
// adapted weight W the pair W.lora_a (ne {k, r}) and W.lora_b (ne {r, n_out}); for stacked MoE experts
// ne {k, r, n_expert} and {r, n_out, n_expert}.
LoraRead read_gguf_lora(const std::string& path) {
    auto f = gguf::File::open(path);
    const std::string type = f->get_string("general.type", "");
    if (type != "adapter")
        throw_error(ErrorCode::kInvalidFile, "%s: general.type is '%s', expected 'adapter' (a LoRA GGUF)", path.c_str(),
                    type.c_str());
    const std::string atype = f->get_string("adapter.type", "");
    if (atype != "lora")
        throw_error(ErrorCode::kUnsupported, "%s: adapter.type is '%s', only 'lora' is supported", path.c_str(),
                    atype.c_str());
    LoraRead out;
    out.arch = f->architecture();
    const float alpha = f->get_f32("adapter.lora.alpha", 0.0f);
    for (const gguf::TensorInfo& ti : f->tensors()) {
        const std::string& n = ti.name;
        if (n.size() < 7 || n.compare(n.size() - 7, 7, ".lora_a") != 0) {
            if (n.size() < 7 || n.compare(n.size() - 7, 7, ".lora_b") != 0)
                throw_error(ErrorCode::kInvalidFile, "%s: tensor %s is neither a .lora_a nor a .lora_b", path.c_str(),
                            n.c_str());
            continue;
        }
        const std::string target = n.substr(0, n.size() - 7);
        const gguf::TensorInfo* tb = f->find_tensor(target + ".lora_b");
        if (!tb) throw_error(ErrorCode::kMissing, "%s: %s has no %s.lora_b", path.c_str(), n.c_str(), target.c_str());
        const size_t dims = ti.ne.size();
        if ((dims != 2 && dims != 3) || tb->ne.size() != dims || ti.ne[1] != tb->ne[0] ||
            (dims == 3 && ti.ne[2] != tb->ne[2]))
            throw_error(ErrorCode::kInvalidFile, "%s: %s.lora_a has ne %s and .lora_b ne %s: not a rank-r pair",
                        path.c_str(), target.c_str(), ne_list(ti.ne).c_str(), ne_list(tb->ne).c_str());
        LoraTensor t;
        t.target = target;
        t.k = ti.ne[0];
        t.r = ti.ne[1];
        t.n_out = tb->ne[1];
        t.n_expert = dims == 3 ? ti.ne[2] : 1;
        // llama.cpp scales by alpha / r, or by 1 when the file gives no alpha.
        t.factor = alpha != 0.0f ? alpha / float(t.r) : 1.0f;
        t.a = tensor_f32(ti, path);
        t.b = tensor_f32(*tb, path);
        out.tensors.push_back(std::move(t));
    }
    if (out.tensors.empty()) throw_error(ErrorCode::kInvalidFile, "%s: no .lora_a / .lora_b tensors", path.c_str());
    return out;
}

}  // namespace

LoraAdapter::~LoraAdapter() {
    if (auto c = cache_.lock()) c->forget(id_);
}

int64_t LoraAdapter::max_rank() const {
    int64_t r = 0;
    for (const LoraTensor& t : tensors_) r = std::max(r, t.r);
    return r;
}

size_t LoraAdapter::bytes() const {
    size_t n = 0;
    for (const LoraTensor& t : tensors_) n += (t.a.size() + t.b.size()) * sizeof(float);
    return n;
}

LoraHeads lora_heads(const gguf::File& f, const std::string& arch) {
    LoraHeads heads;
    heads.n_head = f.get_i64(arch + ".attention.head_count", 0);
    if (const gguf::Value* v = f.find(arch + ".attention.head_count_kv"); v && v->is_integer())
        heads.n_head_kv = v->as_int();
    else
        heads.n_head_kv = heads.n_head;
    heads.n_expert = f.get_i64(arch + ".expert_count", 0);
    return heads;
}

namespace {

// Reads the adapter at `path` for a model of architecture `arch` whose file is `f`, and checks every pair
// against the base weight `shape_of` gives (nullptr: the model has no such weight). The pairs come back
// sorted by target.
std::vector<LoraTensor> read_checked(const std::string& path, const gguf::File& f, const std::string& arch,
                                     const std::function<const int64_t*(const std::string&)>& shape_of) {
    const LoraHeads heads = lora_heads(f, arch);
    LoraRead rd = is_directory(path) ? read_peft_lora(path, arch, heads) : read_gguf_lora(path);
    if (!rd.arch.empty() && rd.arch != arch)
        throw_error(ErrorCode::kInvalidFile, "%s: an adapter for architecture '%s', the model is '%s'", path.c_str(),
                    rd.arch.c_str(), arch.c_str());
    static const std::regex kTargets(
        "blk\\.[0-9]+\\.(attn_q|attn_k|attn_v|attn_output|shortconv\\.in_proj|shortconv\\.out_proj|ffn_gate|ffn_up|"
        "ffn_down|ffn_gate_exps|ffn_up_exps|ffn_down_exps)\\.weight");
    for (LoraTensor& t : rd.tensors) {
        if (!std::regex_match(t.target, kTargets))
            throw_error(ErrorCode::kUnsupported, "%s: LoRA on %s is not supported (only the layers' projections)",
                        path.c_str(), t.target.c_str());
        const int64_t* ne = shape_of(t.target);
        if (!ne)
            throw_error(ErrorCode::kInvalidFile, "%s: LoRA tensor %s adapts %s, which the model does not have",
                        path.c_str(), (t.target + ".lora_a").c_str(), t.target.c_str());
        const int64_t k = ne[0], n_out = ne[1], n_expert = ne[2];
        if (ne[3] != 1)
            throw_error(ErrorCode::kUnsupported, "%s: LoRA on %s (a 4-d weight) is not supported", path.c_str(),
                        t.target.c_str());
        // A pair's shapes as a file holds them: {k, r}, or {k, r, n_expert} for stacked experts.
        auto dims = [](const std::string& a, const std::string& b, int64_t e) {
            return "{" + a + ", " + b + (e == 1 ? "" : ", " + std::to_string(e)) + "}";
        };
        auto num = [](int64_t v) { return std::to_string(v); };
        const std::string base = dims(num(k), num(n_out), n_expert);
        if (t.k != k || t.n_expert != n_expert)
            throw_error(ErrorCode::kInvalidFile,
                        "%s: LoRA tensor %s.lora_a has ne %s, the base %s has ne %s (needs %s)", path.c_str(),
                        t.target.c_str(), dims(num(t.k), num(t.r), t.n_expert).c_str(), t.target.c_str(), base.c_str(),
                        dims(num(k), "r", n_expert).c_str());
        if (t.n_out != n_out)
            throw_error(ErrorCode::kInvalidFile,
                        "%s: LoRA tensor %s.lora_b has ne %s, the base %s has ne %s (needs %s)", path.c_str(),
                        t.target.c_str(), dims(num(t.r), num(t.n_out), t.n_expert).c_str(), t.target.c_str(),
                        base.c_str(), dims("r", num(n_out), n_expert).c_str());
        if (t.r < 1 || !std::isfinite(t.factor))
            throw_error(ErrorCode::kInvalidFile, "%s: LoRA tensor %s has rank %" PRId64 " and scale %g", path.c_str(),
                        t.target.c_str(), t.r, double(t.factor));
    }
    // One pair per target: two would add up silently.
    std::sort(rd.tensors.begin(), rd.tensors.end(), [](const LoraTensor& a, const LoraTensor& b) { return a.target < b.target; });
    for (size_t i = 1; i < rd.tensors.size(); ++i)
        if (rd.tensors[i].target == rd.tensors[i - 1].target)
            throw_error(ErrorCode::kInvalidFile, "%s: %s is adapted twice", path.c_str(), rd.tensors[i].target.c_str());
    return std::move(rd.tensors);
}

}  // namespace

std::shared_ptr<LoraAdapter> load_lora(const std::string& path, const Model& model) {
    const LoraCache& cache = model.lora_cache();
    std::shared_ptr<LoraAdapter> a(new LoraAdapter());
    a->tensors_ = read_checked(path, model.file(), model.arch().info.arch, [&](const std::string& name) {
        const Tensor* w = cache.weight(name);
        return w ? w->ne : nullptr;
    });
    a->path_ = path;
    a->id_ = g_lora_id.fetch_add(1);
    a->cache_ = model.lora_cache_ptr();
    return a;
}

std::vector<LoraTensor> read_lora(const std::string& path, const gguf::File& base) {
    std::array<int64_t, 4> ne{};
    return read_checked(path, base, base.architecture(), [&](const std::string& name) -> const int64_t* {
        const gguf::TensorInfo* t = base.find_tensor(name);
        if (!t || t->ne.empty() || t->ne.size() > 4) return nullptr;
        ne = {1, 1, 1, 1};
        for (size_t i = 0; i < t->ne.size(); ++i) ne[i] = t->ne[i];
        return ne.data();
    });
}

uint64_t lora_set_key(const LoraSet& set) {
    uint64_t h = 0;
    for (const LoraChoice& c : set) {
        uint32_t bits = 0;
        std::memcpy(&bits, &c.scale, sizeof bits);
        for (uint64_t v : {c.adapter ? c.adapter->id() : 0, uint64_t(bits)}) {
            h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
            h *= 0xff51afd7ed558ccdull;
        }
    }
    return set.empty() ? 0 : (h | 1);
}

uint64_t lora_rows_key(std::span<const LoraRows> rows, std::span<const LoraRows> out_rows) {
    if (rows.empty() && out_rows.empty()) return 0;
    uint64_t h = 0x6c6f7261;
    auto mix = [&h](uint64_t v) {
        h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
    };
    for (std::span<const LoraRows> list : {rows, out_rows}) {
        mix(list.size());
        for (const LoraRows& g : list) {
            uint32_t bits = 0;
            std::memcpy(&bits, &g.scale, sizeof bits);
            mix(reinterpret_cast<uintptr_t>(g.adapter));
            mix(bits);
            mix(uint64_t(g.start));
            mix(uint64_t(g.n));
        }
    }
    return h | 1;
}

// ---------------------------------------------------------------- the device cache

LoraCache::LoraCache(Backend& be, std::unordered_map<std::string, Tensor> weights, size_t cap_bytes, GgmlType type)
    : be_(be), weights_(std::move(weights)), cap_(cap_bytes), type_(type) {
    CERA_CHECK(type == GgmlType::kF32 || type == GgmlType::kF16, "LoRA weights are stored as F32 or F16");
}

LoraCache::~LoraCache() = default;  // the backend frees its buffers with itself

const Tensor* LoraCache::weight(const std::string& name) const {
    auto it = weights_.find(name);
    return it == weights_.end() ? nullptr : &it->second;
}

void LoraCache::begin_step() {
    std::lock_guard<std::mutex> lk(mu_);
    ++clock_;
}

void LoraCache::forget(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    dead_.push_back(id);
}

size_t LoraCache::device_bytes() const {
    std::lock_guard<std::mutex> lk(mu_);
    return bytes_;
}

size_t LoraCache::n_resident() const {
    std::lock_guard<std::mutex> lk(mu_);
    return resident_.size();
}

void LoraCache::free_entry(LoraResident& r) {
    for (auto& [w, p] : r.by_weight) {
        be_.free(p.a);
        be_.free(p.bt);
    }
    bytes_ -= r.bytes;
    r.by_weight.clear();
}

const LoraResident& LoraCache::resident(const LoraAdapter& a) {
    std::lock_guard<std::mutex> lk(mu_);
    for (uint64_t id : dead_)
        if (auto it = resident_.find(id); it != resident_.end()) {
            free_entry(it->second);
            resident_.erase(it);
        }
    dead_.clear();
    if (auto it = resident_.find(a.id()); it != resident_.end()) {
        it->second.last_use = clock_;
        return it->second;
    }
    const size_t need = type_ == GgmlType::kF16 ? a.bytes() / 2 : a.bytes();
    while (cap_ > 0 && bytes_ + need > cap_) {
        // The least recently used adapter that this step does not use goes.
        auto victim = resident_.end();
        for (auto it = resident_.begin(); it != resident_.end(); ++it)
            if (it->second.last_use < clock_ && (victim == resident_.end() || it->second.last_use < victim->second.last_use))
                victim = it;
        if (victim == resident_.end()) break;  // everything resident is in this step: the cap gives way
        free_entry(victim->second);
        resident_.erase(victim);
    }
    LoraResident& r = resident_[a.id()];
    for (const LoraTensor& t : a.tensors()) {
        const Tensor* w = weight(t.target);
        CERA_CHECK(w, "LoRA target %s vanished", t.target.c_str());
        LoraPair p;
        p.a = be_.alloc(type_, {t.k, t.r, t.n_expert});
        if (type_ == GgmlType::kF32) {
            be_.write(p.a, t.a.data(), t.a.size() * sizeof(float));
        } else {
            std::vector<uint16_t> h(t.a.size());
            for (size_t i = 0; i < h.size(); ++i) h[i] = fp32_to_fp16(t.a[i]);
            be_.write(p.a, h.data(), h.size() * sizeof(uint16_t));
        }
        std::vector<float> bt(t.b.size());  // B [n_out, r] -> Bᵀ [r, n_out], expert by expert
        const size_t per_expert = size_t(t.n_out * t.r);
        for (int64_t e = 0; e < t.n_expert; ++e)
            for (int64_t o = 0; o < t.n_out; ++o)
                for (int64_t j = 0; j < t.r; ++j)
                    bt[e * per_expert + size_t(j * t.n_out + o)] = t.b[e * per_expert + size_t(o * t.r + j)];
        p.bt = be_.alloc(type_, {t.n_out, t.r, t.n_expert});
        if (type_ == GgmlType::kF32) {
            be_.write(p.bt, bt.data(), bt.size() * sizeof(float));
        } else {
            std::vector<uint16_t> h(bt.size());
            for (size_t i = 0; i < h.size(); ++i) h[i] = fp32_to_fp16(bt[i]);
            be_.write(p.bt, h.data(), h.size() * sizeof(uint16_t));
        }
        p.factor = t.factor;
        r.by_weight[w->data] = p;
    }
    r.bytes = need;
    r.last_use = clock_;
    bytes_ += need;
    return r;
}

// ---------------------------------------------------------------- applying

void Step::linear(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) const {
    be->matmul(w, x, bias, out);
    if (lora.empty()) return;
    lora_segs->clear();
    for (const LoraRows& g : lora) {
        auto it = g.adapter->by_weight.find(w.data);
        if (it == g.adapter->by_weight.end() || g.n == 0) continue;
        LoraSegment sg;
        sg.start = g.start;
        sg.n = g.n;
        sg.a = it->second.a;
        sg.bt = it->second.bt;
        sg.scale = g.scale * it->second.factor;
        lora_segs->push_back(sg);
    }
    if (!lora_segs->empty()) be->lora_segments(x, *lora_segs, out);
}

void Step::experts(const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps, const Tensor& x,
                   const Tensor& ids, const Tensor& weights, const Tensor& out) const {
    std::vector<MoeLoraSegment> segs;
    for (const LoraRows& g : lora) {
        if (g.n == 0) continue;
        MoeLoraSegment sg;
        bool adapted = false;
        int p = 0;
        for (const Tensor* w : {&gate_exps, &up_exps, &down_exps}) {
            if (auto it = g.adapter->by_weight.find(w->data); it != g.adapter->by_weight.end()) {
                sg.a[p] = it->second.a;
                sg.bt[p] = it->second.bt;
                sg.scale[p] = g.scale * it->second.factor;
                adapted = true;
            }
            ++p;
        }
        if (!adapted) continue;
        sg.start = g.start;
        sg.n = g.n;
        segs.push_back(sg);
    }
    if (segs.empty())
        be->moe_ffn(x, gate_exps, up_exps, down_exps, ids, weights, out);
    else
        be->moe_ffn_lora(x, gate_exps, up_exps, down_exps, ids, weights, segs, out);
}

}  // namespace cera
