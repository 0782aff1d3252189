// The merge: each adapted weight is rewritten row by row on a thread pool (dequantize, add the rows of
// s·B·A, quantize), the other tensors are copied at write time. Rows are independent, so the bytes do not
// depend on the thread count.
#include "quantize/lora_merge.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "core/check.h"
#include "core/quant/quant.h"
#include "core/threadpool.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "models/lora.h"

namespace cera::quantize {
namespace {

struct Delta {
    const LoraTensor* t;
    float s;  // the adapter's scale times the pair's factor
};

// Rows [begin, end) of `w` with every delta added, in w's type.
void merge_rows(const gguf::TensorInfo& w, const std::vector<Delta>& deltas, uint8_t* dst, int64_t begin, int64_t end,
                std::vector<float>& row) {
    const int64_t k = w.ne[0];
    const size_t rb = row_size(w.type, k);
    row.resize(size_t(k));
    for (int64_t o = begin; o < end; ++o) {
        dequantize_row_ref(w.type, w.data + size_t(o) * rb, row.data(), k);
        for (const Delta& d : deltas) {
            // Row o of stacked experts is row o % n_out of expert o / n_out; b holds the experts' rows in
            // the same order.
            const int64_t r = d.t->r;
            const float* b = d.t->b.data() + o * r;
            const float* a_e = d.t->a.data() + (o / d.t->n_out) * r * k;
            for (int64_t j = 0; j < r; ++j) {
                const float c = d.s * b[j];
                const float* a = a_e + j * k;
                for (int64_t i = 0; i < k; ++i) row[size_t(i)] += c * a[i];
            }
        }
        quantize_row_ref(w.type, row.data(), dst + size_t(o) * rb, k);
    }
}

}  // namespace

LoraMergeSummary merge_lora(const LoraMergeOptions& o) {
    if (o.adapters.empty()) throw_error(ErrorCode::kInvalidArgument, "--lora-merge needs at least one --lora adapter");
    auto f = gguf::File::open(o.base);
    // Every adapter is read and checked before anything is written.
    std::vector<std::vector<LoraTensor>> adapters;
    std::map<std::string, std::vector<Delta>> by_target;
    adapters.reserve(o.adapters.size());
    for (const LoraMergeInput& in : o.adapters) adapters.push_back(read_lora(in.path, *f));
    for (size_t i = 0; i < adapters.size(); ++i)
        for (const LoraTensor& t : adapters[i]) by_target[t.target].push_back({&t, o.adapters[i].scale * t.factor});
    for (const auto& [name, deltas] : by_target) {
        const gguf::TensorInfo* w = f->find_tensor(name);
        if (!can_dequantize(w->type) || !can_quantize(w->type))
            throw_error(ErrorCode::kUnsupported, "%s: %s has type %s, which cera cannot requantize after the merge",
                        o.base.c_str(), name.c_str(), type_name(w->type));
    }

    gguf::Writer wr;
    for (const auto& [key, v] : f->metadata()) wr.set(key, v);
    const int n_threads = o.n_threads > 0 ? o.n_threads : int(std::max(1u, std::thread::hardware_concurrency()));
    ThreadPool pool(n_threads);
    std::vector<std::vector<float>> rows(static_cast<size_t>(n_threads));  // one f32 row per thread
    LoraMergeSummary s;
    for (const gguf::TensorInfo& t : f->tensors()) {
        ++s.n_tensors;
        auto it = by_target.find(t.name);
        if (it == by_target.end()) {
            wr.add_tensor(t.name, t.type, t.ne, [&t](uint8_t* dst, size_t n) { std::memcpy(dst, t.data, n); });
            continue;
        }
        ++s.n_merged;
        wr.add_tensor(t.name, t.type, t.ne, [&pool, &rows, &t, deltas = &it->second](uint8_t* dst, size_t) {
            pool.parallel_for(
                t.rows(), [&](int64_t begin, int64_t end, int thread) {
                    merge_rows(t, *deltas, dst, begin, end, rows[size_t(thread)]);
                },
                std::max<int64_t>(1, 4096 / t.ne[0]));
        });
    }
    wr.write(o.output, o.on_progress);
    return s;
}

}  // namespace cera::quantize
