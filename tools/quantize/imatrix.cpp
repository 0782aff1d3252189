// Reading, writing and computing importance matrices (see imatrix.h). The statistics come from a
// MatmulObserver on the CPU backend: every product of a weight sees its input rows before it runs, and
// the model names the weight by its device pointer.
#include "quantize/imatrix.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "backends/backend.h"
#include "core/check.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace cera::quantize {
namespace {

constexpr std::string_view kSums = ".in_sum2";
constexpr std::string_view kCounts = ".counts";

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Sums x^2 per column of every observed product, by weight name.
class Collector final : public MatmulObserver {
 public:
    Collector(bool process_output) : process_output_(process_output) {}
    void set_model(const Model* m) { model_ = m; }
    std::map<std::string, ImatrixEntry>& entries() { return entries_; }

    void observe(const Tensor& w, int64_t expert, const float* x, int64_t n) override {
        if (!model_) return;
        const std::string& name = model_->weight_name(w);
        if (name.empty() || !(name.rfind("blk.", 0) == 0 || (process_output_ && name == "output.weight"))) return;
        const int64_t ne0 = w.ne[0], n_mat = w.ne[2] * w.ne[3];
        ImatrixEntry& e = entries_[name];
        if (e.sums.empty()) {
            e.ne0 = ne0;
            e.sums.assign(size_t(ne0 * n_mat), 0.0);
            e.counts.assign(size_t(n_mat), 0);
        }
        const int64_t m = expert < 0 ? 0 : expert;
        CERA_CHECK(m < n_mat, "imatrix: expert %lld of %s, which has %lld", (long long)m, name.c_str(),
                   (long long)n_mat);
        double* acc = e.sums.data() + m * ne0;
        for (int64_t r = 0; r < n; ++r) {
            const float* row = x + r * ne0;
            for (int64_t j = 0; j < ne0; ++j) acc[j] += double(row[j]) * double(row[j]);
        }
        e.counts[size_t(m)] += n;
    }

 private:
    bool process_output_;
    const Model* model_ = nullptr;
    std::map<std::string, ImatrixEntry> entries_;
};

// llama.cpp's legacy format: i32 n_entries; per entry i32 name length, the name, i32 call count, i32 value
// count, f32 values; then optionally i32 chunk count, i32 length and the dataset's name.
Imatrix read_legacy(const std::string& path, const std::string& bytes) {
    size_t at = 0;
    auto fail = [&](const char* what) {
        throw_error(ErrorCode::kInvalidFile, "%s: not an importance matrix (%s at byte %zu of the .dat format)",
                    path.c_str(), what, at);
    };
    auto i32 = [&](const char* what) {
        if (bytes.size() - at < 4) fail(what);
        int32_t v;
        std::memcpy(&v, bytes.data() + at, 4);
        at += 4;
        return v;
    };
    Imatrix m;
    const int32_t n = i32("the entry count");
    if (n < 1) fail("no entries");
    for (int32_t k = 0; k < n; ++k) {
        const int32_t len = i32("a name length");
        if (len < 1 || len > 4096 || size_t(len) > bytes.size() - at) fail("a bad name length");
        std::string name = bytes.substr(at, size_t(len));
        at += size_t(len);
        const int32_t ncall = i32("a call count"), nval = i32("a value count");
        if (ncall < 0 || nval < 1 || (bytes.size() - at) / 4 < size_t(nval)) fail("bad counts");
        ImatrixEntry e;
        e.legacy = true;
        e.ne0 = nval;
        e.counts = {ncall};
        e.sums.resize(size_t(nval));
        for (int32_t i = 0; i < nval; ++i) {
            float v;
            std::memcpy(&v, bytes.data() + at, 4);
            at += 4;
            if (!std::isfinite(v) || v < 0) fail("a value that is not finite and non-negative");
            e.sums[size_t(i)] = v;
        }
        if (!m.entries.emplace(std::move(name), std::move(e)).second) fail("a name given twice");
    }
    if (bytes.size() - at >= 8) {  // the trailing chunk count and dataset are optional
        m.chunk_count = uint32_t(std::max(0, i32("the chunk count")));
        const int32_t len = i32("the dataset's length");
        if (len > 0 && size_t(len) <= bytes.size() - at) m.datasets.push_back(bytes.substr(at, size_t(len)));
    }
    return m;
}

}  // namespace

Imatrix read_imatrix(const std::string& path) {
    {
        std::ifstream in(path, std::ios::binary);
        if (!in) throw_error(ErrorCode::kIo, "%s: cannot open the importance matrix", path.c_str());
        char magic[4] = {};
        in.read(magic, 4);
        if (in.gcount() < 4 || std::memcmp(magic, "GGUF", 4) != 0) {
            in.clear();
            in.seekg(0);
            return read_legacy(path, std::string(std::istreambuf_iterator<char>(in), {}));
        }
    }
    auto f = gguf::File::open(path);
    if (f->get_string("general.type", "") != "imatrix" && !f->find("imatrix.chunk_count"))
        throw_error(ErrorCode::kInvalidFile, "%s: not an importance matrix (no general.type \"imatrix\")",
                    path.c_str());
    Imatrix m;
    if (f->find("imatrix.datasets")) m.datasets = f->get_string_array("imatrix.datasets");
    m.chunk_count = f->get_u32("imatrix.chunk_count", 0);
    m.chunk_size = f->get_u32("imatrix.chunk_size", 0);
    std::map<std::string, std::pair<const gguf::TensorInfo*, const gguf::TensorInfo*>> parts;
    for (const gguf::TensorInfo& t : f->tensors()) {
        if (ends_with(t.name, kSums))
            parts[t.name.substr(0, t.name.size() - kSums.size())].first = &t;
        else if (ends_with(t.name, kCounts))
            parts[t.name.substr(0, t.name.size() - kCounts.size())].second = &t;
    }
    if (parts.empty()) throw_error(ErrorCode::kInvalidFile, "%s: no importance matrix entries", path.c_str());
    for (const auto& [name, p] : parts) {
        const auto [sums, counts] = p;
        if (!sums || !counts)
            throw_error(ErrorCode::kInvalidFile, "%s: %s has %s but no %s", path.c_str(), name.c_str(),
                        sums ? "sums" : "counts", sums ? "counts" : "sums");
        if (sums->type != GgmlType::kF32 || counts->type != GgmlType::kF32)
            throw_error(ErrorCode::kInvalidFile, "%s: %s: sums and counts must be F32", path.c_str(), name.c_str());
        const int64_t n_mat = counts->n_elements(), n_val = sums->n_elements();
        if (n_mat < 1 || n_val < 1 || n_val % n_mat != 0)
            throw_error(ErrorCode::kInvalidFile, "%s: %s: %lld sums do not split into %lld matrices", path.c_str(),
                        name.c_str(), (long long)n_val, (long long)n_mat);
        ImatrixEntry e;
        e.ne0 = n_val / n_mat;
        const auto* s = reinterpret_cast<const float*>(sums->data);
        const auto* c = reinterpret_cast<const float*>(counts->data);
        e.sums.resize(size_t(n_val));
        for (int64_t i = 0; i < n_val; ++i) {
            float v;
            std::memcpy(&v, s + i, 4);
            if (!std::isfinite(v) || v < 0)
                throw_error(ErrorCode::kInvalidFile, "%s: %s: sum %lld is %g", path.c_str(), name.c_str(), (long long)i,
                            double(v));
            e.sums[size_t(i)] = v;
        }
        e.counts.resize(size_t(n_mat));
        for (int64_t i = 0; i < n_mat; ++i) {
            float v;
            std::memcpy(&v, c + i, 4);
            if (!std::isfinite(v) || v < 0)
                throw_error(ErrorCode::kInvalidFile, "%s: %s: count %lld is %g", path.c_str(), name.c_str(),
                            (long long)i, double(v));
            e.counts[size_t(i)] = std::lround(v);
        }
        m.entries.emplace(name, std::move(e));
    }
    return m;
}

void write_imatrix(const Imatrix& m, const std::string& path) {
    gguf::Writer w;
    w.set_string("general.type", "imatrix");
    w.set("imatrix.datasets", gguf::value_string_array(m.datasets));
    w.set_u32("imatrix.chunk_count", m.chunk_count);
    w.set_u32("imatrix.chunk_size", m.chunk_size);
    for (const auto& [name, e] : m.entries) {  // sorted by name, as llama-imatrix writes them
        const int64_t n_mat = int64_t(e.counts.size());
        std::vector<float> sums(e.sums.begin(), e.sums.end()), counts(e.counts.begin(), e.counts.end());
        const auto* sb = reinterpret_cast<const uint8_t*>(sums.data());
        const auto* cb = reinterpret_cast<const uint8_t*>(counts.data());
        // Trailing dimensions of 1 are not written, as ggml writes its tensors.
        auto dims = [](int64_t ne0, int64_t ne1) {
            return ne1 == 1 ? std::vector<int64_t>{ne0} : std::vector<int64_t>{ne0, ne1};
        };
        w.add_tensor(name + std::string(kSums), GgmlType::kF32, dims(e.ne0, n_mat),
                     std::vector<uint8_t>(sb, sb + sums.size() * 4));
        w.add_tensor(name + std::string(kCounts), GgmlType::kF32, dims(1, n_mat),
                     std::vector<uint8_t>(cb, cb + counts.size() * 4));
    }
    w.write(path);
}

std::vector<float> importance(const ImatrixEntry& e) {
    std::vector<float> out(e.sums.size());
    for (size_t m = 0; m < e.counts.size(); ++m) {
        const float count = float(e.counts[m]);
        for (int64_t i = 0; i < e.ne0; ++i) {
            const size_t k = m * size_t(e.ne0) + size_t(i);
            out[k] = count > 0 ? float(e.sums[k]) / count : e.legacy ? float(e.sums[k]) : 1.0f;
        }
    }
    return out;
}

ImatrixRun compute_imatrix(const ImatrixOptions& o, const std::string& text) {
    const auto t0 = std::chrono::steady_clock::now();
    if (o.n_ctx < 2) throw_error(ErrorCode::kInvalidArgument, "imatrix: context %d is too small (at least 2)", o.n_ctx);
    Collector collector(o.process_output);
    ModelOptions mo;
    mo.device = DeviceKind::kCpu;
    mo.n_threads = o.n_threads;
    mo.n_ctx = o.n_ctx;
    mo.n_batch = o.n_ctx;  // a chunk is one forward pass, as in llama-imatrix
    mo.observer = &collector;
    std::unique_ptr<Model> model = load_model(o.model, mo);
    collector.set_model(model.get());
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file());

    const std::vector<int32_t> tokens = tok->encode(text, tok->add_bos(), false);
    if (int64_t(tokens.size()) < 2 * int64_t(o.n_ctx))
        throw_error(ErrorCode::kInvalidArgument,
                    "imatrix: the text is %zu tokens; a context of %d needs at least %lld (two chunks)", tokens.size(),
                    o.n_ctx, 2 * (long long)o.n_ctx);
    int32_t n_chunks = int32_t(tokens.size() / size_t(o.n_ctx));
    if (o.n_chunks >= 0) n_chunks = std::min(n_chunks, o.n_chunks);
    if (n_chunks < 1) throw_error(ErrorCode::kInvalidArgument, "imatrix: no chunk to run (--chunks 0)");

    const bool put_bos = tok->add_bos() && tok->bos() >= 0;
    std::unique_ptr<ModelState> state = model->create_state(o.n_ctx);
    // Every row's output is asked for, so that every layer runs over every token (llama-imatrix asks for
    // every row's logits): the hidden states, or with process_output the logits, whose product is then
    // the head's input being measured.
    const size_t width = size_t(o.process_output ? model->info().n_vocab : model->info().n_embd);
    std::vector<float> out(size_t(o.n_ctx) * width);
    std::vector<int32_t> chunk(size_t(o.n_ctx));
    for (int32_t c = 0; c < n_chunks; ++c) {
        std::copy_n(tokens.begin() + int64_t(c) * o.n_ctx, o.n_ctx, chunk.begin());
        if (put_bos) chunk[0] = tok->bos();
        state->reset();
        EvalRequest rq{.tokens = chunk, .all_logits = true};
        (o.process_output ? rq.logits : rq.hidden) = out.data();
        state->eval(rq);
        if (o.on_chunk) o.on_chunk(c + 1, n_chunks);
    }

    ImatrixRun run;
    run.imatrix.entries = std::move(collector.entries());
    if (!o.dataset.empty()) run.imatrix.datasets.push_back(o.dataset);
    run.imatrix.chunk_count = uint32_t(n_chunks);
    run.imatrix.chunk_size = uint32_t(o.n_ctx);
    run.n_tokens = int64_t(n_chunks) * o.n_ctx;
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return run;
}

}  // namespace cera::quantize
