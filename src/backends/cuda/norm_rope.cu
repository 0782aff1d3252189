// Row norms, per-head q/k norm + RoPE, the KV-cache append, and the three fused for decode.
// Idea: all three are bandwidth-trivial (a few KB per token) and latency-bound in decode, so each is
// one launch over the whole batch: rms_norm one block per row; norm_rope one warp per (token, head),
// RMSNorm of the head then rotation of its pairs (NORM: (2i, 2i+1); NEOX: (i, i + n_rot/2)), angles
// in double as the CPU reference computes them; kv_store one warp per 32 elements of a row (a block of
// the quantized codecs); qkv_rope_store one
// warp per q, k or v head row (q and k rotated in place, k and v appended to the cache): one launch
// instead of three. rms_norm can also write the 8-bit rows of its output for the next GEMV.
// Roofline: bytes = 2 x activations; microseconds are launch latency, not bandwidth.
#include "backends/cuda/kv_codec.cuh"
#include "backends/cuda/rope_device.cuh"

namespace cera::cuda {
namespace {

// Rows of up to kNormRegs * blockDim elements keep x and w in registers: the weight is loaded before
// the PDL wait (it does not depend on earlier kernels) and x is read once.
constexpr int kNormRegs = 8;
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ w, float eps, int64_t n,
                                float* out, uint8_t* xq) {
    pdl_trigger();
    __shared__ float red[32];
    const int bd = blockDim.x, tid = threadIdx.x;
    const bool regs = n <= int64_t(kNormRegs) * bd;
    float wv[kNormRegs], xv[kNormRegs];
    if (regs) {
#pragma unroll
        for (int j = 0; j < kNormRegs; ++j) {
            const int64_t i = tid + int64_t(j) * bd;
            wv[j] = w && i < n ? w[i] : 1.0f;
        }
    }
    pdl_wait();
    const float* xr = x + int64_t(blockIdx.x) * n;
    float* yr = out + int64_t(blockIdx.x) * n;
    uint8_t* qr = xq ? xq + int64_t(blockIdx.x) * q8_row_bytes(n) : nullptr;
    float ss = 0.0f;
    if (regs) {
#pragma unroll
        for (int j = 0; j < kNormRegs; ++j) {
            const int64_t i = tid + int64_t(j) * bd;
            xv[j] = i < n ? xr[i] : 0.0f;
            ss = fmaf(xv[j], xv[j], ss);
        }
    } else {
        for (int64_t i = tid; i < n; i += bd) ss = fmaf(xr[i], xr[i], ss);
    }
    ss = block_sum(ss, red);  // also orders every read of x before the writes (out may alias x)
    const float r = rsqrtf(ss / float(n) + eps);
    if (regs) {
#pragma unroll
        for (int j = 0; j < kNormRegs; ++j) {
            const int64_t i = tid + int64_t(j) * bd;
            if (i >= n) break;  // n % 32 == 0 when qr is set: whole warps stop together
            const float v = xv[j] * r * wv[j];
            yr[i] = v;
            if (qr) warp_quantize_q8(v, qr, n, i >> 5);
        }
        return;
    }
    for (int64_t i = tid; i < n; i += bd) {
        const float v = w ? xr[i] * r * w[i] : xr[i] * r;
        yr[i] = v;
        if (qr) warp_quantize_q8(v, qr, n, i >> 5);  // n % 32 == 0: whole warps take part
    }
}

__global__ void norm_rope_kernel(float* x, int64_t n_rows, int n_head, int head_dim, const float* __restrict__ norm_w,
                                 float eps, const int32_t* __restrict__ pos, RopeArgs rope) {
    pdl_trigger();
    const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    // Positions are written by the host before the step (never by a kernel): the angles come first.
    const int32_t p = row < n_rows ? pos[row / n_head] : 0;
    const bool pre = rope_precomputable(rope);
    RopeCS cs;
    if (pre) cs = rope_angles(p, rope);
    pdl_wait();
    if (row >= n_rows) return;
    head_norm_rope(x + row * head_dim, head_dim, norm_w, eps, p, rope, pre ? &cs : nullptr);
}

// Rows per token: n_head q heads, n_head_kv k heads, n_head_kv v heads; one warp each.
__global__ void qkv_rope_store_kernel(const QkvRopeArgs a) {
    pdl_trigger();
    const int per_token = a.n_head + 2 * a.n_head_kv;
    const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const bool live = row < a.n_tokens * per_token;
    const int64_t t = live ? row / per_token : 0;
    const int h = live ? int(row % per_token) : 0;
    // Positions are written by the host before the step (never by a kernel): the angles of this
    // warp's q or k head are computed before the PDL wait.
    const int32_t p = live ? a.pos[t] : 0;
    const RopeArgs& rr = h < a.n_head ? a.q_rope : a.k_rope;
    const bool pre = live && h < a.n_head + a.n_head_kv && rope_precomputable(rr);
    RopeCS cs;
    if (pre) cs = rope_angles(p, rr);
    pdl_wait();
    if (!live) return;
    const int hd = a.head_dim;
    const int64_t kv_width = int64_t(a.n_head_kv) * hd;
    if (h < a.n_head) {
        float* qh = a.q + (t * a.n_head + h) * hd;
        head_norm_rope(qh, hd, a.q_norm, a.q_eps, p, a.q_rope, pre ? &cs : nullptr);
        if (a.rotate_q) rotate_head_warp(qh, hd, false);
        return;
    }
    const bool in_ctx = p >= 0 && p < a.n_ctx;
    if (h < a.n_head + a.n_head_kv) {
        const int hk = h - a.n_head;
        float* kv = a.k + t * kv_width + int64_t(hk) * hd;
        head_norm_rope(kv, hd, a.k_norm, a.k_eps, p, a.k_rope, pre ? &cs : nullptr);
        if (a.rotate_k) rotate_head_warp(kv, hd, false);
        __syncwarp();  // the lanes read each other's rotated values
        if (in_ctx)
            kv_put_head(a.codec, kv,
                        static_cast<unsigned char*>(a.k_cache) + p * kv_row_bytes(a.codec, kv_width) +
                            kv_row_bytes(a.codec, int64_t(hk) * hd),
                        hd);
        return;
    }
    const int hv = h - a.n_head - a.n_head_kv;
    float* vh = a.v + t * kv_width + int64_t(hv) * hd;
    if (a.rotate_v) rotate_head_warp(vh, hd, false);
    if (in_ctx)
        kv_put_head(a.v_codec, vh,
                    static_cast<unsigned char*>(a.v_cache) + p * kv_row_bytes(a.v_codec, kv_width) +
                        kv_row_bytes(a.v_codec, int64_t(hv) * hd),
                    hd);
}

// One warp a 32-element group of a row (grid: groups a row, tokens): element codecs store element by
// element, block codecs quantize the group as one block.
__global__ void kv_store_kernel(const float* __restrict__ k, const float* __restrict__ v, int64_t n_tokens,
                                int64_t width, const int32_t* __restrict__ pos, void* k_cache, void* v_cache,
                                KvCodec codec, KvCodec v_codec, int64_t n_ctx) {
    pdl_trigger();
    pdl_wait();
    const int64_t g = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5, t = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int64_t c = g * 32 + lane, p = pos[t];
    if (g * 32 >= width || p < 0 || p >= n_ctx) return;  // the same for the whole warp
    auto put = [&](KvCodec cc, void* cache, float x) {
        unsigned char* r = static_cast<unsigned char*>(cache) + p * kv_row_bytes(cc, width);
        if (kv_blocked(cc)) kv_put_block(cc, r + kv_row_bytes(cc, g * 32), x);
        else if (c < width) kv_put1(cc, r, c, x);
    };
    const bool in = c < width;
    put(codec, k_cache, in ? k[t * width + c] : 0.0f);
    put(v_codec, v_cache, in ? v[t * width + c] : 0.0f);
}

}  // namespace

void rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* out, Stream stream, void* xq) {
    if (rows == 0) return;
    CERA_CHECK(!xq || n % 32 == 0);
    const int threads = n >= 2048 ? 512 : n >= 512 ? 256 : 128;
    launch(rms_norm_kernel, unsigned(rows), threads, 0, as_stream(stream), x, w, eps, n, out,
           static_cast<uint8_t*>(xq));
}

void norm_rope(float* x, int64_t n_tokens, int n_head, int head_dim, const float* norm_w, float eps,
               const int32_t* pos, const RopeArgs& rope, Stream stream) {
    const int64_t rows = n_tokens * n_head;
    if (rows == 0 || (!norm_w && rope.mode == 0)) return;
    CERA_CHECK(rope.mode == 0 || (rope.n_rot % 2 == 0 && rope.n_rot <= head_dim));
    launch(norm_rope_kernel, unsigned(ceil_div(rows, 4)), 128, 0, as_stream(stream), x, rows, n_head, head_dim, norm_w,
                                                                                eps, pos, rope);
}

void kv_store(const float* k, const float* v, int64_t n_tokens, int64_t width, const int32_t* pos, void* k_cache,
              void* v_cache, KvCodec codec, KvCodec v_codec, int64_t n_ctx, Stream stream) {
    if (n_tokens == 0 || width == 0) return;
    CERA_CHECK((!kv_blocked(codec) && !kv_blocked(v_codec)) || width % 32 == 0, "kv_store: rows of %lld for a block codec",
               (long long)width);
    const dim3 grid(unsigned(ceil_div(ceil_div(width, 32), 8)), unsigned(n_tokens));
    launch(kv_store_kernel, grid, 256, 0, as_stream(stream), k, v, n_tokens, width, pos, k_cache, v_cache, codec,
           v_codec, n_ctx);
}

__global__ void rope_table_kernel(RopeArgs r, int64_t rows, float2* table) {
    const int half = r.n_rot / 2;
    const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= rows * half) return;
    const int64_t pos = e / half;
    const int i = int(e % half);
    float c, s;
    rope_pair_cs(i, double(pos) * r.freq_scale, r.n_rot, r, c, s);
    table[e] = make_float2(c, s);
}

void rope_table(const RopeArgs& r, int64_t rows, float* table, Stream stream) {
    CERA_CHECK(r.mode != 0 && r.n_rot % 2 == 0 && r.n_rot > 0, "rope_table: no rotation");
    const int64_t n = rows * (r.n_rot / 2);
    if (n == 0) return;
    launch(rope_table_kernel, unsigned(ceil_div(n, 256)), 256, 0, as_stream(stream), r, rows,
           reinterpret_cast<float2*>(table));
}

void qkv_rope_store(const QkvRopeArgs& a, Stream stream) {
    const int64_t rows = a.n_tokens * (a.n_head + 2 * a.n_head_kv);
    if (rows == 0) return;
    for (const RopeArgs* r : {&a.q_rope, &a.k_rope})
        CERA_CHECK(r->mode == 0 || (r->n_rot % 2 == 0 && r->n_rot <= a.head_dim));
    const unsigned grid = unsigned(ceil_div(rows, 4));
    CERA_CHECK((!kv_blocked(a.codec) && !kv_blocked(a.v_codec)) || a.head_dim % 32 == 0,
               "qkv_rope_store: heads of %d for a block codec", a.head_dim);
    CERA_CHECK(!(a.rotate_q || a.rotate_k || a.rotate_v) || rotation_fits(a.head_dim),
               "qkv_rope_store: heads of %d cannot be rotated", a.head_dim);
    launch(qkv_rope_store_kernel, grid, 128, 0, as_stream(stream), a);
}

}  // namespace cera::cuda
