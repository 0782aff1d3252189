// The requantizer: plan every tensor's type, then stream the tensors through the GGUF
// writer in llama-quantize's order, each converted row by row on a thread pool
// (dequantize to f32, quantize with the reference quantizer). Rows are independent, so
// the bytes do not depend on the thread count. The quantizers (the scale searches of
// the K-quants) dominate the time; copying and disk come after.
#include "quantize/quantize.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "core/check.h"
#include "core/quant/quant.h"
#include "core/threadpool.h"
#include "gguf/keys.h"
#include "gguf/writer.h"
#include "quantize/imatrix.h"

namespace cera::quantize {
namespace {

// Keys llama-quantize drops: a split file's bookkeeping does not describe the single file written.
bool dropped_key(const std::string& key) {
    return key == gguf::keys::kFileType || key == gguf::keys::kQuantVersion || key == "split.no" ||
           key == "split.count" || key == "split.tensors.count";
}

constexpr uint32_t kQuantizationVersion = 2;  // GGML_QNT_VERSION: the block layouts of src/core/quant

// Converts rows [begin, end) of a tensor from one type to another through f32, under the importance
// matrix qw ([experts * ne[0]]: row r takes expert r / ne[1]'s part) when it is given.
void convert_rows(const gguf::TensorInfo& t, GgmlType to, const float* qw, uint8_t* dst, int64_t begin, int64_t end,
                  std::vector<float>& row) {
    const int64_t ne0 = t.ne[0];
    const size_t in_bytes = row_size(t.type, ne0), out_bytes = row_size(to, ne0);
    row.resize(size_t(ne0));
    for (int64_t r = begin; r < end; ++r) {
        const uint8_t* src = t.data + size_t(r) * in_bytes;
        uint8_t* out = dst + size_t(r) * out_bytes;
        const float* w = qw ? qw + (r / t.ne[1]) * ne0 : nullptr;
        const float* x = reinterpret_cast<const float*>(src);
        if (t.type != GgmlType::kF32) {
            dequantize_row_ref(t.type, src, row.data(), ne0);
            x = row.data();
        }
        quantize_row_imatrix(to, x, out, ne0, w);
    }
}

}  // namespace

ModelFacts model_facts(const gguf::File& f) {
    ModelFacts m;
    m.arch = f.architecture();
    auto k = [&](const char* suffix) { return gguf::keys::arch_key(m.arch, suffix); };
    m.n_layer = f.get_i64(k("block_count"), 0);
    m.n_expert = f.get_i64(k("expert_count"), 0);
    if (m.n_expert <= 1) m.n_expert = 0;
    // Head counts are a scalar or one per layer; layer 0's decide.
    auto first = [&](const char* suffix) -> int64_t {
        const gguf::Value* v = f.find(k(suffix));
        if (!v) return 0;
        if (v->is_integer()) return v->as_int();
        if (v->type != gguf::ValueType::kArray) return 0;
        const auto& a = v->as_array();
        return a.items.empty() || !a.items[0].is_integer() ? 0 : a.items[0].as_int();
    };
    if (const int64_t h = first("attention.head_count"), hkv = first("attention.head_count_kv"); hkv > 0)
        m.n_gqa = h / hkv;
    if (m.n_layer == 80 && (m.arch == "llama" || m.arch == "qwen2")) {
        // Per-layer head counts (arrays) do not occur in these architectures; a scalar is read.
        const gguf::Value* h = f.find(k("attention.head_count"));
        const gguf::Value* hkv = f.find(k("attention.head_count_kv"));
        const bool grouped = h && hkv && h->is_integer() && hkv->is_integer() && h->as_int() != hkv->as_int();
        m.is_70b = m.arch == "qwen2" || grouped;
    }
    return m;
}

std::vector<GgmlType> plan_types(const gguf::File& f, const QuantizeOptions& o) {
    std::vector<TensorDesc> descs;
    descs.reserve(f.tensors().size());
    for (const auto& t : f.tensors()) descs.push_back({t.name, t.ne, t.type});
    MixtureOptions mo;
    mo.file_type = o.file_type;
    mo.has_imatrix = !o.imatrix.empty();
    std::vector<GgmlType> types = choose_types(mo, model_facts(f), descs);
    for (const std::string& name : o.keep) {
        auto it = std::find_if(descs.begin(), descs.end(), [&](const TensorDesc& d) { return d.name == name; });
        if (it == descs.end())
            throw_error(ErrorCode::kInvalidArgument, "--keep: %s has no tensor named '%s'", f.path().c_str(),
                        name.c_str());
        types[size_t(it - descs.begin())] = it->type;
    }
    for (size_t i = 0; i < descs.size(); ++i) {
        const TensorDesc& d = descs[i];
        if (types[i] == d.type) continue;
        if (!can_dequantize(d.type))
            throw_error(ErrorCode::kUnsupported,
                        "tensor '%s' has type %s, which cera cannot read (keep it with --keep)", d.name.c_str(),
                        type_name(d.type));
        if (!can_quantize(types[i]))
            throw_error(ErrorCode::kUnsupported, "tensor '%s': cera has no quantizer for %s", d.name.c_str(),
                        type_name(types[i]));
    }
    return types;
}

QuantizeSummary quantize_model(const QuantizeOptions& o) {
    auto f = gguf::File::open(o.input);
    const std::vector<GgmlType> types = plan_types(*f, o);
    Imatrix im;
    std::unordered_map<std::string, std::vector<float>> importance_of;  // by tensor name
    if (!o.imatrix.empty()) {
        im = read_imatrix(o.imatrix);
        for (const auto& [name, e] : im.entries) importance_of.emplace(name, importance(e));
    }

    gguf::Writer w;
    for (const auto& [key, v] : f->metadata())
        if (!dropped_key(key)) w.set(key, v);
    // llama-quantize writes these two last, after every copied key.
    w.set_u32(gguf::keys::kQuantVersion, kQuantizationVersion);
    w.set_u32(gguf::keys::kFileType, uint32_t(o.file_type));
    if (!o.imatrix.empty()) {  // llama-quantize's record of the importance matrix (a 127-byte field there)
        w.set_string("quantize.imatrix.file", o.imatrix.substr(0, 127));
        if (!im.datasets.empty()) w.set_string("quantize.imatrix.dataset", im.datasets[0].substr(0, 127));
        w.set_u32("quantize.imatrix.entries_count", uint32_t(im.entries.size()));
        if (im.chunk_count > 0) w.set_u32("quantize.imatrix.chunks_count", im.chunk_count);
    }

    const int n_threads = o.n_threads > 0 ? o.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    ThreadPool pool(n_threads);
    std::vector<std::vector<float>> rows(static_cast<size_t>(n_threads));  // one f32 row per thread

    QuantizeSummary s;
    const auto& tensors = f->tensors();
    std::vector<std::string> names;
    for (const auto& t : tensors) names.push_back(t.name);
    for (size_t i : quantize_order(names)) {
        const gguf::TensorInfo& t = tensors[i];
        const GgmlType to = types[i];
        ++s.n_tensors;
        ++s.types[to];
        s.bytes_in += t.n_bytes;
        if (to == t.type) {
            s.bytes_out += t.n_bytes;
            // Copied at write time, so a large kept tensor is never held in memory twice.
            w.add_tensor(t.name, to, t.ne, [&t](uint8_t* dst, size_t n) { std::memcpy(dst, t.data, n); });
            continue;
        }
        ++s.n_converted;
        s.bytes_out += uint64_t(t.rows()) * row_size(to, t.ne[0]);
        const float* qw = nullptr;
        if (!importance_of.empty()) {
            auto it = importance_of.find(t.name);
            const int64_t want = t.ne[0] * (t.ne.size() > 2 ? t.ne[2] : 1);
            if (it == importance_of.end()) {
                if (takes_imatrix(to)) s.no_imatrix.push_back(t.name);
            } else if (int64_t(it->second.size()) == want) {
                qw = it->second.data();
                if (takes_imatrix(to)) ++s.n_imatrix;
            } else if (t.name != "token_embd.weight") {  // llama-quantize lets the embedding go without
                throw_error(ErrorCode::kInvalidArgument, "%s: the entry for %s has %zu values, the tensor needs %lld",
                            o.imatrix.c_str(), t.name.c_str(), it->second.size(), (long long)want);
            }
        }
        w.add_tensor(t.name, to, t.ne, [&pool, &rows, &t, to, qw](uint8_t* dst, size_t) {
            pool.parallel_for(
                t.rows(),
                [&](int64_t begin, int64_t end, int thread) {
                    convert_rows(t, to, qw, dst, begin, end, rows[size_t(thread)]);
                },
                std::max<int64_t>(1, 4096 / t.ne[0]));
        });
    }
    w.write(o.output, o.on_progress);
    return s;
}

}  // namespace cera::quantize
