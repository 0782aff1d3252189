// CPU backend: executes each op immediately on the kernel table its options name
// (kernel_table.h): matmuls, row ops and attention go to the table's kernels; RoPE,
// the short conv and the router are plain loops here (they move little data next to
// the matmuls).
// Work is split over the thread pool only when an op is large enough to pay for
// the hand-off (a decode step of a small model runs mostly on one thread).
#include "backends/cpu/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backends/cpu/kernel_table.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/moe.h"
#include "backends/cpu/repack.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/mmap.h"
#include "core/quant/kv_groups.h"
#include "core/quant/quant.h"
#include "core/rotation.h"
#include "core/threadpool.h"

namespace cera {
namespace {

// Elements of work below which an op stays on the calling thread.
constexpr int64_t kParallelMinWork = 32 * 1024;

const float* f16_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(65536);
        for (uint32_t i = 0; i < 65536; ++i) t[i] = fp16_to_fp32(uint16_t(i));
        return t;
    }();
    return table.data();
}

// One row of n elements of `type` -> f32.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
    switch (type) {
        case GgmlType::kF32:
            std::memcpy(dst, src, size_t(n) * sizeof(float));
            return;
        case GgmlType::kF16: {
            const float* tab = f16_table();
            const auto* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = tab[s[i]];
            return;
        }
        case GgmlType::kBF16: {
            const auto* s = static_cast<const uint16_t*>(src);
            for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
            return;
        }
        default:
            dequantize_row_ref(type, src, dst, n);
            return;
    }
}

class CpuBackend final : public Backend {
 public:
    CpuBackend(int n_threads, cpu::Isa isa, MatmulObserver* observer)
        : table_(cpu::kernel_table(isa)),
          pool_(n_threads > 0 ? n_threads : std::max(1, cpu_features().physical_cores)),
          observer_(observer) {
        f16_table();
    }
    ~CpuBackend() override {
        for (const auto& [p, mapped_bytes] : buffers_) release_buffer(p, mapped_bytes);
        for (const void* p : packed_) cpu::unregister_weight(p);
        for (void* p : copied_) std::free(p);
    }

    DeviceKind kind() const override { return DeviceKind::kCpu; }
    std::string description() const override {
        return std::string("cpu ") + cpu::isa_name(table_.isa) + ", " + std::to_string(pool_.size()) +
               (pool_.size() == 1 ? " thread" : " threads");
    }

    // ------------------------------------------------------------ memory
    Tensor upload_weight(GgmlType type, std::span<const int64_t> ne, const void* host) override {
        Tensor t = weight_view(type, ne, host);
        pack(t, ne.size(), /*immutable=*/false);
        return t;
    }

    // Weights are resident once. A repacked matrix is read from its packed copy by every op (matmul,
    // and embed through unpack_row), and the file's pages under it are dropped. Where the kernel table
    // repacks, a small tensor (norms, biases, conv kernels) is copied to the heap and its pages dropped
    // too: reading it through the mapping at every step could map its dropped neighbours again (see
    // hold_mapped). Other tensors stay views of the mapping.
    Tensor upload_mapped_weight(GgmlType type, std::span<const int64_t> ne, const void* host) override {
        Tensor t = weight_view(type, ne, host);
        if (!pack(t, ne.size(), /*immutable=*/true)) {
            if (t.n_bytes() >= kCopiedWeightBytes || !table_repacks()) return t;
            void* copy = std::aligned_alloc(64, std::max<size_t>(64, (t.n_bytes() + 63) / 64 * 64));
            if (!copy) throw std::bad_alloc();
            std::memcpy(copy, host, t.n_bytes());
            copied_.push_back(copy);
            t.data = copy;
        }
        hold_mapped(host, t.n_bytes());
        return t;
    }

    // Buffers from kLazyBufferBytes up are anonymous mappings, zero pages that take memory only once
    // written: a KV cache holds the rows its positions reached, and logits rows no step writes cost
    // nothing. Smaller ones come from the heap.
    Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne) override {
        CERA_CHECK(ne.size() >= 1 && ne.size() <= 4);
        Tensor t;
        t.type = type;
        size_t i = 0;
        for (int64_t n : ne) t.ne[i++] = n;
        for (; i < 4; ++i) t.ne[i] = 1;
        const size_t bytes = std::max<size_t>(64, (t.n_bytes() + 63) / 64 * 64);
        void* p = nullptr;
        size_t mapped_bytes = 0;
        if (bytes >= kLazyBufferBytes) {
            p = map_zero_pages(bytes);
            mapped_bytes = bytes;
        } else {
            p = std::aligned_alloc(64, bytes);
            if (!p) throw std::bad_alloc();
            std::memset(p, 0, bytes);
        }
        buffers_.emplace(p, mapped_bytes);
        t.data = p;
        return t;
    }

    void free(Tensor& t) override {
        if (t.data) {
            if (auto it = buffers_.find(t.data); it != buffers_.end()) {
                release_buffer(it->first, it->second);
                buffers_.erase(it);
            }
        }
        t = Tensor{};
    }

    void write(const Tensor& dst, const void* host, size_t n_bytes, size_t offset) override {
        std::memcpy(static_cast<uint8_t*>(dst.data) + offset, host, n_bytes);
    }
    void read(void* host, const Tensor& src, size_t n_bytes, size_t offset) override {
        std::memcpy(host, static_cast<const uint8_t*>(src.data) + offset, n_bytes);
    }
    void copy(const Tensor& dst, const Tensor& src) override { std::memcpy(dst.data, src.data, src.n_bytes()); }
    void zero(const Tensor& t) override { std::memset(t.data, 0, t.n_bytes()); }
    void synchronize() override {}

    // --------------------------------------------------------------- ops
    void embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) override {
        const int64_t n_embd = table.ne[0], n_tokens = ids.ne[0];
        const int32_t* id = ids.as<const int32_t>();
        // A repacked table (tied to the LM head) is read from its packed copy: its file pages are gone.
        const cpu::PackedView packed = cpu::find_packed(table.data, table.type, table.rows(), n_embd);
        if (packed.data != nullptr && embed_row_.size() < table.row_bytes()) embed_row_.resize(table.row_bytes());
        for (int64_t t = 0; t < n_tokens; ++t) {
            CERA_CHECK(id[t] >= 0 && id[t] < table.ne[1], "token id %d outside [0, %lld)", id[t],
                       (long long)table.ne[1]);
            float* y = out.as<float>() + t * n_embd;
            const uint8_t* row = table.as<const uint8_t>() + size_t(id[t]) * table.row_bytes();
            if (packed.data != nullptr) {
                cpu::unpack_row(table.type, packed, id[t], n_embd, embed_row_.data());
                row = embed_row_.data();
            }
            dequantize_row(table.type, row, y, n_embd);
            if (scale != 1.0f)
                for (int64_t i = 0; i < n_embd; ++i) y[i] *= scale;
        }
    }

    void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) override {
        const int64_t n = x.ne[0], rows = x.rows();
        const float* wp = w ? w.as<const float>() : nullptr;
        for_rows(rows, n, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r)
                table_.rms_norm(x.as<const float>() + r * n, wp, out.as<float>() + r * n, n, eps);
        });
    }

    void matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) override {
        const int64_t k = w.ne[0], rows = w.rows(), n_tokens = x.rows();
        CERA_CHECK(x.ne[0] == k && out.ne[0] == rows, "matmul shapes: w {%lld, %lld}, x ne0 %lld, out ne0 %lld",
                   (long long)k, (long long)rows, (long long)x.ne[0], (long long)out.ne[0]);
        if (observer_) observer_->observe(w, -1, x.as<const float>(), n_tokens);
        cpu::matmul(table_, w.type, w.data, rows, k, x.as<const float>(), n_tokens, out.as<float>(), rows, &pool_,
                    batch_variant_.count(w.data) != 0);
        if (bias) {
            const float* b = bias.as<const float>();
            for (int64_t t = 0; t < n_tokens; ++t) {
                float* y = out.as<float>() + t * rows;
                for (int64_t r = 0; r < rows; ++r) y[r] += b[r];
            }
        }
    }

    // Each segment in two steps: t = A x through the matmul kernels (r long rows), then y += s Bᵀᵀ t as r
    // scaled row additions of Bᵀ's rows (the add kernel: no per-output reductions over the short rank),
    // split over column blocks. A decode step reads the adapter's bytes once, a few percent of the base
    // product's at ranks up to 64.
    void lora_segments(const Tensor& x, std::span<const LoraSegment> segs, const Tensor& y) override {
        const int64_t k = x.ne[0], n_out = y.ne[0];
        for (const LoraSegment& sg : segs) {
            const int64_t r = sg.a.ne[1];
            CERA_CHECK(sg.a.ne[0] == k && (sg.bt.type == GgmlType::kF32 || sg.bt.type == GgmlType::kF16) &&
                           sg.bt.ne[1] == r && sg.bt.ne[0] == n_out && sg.start >= 0 && sg.start + sg.n <= x.rows() &&
                           x.rows() == y.rows(),
                       "lora_segments: segment rows %lld+%lld, a {%lld, %lld}, bt {%lld, %lld}, x ne0 %lld, y ne0 %lld",
                       (long long)sg.start, (long long)sg.n, (long long)sg.a.ne[0], (long long)r,
                       (long long)sg.bt.ne[0], (long long)sg.bt.ne[1], (long long)k, (long long)n_out);
            if (sg.n == 0) continue;
            if (sg.n <= kLoraFusedRows && sg.bt.type == GgmlType::kF16 && pool_.size() > 1) {
                lora_decode(x, sg, y);
                continue;
            }
            if (lora_tmp_.size() < size_t(sg.n * r)) lora_tmp_.resize(size_t(sg.n * r));  // grows, then stays
            float* t = lora_tmp_.data();
            cpu::matmul(table_, sg.a.type, sg.a.data, r, k, x.as<const float>() + sg.start * k, sg.n, t, r, &pool_);
            for (int64_t i = 0; i < sg.n * r; ++i) t[i] *= sg.scale;
            float* yo = y.as<float>() + sg.start * n_out;
            constexpr int64_t kCols = 512;  // a column block of every row stays in L1 across the r additions
            const int64_t n_blocks = (n_out + kCols - 1) / kCols;
            const bool f16 = sg.bt.type == GgmlType::kF16;
            for_rows(n_blocks, sg.n * r * kCols, [&](int64_t b0, int64_t b1) {
                const int64_t c0 = b0 * kCols, c1 = std::min(n_out, b1 * kCols);
                for (int64_t row = 0; row < sg.n; ++row) {
                    float* yr = yo + row * n_out + c0;
                    if (f16) {
                        table_.axpy_rows_f16(sg.bt.as<const uint16_t>() + c0, n_out, t + row * r, r, yr, c1 - c0);
                        continue;
                    }
                    for (int64_t j = 0; j < r; ++j)
                        table_.add(yr, sg.bt.as<const float>() + j * n_out + c0, t[row * r + j], yr, c1 - c0);
                }
            });
        }
    }

    // Decode-sized segments in one hand-off to the pool instead of two: every thread computes t = A x
    // itself (A is at most a few hundred KB, r x k, and stays in cache) and then adds its share of Bᵀ's
    // columns. The two hand-offs a projection cost otherwise are a tenth of a small model's decode step.
    static constexpr int64_t kLoraFusedRows = 4;
    void lora_decode(const Tensor& x, const LoraSegment& sg, const Tensor& y) {
        const int64_t k = x.ne[0], n_out = y.ne[0], r = sg.a.ne[1];
        const int nt = pool_.size();
        if (lora_tmp_.size() < size_t(nt * sg.n * r)) lora_tmp_.resize(size_t(nt * sg.n * r));
        const int64_t n_chunks = (n_out + 15) / 16;
        pool_.parallel_for(nt, [&](int64_t i0, int64_t i1, int) {
            for (int64_t i = i0; i < i1; ++i) {
                const int64_t c0 = std::min(n_out, n_chunks * i / nt * 16),
                              c1 = std::min(n_out, n_chunks * (i + 1) / nt * 16);
                if (c1 <= c0) continue;
                float* t = lora_tmp_.data() + i * sg.n * r;
                cpu::matmul(table_, sg.a.type, sg.a.data, r, k, x.as<const float>() + sg.start * k, sg.n, t, r,
                            nullptr);
                for (int64_t j = 0; j < sg.n * r; ++j) t[j] *= sg.scale;
                for (int64_t row = 0; row < sg.n; ++row)
                    table_.axpy_rows_f16(sg.bt.as<const uint16_t>() + c0, n_out, t + row * r, r,
                                         y.as<float>() + (sg.start + row) * n_out + c0, c1 - c0);
            }
        });
    }

    void norm_rope(const Tensor& x, int n_head, int head_dim, const Tensor& norm_w, float eps, const Tensor& pos,
                   const RopeParams& rope) override {
        const int64_t n_tokens = x.rows();
        const int half = rope.n_rot / 2;
        const int32_t* p = pos.as<const int32_t>();
        // cos/sin table [n_tokens, n_rot/2]
        if (rope.mode != RopeMode::kNone) {
            grow(rope_cs_, size_t(n_tokens) * half * 2);
            const float* ff = rope.freq_factors ? rope.freq_factors.as<const float>() : nullptr;
            for (int64_t t = 0; t < n_tokens; ++t) {
                float* cs = rope_cs_.data() + t * half * 2;
                const double position = double(p[t]) * rope.freq_scale;
                for (int i = 0; i < half; ++i) {
                    double theta = position * std::pow(double(rope.freq_base), -2.0 * i / rope.n_rot);
                    if (ff) theta /= ff[i];
                    cs[2 * i] = float(std::cos(theta));
                    cs[2 * i + 1] = float(std::sin(theta));
                }
            }
        }
        const float* nw = norm_w ? norm_w.as<const float>() : nullptr;
        for_rows(n_tokens * n_head, head_dim, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                float* v = x.as<float>() + r * head_dim;
                if (nw) table_.rms_norm(v, nw, v, head_dim, eps);
                if (rope.mode == RopeMode::kNone) continue;
                const float* cs = rope_cs_.data() + (r / n_head) * half * 2;
                for (int i = 0; i < half; ++i) {
                    const int i0 = rope.mode == RopeMode::kNorm ? 2 * i : i;
                    const int i1 = rope.mode == RopeMode::kNorm ? 2 * i + 1 : i + half;
                    const float c = cs[2 * i], s = cs[2 * i + 1];
                    const float a = v[i0], b = v[i1];
                    v[i0] = a * c - b * s;
                    v[i1] = a * s + b * c;
                }
            }
        });
    }

    void kv_store(const Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& k_cache, const Tensor& v_cache,
                  const Tensor& k_open) override {
        const int64_t n_tokens = k.rows(), width = k.ne[0];
        const int32_t* p = pos.as<const int32_t>();
        const bool grouped = k_cache.type == GgmlType::kQ4_CH;
        CERA_CHECK(grouped == bool(k_open) && (!grouped || k_cache.ne[1] % kv_groups::kRows == 0),
                   "kv_store: Q4_CH keys take their open groups, in a cache of whole groups");
        for (int64_t t = 0; t < n_tokens; ++t) {
            CERA_CHECK(p[t] >= 0 && p[t] < k_cache.ne[1], "position %d outside the cache of %lld", p[t],
                       (long long)k_cache.ne[1]);
            if (!grouped) store_row(k.as<const float>() + t * width, k_cache, p[t], width);
            store_row(v.as<const float>() + t * width, v_cache, p[t], width);
        }
        if (grouped)
            kv_groups::store(k.as<const float>(), p, n_tokens, width, static_cast<uint8_t*>(k_cache.data),
                             static_cast<uint8_t*>(k_open.data), int(k_open.ne[1] / (kv_groups::kRows + 1)));
    }

    void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                   const AttentionParams& ap, const Tensor& out) override {
        const int64_t n_tokens = q.rows();
        cpu_attention::Args a;
        a.q = q.as<const float>();
        a.k = k_cache.data;
        a.v = v_cache.data;
        a.k_type = cache_elem(k_cache);
        a.v_type = cache_elem(v_cache);
        a.pos = pos.as<const int32_t>();
        a.out = out.as<float>();
        a.n_head = ap.n_head;
        a.group = ap.n_head / ap.n_head_kv;
        a.head_dim = ap.head_dim;
        a.kv_width = int64_t(ap.n_head_kv) * ap.head_dim;
        a.window = ap.sliding_window;
        a.scale = ap.scale;
        // One Args a sequence: its rows of q, pos and out, its block table.
        std::vector<cpu_attention::Args>& seqs = attn_seqs_;
        std::vector<int64_t>& first = attn_first_;  // each sequence's first token
        seqs.clear(), first.clear();
        const KvPaging& pg = ap.paging;
        if (!pg) {
            seqs.push_back(a), first.push_back(0);
        } else {
            CERA_CHECK(
                pg.block_size > 0 && (pg.block_size & (pg.block_size - 1)) == 0 && pg.seq.n_elements() >= n_tokens,
                "attention: paging needs a power-of-two block size and a sequence per query");
            const int32_t* sq = pg.seq.as<const int32_t>();
            for (int64_t t = 0; t < n_tokens; ++t) {
                if (t > 0 && sq[t] == sq[t - 1]) continue;
                CERA_CHECK(sq[t] >= 0 && sq[t] < pg.block_table.rows(), "attention: query %lld of sequence %d",
                           (long long)t, sq[t]);
                cpu_attention::Args s = a;
                s.q += t * ap.n_head * ap.head_dim, s.out += t * ap.n_head * ap.head_dim, s.pos += t;
                s.table = pg.block_table.as<const int32_t>() + int64_t(sq[t]) * pg.block_table.ne[0];
                s.block_shift = std::countr_zero(unsigned(pg.block_size));
                seqs.push_back(s), first.push_back(t);
            }
        }
        if (a.k_type == cpu_attention::Elem::kQ4_CH) {  // each sequence's own keys and open group
            CERA_CHECK(ap.k_new && ap.k_open && ap.k_new.rows() == n_tokens,
                       "attention: Q4_CH keys need k_new, k_open");
            const int slots = int(ap.k_open.ne[1] / (kv_groups::kRows + 1));
            grow(open_keys_, size_t(n_tokens * a.kv_width));
            kv_groups::round_rows(ap.k_new.as<const float>(), n_tokens, a.kv_width, open_keys_.data());
            for (size_t i = 0; i < seqs.size(); ++i) {
                cpu_attention::Args& s = seqs[i];
                s.k_new = open_keys_.data() + first[i] * a.kv_width;
                s.new_first = s.pos[0];
                const int32_t in_group = s.new_first % kv_groups::kRows;
                s.k_slot = in_group == 0 ? nullptr
                                         : kv_groups::find_open(
                                               static_cast<const uint8_t*>(ap.k_open.data), a.kv_width, slots,
                                               cpu_attention::kv_row(s, s.new_first) / kv_groups::kRows, in_group);
            }
        }
        first.push_back(n_tokens);
        int32_t max_pos = 0;
        for (int64_t t = 0; t < n_tokens; ++t) max_pos = std::max(max_pos, a.pos[t]);
        const int nt = pool_.size();
        const int64_t per_thread = cpu_attention::scratch_floats(max_pos + 1, ap.head_dim, a.group);
        grow(attn_scratch_, size_t(per_thread * nt));
        // Units of work: (query block of a sequence, KV head). Threads take every nt-th unit, which
        // balances the causal triangle (later blocks see more keys) and the heads.
        std::vector<int64_t>& units = attn_units_;  // (sequence, block start) pairs
        units.clear();
        for (size_t i = 0; i + 1 < first.size(); ++i)
            for (int64_t t0 = 0; t0 < first[i + 1] - first[i]; t0 += cpu_attention::kBlockTokens)
                units.push_back(int64_t(i)), units.push_back(t0);
        struct Ctx {
            const cpu_attention::Args* seqs;
            const int64_t* first;
            const int64_t* units;
            cpu_attention::BlockFn fn;
            int64_t n_units, per_thread;
            int n_head_kv;
            float* scratch;
        } ctx{
            seqs.data(), first.data(), units.data(),        table_.attention, int64_t(units.size() / 2) * ap.n_head_kv,
            per_thread,  ap.n_head_kv, attn_scratch_.data()};
        auto work = [](void* p, int thread, int n_threads) {
            const Ctx& c = *static_cast<const Ctx*>(p);
            for (int64_t u = thread; u < c.n_units; u += n_threads) {
                const int64_t b = u / c.n_head_kv, i = c.units[2 * b], t0 = c.units[2 * b + 1];
                const int64_t t1 = std::min(c.first[i + 1] - c.first[i], t0 + cpu_attention::kBlockTokens);
                c.fn(c.seqs[i], t0, t1, int(u % c.n_head_kv), c.scratch + c.per_thread * thread);
            }
        };
        const int64_t flops = n_tokens * ap.n_head * int64_t(max_pos + 1) * ap.head_dim;
        if (flops < kParallelMinWork || nt == 1 || ctx.n_units == 1)
            work(&ctx, 0, 1);
        else
            pool_.run(work, &ctx);
    }

    void short_conv(const Tensor& bcx, const Tensor& w, const Tensor& state, const Tensor& out,
                    const Tensor& state_prev) override {
        const int64_t n_tokens = bcx.rows(), n_embd = out.ne[0], L = w.ne[0], n_state = L - 1;
        CERA_CHECK(bcx.ne[0] == 3 * n_embd && state.ne[0] == n_embd && state.ne[1] == n_state);
        if (state_prev) {
            CERA_CHECK(state_prev.n_bytes() >= state.n_bytes(), "short_conv: state_prev smaller than the state");
            std::memcpy(state_prev.data, state.data, state.n_bytes());
        }
        grow(conv_pad_, size_t(n_state + n_tokens) * n_embd);
        float* pad = conv_pad_.data();
        std::memcpy(pad, state.data, size_t(n_state * n_embd) * sizeof(float));
        const float* in = bcx.as<const float>();
        for (int64_t t = 0; t < n_tokens; ++t) {
            const float* b = in + t * 3 * n_embd;
            const float* x = b + 2 * n_embd;
            float* d = pad + (n_state + t) * n_embd;
            for (int64_t c = 0; c < n_embd; ++c) d[c] = b[c] * x[c];
        }
        const float* wp = w.as<const float>();
        for_rows(n_tokens, n_embd * L, [&](int64_t t0, int64_t t1) {
            for (int64_t t = t0; t < t1; ++t) {
                const float* cg = in + t * 3 * n_embd + n_embd;
                float* y = out.as<float>() + t * n_embd;
                for (int64_t c = 0; c < n_embd; ++c) {
                    float s = 0.0f;
                    for (int64_t j = 0; j < L; ++j) s += wp[c * L + j] * pad[(t + j) * n_embd + c];
                    y[c] = cg[c] * s;
                }
            }
        });
        std::memcpy(state.data, pad + n_tokens * n_embd, size_t(n_state * n_embd) * sizeof(float));
    }

    void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) override {
        const int64_t n = gate.n_elements();
        const float* g = gate.as<const float>();
        const float* u = up.as<const float>();
        float* o = out.as<float>();
        for_rows(n / gate.ne[0], gate.ne[0], [&](int64_t r0, int64_t r1) {
            const int64_t b = r0 * gate.ne[0];
            table_.silu_mul(g + b, u + b, o + b, (r1 - r0) * gate.ne[0]);
        });
    }

    void add(const Tensor& a, const Tensor& b, float scale, const Tensor& out) override {
        const int64_t n = a.n_elements();
        const float* x = a.as<const float>();
        const float* y = b.as<const float>();
        float* o = out.as<float>();
        table_.add(x, y, scale, o, n);
    }

    // The encoder ops, split over the pool by rows: the tanh GELU on the kernel table, layer norm and the
    // erf GELU as their references (backend.h).
    void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out) override {
        const int64_t n = x.ne[0];
        for_rows(x.rows(), 4 * n, [&](int64_t r0, int64_t r1) {
            layer_norm_rows_host(x.as<const float>(), n, w ? w.as<const float>() : nullptr,
                                 b ? b.as<const float>() : nullptr, eps, out.as<float>(), r0, r1);
        });
    }

    void gelu(const Tensor& x, GeluKind kind, const Tensor& out) override {
        const int64_t n = x.ne[0];
        for_rows(x.rows(), 16 * n, [&](int64_t r0, int64_t r1) {
            if (kind == GeluKind::kTanh)
                table_.gelu_tanh(x.as<const float>() + r0 * n, out.as<float>() + r0 * n, (r1 - r0) * n);
            else
                gelu_host(x.as<const float>() + r0 * n, out.as<float>() + r0 * n, (r1 - r0) * n, kind);
        });
    }

    // Bidirectional attention as two products a head, on the matmul kernels: S = K_h · (scale Q_h) for a
    // block of queries, a softmax a row, then O = V_hᵀ · S written into the head's columns of out. The
    // reference table runs attention_full_host instead (the specification these are checked against).
    void attention_full(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int head_dim, float scale,
                        const Tensor& out) override {
        CERA_CHECK(q.ne[0] == int64_t(n_head) * head_dim && k.ne[0] == q.ne[0] && v.ne[0] == q.ne[0] &&
                       k.rows() == q.rows() && v.rows() == q.rows(),
                   "attention_full: q, k, v must be [n_tokens, n_head * head_dim]");
        const int64_t n = q.rows(), width = q.ne[0], hd = head_dim;
        if (table_.isa == cpu::Isa::kRef) {
            for_rows(n, 4 * n * width, [&](int64_t r0, int64_t r1) {
                attention_full_host(q.as<const float>(), k.as<const float>(), v.as<const float>(), n, n_head, head_dim,
                                    scale, out.as<float>(), r0, r1);
            });
            return;
        }
        constexpr int64_t kQueryBlock = 256;
        const int64_t qb = std::min(n, kQueryBlock);
        grow(enc_k_, size_t(n * hd));
        grow(enc_vt_, size_t(hd * n));
        grow(enc_q_, size_t(n * hd));
        grow(enc_s_, size_t(qb * n));
        const float *Q = q.as<const float>(), *K = k.as<const float>(), *V = v.as<const float>();
        for (int h = 0; h < n_head; ++h) {
            for_rows(n, hd, [&](int64_t r0, int64_t r1) {
                for (int64_t t = r0; t < r1; ++t)
                    for (int64_t c = 0; c < hd; ++c) {
                        const size_t src = size_t(t * width + h * hd + c);
                        enc_k_[size_t(t * hd + c)] = K[src];
                        enc_q_[size_t(t * hd + c)] = Q[src] * scale;
                        enc_vt_[size_t(c * n + t)] = V[src];
                    }
            });
            for (int64_t b = 0; b < n; b += qb) {
                const int64_t m = std::min(qb, n - b);
                cpu::matmul(table_, GgmlType::kF32, enc_k_.data(), n, hd, enc_q_.data() + b * hd, m, enc_s_.data(), n,
                            &pool_, true);
                for_rows(m, 8 * n, [&](int64_t r0, int64_t r1) {
                    for (int64_t r = r0; r < r1; ++r) table_.softmax(enc_s_.data() + r * n, n);
                });
                cpu::matmul(table_, GgmlType::kF32, enc_vt_.data(), hd, n, enc_s_.data(), m,
                            out.as<float>() + b * width + h * hd, width, &pool_, true);
            }
        }
    }

    void scale(const Tensor& x, float s) override {
        const int64_t n = x.n_elements();
        float* v = x.as<float>();
        for (int64_t i = 0; i < n; ++i) v[i] *= s;
    }

    void rotate_heads(const Tensor& x, int head_dim, bool inverse) override {
        CERA_CHECK(x.type == GgmlType::kF32 && head_dim > 0 && x.ne[0] % head_dim == 0);
        const int64_t n_heads = x.n_elements() / head_dim;
        float* v = x.as<float>();
        auto body = [&](int64_t h0, int64_t h1, int) {
            for (int64_t h = h0; h < h1; ++h) rotate_head(v + h * head_dim, head_dim, inverse);
        };
        // A decode step's few heads cost less than a hand-off to the pool; a prefill chunk's are shared.
        if (n_heads < 256)
            body(0, n_heads, 0);
        else
            pool_.parallel_for(n_heads, body, 16);
    }

    void moe_route(const Tensor& logits, const Tensor& bias, const MoeParams& mp, const Tensor& ids,
                   const Tensor& weights) override {
        const int64_t n_tokens = logits.rows(), n_expert = logits.ne[0];
        const int k = mp.n_expert_used;
        CERA_CHECK(k >= 1 && k <= n_expert && ids.ne[0] == k && weights.ne[0] == k);
        grow(route_scratch_, size_t(2 * n_expert));
        float* prob = route_scratch_.data();
        float* sel = prob + n_expert;
        const float* b = bias ? bias.as<const float>() : nullptr;
        for (int64_t t = 0; t < n_tokens; ++t) {
            const float* l = logits.as<const float>() + t * n_expert;
            if (mp.gating == MoeGating::kSigmoid) {
                for (int64_t e = 0; e < n_expert; ++e) prob[e] = 1.0f / (1.0f + std::exp(-l[e]));
            } else {
                float mx = -INFINITY;
                for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, l[e]);
                double sum = 0;
                for (int64_t e = 0; e < n_expert; ++e) sum += prob[e] = std::exp(l[e] - mx);
                for (int64_t e = 0; e < n_expert; ++e) prob[e] = float(prob[e] / sum);
            }
            for (int64_t e = 0; e < n_expert; ++e) sel[e] = prob[e] + (b ? b[e] : 0.0f);
            int32_t* id = ids.as<int32_t>() + t * k;
            float* wt = weights.as<float>() + t * k;
            double wsum = 0;
            for (int j = 0; j < k; ++j) {  // k is small: repeated argmax, ties to the lower id
                int64_t best = -1;
                for (int64_t e = 0; e < n_expert; ++e)
                    if (sel[e] != -INFINITY && (best < 0 || sel[e] > sel[best])) best = e;
                id[j] = int32_t(best);
                wt[j] = prob[best];
                wsum += prob[best];
                sel[best] = -INFINITY;
            }
            for (int j = 0; j < k; ++j) {
                if (mp.normalize_weights) wt[j] = float(wt[j] / wsum);
                wt[j] *= mp.weights_scale;
            }
        }
    }

    void argmax(const Tensor& x, const Tensor& out) override {
        CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kI32, "argmax: x must be f32 and out i32");
        CERA_CHECK(out.n_elements() >= x.rows(), "argmax: out holds %lld ids for %lld rows",
                   (long long)out.n_elements(), (long long)x.rows());
        argmax_rows_host(x.as<const float>(), x.rows(), x.ne[0], out.as<int32_t>());
    }

    void top_logits(const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) override {
        const int64_t n_g = top_logits_checked(x, m, gather, out);
        top_logits_host(x.as<const float>(), x.n_elements(), m, n_g ? gather.as<const int32_t>() : nullptr, n_g,
                        out.as<int32_t>());
    }

    void moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                 const Tensor& ids, const Tensor& weights, const Tensor& out) override {
        cpu::moe_experts(table_, &pool_, observer_, moe_, x, gate_exps, up_exps, down_exps, ids, weights, {}, out);
    }

    void moe_ffn_lora(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                      const Tensor& ids, const Tensor& weights, std::span<const MoeLoraSegment> segs,
                      const Tensor& out) override {
        cpu::moe_experts(table_, &pool_, observer_, moe_, x, gate_exps, up_exps, down_exps, ids, weights, segs, out);
    }

 private:
    static constexpr size_t kLazyBufferBytes = size_t(1) << 20;
    static constexpr size_t kCopiedWeightBytes = size_t(1) << 20;
    static constexpr uintptr_t kFolioBytes = uintptr_t(2) << 20;

    static Tensor weight_view(GgmlType type, std::span<const int64_t> ne, const void* host) {
        CERA_CHECK(ne.size() <= 4);
        Tensor t;
        t.data = const_cast<void*>(host);
        t.type = type;
        for (size_t i = 0; i < 4; ++i) t.ne[i] = i < ne.size() ? ne[i] : 1;
        return t;
    }

    void allow_batch_variance(const Tensor& w) override { batch_variant_.insert(w.data); }

    // A matrix (dims == 2) of a type the kernels keep in a repacked layout gets its packed copy now;
    // returns whether.
    bool pack(const Tensor& w, size_t dims, bool immutable) {
        if (dims != 2 || !cpu::register_weight(table_, w.type, w.data, w.ne[1], w.ne[0], immutable)) return false;
        packed_.push_back(w.data);
        return true;
    }

    bool table_repacks() const {
        return std::any_of(std::begin(table_.packed), std::end(table_.packed),
                           [](const auto& k) { return k.fn != nullptr; });
    }

    // Drops the file's pages of [host, host + bytes), whose content the backend now holds itself. A fault
    // on a file mapping can map more than the page it reads: fault-around maps up to 64 KiB, and a tmpfs
    // file maps a whole large folio (up to a PMD, 2 MiB), so reading one tensor may map pages of a
    // neighbour whose pages were dropped before. The held ranges within kFolioBytes are dropped again.
    void hold_mapped(const void* host, size_t bytes) {
        const uintptr_t a = uintptr_t(host), b = a + bytes;
        held_.emplace(a, b);
        const uintptr_t lo = a > kFolioBytes ? a - kFolioBytes : 0, hi = b + kFolioBytes;
        auto it = held_.upper_bound(lo);
        if (it != held_.begin()) --it;
        for (; it != held_.end() && it->first < hi; ++it)
            if (it->second > lo) release_mapped_pages(reinterpret_cast<const void*>(it->first), it->second - it->first);
    }

    static void release_buffer(void* p, size_t mapped_bytes) {
        if (mapped_bytes > 0)
            unmap_pages(p, mapped_bytes);
        else
            std::free(p);
    }

    static void store_row(const float* src, const Tensor& cache, int64_t row, int64_t width) {
        uint8_t* dst = static_cast<uint8_t*>(cache.data) + size_t(row) * row_size(cache.type, width);
        if (cache.type == GgmlType::kF32)
            std::memcpy(dst, src, size_t(width) * sizeof(float));
        else
            quantize_row_ref(cache.type, src, dst, width);  // F16, BF16 round to nearest even; blocks
    }

    static cpu_attention::Elem cache_elem(const Tensor& cache) {
        switch (cache.type) {
            case GgmlType::kF32: return cpu_attention::Elem::kF32;
            case GgmlType::kF16: return cpu_attention::Elem::kF16;
            case GgmlType::kBF16: return cpu_attention::Elem::kBF16;
            case GgmlType::kQ8_0: return cpu_attention::Elem::kQ8_0;
            case GgmlType::kQ4_0: return cpu_attention::Elem::kQ4_0;
            case GgmlType::kQ3_KV: return cpu_attention::Elem::kQ3_KV;
            case GgmlType::kQ4_KV:
                return cpu_attention::Elem::kQ4_KV;
            case GgmlType::kQ4_CH:
                return cpu_attention::Elem::kQ4_CH;
            default: break;
        }
        throw_error(ErrorCode::kUnsupported, "attention: a KV cache of type %s", type_name(cache.type));
    }

    // Runs body(r0, r1) over [0, rows), split over the pool when rows * cost_per_row is large.
    template <class F>
    void for_rows(int64_t rows, int64_t cost_per_row, F&& body) {
        if (pool_.size() == 1 || rows < 2 || rows * cost_per_row < kParallelMinWork) {
            body(0, rows);
            return;
        }
        pool_.parallel_for(rows, [&](int64_t r0, int64_t r1, int) { body(r0, r1); });
    }

    static void grow(std::vector<float>& v, size_t n) {
        if (v.size() < n) v.resize(n);
    }

    const cpu::KernelTable& table_;  // the kernels of BackendOptions::cpu_isa
    ThreadPool pool_;
    std::unordered_map<void*, size_t> buffers_;  // alloc()'s buffers: bytes mapped, or 0 for the heap
    std::vector<const void*> packed_;            // weights registered with cpu::register_weight
    std::unordered_set<const void*> batch_variant_;  // weights whose products may take tile kernels
    std::vector<void*> copied_;                  // heap copies of small mapped weights
    std::map<uintptr_t, uintptr_t> held_;        // [begin, end) of mapped weights held in a packed or heap copy
    // Scratch, grown to the largest batch seen and then reused (no allocation in steady state).
    std::vector<float> rope_cs_, attn_scratch_, conv_pad_, route_scratch_, lora_tmp_;
    std::vector<float> open_keys_;                // Q4_CH: the step's keys as the open groups hold them
    std::vector<cpu_attention::Args> attn_seqs_;  // attention(): one a sequence
    std::vector<int64_t> attn_first_, attn_units_;
    std::vector<float> enc_k_, enc_vt_, enc_q_, enc_s_;  // attention_full: one head's K, Vᵀ, Q, a block of S
    std::vector<uint8_t> embed_row_;                     // one table row unpacked from its packed copy
    cpu::MoeScratch moe_;
    MatmulObserver* observer_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int n_threads, CpuIsa isa, MatmulObserver* observer) {
    cpu::Isa want = cpu::active_isa();
    switch (isa) {
        case CpuIsa::kAuto:
            break;
        case CpuIsa::kRef:
            want = cpu::Isa::kRef;
            break;
        case CpuIsa::kAvx2:
            want = cpu::Isa::kAvx2;
            break;
        case CpuIsa::kAvx512:
            want = cpu::Isa::kAvx512;
            break;
        case CpuIsa::kAmx:
            want = cpu::Isa::kAmx;
            break;
    }
    if (!cpu::isa_supported(want))
        throw_error(ErrorCode::kDevice, "cpu kernels %s: not supported by this CPU", cpu::isa_name(want));
    return std::make_unique<CpuBackend>(n_threads, want, observer);
}

}  // namespace cera
