// The CUDA kernels' host-side launchers: plain C++ (no CUDA types), so that the backend
// (cuda_backend.cpp) and the layout code can be compiled by the host compiler. Every launcher
// queues work on `stream` and returns at once; none synchronises with the host, so a decode
// step made of them can be captured as a CUDA graph.
//
// Device image of a weight. Float weights (F32, F16, BF16) keep their GGUF bytes. Block-quantized
// weights are split on upload into two streams so that every quant load is 16 bytes and aligned:
//   [rows * nb blocks of q_bytes]   the quants (and, for Q6_K, the sub-scales), 16-byte multiples
//   [rows * nb blocks of m_bytes]   the per-block scales (fp16 d, min, packed K scales, Q5 high bits)
// with nb = k / block_elems blocks per row. K-quant blocks are rearranged (weight_image.cpp): Q4_K's
// as eight 32-element items with a byte scale and min each, Q5_K's qs as two halves with the 6-bit
// scales and mins regrouped per 64-element group, Q3_K's 6-bit scales unpacked. A row slice or an
// expert of a stacked MoE tensor is addressed by its first row (WeightRef::row0).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"

#if defined(__CUDACC__)
#define CERA_HD __host__ __device__
#else
#define CERA_HD
#endif

namespace cera::cuda {

using Stream = void*;  // a cudaStream_t

struct QuantLayout {
    int block_elems = 0;  // elements per block; 0: not a split-layout type
    int q_bytes = 0;      // quant-stream bytes per block (multiple of 16)
    int m_bytes = 0;      // scale-stream bytes per block
};

CERA_HD constexpr QuantLayout quant_layout(GgmlType t) {
    switch (t) {
        case GgmlType::kQ4_0: return {32, 16, 2};
        case GgmlType::kQ4_1: return {32, 16, 4};
        case GgmlType::kQ5_0: return {32, 16, 8};   // d, pad, qh (u32)
        case GgmlType::kQ5_1: return {32, 16, 8};   // d, m, qh (u32)
        case GgmlType::kQ8_0: return {32, 32, 2};
        case GgmlType::kQ4_K: return {256, 128, 20};  // m: d, dmin, 8 x (scale, min) (weight_image.cpp)
        case GgmlType::kQ5_K: return {256, 160, 16};  // q: qs[128], qh[32]
        case GgmlType::kQ6_K: return {256, 208, 2};   // q: ql[128], qh[64], scales[16]; m: d
        case GgmlType::kQ2_K: return {256, 64, 20};   // q: qs; m: d, dmin, scales[16]
        case GgmlType::kQ3_K: return {256, 96, 20};   // q: qs, hmask; m: d, pad, 16 signed scales
        case GgmlType::kIQ4_NL: return {32, 16, 2};   // q: qs; m: d
        case GgmlType::kIQ4_XS: return {256, 128, 8};  // q: qs; m: d, scales_h, scales_l
        default: return {};
    }
}
// Whether a quantized type's items decode their scales from a record shared by a 256-element block
// (Q5_K's packed 6-bit scales, Q6_K's sub-scales, Q2_K's and Q3_K's two scales an item), heavier per
// byte than Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / IQ4_NL and the 32-element items of Q4_K and IQ4_XS: the
// launch choices (rows a warp, the L1 / shared-memory split, the staged SwiGLU blocks) follow this.
CERA_HD constexpr bool heavy_scales(GgmlType t) {
    return t == GgmlType::kQ2_K || t == GgmlType::kQ3_K || t == GgmlType::kQ5_K || t == GgmlType::kQ6_K;
}
inline bool is_float_type(GgmlType t) { return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16; }
inline bool weight_type_supported(GgmlType t) { return is_float_type(t) || quant_layout(t).block_elems > 0; }

// The next kernel launched on this thread goes without programmatic dependent launch (a decode
// step's first kernel: common.cuh).
void pdl_skip_next();

// Kernel timeline trace (trace.cu): nothing unless built with CERA_CUDA_TRACE and run with
// CERA_CUDA_TRACE_FILE set.
void trace_start();
void trace_finish();

// Bytes of the device image of a [rows, k] weight.
size_t weight_image_bytes(GgmlType type, int64_t rows, int64_t k);
// GGUF bytes (rows of row_size(type, k)) -> device image layout, on the host.
void make_weight_image(GgmlType type, const void* gguf, int64_t rows, int64_t k, void* image);
// GGUF rows of a type without a kernel, expanded to F16 (round to nearest even) on the host; throws
// kUnsupported for a type the reference kernels cannot dequantize.
std::vector<uint8_t> expand_to_f16(GgmlType type, const void* gguf, int64_t rows, int64_t k);

struct WeightRef {
    GgmlType type = GgmlType::kF32;
    const void* image = nullptr;  // device image start
    int64_t image_rows = 0;       // rows in the whole image
    int64_t k = 0;                // elements per row
    int64_t row0 = 0;             // first row used
};

// The scale stream of a block-quantized image (null for float types): it follows the quants of all
// image_rows rows.
CERA_HD inline const uint8_t* scale_stream(const WeightRef& w) {
    const QuantLayout L = quant_layout(w.type);
    if (L.block_elems == 0) return nullptr;
    return static_cast<const uint8_t*>(w.image) + w.image_rows * (w.k / L.block_elems) * L.q_bytes;
}

// 8-bit activations for the quantized GEMV: per row, k int8 then k/32 float scales (x ~= d * q),
// row stride q8_row_bytes(k). k must be a multiple of 32.
CERA_HD inline int64_t q8_row_bytes(int64_t k) { return (k + k / 8 + 15) / 16 * 16; }
//   x: f32 [n_rows, ldx]
void quantize_q8(const float* x, int64_t n_rows, int64_t k, int64_t ldx, void* xq, Stream stream);

// y[j][r] = (accumulate ? y[j][r] : 0) + bias[r] + sum_k W_m[r][k] * x[j / x_div][k]
// for j < n_y, r < rows, with matrix m = ids ? ids[j] : 0 (W_m = rows [row0 + m * rows, ...)).
struct GemvArgs {
    WeightRef w;
    int64_t rows = 0;               // output rows per matrix
    int n_y = 1;                    // output vectors (tokens, or token x expert slots)
    const int32_t* ids = nullptr;   // [n_y] matrix index per output, or null (device memory)
    int x_div = 1;
    const float* x = nullptr;       // f32 [.., ldx]: used by float weights
    int64_t ldx = 0;
    const void* xq = nullptr;       // quantize_q8 rows: used by block-quantized weights
    const float* bias = nullptr;    // [rows] or null
    float* y = nullptr;             // [n_y, ldy]
    int64_t ldy = 0;
    bool accumulate = false;
    int rows_per_warp = 0;          // 0: chosen from the shape; else 2 or 4 (benchmarks)
    // SwiGLU pairs (gemv_glu, the gate's args): -1 the launch table's choice, else a variant a test
    // forces (CudaVariants): glu_stage 0 the register kernel, glu_wide 0 16-byte items, pro_xreg 0 the
    // prologue's x in shared memory.
    int glu_stage = -1, glu_wide = -1, pro_xreg = -1;
    bool no_stream = false;  // never the streamed LM-head kernel (CudaVariants::head_register)
    // Residual epilogue (or null): res_out[j][r] = res_a[j][r] + res_scale * y[j][r], after y is
    // written; res_a, res_out: [n_y, ldy] (res_out may alias res_a, not x or y).
    const float* res_a = nullptr;
    float* res_out = nullptr;
    float res_scale = 1.0f;
    // RMSNorm of the residual rows after them (or norm_out null; one product a launch, rows a multiple
    // of 32, see gemv_norm_supported): norm_out[j] = rms_norm(res_out[j], norm_w, norm_eps) ([n_y, rows])
    // and its quantize_q8 rows in norm_xq (or null), computed by the last block to finish each row;
    // norm_ctr: n_y zeroed counters that only this stream's launches use (left zeroed).
    const float* norm_w = nullptr;
    float norm_eps = 0.0f;
    float* norm_out = nullptr;
    void* norm_xq = nullptr;
    unsigned* norm_ctr = nullptr;
    // RMSNorm prologue (or pro_x null; gemv_norm_prologue_supported): the input is y = rms_norm(pro_x,
    // pro_w, pro_eps) (pro_x, pro_w: [k]; pro_w may be null), made and quantized in shared memory by
    // every block of the launch instead of read from xq, and block 0 writes y to pro_out (or null), so
    // neither the norm nor its 8-bit rows go through memory before the product. x stays y's buffer.
    const float* pro_x = nullptr;
    const float* pro_w = nullptr;
    float pro_eps = 0.0f;
    float* pro_out = nullptr;
};
// Whether products of `type` over rows of k can take GemvArgs::pro_x: block-quantized weights, one
// token, k % 32 == 0, k <= kProMaxK. gemv_glu, gemv_qkv_rope_store and gemv_conv take it then; gemv
// and gemv_multi do not (their many small blocks would each make the norm).
constexpr int64_t kProMaxK = 4096;
bool gemv_norm_prologue_supported(GgmlType type, int64_t k, int n_y);
// Whether gemv can take the RMSNorm of its residual output (GemvArgs::norm_out).
bool gemv_norm_supported(const GemvArgs& a);
void gemv(const GemvArgs& a, Stream stream);
// Up to kMaxSegs products in one launch: they share x / xq, the weight type, k and n_y (and have no
// ids); each has its own weight, rows, bias, y and residual epilogue (q/k/v, gate/up).
constexpr int kMaxSegs = 3;
void gemv_multi(const GemvArgs* a, int n, Stream stream);
// SwiGLU pair in one launch: y_gate = W_gate x, y_up = W_up x (the same rows), then
//   act[j][r] = silu(y_gate[j][r]) * y_up[j][r]  (act: [n_y, rows]; may alias either y)
// and, when act_xq is not null, act's quantize_q8 rows. Quantized weights with rows % 32 == 0 only.
bool gemv_glu_supported(GgmlType type, int64_t rows);
// next (or null): the product queued right after, whose weights the pair's blocks prefetch into L2.
// gemv_glu_staged: whether the pair goes to the staged kernel (rows copied to shared memory first).
bool gemv_glu_staged(const GemvArgs& gate, const GemvArgs& up);
void gemv_glu(const GemvArgs& gate, const GemvArgs& up, float* act, void* act_xq, Stream stream,
              const GemvArgs* next = nullptr);

// out[t] = scale * dequantize(row row_ids ? row_ids[t] : t) as f32 (out_f16 = false) or f16.
//   out: [n_rows, w.k]
void dequantize_rows(const WeightRef& w, const int32_t* row_ids, int64_t n_rows, float scale, void* out, bool out_f16,
                     Stream stream);

void convert_f32_to_f16(const float* x, int64_t n, void* out, Stream stream);

// Several ops below can also write their f32 output's quantize_q8 rows (`xq`, or null), for the matmul
// that reads it next: that saves the quantize launch. They need n (the row length) % 32 == 0.

// out[r] = x[r] * rsqrt(mean(x[r]^2) + eps) * w   (w may be null); x, out: [rows, n]
void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* out, Stream stream,
              void* xq = nullptr);

struct RopeArgs {
    int mode = 0;              // 0 none, 1 norm (adjacent pairs), 2 neox (i, i + n_rot/2)
    int n_rot = 0;
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;
    const float* freq_factors = nullptr;  // [n_rot/2] or null
    // (cos, sin) of every pair at positions 0 .. table_rows - 1 ([table_rows, n_rot / 2, 2], rope_table()),
    // or null: the kernels compute the angles (in double) themselves.
    const float* table = nullptr;
    int64_t table_rows = 0;
};
// Fills table [rows, n_rot / 2] with the (cos, sin) of r's rotation of each pair at each position, as
// the kernels compute them (double angles, rounded to float).
void rope_table(const RopeArgs& r, int64_t rows, float* table, Stream stream);
// In place on x: f32 [n_tokens, n_head * head_dim]; optional per-head RMSNorm then RoPE at pos[t].
void norm_rope(float* x, int64_t n_tokens, int n_head, int head_dim, const float* norm_w, float eps,
               const int32_t* pos, const RopeArgs& rope, Stream stream);

// The KV cache's row formats: F32, F16 and BF16 elements, or GGUF's Q8_0 and Q4_0 blocks of 32, or the
// tq3 cache's Q3_KV blocks (kv_codec.cuh). A row holds the same bytes as the CPU backend's cache of that type.
enum class KvCodec : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ3 };
// The codec of a cache type; false for a type the kernels do not read.
inline bool kv_codec_of(GgmlType t, KvCodec& c) {
    switch (t) {
        case GgmlType::kF32: c = KvCodec::kF32; return true;
        case GgmlType::kF16: c = KvCodec::kF16; return true;
        case GgmlType::kBF16: c = KvCodec::kBF16; return true;
        case GgmlType::kQ8_0: c = KvCodec::kQ8_0; return true;
        case GgmlType::kQ4_0: c = KvCodec::kQ4_0; return true;
        case GgmlType::kQ3_KV: c = KvCodec::kQ3; return true;
        default: return false;
    }
}
// Bytes of a row of n elements (n a multiple of 32 for the block codecs).
CERA_HD constexpr int64_t kv_row_bytes(KvCodec c, int64_t n) {
    switch (c) {
        case KvCodec::kF32: return 4 * n;
        case KvCodec::kF16:
        case KvCodec::kBF16: return 2 * n;
        case KvCodec::kQ8_0: return n / 32 * 34;
        case KvCodec::kQ4_0: return n / 32 * 18;
        case KvCodec::kQ3: return n / 32 * 14;
    }
    return 0;
}
// Whether the codec stores blocks of 32 elements (quantized) rather than single elements.
CERA_HD constexpr bool kv_blocked(KvCodec c) { return c == KvCodec::kQ8_0 || c == KvCodec::kQ4_0 || c == KvCodec::kQ3; }

// cache[pos[t]] = src[t] for k and v ([n_ctx, width]), converted to each cache's codec (width a multiple
// of 32 for the block codecs, which quantize as the CPU's reference quantizers do: the same bytes).
void kv_store(const float* k, const float* v, int64_t n_tokens, int64_t width, const int32_t* pos, void* k_cache,
              void* v_cache, KvCodec codec, KvCodec v_codec, int64_t n_ctx, Stream stream);

// norm_rope of q and of k, then kv_store of k and v, in one launch (one warp per head row).
//   q: [n_tokens, n_head * head_dim]; k, v: [n_tokens, n_head_kv * head_dim]; q_norm, k_norm: [head_dim] or null
struct QkvRopeArgs {
    float* q = nullptr;
    float* k = nullptr;
    float* v = nullptr;
    int64_t n_tokens = 0;
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    // Rotated caches (tq4, tq3): each head of q, k or v through rotate_head after its RoPE, before the store.
    bool rotate_q = false, rotate_k = false, rotate_v = false;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    float q_eps = 0.0f, k_eps = 0.0f;
    RopeArgs q_rope, k_rope;
    const int32_t* pos = nullptr;
    void* k_cache = nullptr;
    void* v_cache = nullptr;
    KvCodec codec = KvCodec::kF16, v_codec = KvCodec::kF16;  // of the keys, of the values
    int64_t n_ctx = 0;
    // gemv_qkv_rope_store: the warps' epilogue where it fits (-1 or 1, gemv_fused.cu qkv_rows_fit), or
    // warp 0's of a block a head (0, CudaVariants::qkv_head_blocks), so that tests can compare them.
    int rows_kernel = -1;
};
void qkv_rope_store(const QkvRopeArgs& a, Stream stream);

// Decode products fused with the op that consumes them (gemv_fused.cu); the callers check *_supported
// and otherwise launch the two ops. gemv_qkv_rope_store: the q, k and v products (qkv[0..2], their y
// = r.q, r.k, r.v) and then qkv_rope_store(r); quantized weights, head_dim 64, 128 or 256.
bool gemv_qkv_rope_supported(const GemvArgs (&qkv)[3], const QkvRopeArgs& r);
// Whether a q/k/v launch with q/k weights of type t takes v weights of type tv: t, or llama-quantize's
// mixtures (Q4_K with Q5_K or Q6_K, Q5_K with Q6_K).
bool gemv_qkv_v_fits(GgmlType t, GgmlType tv);
void gemv_qkv_rope_store(const GemvArgs (&qkv)[3], const QkvRopeArgs& r, Stream stream);
// gemv_conv: one token's in_proj product (its y = bcx, 3 n rows) and then short_conv(bcx, ...) with its
// 8-bit output rows out_xq (or null); quantized weights, n % 32 == 0, kernel length taps <= 8.
bool gemv_conv_supported(const GemvArgs& in_proj, int taps);
void gemv_conv(const GemvArgs& in_proj, const float* conv_w, int taps, float* state, float* state_prev, float* out,
               void* out_xq, Stream stream);

struct AttentionArgs {
    const float* q = nullptr;     // [n_tokens, n_head * head_dim]
    const void* k_cache = nullptr;  // [n_ctx, n_head_kv * head_dim]
    const void* v_cache = nullptr;
    // Of the keys and of the values: the staged decode kernel and the per-query kernel take a pair of
    // codecs, the warp decode kernel and the tensor-core prefill one codec for both.
    KvCodec codec = KvCodec::kF16, v_codec = KvCodec::kF16;
    const int32_t* pos = nullptr;  // [n_tokens]
    int64_t n_tokens = 0, n_ctx = 0;
    int n_head = 0, n_head_kv = 0, head_dim = 0;
    float scale = 1.0f;
    int sliding_window = 0;
    float* out = nullptr;          // [n_tokens, n_head * head_dim]
    float* partial = nullptr;      // scratch of attention_scratch_floats(), zero-filled when allocated
    void* out_xq = nullptr;        // quantize_q8 rows of out, or null (head_dim % 32 == 0)
    // Paged caches (backend.h KvPaging): block_table [n_seq, table_stride] i32, seq [n_tokens] the row of
    // each query's sequence; n_ctx is then table_stride << block_shift. Null: row = position.
    const int32_t* seq = nullptr;
    const int32_t* block_table = nullptr;
    int table_stride = 0, block_shift = 0;
    // Every query is a sequence of its own (a batch of decode tokens); false: the queries are one
    // sequence's (with a block table, the launch holds one run of a sequence).
    bool each_seq = false;
};
// Scratch floats attention(a) needs (0: none). Its first words are counters that every call leaves
// at zero, so the buffer must be zero-filled once when it is allocated.
size_t attention_scratch_floats(const AttentionArgs& a);
void attention(const AttentionArgs& a, Stream stream);

// LFM2 short conv (see backend.h): bcx [n_tokens, 3 n_embd], w [n_embd, L], state [L-1, n_embd];
// state_prev (or null) receives the state from before the update. L <= kMaxConv.
constexpr int kMaxConv = 8;
constexpr int kConvSegInts = 6;  // backend.h: a short_conv_segments descriptor
void short_conv(const float* bcx, const float* w, int L, float* state, int64_t n_tokens, int64_t n_embd, float* out,
                Stream stream, void* xq = nullptr, float* state_prev = nullptr);
// Backend::short_conv_segments: n_seg segments (segs i32 [n_seg, kConvSegInts]) over states f32
// [slots, (L-1) n_embd].
void short_conv_segments(const float* bcx, const float* w, int L, float* states, const int32_t* segs, int n_seg,
                         const int32_t* snaps, float* snapshots, int64_t n_tokens, int64_t n_embd, float* out,
                         Stream stream);

// out = silu(gate) * up over n elements; with xq, rows of `row` elements are quantized too.
void swiglu(const float* gate, const float* up, int64_t n, float* out, Stream stream, void* xq = nullptr,
            int64_t row = 0);
// out = a + scale * b
void add(const float* a, const float* b, float scale, int64_t n, float* out, Stream stream);
void scale(float* x, float s, int64_t n, Stream stream);
// Each of the n_heads heads of head_dim elements of x through the rotated caches' rotation
// (core/rotation.h) or its inverse, with the CPU's operations in the CPU's order: the same floats.
void rotate_heads(float* x, int64_t n_heads, int head_dim, bool inverse, Stream stream);
// y[t][r] += bias[r]; y: [n_rows, n]
void add_bias(float* y, const float* bias, int64_t n_rows, int64_t n, Stream stream);

// MoE router, one token per warp: logits [n_tokens, n_expert] -> ids, weights [n_tokens, k]
void moe_route(const float* logits, const float* bias, int64_t n_tokens, int n_expert, int k, bool sigmoid,
               bool normalize, float weights_scale, int32_t* ids, float* weights, Stream stream);
// out[t] = sum_j weights[t][j] * y[t * k + j];  y: [n_tokens * k, n], out: [n_tokens, n]
void moe_combine(const float* y, const float* weights, int64_t n_tokens, int k, int64_t n, float* out,
                 Stream stream);


// Greedy pick per row (argmax.cu): out[r] = the lowest i holding the largest non-NaN x[r][i], 0 when
// every value is NaN (Backend::argmax). One block per row, or with `scratch` (kArgmaxScratchBytes,
// zero-filled once) one long row split over blocks; x: f32 [rows, n] (n >= 1), out: i32 [rows]
constexpr int kArgmaxSplitBlocks = 256;  // also the streamed LM head's blocks (gemv_argmax_feed)
constexpr size_t kArgmaxScratchBytes = size_t(kArgmaxSplitBlocks) * 8 + 16;
void argmax_rows(const float* x, int64_t rows, int64_t n, int32_t* out, Stream stream, void* scratch = nullptr);
// argmax_rows of one row, the pick fed back as the next step's input: ids[0] = out[0] = the pick,
// pos[0] = pos[pos_last] + 1 (Backend::argmax_feed).
// With mail.ring set, the pick is also stored into the mailbox (pick_mail.h): seq = ++*mail.seq,
// ring[seq % kPickMailSlots] = (pick << 32) | seq, one 8-byte store to host-mapped memory.
constexpr int kPickMailSlots = 8;
struct PickMail {
    unsigned long long* ring = nullptr;
    unsigned* seq = nullptr;
};
void argmax_feed(const float* x, int64_t n, int32_t* out, int32_t* ids, int32_t* pos, int64_t pos_last, Stream stream,
                 void* scratch = nullptr, PickMail mail = {});
// gemv of one product through the streamed kernel (gemv_stream.cu), where it takes it (one token, at
// least 32 MB of quantized rows); false, having launched nothing, where it does not. gemv calls it.
bool gemv_stream(const GemvArgs& a, Stream stream);
// argmax_feed of the row that the one-token product `a` (an LM head) writes, made by the product's own
// launch where the streamed GEMV takes it (gemv.cu; scratch: argmax_feed's). Returns false, having
// launched nothing, where it does not: then gemv and argmax_feed.
bool gemv_argmax_feed(const GemvArgs& a, int32_t* out, int32_t* ids, int32_t* pos, int64_t pos_last, Stream stream,
                      void* scratch, PickMail mail);
// Backend::top_logits (top_logits.cu): the best m <= kTopLogitsMax entries of x (f32 [n]) and the
// values at gather (i32 [n_g] or null); out: i32 [1 + 2 m + n_g] as Backend::top_logits lays it out.
constexpr int kTopLogitsMax = 1024;
void top_logits(const float* x, int64_t n, int m, const int32_t* gather, int n_g, int32_t* out, Stream stream);

// MoE expert products grouped by expert (moe.cu), for batches: every expert's weight rows are read
// once per call instead of once per (token, expert) slot.
// Routing, from ids [n_slots] (slot s = t * k + j uses expert ids[s]; ids outside [0, n_expert) are
// clamped) into `route`, int32 of moe_group_ints():
//   counts [n_expert], offsets [n_expert + 1] (exclusive scan of counts), slots [n_slots] (the slots
//   of expert e at offsets[e] .. offsets[e + 1], in no particular order). One block; n_expert <= 256.
size_t moe_group_ints(int n_expert, int64_t n_slots);
void moe_group(const int32_t* ids, int64_t n_slots, int n_expert, int32_t* route, Stream stream);
// y[s][r] = sum_k W_e[r][k] * x[s / x_div][k] for every slot s of every expert e of route, with
// W_e = rows [row0 + e * rows, ...) of w and x the quantize_q8 rows xq (block-quantized types only).
struct MoeGemvArgs {
    WeightRef w;
    int64_t rows = 0;               // output rows per expert
    int n_expert = 0;
    const int32_t* route = nullptr;  // moe_group output (device memory)
    int64_t n_slots = 0;
    const void* xq = nullptr;       // quantize_q8 rows of w.k: [n_slots / x_div rows]
    int x_div = 1;                  // k (gate/up read token s / k) or 1 (down)
    float* y = nullptr;             // [n_slots, ldy]
    int64_t ldy = 0;
    int tile_rows = 0;              // rows a block (a multiple of 8 up to 128), 0: chosen from the shape
};
bool moe_grouped_supported(GgmlType type, int64_t k, int n_expert);
void moe_gemv_grouped(const MoeGemvArgs& a, Stream stream);

}  // namespace cera::cuda
