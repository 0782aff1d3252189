// Small per-element ops: SwiGLU, add/scale/bias, the LFM2 short conv, the MoE router and combine,
// and argmax. All are bandwidth-trivial next to the matmuls (KBs per token) and latency-bound in
// decode: one launch each over the whole batch, grid-stride free, no host round trips.
// Short conv variants: for short chunks (decode) one thread per channel walks the tokens with the
// window in registers and updates the state itself; for long chunks (prefill) one thread per
// (token, channel), then a second launch writes the new state.
// SwiGLU and the decode short conv can also write their output's 8-bit rows for the next GEMV.
// Roofline: bytes = inputs + outputs; at batch 1 each launch is ~2-3 us of latency.
#include "backends/cuda/common.cuh"
#include "backends/cuda/rope_device.cuh"
#include "core/rotation.h"

namespace cera::cuda {
namespace {

// With xq: rows of `row` elements (row % 32 == 0, n % row == 0) are quantized too; whole warps
// then cover one 32-group each.
__global__ void swiglu_kernel(const float* __restrict__ g, const float* __restrict__ u, int64_t n, float* out,
                              uint8_t* xq, int64_t row) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = g[i];
    const float v = x / (1.0f + __expf(-x)) * u[i];
    out[i] = v;
    if (xq) warp_quantize_q8(v, xq + (i / row) * q8_row_bytes(row), row, (i % row) >> 5);
}

__global__ void add_kernel(const float* a, const float* b, float scale, int64_t n, float* out) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + scale * b[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

__global__ void add_bias_kernel(float* y, const float* __restrict__ bias, int64_t n_rows, int64_t n) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n_rows * n) y[i] += bias[i % n];
}

// One thread per channel, tokens in order; the window of the last L-1 inputs stays in registers.
__global__ void short_conv_seq_kernel(const float* __restrict__ bcx, const float* __restrict__ w, int L, float* state,
                                      int64_t n_tokens, int64_t n, float* out, uint8_t* xq, float* prev) {
    pdl_trigger();
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    float win[kMaxConv], wc[kMaxConv];
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j) wc[j] = j < L && c < n ? w[c * L + j] : 0.0f;  // a weight: before the wait
    // The state was written by this kernel in an earlier step (complete before this step began) and
    // by no other kernel of this one, so it is read, and copied to prev, before the wait too: the
    // read would otherwise miss L2 behind the next launches' weight streams.
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j) win[j] = j < L - 1 && c < n ? state[j * n + c] : 0.0f;
    if (prev && c < n)
#pragma unroll
        for (int j = 0; j < kMaxConv; ++j)
            if (j < L - 1) prev[j * n + c] = win[j];
    pdl_wait();
    if (c >= n) return;
    for (int64_t t = 0; t < n_tokens; ++t) {
        const float* row = bcx + t * 3 * n;
        const float bx = row[c] * row[2 * n + c];
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxConv; ++j) {
            if (j < L - 1) s = fmaf(wc[j], win[j], s);
            if (j == L - 1) s = fmaf(wc[j], bx, s);
        }
        const float o = row[n + c] * s;
        out[t * n + c] = o;
        if (xq) warp_quantize_q8(o, xq + t * q8_row_bytes(n), n, c >> 5);  // n % 32 == 0: whole warps
#pragma unroll
        for (int j = 0; j < kMaxConv - 1; ++j)
            if (j < L - 2) win[j] = win[j + 1];
#pragma unroll
        for (int j = 0; j < kMaxConv; ++j)
            if (j == L - 2) win[j] = bx;
    }
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j)
        if (j < L - 1) state[j * n + c] = win[j];
}

// pad row r (0 <= r < L-1 + n_tokens) of channel c: the state, then B*X of the chunk.
__device__ __forceinline__ float conv_pad(const float* bcx, const float* state, int L, int64_t n, int64_t r, int64_t c) {
    if (r < L - 1) return state[r * n + c];
    const float* row = bcx + (r - (L - 1)) * 3 * n;
    return row[c] * row[2 * n + c];
}

__global__ void short_conv_par_kernel(const float* __restrict__ bcx, const float* __restrict__ w, int L,
                                      const float* __restrict__ state, int64_t n_tokens, int64_t n, float* out) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * n) return;
    const int64_t t = i / n, c = i % n;
    float s = 0.0f;
    for (int j = 0; j < L; ++j) s = fmaf(w[c * L + j], conv_pad(bcx, state, L, n, t + j, c), s);
    out[i] = bcx[t * 3 * n + n + c] * s;
}

// Run after short_conv_par_kernel: the new state is the last L-1 pad rows.
__global__ void short_conv_state_kernel(const float* __restrict__ bcx, int L, float* state, int64_t n_tokens,
                                        int64_t n, float* prev) {
    pdl_trigger();
    pdl_wait();
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= n) return;
    float nw[kMaxConv];
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j)
        if (j < L - 1) nw[j] = conv_pad(bcx, state, L, n, n_tokens + j, c);
    if (prev)
#pragma unroll
        for (int j = 0; j < kMaxConv; ++j)
            if (j < L - 1) prev[j * n + c] = state[j * n + c];
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j)
        if (j < L - 1) state[j * n + c] = nw[j];
}

// A segment's state before it: row `src` of the snapshots when given, else its own row of states.
__device__ __forceinline__ const float* segment_state_in(const int32_t* d, const float* states, const float* snapshots,
                                                         int L, int64_t n) {
    return d[5] >= 0 ? snapshots + int64_t(d[5]) * (L - 1) * n : states + int64_t(d[2]) * (L - 1) * n;
}

// short_conv_segments, the outputs: a thread per (row, channel); the row's segment by a binary search
// over the segments' starts, its pad rows before the segment's first from the segment's state.
__global__ void conv_segments_out_kernel(const float* __restrict__ bcx, const float* __restrict__ w, int L,
                                         const float* __restrict__ states, const int32_t* __restrict__ segs,
                                         int n_seg, const float* snapshots, int64_t n_tokens, int64_t n, float* out) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * n) return;
    const int64_t t = i / n, c = i % n;
    int lo = 0, hi = n_seg - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (segs[kConvSegInts * mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    const int32_t* d = segs + kConvSegInts * lo;
    const int64_t start = d[0];
    const float* seg = bcx + start * 3 * n;
    const float* state = segment_state_in(d, states, snapshots, L, n);
    float s = 0.0f;
    for (int j = 0; j < L; ++j) s = fmaf(w[c * L + j], conv_pad(seg, state, L, n, t - start + j, c), s);
    out[i] = bcx[t * 3 * n + n + c] * s;
}

// short_conv_segments, after the outputs: a thread per (segment, channel) writes the snapshots (pad rows
// end .. end + L - 2) and the new state (the last L - 1 pad rows) from the old state held in registers.
__global__ void conv_segments_state_kernel(const float* __restrict__ bcx, int L, float* states,
                                           const int32_t* __restrict__ segs, const int32_t* __restrict__ snaps,
                                           float* snapshots, int64_t n) {
    pdl_trigger();
    pdl_wait();
    const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= n) return;
    const int32_t* d = segs + kConvSegInts * blockIdx.y;
    const int64_t start = d[0], len = d[1], slot = d[2];
    const float* seg = bcx + start * 3 * n;
    const float* in = segment_state_in(d, states, snapshots, L, n);
    float* state = states + slot * (L - 1) * n;
    float old[kMaxConv];
#pragma unroll
    for (int j = 0; j < kMaxConv; ++j) old[j] = j < L - 1 ? in[j * n + c] : 0.0f;
    auto pad = [&](int64_t r) {
        if (r >= L - 1) return conv_pad(seg, nullptr, L, n, r, c);
        float v = 0.0f;
#pragma unroll
        for (int j = 0; j < kMaxConv; ++j)
            if (j == r) v = old[j];
        return v;
    };
    for (int q = d[3]; q < d[3] + d[4]; ++q) {
        float* row = snapshots + int64_t(snaps[2 * q + 1]) * (L - 1) * n;
        for (int j = 0; j < L - 1; ++j) row[j * n + c] = pad(snaps[2 * q] + j);
    }
    for (int j = 0; j < L - 1; ++j) state[j * n + c] = pad(len + j);
}

// One warp per token: gating, then k rounds of argmax over (p + bias), lowest id on ties.
__global__ void moe_route_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int64_t n_tokens,
                                 int n_expert, int k, int sigmoid, int normalize, float weights_scale, int32_t* ids,
                                 float* weights) {
    pdl_trigger();
    pdl_wait();
    extern __shared__ float sm[];  // per warp: prob[n_expert], sel[n_expert]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t t = int64_t(blockIdx.x) * (blockDim.x >> 5) + warp;
    if (t >= n_tokens) return;
    float* prob = sm + warp * 2 * n_expert;
    float* sel = prob + n_expert;
    const float* l = logits + t * n_expert;
    if (sigmoid) {
        for (int e = lane; e < n_expert; e += 32) prob[e] = 1.0f / (1.0f + expf(-l[e]));
    } else {
        float mx = -INFINITY;
        for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, l[e]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int e = lane; e < n_expert; e += 32) sum += prob[e] = expf(l[e] - mx);
        sum = warp_sum(sum);
        for (int e = lane; e < n_expert; e += 32) prob[e] /= sum;
    }
    for (int e = lane; e < n_expert; e += 32) sel[e] = prob[e] + (bias ? bias[e] : 0.0f);
    __syncwarp();
    float wsum = 0.0f, my_w = 0.0f;
    int my_id = 0;
    for (int j = 0; j < k; ++j) {
        float best = -INFINITY;
        int best_e = n_expert;
        for (int e = lane; e < n_expert; e += 32)
            if (sel[e] > best) best = sel[e], best_e = e;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
            if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
        }
        if (best_e >= n_expert) best_e = 0;  // all -inf: cannot happen with finite logits
        const float pw = prob[best_e];
        wsum += pw;
        if (lane == j) my_id = best_e, my_w = pw;
        __syncwarp();
        if (lane == 0) sel[best_e] = -INFINITY;
        __syncwarp();
    }
    if (lane < k) {
        float wv = normalize ? my_w / wsum : my_w;
        ids[t * k + lane] = my_id;
        weights[t * k + lane] = wv * weights_scale;
    }
}

__global__ void moe_combine_kernel(const float* __restrict__ y, const float* __restrict__ w, int64_t n_tokens, int k,
                                   int64_t n, float* out) {
    pdl_trigger();
    pdl_wait();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * n) return;
    const int64_t t = i / n, c = i % n;
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s = fmaf(w[t * k + j], y[(t * k + j) * n + c], s);
    out[i] = s;
}

inline unsigned blocks(int64_t n, int threads) { return unsigned(ceil_div(n, threads)); }

}  // namespace

void swiglu(const float* gate, const float* up, int64_t n, float* out, Stream stream, void* xq, int64_t row) {
    if (n == 0) return;
    CERA_CHECK(!xq || (row > 0 && row % 32 == 0 && n % row == 0));
    launch(swiglu_kernel, blocks(n, 256), 256, 0, as_stream(stream), gate, up, n, out, static_cast<uint8_t*>(xq),
           row > 0 ? row : int64_t(1));
}

void add(const float* a, const float* b, float scale, int64_t n, float* out, Stream stream) {
    if (n == 0) return;
    launch(add_kernel, blocks(n, 256), 256, 0, as_stream(stream), a, b, scale, n, out);
}

void scale(float* x, float s, int64_t n, Stream stream) {
    if (n == 0) return;
    launch(scale_kernel, blocks(n, 256), 256, 0, as_stream(stream), x, s, n);
}

namespace {

// One warp a head, staged in shared memory (rotate_head_warp).
constexpr int kRotateWarps = 4;
__global__ void rotate_heads_kernel(float* x, int64_t n_heads, int n, bool inverse) {
    pdl_trigger();
    extern __shared__ float rot_s[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t h = int64_t(blockIdx.x) * kRotateWarps + warp;
    pdl_wait();
    if (h >= n_heads) return;
    float* v = rot_s + warp * n;
    float* xh = x + h * n;
    for (int i = lane; i < n; i += 32) v[i] = xh[i];
    rotate_head_warp(v, n, inverse);
    for (int i = lane; i < n; i += 32) xh[i] = v[i];
}

}  // namespace

void rotate_heads(float* x, int64_t n_heads, int head_dim, bool inverse, Stream stream) {
    CERA_CHECK(rotation_fits(head_dim), "rotate_heads: %d is not a power of two in 2..1024", head_dim);
    if (n_heads == 0) return;
    launch(rotate_heads_kernel, unsigned(ceil_div(n_heads, int64_t(kRotateWarps))), 32 * kRotateWarps,
           size_t(kRotateWarps) * head_dim * sizeof(float), as_stream(stream), x, n_heads, head_dim, inverse);
}

void add_bias(float* y, const float* bias, int64_t n_rows, int64_t n, Stream stream) {
    if (n_rows * n == 0) return;
    launch(add_bias_kernel, blocks(n_rows * n, 256), 256, 0, as_stream(stream), y, bias, n_rows, n);
}

void short_conv(const float* bcx, const float* w, int L, float* state, int64_t n_tokens, int64_t n_embd, float* out,
                Stream stream, void* xq, float* state_prev) {
    CERA_CHECK(L >= 1 && L <= kMaxConv, "short_conv: kernel length %d (supported 1..%d)", L, kMaxConv);
    if (n_tokens == 0) return;
    cudaStream_t s = as_stream(stream);
    if (n_tokens <= 16) {
        CERA_CHECK(!xq || n_embd % 32 == 0);
        launch(short_conv_seq_kernel, blocks(n_embd, 128), 128, 0, s, bcx, w, L, state, n_tokens, n_embd, out,
               static_cast<uint8_t*>(xq), state_prev);
        return;
    }
    CERA_CHECK(!xq, "short_conv: 8-bit output rows only for short chunks");
    launch(short_conv_par_kernel, blocks(n_tokens * n_embd, 256), 256, 0, s, bcx, w, L, state, n_tokens, n_embd, out);
    launch(short_conv_state_kernel, blocks(n_embd, 128), 128, 0, s, bcx, L, state, n_tokens, n_embd, state_prev);
}

void short_conv_segments(const float* bcx, const float* w, int L, float* states, const int32_t* segs, int n_seg,
                         const int32_t* snaps, float* snapshots, int64_t n_tokens, int64_t n_embd, float* out,
                         Stream stream) {
    CERA_CHECK(L >= 1 && L <= kMaxConv && n_seg <= 65535, "short_conv_segments: kernel length %d (supported 1..%d), "
               "%d segments", L, kMaxConv, n_seg);
    if (n_tokens == 0 || n_seg == 0) return;
    cudaStream_t s = as_stream(stream);
    launch(conv_segments_out_kernel, blocks(n_tokens * n_embd, 256), 256, 0, s, bcx, w, L, states, segs, n_seg,
           snapshots, n_tokens, n_embd, out);
    launch(conv_segments_state_kernel, dim3{unsigned(blocks(n_embd, 128)), unsigned(n_seg)}, 128, 0, s, bcx, L,
           states, segs, snaps, snapshots, n_embd);
}

void moe_route(const float* logits, const float* bias, int64_t n_tokens, int n_expert, int k, bool sigmoid,
               bool normalize, float weights_scale, int32_t* ids, float* weights, Stream stream) {
    CERA_CHECK(k >= 1 && k <= 32 && k <= n_expert && n_expert <= 1024, "moe_route: k %d, n_expert %d", k, n_expert);
    if (n_tokens == 0) return;
    const int warps = 4;
    const size_t smem = sizeof(float) * 2 * n_expert * warps;
    launch(moe_route_kernel, blocks(n_tokens, warps), 32 * warps, smem, as_stream(stream), 
        logits, bias, n_tokens, n_expert, k, sigmoid, normalize, weights_scale, ids, weights);
}

void moe_combine(const float* y, const float* weights, int64_t n_tokens, int k, int64_t n, float* out, Stream stream) {
    if (n_tokens * n == 0) return;
    launch(moe_combine_kernel, blocks(n_tokens * n, 256), 256, 0, as_stream(stream), y, weights, n_tokens, k, n, out);
}


}  // namespace cera::cuda
