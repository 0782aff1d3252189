// The compute-device interface the model layer calls: CPU executes each op at
// once; CUDA queues it on a stream (and may record a whole decode step as a
// graph, see step_begin). Designed for both from the start:
//   - weights are uploaded once and stay resident in their GGUF types
//     (CPU: views into the mapped file, no copy; a matrix the matmul keeps
//     repacked has its copy in place of the file's pages);
//   - activations, KV caches and recurrent states live in device buffers
//     made by alloc();
//   - every op works on a whole batch of tokens of one sequence;
//   - nothing inside a step needs the host: per-token values that change from
//     one decode step to the next (token ids, positions) reach the ops only
//     through device tensors written with write() before the step, never as
//     host scalars. Host scalars passed to ops (eps, scales, shapes) are the
//     same for every step of a given n_tokens.
// Tensors are contiguous, row-major, rows of ne[0] elements (GGUF order:
// ne[0] innermost). Shapes in the comments below are written [outer, inner],
// i.e. [ne[1], ne[0]], using the glossary n_embd, n_head, n_head_kv, head_dim,
// n_ff, n_vocab, n_ctx, n_tokens, n_layer.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backends/top_logits_host.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/fifo_mutex.h"

namespace cera {

enum class DeviceKind { kCpu, kCuda };
const char* device_kind_name(DeviceKind kind);  // "cpu", "cuda"

// A view of device memory. Not owning; alloc()/free() own buffers.
struct Tensor {
    void* data = nullptr;            // device pointer (plain host pointer on the CPU backend)
    GgmlType type = GgmlType::kF32;  // element type
    int64_t ne[4] = {0, 1, 1, 1};    // elements per dimension, ne[0] innermost and contiguous
    DeviceKind device = DeviceKind::kCpu;

    explicit operator bool() const { return data != nullptr; }
    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t rows() const { return ne[1] * ne[2] * ne[3]; }  // product of ne[1..3]
    size_t row_bytes() const { return row_size(type, ne[0]); }
    size_t n_bytes() const { return row_bytes() * size_t(rows()); }
    template <class T>
    T* as() const {
        return static_cast<T*>(data);
    }

    // Rows [r0, r0 + n) of this tensor seen as 2-D [rows(), ne[0]].
    Tensor row_slice(int64_t r0, int64_t n) const {
        Tensor t = *this;
        t.data = static_cast<uint8_t*>(data) + size_t(r0) * row_bytes();
        t.ne[1] = n;
        t.ne[2] = t.ne[3] = 1;
        return t;
    }
    // The same memory seen with another shape (same element count).
    Tensor reshaped(int64_t ne0, int64_t ne1 = 1, int64_t ne2 = 1, int64_t ne3 = 1) const {
        Tensor t = *this;
        t.ne[0] = ne0, t.ne[1] = ne1, t.ne[2] = ne2, t.ne[3] = ne3;
        return t;
    }
};

enum class RopeMode {
    kNone,  // no rotation
    kNorm,  // rotate adjacent pairs (2i, 2i+1): llama, granite
    kNeox,  // rotate pairs (i, i + n_rot/2): qwen2, qwen3, lfm2
};

struct RopeParams {
    RopeMode mode = RopeMode::kNone;
    int n_rot = 0;  // rotated dimensions per head (<= head_dim, even); the rest pass through
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;  // positions are multiplied by this (linear scaling)
    Tensor freq_factors;      // f32 [n_rot/2] or empty: theta_i is divided by freq_factors[i] (llama-3 rope_freqs)
};

// KV caches as pools of blocks shared by several sequences: position p of the sequence of query t
// is cache row block_table[seq[t]][p / block_size] * block_size + p % block_size. The queries of one
// sequence are consecutive rows of the batch. Empty (no block_table): one sequence, position p at row p.
struct KvPaging {
    Tensor seq;          // i32 [n_tokens]: the sequence (row of block_table) of each query
    Tensor block_table;  // i32 [n_seq, max_blocks]: the pool block of each block of a sequence's positions
    int block_size = 0;  // rows a block, a power of two
    // Host: the number of queries of each sequence, in batch order (summing to n_tokens), so that a
    // device backend can launch its kernels by sequence without reading `seq` back.
    std::span<const int32_t> runs;
    explicit operator bool() const { return bool(block_table); }
};

struct AttentionParams {
    int n_head = 0;     // query heads
    int n_head_kv = 0;  // key/value heads; query head h reads kv head h / (n_head / n_head_kv)
    int head_dim = 0;
    float scale = 0.0f;      // softmax scale, usually 1/sqrt(head_dim)
    int sliding_window = 0;  // > 0: query at position p sees keys at positions (p - window, p]
    KvPaging paging;
    // Q4_CH keys (kivi4, core/quant/kv_groups.h): a query reads the keys of its own group of 64 positions
    // as Q8_0 rows, from the step's keys (k_new: f32 [n_tokens, n_head_kv * head_dim], as given to kv_store)
    // and the cache's open groups (LayerCache::k_open). Empty for the other types.
    Tensor k_new, k_open;
};

enum class MoeGating { kSoftmax, kSigmoid };

struct MoeParams {
    int n_expert = 0;
    int n_expert_used = 0;  // k
    MoeGating gating = MoeGating::kSoftmax;
    bool normalize_weights = true;  // divide the chosen k weights by their sum
    float weights_scale = 1.0f;     // multiplies the (normalised) weights
};

enum class GeluKind {
    kTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): SigLIP's gelu_pytorch_tanh
    kErf,   // 0.5 x (1 + erf(x / sqrt(2))): the exact GELU (LFM2-VL's projector)
};

class Backend;
// The references of the encoder ops (Backend::layer_norm, gelu, attention_full) on host memory: plain
// loops, the specification every backend's kernel is checked against. Rows [r0, r1) of x / q only, so
// that a caller may split the rows over threads.
//   layer_norm: x, out f32 [rows, n]; w, b f32 [n] or null.
void layer_norm_rows_host(const float* x, int64_t n, const float* w, const float* b, float eps, float* out, int64_t r0,
                          int64_t r1);
void gelu_host(const float* x, float* out, int64_t n, GeluKind kind);
//   attention_full: q, k, v, out f32 [n_tokens, n_head * head_dim]; query rows [r0, r1) of every head.
void attention_full_host(const float* q, const float* k, const float* v, int64_t n_tokens, int n_head, int head_dim,
                         float scale, float* out, int64_t r0, int64_t r1);
// The defaults of those ops: read the operands to the host, run the reference, write out back.
void layer_norm_via_host(Backend& be, const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out);
void gelu_via_host(Backend& be, const Tensor& x, GeluKind kind, const Tensor& out);
void attention_full_via_host(Backend& be, const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int head_dim,
                             float scale, const Tensor& out);
// Backend::argmax's default: synchronize, read x, argmax_rows_host, write out.
void argmax_via_host(Backend& be, const Tensor& x, const Tensor& out);
// Backend::argmax_feed's default: argmax(), then the pick and the next position through the host.
void argmax_feed_via_host(Backend& be, const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos);
// Token counts for Backend::warm_up_products: from 16 to `max` at four a doubling (n, 5n/4, 3n/2, 7n/4
// for n a power of two), and `max`. Readying the products for these costs a few dozen products a shape
// where every count costs hundreds; a library picks one kernel for a range of counts, so a step of a
// count between two of these mostly finds its kernel loaded.
inline std::vector<int64_t> product_count_ladder(int64_t max) {
    std::vector<int64_t> out;
    for (int64_t p = 16; p <= max; p *= 2)
        for (int64_t q : {4, 5, 6, 7})
            if (p * q / 4 <= max) out.push_back(p * q / 4);
    if (max > 0 && (out.empty() || out.back() != max)) out.push_back(max);
    return out;
}
// The ints of one Backend::short_conv_segments descriptor.
constexpr int kConvSegInts = 6;
// Backend::short_conv_segments's default.
void short_conv_segments_via_host(Backend& be, const Tensor& bcx, const Tensor& w, const Tensor& states,
                                  const Tensor& out, const Tensor& segs, const Tensor& snaps, const Tensor& snapshots);
// One group of rows of a grouped LoRA product (Backend::lora_segments): rows [start, start + n) of x
// and y go through one adapter's A and B for one projection.
struct LoraSegment {
    int64_t start = 0, n = 0;  // rows of x and y
    Tensor a;                  // f32 or f16 [r, k]   (GGUF ne {k, r}): the down projection A
    Tensor bt;                 // like a, [r, n_out]  (GGUF ne {n_out, r}): the up projection B, transposed, so
                               // that B·t is r scaled row additions (no per-output reductions)
    float scale = 0.0f;        // the adapter's scale times alpha / r
};
// One group of rows of the MoE experts' products with LoRA deltas (Backend::moe_ffn_lora): rows
// [start, start + n) of the step add, to each adapted product P (0 gate, 1 up, 2 down) of a routed expert
// e, scale[P] · B_e (A_e in), where in is that product's input (x, or the SwiGLU of gate and up).
struct MoeLoraSegment {
    int64_t start = 0, n = 0;
    Tensor a[3];   // f32 or f16 [n_expert, r, k] (GGUF ne {k, r, n_expert}); empty: P is not adapted
    Tensor bt[3];  // like a[P], [n_expert, r, n_out] (GGUF ne {n_out, r, n_expert}): each expert's B transposed
    float scale[3] = {0.0f, 0.0f, 0.0f};
};
// Backend::moe_ffn_lora's argument checks (throws kInvalidArgument): each adapted product's A and Bᵀ F32
// or F16 in the shapes of its expert weight, each segment's rows within the n_rows of the call.
inline void moe_lora_checked(std::span<const MoeLoraSegment> segs, const Tensor& gate_exps, const Tensor& up_exps,
                             const Tensor& down_exps, int64_t n_rows) {
    for (const MoeLoraSegment& sg : segs)
        for (int p = 0; p < 3; ++p) {
            const Tensor& w = p == 0 ? gate_exps : p == 1 ? up_exps : down_exps;
            if (!sg.a[p]) continue;
            const auto f32_or_f16 = [](const Tensor& t) {
                return t.type == GgmlType::kF32 || t.type == GgmlType::kF16;
            };
            CERA_CHECK(
                f32_or_f16(sg.a[p]) && f32_or_f16(sg.bt[p]) && sg.a[p].ne[0] == w.ne[0] && sg.a[p].ne[2] == w.ne[2] &&
                    sg.bt[p].ne[0] == w.ne[1] && sg.bt[p].ne[1] == sg.a[p].ne[1] && sg.bt[p].ne[2] == w.ne[2] &&
                    sg.a[p].ne[1] <= INT32_MAX && sg.start >= 0 && sg.n >= 0 && sg.start + sg.n <= n_rows,
                "moe_ffn_lora: product %d, a {%lld, %lld, %lld}, bt {%lld, %lld, %lld}, experts {%lld, %lld, "
                "%lld}, rows %lld+%lld of %lld",
                p, (long long)sg.a[p].ne[0], (long long)sg.a[p].ne[1], (long long)sg.a[p].ne[2],
                (long long)sg.bt[p].ne[0], (long long)sg.bt[p].ne[1], (long long)sg.bt[p].ne[2], (long long)w.ne[0],
                (long long)w.ne[1], (long long)w.ne[2], (long long)sg.start, (long long)sg.n, (long long)n_rows);
        }
}
// The reference of Backend::lora_segments on host memory: y[t] += scale_i * B_i (A_i x[t]) for every
// row t of each segment i, in segment order. x: f32 [n_tokens, k]; y: f32 [n_tokens, n_out]; the a and b
// of each segment point at host memory.
void lora_segments_host(const float* x, int64_t k, std::span<const LoraSegment> segs, float* y, int64_t n_out);
// Backend::lora_segments's default: reads x, y and every segment's A and Bᵀ to the host, runs
// lora_segments_host there and writes y back.
void lora_segments_via_host(Backend& be, const Tensor& x, std::span<const LoraSegment> segs, const Tensor& y);
// Backend::top_logits's default: synchronize, read x and gather, top_logits_host, write out (inline,
// below, so that a device backend can fall back to it without a link dependency on this library).
inline void top_logits_via_host(Backend& be, const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out);
// Backend::top_logits's argument checks (throws kInvalidArgument); returns gather's element count.
inline int64_t top_logits_checked(const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) {
    const int64_t n_g = gather ? gather.n_elements() : 0;
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kI32 && (!gather || gather.type == GgmlType::kI32) &&
                   m >= 0 && out.n_elements() >= 1 + 2 * int64_t(m) + n_g,
               "top_logits: x f32, gather and out i32 with 1 + 2 m + n_g elements");
    return n_g;
}

// Device memory a backend holds, by what it holds (bytes).
struct MemoryUse {
    size_t weights = 0;  // uploaded weights, as stored on the device
    size_t buffers = 0;  // alloc(): KV caches, recurrent states, activations, outputs
    size_t scratch = 0;  // the backend's own working memory (kernel scratch, library workspaces)
    size_t total() const { return weights + buffers + scratch; }
};

class Backend {
 public:
    virtual ~Backend() = default;
    virtual DeviceKind kind() const = 0;
    virtual std::string description() const = 0;  // e.g. "cpu avx512, 2 threads"

    // Held by a sequence while it runs ops: the backends keep per-device scratch (rope
    // tables, attention tiles, graph recordings) shared by every sequence on them. Taken in turn:
    // a long holder gives it to a waiter between its parts (FifoMutex::contended).
    FifoMutex& exec_mutex() { return exec_mu_; }

    // ---------------------------------------------------------------- memory
    // Makes a weight resident on the device in its own type. `host` must stay valid for the
    // backend's lifetime: the CPU backend returns a view of it without copying (keep the GGUF mapped).
    virtual Tensor upload_weight(GgmlType type, std::span<const int64_t> ne, const void* host) = 0;
    // upload_weight() of bytes in a read-only private file mapping that outlives the backend (a GGUF
    // opened by path): the backend may drop the mapped pages of what it keeps in a form of its own
    // (release_mapped_pages), so that the weights are held once. The default is upload_weight().
    virtual Tensor upload_mapped_weight(GgmlType type, std::span<const int64_t> ne, const void* host) {
        return upload_weight(type, ne, host);
    }
    // Lets products with weight w trade batch invariance for speed: a row's result may then depend on how
    // many rows a product has (the CPU's AMX tiles take products of many). The text models, whose batched
    // and lone outputs agree bit for bit on the CPU (docs/batching.md), leave their weights alone; the
    // vision encoder marks its own. No effect on a backend without such kernels.
    virtual void allow_batch_variance(const Tensor& w) { (void)w; }
    // A zero-filled device buffer; released by free() or when the backend is destroyed.
    virtual Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne) = 0;
    virtual void free(Tensor& t) = 0;  // t becomes empty
    // What the backend holds now. The CPU backend reports nothing (its memory is the process's).
    virtual MemoryUse memory_use() const { return {}; }
    // Host -> device copy of n_bytes at a byte offset into dst. The host memory may be reused on return.
    virtual void write(const Tensor& dst, const void* host, size_t n_bytes, size_t offset = 0) = 0;
    // Device -> host copy; waits for the queued work first.
    virtual void read(void* host, const Tensor& src, size_t n_bytes, size_t offset = 0) = 0;
    // Device -> device copy of src.n_bytes() bytes (dst at least as large).
    virtual void copy(const Tensor& dst, const Tensor& src) = 0;
    virtual void zero(const Tensor& t) = 0;
    // Waits for every queued op.
    virtual void synchronize() = 0;
    // Small reads that do not wait for work queued after them: read_async() queues a copy of src's first
    // n_bytes (<= kAsyncReadMax) and returns a ticket; read_wait(ticket, host) waits for that copy only
    // and copies the bytes out. A ticket is valid until kAsyncReads later read_async() calls. The
    // default reads at once. asynchronous(): whether ops run behind the host (queued on a device), so
    // that work queued ahead overlaps the host's.
    static constexpr size_t kAsyncReadMax = 64;
    static constexpr int kAsyncReads = 4;
    virtual int read_async(const Tensor& src, size_t n_bytes) {
        CERA_CHECK(n_bytes <= kAsyncReadMax, "read_async: %zu bytes (at most %zu)", n_bytes, kAsyncReadMax);
        const int t = async_next_;
        async_next_ = (async_next_ + 1) % kAsyncReads;
        read(async_bytes_[t], src, n_bytes);
        async_n_[t] = n_bytes;
        return t;
    }
    virtual void read_wait(int ticket, void* host) {
        CERA_CHECK(ticket >= 0 && ticket < kAsyncReads, "read_wait: ticket %d", ticket);
        std::memcpy(host, async_bytes_[ticket], async_n_[ticket]);
    }
    virtual bool asynchronous() const { return false; }
    // read_async of the pick argmax_feed wrote to `out` (one i32), queued right after the step that fed
    // it: a backend may deliver it without a copy (CUDA: a mailbox the kernel writes). read_wait() as
    // for read_async().
    virtual int read_fed_async(const Tensor& out) { return read_async(out, sizeof(int32_t)); }

    // --------------------------------------------------------- decode graphs
    // The model brackets the ops of one step with step_begin(key) / step_end(). A backend that
    // has recorded a step with the same key may replay it and return true: the caller then skips
    // the ops and step_end(). Tensors and host scalars of two steps with one key must be identical
    // (the model keys by state and n_tokens). The CPU backend never records.
    virtual bool step_begin(uint64_t key) { return false; }
    virtual void step_end() {}

    // ------------------------------------------------------------------- ops
    // out[t] = scale * dequantize(table row ids[t])
    //   table: [n_vocab, n_embd] any weight type; ids: i32 [n_tokens]; out: f32 [n_tokens, n_embd]
    virtual void embed(const Tensor& table, const Tensor& ids, float scale, const Tensor& out) = 0;

    // out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, for every row r
    //   x, out: f32 [rows, n] (out may alias x); w: f32 [n], or empty for no weight
    virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) = 0;

    // out[t][r] = sum_k W[r][k] * x[t][k] (+ bias[r])
    //   w: [rows, k] (GGUF ne {k, rows}) any weight type; x: f32 [n_tokens, k];
    //   bias: f32 [rows] or empty; out: f32 [n_tokens, rows] (must not alias x)
    virtual void matmul(const Tensor& w, const Tensor& x, const Tensor& bias, const Tensor& out) = 0;

    // In place on x: f32 [n_tokens, n_head * head_dim]. For each token t and head h: optional
    // RMSNorm of the head vector with weight norm_w (f32 [head_dim]; empty = no norm), then RoPE at
    // position pos[t] (pos: i32 [n_tokens]).
    virtual void norm_rope(const Tensor& x, int n_head, int head_dim, const Tensor& norm_w, float eps,
                           const Tensor& pos, const RopeParams& rope) = 0;

    // k_cache[pos[t]] = k[t], v_cache[pos[t]] = v[t], converting to the cache type.
    //   k, v: f32 [n_tokens, n_head_kv * head_dim]; k_cache, v_cache: [n_ctx, n_head_kv * head_dim]
    //   k_open: Q4_CH keys' open groups (LayerCache::k_open, kv_groups::store), else empty
    virtual void kv_store(const Tensor& k, const Tensor& v, const Tensor& pos, const Tensor& k_cache,
                          const Tensor& v_cache, const Tensor& k_open = {}) = 0;

    // Causal GQA softmax attention of a batch of queries of one sequence over its cache:
    // query t sees cache rows 0..pos[t] (window-limited when p.sliding_window > 0).
    //   q: f32 [n_tokens, n_head * head_dim]; k_cache, v_cache: [n_ctx, n_head_kv * head_dim] (F32 or F16);
    //   pos: i32 [n_tokens]; out: f32 [n_tokens, n_head * head_dim]
    virtual void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                           const AttentionParams& p, const Tensor& out) = 0;

    // LFM2 gated short convolution over a chunk of one sequence, with its rolling state:
    //   bx = B ⊙ X;  pad = [state; bx];  conv[t][c] = sum_j w[c][j] * pad[t + j][c];  out = C ⊙ conv;
    //   state = last L-1 rows of pad.
    //   bcx: f32 [n_tokens, 3 * n_embd], split in this order: B, C, X; w: f32 [n_embd, L] (GGUF ne {L, n_embd});
    //   state: f32 [L - 1, n_embd] (read and updated); out: f32 [n_tokens, n_embd]
    //   state_prev: f32 like state, or empty; when given, it receives state's content from before the
    //   update (a decode step that has to be undone restores the state from it).
    virtual void short_conv(const Tensor& bcx, const Tensor& w, const Tensor& state, const Tensor& out,
                            const Tensor& state_prev = {}) = 0;

    // short_conv over the chunks of several sequences in one call (a step of the batched engine):
    // segment i is rows [start, start + n) of bcx and out, with its rolling state in row `slot` of
    // `states`; after the segment's first `end` tokens, for each of its snapshots, that state is also
    // copied to row `row` of `snapshots`.
    //   bcx: f32 [n_tokens, 3 * n_embd]; w: f32 [n_embd, L]; states: f32 [n_slots, (L - 1) * n_embd]
    //   (each row laid out as short_conv's state); out: f32 [n_tokens, n_embd];
    //   segs: i32 [n_seg, kConvSegInts]: start, n, slot, first snapshot, snapshot count, source
    //   (segments in row order); source -1: the state before the segment is row `slot` of states, else
    //   it is row `source` of snapshots (a rewind to a kept state without a copy; no segment of the call
    //   may write that row as a snapshot);
    //   snaps: i32 [n_snaps, 2]: end (1..n), row (a segment's in increasing `end`), empty when none;
    //   snapshots: f32 [n_rows, (L - 1) * n_embd], empty when there are no snapshots
    // The default reads segs and snaps to the host and runs short_conv and copy per piece.
    virtual void short_conv_segments(const Tensor& bcx, const Tensor& w, const Tensor& states, const Tensor& out,
                                     const Tensor& segs, const Tensor& snaps, const Tensor& snapshots) {
        short_conv_segments_via_host(*this, bcx, w, states, out, segs, snaps, snapshots);
    }

    // The LoRA deltas of one projection over a step whose rows belong to several adapters (grouped,
    // as Punica's and S-LoRA's segmented products are): y[t] += scale_i * B_i · (A_i · x[t]) for every
    // row t of segment i. Segments come in any order and may cover a row more than once (several
    // adapters on one sequence: their deltas add up); rows in no segment are left alone.
    //   x: f32 [n_tokens, k]; y: f32 [n_tokens, n_out] (the base product, updated in place; must not
    //   alias x); segs: host descriptors, each a [r_i, k] and bt [r_i, n_out] on this device (f32 or f16
    //   each).
    // The default goes through the host (lora_segments_via_host); a device backend should override it.
    virtual void lora_segments(const Tensor& x, std::span<const LoraSegment> segs, const Tensor& y) {
        lora_segments_via_host(*this, x, segs, y);
    }

    // The vision encoder's ops (SigLIP2 ViT and the LFM2-VL projector). Their defaults go through the host
    // (the *_via_host functions above); a device backend should override them.
    // out[r] = (x[r] - mean(x[r])) / sqrt(var(x[r]) + eps) * w + b
    //   x, out: f32 [rows, n] (out may alias x); w, b: f32 [n] or empty (1 and 0)
    virtual void layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, float eps, const Tensor& out) {
        layer_norm_via_host(*this, x, w, b, eps, out);
    }
    // out = gelu(x), elementwise;  x, out: f32, same shape (out may alias x)
    virtual void gelu(const Tensor& x, GeluKind kind, const Tensor& out) { gelu_via_host(*this, x, kind, out); }
    // Bidirectional multi-head softmax attention of a set of tokens (the patches of one image): every
    // query sees every key, no mask, no cache.
    //   q, k, v: f32 [n_tokens, n_head * head_dim]; out: f32 [n_tokens, n_head * head_dim] (must not alias q, k, v)
    virtual void attention_full(const Tensor& q, const Tensor& k, const Tensor& v, int n_head, int head_dim,
                                float scale, const Tensor& out) {
        attention_full_via_host(*this, q, k, v, n_head, head_dim, scale, out);
    }

    // out = silu(gate) ⊙ up;  gate, up, out: f32 [n_tokens, n_ff] (out may alias gate or up)
    virtual void swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;

    // out = a + scale * b;  a, b, out: f32, same shape (out may alias a or b)
    virtual void add(const Tensor& a, const Tensor& b, float scale, const Tensor& out) = 0;

    // x *= s;  x: f32
    virtual void scale(const Tensor& x, float s) = 0;

    // Each head of head_dim elements of x (f32 [rows, n_heads * head_dim]) through the rotated KV
    // caches' rotation (core/rotation.h), or its inverse.
    virtual void rotate_heads(const Tensor& x, int head_dim, bool inverse) = 0;

    // MoE router: p = gating(logits); the k experts with the largest p + bias are chosen;
    // their weights are p (renormalised to sum 1 when p.normalize_weights) times p.weights_scale.
    //   logits: f32 [n_tokens, n_expert]; bias: f32 [n_expert] or empty (affects the choice only);
    //   ids: i32 [n_tokens, k]; weights: f32 [n_tokens, k]
    virtual void moe_route(const Tensor& logits, const Tensor& bias, const MoeParams& p, const Tensor& ids,
                           const Tensor& weights) = 0;

    // MoE SwiGLU experts: out[t] = sum_j weights[t][j] * down_e(silu(gate_e x[t]) ⊙ up_e x[t]), e = ids[t][j].
    //   x: f32 [n_tokens, n_embd]; gate_exps, up_exps: [n_expert, n_ff_exp, n_embd] (ne {n_embd, n_ff_exp, n_expert});
    //   down_exps: [n_expert, n_embd, n_ff_exp] (ne {n_ff_exp, n_embd, n_expert}); ids, weights: [n_tokens, k];
    //   out: f32 [n_tokens, n_embd] (overwritten; must not alias x)
    virtual void moe_ffn(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                         const Tensor& ids, const Tensor& weights, const Tensor& out) = 0;

    // moe_ffn with LoRA deltas on the experts' products (MoeLoraSegment). A backend without it throws
    // kUnsupported.
    virtual void moe_ffn_lora(const Tensor& x, const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps,
                              const Tensor& ids, const Tensor& weights, std::span<const MoeLoraSegment> segs,
                              const Tensor& out) {
        (void)x, (void)gate_exps, (void)up_exps, (void)down_exps, (void)ids, (void)weights, (void)segs, (void)out;
        throw_error(ErrorCode::kUnsupported, "LoRA on MoE experts is not supported on this device");
    }

    // out[r] = the lowest i with x[r][i] equal to the largest non-NaN value of row r (0 when every value
    // is NaN): exactly the token a greedy Sampler picks from that row, so a decode step can end in the
    // chosen id and copy back 4 bytes instead of the logits.
    //   x: f32 [rows, n] (n >= 1); out: i32 [rows]
    // The default synchronizes, reads x to the host, computes there (argmax_rows_host) and writes out;
    // it is correct on any backend but moves the whole of x, so a device backend should override it.
    // (Defined inline, through argmax_via_host, so that Backend keeps no key function: its vtable and
    // type info are then emitted wherever they are used, whatever order the static libraries link in.)
    virtual void argmax(const Tensor& x, const Tensor& out) { argmax_via_host(*this, x, out); }

    // argmax() of one row, whose pick then becomes the next step's input: out[0] = ids[0] = the pick and
    // pos[0] = pos[n - 1] + 1 (n = pos's element count), so that a greedy decode can queue its next step
    // before the host has seen the pick. x: f32 [n_vocab]; out, ids, pos: i32. The default goes through
    // argmax() and the host.
    virtual void argmax_feed(const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos) {
        argmax_feed_via_host(*this, x, out, ids, pos);
    }

    // Readies the batched products of every shape run since the last call for each of `token_counts`, so
    // that a later step of such a size does not pay a library's first use of it (CUDA: cuBLAS loads the
    // kernel it picks for a size when that size first runs). Called at load, after a warm-up.
    virtual void warm_up_products(std::span<const int64_t> token_counts) { (void)token_counts; }

    // The m best entries of one row of logits, for a sampler whose chain starts with a top-k: the
    // candidates are the entries above -inf (NaN never), ordered by value, descending, then by index,
    // ascending (the order Sampler ranks by), and the first m of them are kept. Also the values at
    // `gather`'s indices (the penalty window's tokens; an index outside the row gives NaN).
    //   x: f32 [n]; gather: i32 [n_g] (may be empty); out: i32 [>= 1 + 2 m + n_g], written as
    //   out[0] = c = min(m, candidates); out[1 + j] = index j of the kept, j < c; out[1 + m + j] = its
    //   value (f32 bits, as in x); out[1 + 2 m + g] = x[gather[g]] (f32 bits).
    // The default goes through the host (top_logits_via_host); a device backend should override it.
    virtual void top_logits(const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) {
        top_logits_via_host(*this, x, m, gather, out);
    }

 private:
    FifoMutex exec_mu_;
    // read_async()'s default: the bytes of each ticket.
    uint8_t async_bytes_[kAsyncReads][kAsyncReadMax] = {};
    size_t async_n_[kAsyncReads] = {};
    int async_next_ = 0;
};

// Kernel variants a test forces on the CUDA backend where its launch table would pick another for the
// shapes at hand. Each is the table's choice for some other type or shape, so tests compare them on
// the same data; production code leaves these at their defaults.
struct CudaVariants {
    bool glu_registers = false;      // gate/up pairs on the register kernel, never the staged one
    bool glu_narrow = false;         // the staged pair reads 16-byte items for every type
    bool pro_smem = false;           // the staged pair's RMSNorm prologue keeps x in shared memory
    int norm_prologues = -1;         // mask of the launches that take a one-token norm in their prologue
                                     // (cuda::ProKind; 0: the norm in the residual product's launch)
    bool fuse_all_products = false;  // q/k/v + RoPE + store and in_proj + conv fused for every type
    bool qkv_head_blocks = false;    // the fused q/k/v launch's norm, RoPE and store by one warp a head
    bool head_register = false;      // LM-head-sized products on the register kernel, not the streamed one
    bool moe_per_slot = false;       // MoE batches as one product per (token, expert), not grouped tiles
    int moe_tile_rows = 0;           // grouped MoE rows a block (a multiple of 8 up to 128; 0: the table's)
};

struct CudaOptions {
    bool graphs = true;     // decode steps captured once and replayed as CUDA graphs (false: all eager)
    bool fuse = true;       // fused launches (false: one launch an op, the reference for the fused ones)
    bool profile = false;   // GPU and host time per decode step, printed when the backend is destroyed
    CudaVariants variants;  // tests only
};

// The kernel table a CPU backend computes with (backends/cpu/kernels.h). kAuto: the process's choice,
// the best this CPU has (or CERA_CPU_ISA's); the others must be supported by this CPU, else
// create_backend throws. Tests build a backend of each table side by side.
enum class CpuIsa { kAuto, kRef, kAvx2, kAvx512, kAmx };

// Sees the input rows of every product with a weight matrix: the statistics of `cera imatrix`. Called on
// the thread that issues the op, before the product.
class MatmulObserver {
 public:
    virtual ~MatmulObserver() = default;
    // x: f32 [n, w.ne[0]], multiplied by w (by its expert `expert` when w is a stacked MoE weight, else -1).
    virtual void observe(const Tensor& w, int64_t expert, const float* x, int64_t n) = 0;
};

struct BackendOptions {
    DeviceKind device = DeviceKind::kCpu;
    int n_threads = 0;               // CPU: 0 = physical cores
    CpuIsa cpu_isa = CpuIsa::kAuto;  // CPU: which kernel table
    int gpu_index = 0;               // CUDA: which device
    CudaOptions cuda;
    MatmulObserver* observer = nullptr;  // CPU: sees every weight product's input (null: none)
};

// The arg-max of Backend::argmax on host memory: x f32 [rows, n], out i32 [rows]. The reference for
// every backend's argmax, and the CPU backend's implementation.
void argmax_rows_host(const float* x, int64_t rows, int64_t n, int32_t* out);

// Throws cera::Error(kDevice) when the device is not available in this build or machine.
std::unique_ptr<Backend> create_backend(const BackendOptions& opts);

inline void top_logits_via_host(Backend& be, const Tensor& x, int32_t m, const Tensor& gather, const Tensor& out) {
    const int64_t n_g = top_logits_checked(x, m, gather, out);
    be.synchronize();
    std::vector<float> host(static_cast<size_t>(x.n_elements()));
    std::vector<int32_t> g(static_cast<size_t>(n_g)), o(static_cast<size_t>(1 + 2 * int64_t(m) + n_g));
    be.read(host.data(), x, host.size() * sizeof(float));
    if (n_g) be.read(g.data(), gather, g.size() * sizeof(int32_t));
    top_logits_host(host.data(), x.n_elements(), m, g.data(), n_g, o.data());
    be.write(out, o.data(), o.size() * sizeof(int32_t));
}

}  // namespace cera
