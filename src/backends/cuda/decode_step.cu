// The decode program's kernel (decode_step.h): one persistent cooperative grid, one block per SM,
// walks the phases of a recorded single-token step.
//
// Block = kConsumers compute warps + 1 producer warp. The producer's lane 0 walks the program's
// matmul phases and, for each work unit this block owns (a run of rows of one matrix, or the same
// rows of a gate/up pair), issues bulk copies of the rows' quant and scale bytes into the next
// stage of a ring of MxProgram::stages (mbarrier "full" completes on the bytes; "empty" is arrived by
// every compute warp when done). It never waits for grid barriers, so weights of later phases are
// loaded while earlier ones compute: the HBM stream does not stop at phase boundaries.
// Compute warps: per matmul phase the input row is read (L2), normalised if the phase folds an
// RMSNorm, kept as f32 and as 8-bit groups with their scales and 16-element sums in shared memory;
// then each unit's rows are dotted (two rows per warp pass, lanes over the row's items) straight
// from the stage, with the bias, output scale, residual add, SwiGLU and argmax folded into the row
// epilogue. Small phases (conv, RoPE + KV store, attention, elementwise) spread warps or threads over
// the grid. A grid barrier (an arrival counter in global memory, reset by the last block to leave)
// separates dependent phases.
// Activations written in this kernel by other blocks are read with ld.global.cg: never through the
// read-only or L1 path, which could return lines this SM cached earlier in the launch. (A whole-file
// -dlcm=cg measured far slower: generic loads of stack objects went to L2.)
// Roofline: lfm2-1.2b Q4_0 moves 0.67 GB per token: 155 us at 4.3 TB/s; ~90 grid barriers of
// ~1 us each run beside the stream.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backends/cuda/decode_step.h"
#include "backends/cuda/quant_device.cuh"
#include "backends/cuda/rope_device.cuh"

namespace cera::cuda {
namespace {

constexpr int kConsumers = 16;  // compute warps
constexpr int kCThreads = kConsumers * 32;
// The compute warps form kGroups groups; a block's matmul units go round-robin to the groups, so
// several units are in work at once (a unit is a few rows: latency-bound for one group alone).
constexpr int kGroups = 4, kGroupWarps = kConsumers / kGroups;
constexpr int kThreads = kCThreads + 32;

// Shared memory layout (dynamic).
constexpr int kRingBytes = kMxRingBytes;
constexpr int kXfOff = kRingBytes;                       // f32 input [kMxMaxK]
constexpr int kXqOff = kXfOff + kMxMaxK * 4;             // int8 input [kMxMaxK]
constexpr int kXdOff = kXqOff + kMxMaxK;                 // f32 scale per 32 [kMxMaxK / 32]
constexpr int kXsOff = kXdOff + kMxMaxK / 32 * 4;        // i32 sum per 16 [kMxMaxK / 16]
constexpr int kRedOff = kXsOff + kMxMaxK / 16 * 4;       // f32 [64] + u64 [kConsumers]
constexpr int kBarOff = kRedOff + 64 * 4 + kConsumers * 8;  // u64 full[kMxMaxStages], empty[..]
constexpr int kPhaseOff = kBarOff + 2 * kMxMaxStages * 8;     // the current phase: compute warps, producer
constexpr int kSmemBytes = kPhaseOff + 2 * int(sizeof(MxPhase));
static_assert(sizeof(MxPhase) % 16 == 0 && kPhaseOff % 16 == 0 && kSmemBytes <= 227 * 1024);

// Copies phase descriptor `src` (device memory, read-only for the kernel's lifetime: the cached
// read-only path is safe) into shared memory, by threads [0, n_threads) of the caller's group.
__device__ __forceinline__ void load_phase(const MxPhase* src, MxPhase* dst, int t, int n_threads) {
    constexpr int kWords = int(sizeof(MxPhase) / 16);
    for (int i = t; i < kWords; i += n_threads)
        reinterpret_cast<uint4*>(dst)[i] = __ldg(reinterpret_cast<const uint4*>(src) + i);
}

// The compute warps only (the producer warp never joins).
__device__ __forceinline__ void csync() { asm volatile("bar.sync 1, %0;" ::"n"(kCThreads) : "memory"); }

__device__ __forceinline__ uint32_t ld_acquire(const unsigned* p) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ float ldf(const float* p) { return __ldcg(p); }

// Sum over the compute threads; every compute thread gets it.
__device__ __forceinline__ float csum(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    csync();
    if (lane == 0) red[warp] = v;
    csync();
    v = lane < kConsumers ? red[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Barrier number `gen` (1, 2, ...) of the grid: arrivals counted in sync[kSyncCount]; the last block
// to arrive publishes gen in sync[kSyncFlag] (another cache line, so the waiting blocks' polls do not
// queue behind the arrivals).
constexpr int kSyncCount = 0, kSyncDone = 16, kSyncFlag = 32;
__device__ __forceinline__ void grid_sync(unsigned* sync, unsigned gen, unsigned grid) {
    csync();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&sync[kSyncCount], 1u) == gen * grid - 1) {
            __threadfence();
            st_release(&sync[kSyncFlag], gen);
        } else {
            while (ld_acquire(&sync[kSyncFlag]) < gen) {
            }
        }
        __threadfence();
    }
    csync();
}

// ------------------------------------------------------------------ work units of a matmul phase
struct Seg {
    const uint8_t* src;
    uint32_t bytes;  // exact bytes
};
struct Unit {
    int mm;       // matmul index (glu: 0)
    int64_t r0;   // first row
    int nr;       // rows
    Seg seg[4];   // q, m of mm (and of mm 1 for glu); bytes 0 = none
};

__device__ __forceinline__ Unit unit_of(const MxPhase& ph, int64_t u) {
    Unit t{};
    int i = 0;
    if (!ph.glu)
        while (i + 1 < ph.n_mm && u >= ph.mm[i].n_units) u -= ph.mm[i++].n_units;
    const MxMatmul& m = ph.mm[i];
    t.mm = i;
    t.r0 = u * m.unit_rows;
    t.nr = int(min(m.unit_rows, m.rows - t.r0));
    const int n_mats = ph.glu ? 2 : 1;
    for (int j = 0; j < n_mats; ++j) {
        const MxMatmul& mj = ph.mm[i + j];
        t.seg[2 * j] = {mj.q + t.r0 * mj.q_row_bytes, uint32_t(t.nr * mj.q_row_bytes)};
        t.seg[2 * j + 1] = {mj.m ? mj.m + t.r0 * mj.m_row_bytes : nullptr, mj.m ? uint32_t(t.nr * mj.m_row_bytes) : 0u};
    }
    return t;
}

// Where segment s of a unit lands in its stage: 16-byte aligned windows, one after another.
__device__ __forceinline__ void seg_window(const Seg& s, const uint8_t*& lo, uint32_t& len) {
    lo = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(s.src) & ~uintptr_t(15));
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(s.src) + s.bytes + 15) & ~uintptr_t(15);
    len = uint32_t(hi - reinterpret_cast<uintptr_t>(lo));
}

__device__ __forceinline__ int64_t first_unit(const MxPhase& ph, int grid) {
    return (int64_t(blockIdx.x) - ph.rot % grid + grid) % grid;
}

// The producer warp: the lanes load each matmul phase's descriptor together, lane 0 issues the copies.
__device__ void producer(const MxProgram& P, uint8_t* ring, uint64_t* full, uint64_t* empty, MxPhase* slot) {
    const int lane = threadIdx.x & 31;
    uint32_t it = 0;
    for (int p = 0; p < P.n_phases; ++p) {
        if (__ldg(reinterpret_cast<const int32_t*>(&P.phases[p].kind)) != int32_t(MxKind::kGemv)) continue;
        __syncwarp();
        load_phase(&P.phases[p], slot, lane, 32);
        __syncwarp();
        if (lane != 0) continue;
        const MxPhase& ph = *slot;
        for (int64_t u = first_unit(ph, P.grid); u < ph.n_units; u += P.grid, ++it) {
            const int s = int(it % P.stages);
            mbar_wait(&empty[s], ((it / P.stages) & 1u) ^ 1u);
            const Unit t = unit_of(ph, u);
            uint32_t total = 0;
            const uint8_t* lo[4];
            uint32_t len[4];
            for (int j = 0; j < 4; ++j) {
                len[j] = 0;
                if (t.seg[j].bytes == 0) continue;
                seg_window(t.seg[j], lo[j], len[j]);
                total += len[j];
            }
            mbar_expect_tx(&full[s], total);
            uint8_t* dst = ring + size_t(s) * P.stage_bytes;
            for (int j = 0; j < 4; ++j) {
                if (len[j] == 0) continue;
                bulk_copy(dst, lo[j], len[j], &full[s]);
                dst += len[j];
            }
        }
    }
}

// ------------------------------------------------------------------ matmul phase, compute side
struct SmemX {
    float* xf;
    int8_t* xq;
    float* xd;
    int* xs;
};

// The activations of item (ea, eb), runs of 4N, from shared memory (sums precomputed per 16).
template <int N>
__device__ __forceinline__ XQn<N> xq_at(const SmemX& x, int64_t ea, int64_t eb, int flip) {
    XQn<N> r;
    r.sa = 0, r.sb = 0;
#pragma unroll
    for (int h = 0; h < N / 4; ++h) {
        const int o = 16 * (h ^ flip);
        set_words(r.a + 4 * h, *reinterpret_cast<const uint4*>(x.xq + ea + o));
        set_words(r.b + 4 * h, *reinterpret_cast<const uint4*>(x.xq + eb + o));
        r.sa += x.xs[(ea >> 4) + h], r.sb += x.xs[(eb >> 4) + h];
    }
    r.da = x.xd[ea >> 5], r.db = x.xd[eb >> 5];
    return r;
}

struct Best {
    float v = -INFINITY;
    int64_t i = -1;
};
// (value, index) packed so that a larger key is a larger value, then a lower index (-0 == +0).
__device__ __forceinline__ unsigned long long argmax_key(float v, int64_t i) {
    if (v == 0.0f) v = 0.0f;
    uint32_t b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return (static_cast<unsigned long long>(b) << 32) | (0xFFFFFFFFu - uint32_t(i));
}

// The epilogue's inputs of row r, loaded before the row's dot product so their latency overlaps it.
struct RowIn {
    float bias = 0.0f, res = 0.0f;
};
__device__ __forceinline__ RowIn row_in(const MxMatmul& m, int64_t r) {
    RowIn in;
    if (m.bias) in.bias = m.bias[r];
    if (m.res_out) in.res = ldf(m.res_a + r);
    return in;
}

// Row r (of the whole matrix) is done: bias, scale, store, residual, argmax. Lane 0 only.
__device__ __forceinline__ void row_out(const MxMatmul& m, int64_t r, float acc, const RowIn& in, Best& best) {
    float v = (acc + in.bias) * m.out_scale;
    m.y[r] = v;
    if (m.res_out) m.res_out[r] = in.res + m.res_scale * v;
    // The greedy sampler's pick: the lowest row holding the largest non-NaN value (rows come in
    // increasing order per warp); -inf counts.
    if (!isnan(v) && (best.i < 0 || v > best.v)) best.v = v, best.i = r;
}

template <GgmlType T>
__device__ __forceinline__ void dot_q(const uint8_t* q0, const uint8_t* m0, const uint8_t* q1, const uint8_t* m1,
                                      int64_t nb, const SmemX& x, float& a0, float& a1) {
    using Tr = QTraits<T>;
    constexpr QuantLayout L = quant_layout(T);
    const int lane = threadIdx.x & 31;
    const int64_t n_items = nb * Tr::kItems;
    for (int64_t i = lane; i < n_items; i += 32) {
        const int64_t blk = i / Tr::kItems;
        const int j = int(i % Tr::kItems);
        int ea, eb;
        Tr::runs(j, ea, eb);
        const int64_t base = blk * L.block_elems;
        const auto xv = xq_at<Tr::kRun / 4>(x, base + ea, base + eb, Tr::flip(blk));
        const auto w0 = Tr::template load_w<PlainLd>(q0, m0, blk, j);
        a0 += Tr::dot(w0, xv, j);
        if (q1) {
            const auto w1 = Tr::template load_w<PlainLd>(q1, m1, blk, j);
            a1 += Tr::dot(w1, xv, j);
        }
    }
}


template <GgmlType T>
__device__ __forceinline__ void dot_f(const uint8_t* q0, const uint8_t* q1, int64_t k, const SmemX& x, float& a0,
                                      float& a1) {
    const int lane = threadIdx.x & 31;
    // Rows staged in shared memory may start at any 4-byte (F32) or 2-byte offset: element loads.
    for (int64_t i = lane; i < k; i += 32) {
        const float xv = x.xf[i];
        a0 = fmaf(FTraits<T>::one(q0, i), xv, a0);
        if (q1) a1 = fmaf(FTraits<T>::one(q1, i), xv, a1);
    }
}

template <GgmlType T>
__device__ void unit_rows(const MxPhase& ph, const Unit& t, const uint8_t* stage, const SmemX& x, Best& best) {
    constexpr QuantLayout L = quant_layout(T);
    const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % kGroupWarps;  // warp of the group
    // Stage pointers of the segments (the same windows the producer copied).
    const uint8_t* sp[4] = {nullptr, nullptr, nullptr, nullptr};
    const uint8_t* cur = stage;
    for (int j = 0; j < 4; ++j) {
        if (t.seg[j].bytes == 0) continue;
        const uint8_t* lo;
        uint32_t len;
        seg_window(t.seg[j], lo, len);
        sp[j] = cur + (t.seg[j].src - lo);
        cur += len;
    }
    const MxMatmul m = ph.mm[t.mm];
    const int64_t qrb = m.q_row_bytes, mrb = m.m_row_bytes;
    if (ph.glu) {
        const MxMatmul mu = ph.mm[1];
        for (int r = warp; r < t.nr; r += kGroupWarps) {
            float g = 0.0f, u = 0.0f;
            const float bg = m.bias && lane == 0 ? m.bias[t.r0 + r] : 0.0f;
            const float bu = mu.bias && lane == 0 ? mu.bias[t.r0 + r] : 0.0f;
            if constexpr (L.block_elems > 0)
                dot_q<T>(sp[0] + r * qrb, sp[1] + r * mrb, sp[2] + r * mu.q_row_bytes, sp[3] + r * mu.m_row_bytes,
                         ph.k / L.block_elems, x, g, u);
            else
                dot_f<T>(sp[0] + r * qrb, sp[2] + r * mu.q_row_bytes, ph.k, x, g, u);
            g = warp_sum(g), u = warp_sum(u);
            if (lane == 0) {
                const int64_t row = t.r0 + r;
                g += bg, u += bu;
                m.y[row] = g;
                mu.y[row] = u;
                ph.act[row] = g / (1.0f + __expf(-g)) * u;
            }
        }
        return;
    }
    for (int r = 2 * warp; r < t.nr; r += 2 * kGroupWarps) {
        const bool two = r + 1 < t.nr;
        float a0 = 0.0f, a1 = 0.0f;
        RowIn in0, in1;
        if (lane == 0) {
            in0 = row_in(m, t.r0 + r);
            if (two) in1 = row_in(m, t.r0 + r + 1);
        }
        if constexpr (L.block_elems > 0)
            dot_q<T>(sp[0] + r * qrb, sp[1] + r * mrb, two ? sp[0] + (r + 1) * qrb : nullptr,
                     two ? sp[1] + (r + 1) * mrb : nullptr, ph.k / L.block_elems, x, a0, a1);
        else
            dot_f<T>(sp[0] + r * qrb, two ? sp[0] + (r + 1) * qrb : nullptr, ph.k, x, a0, a1);
        a0 = warp_sum(a0);
        a1 = warp_sum(a1);
        if (lane == 0) {
            row_out(m, t.r0 + r, a0, in0, best);
            if (two) row_out(m, t.r0 + r + 1, a1, in1, best);
        }
    }
}

__device__ void gemv_phase(const MxProgram& P, const MxPhase& ph, uint8_t* ring, uint64_t* full, uint64_t* empty,
                           const SmemX& x, float* red, unsigned long long* red_key, uint32_t& it,
                           long long (&prof)[4]) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const long long tp = P.prof ? clock64() : 0;
    const int64_t k = ph.k;
    csync();  // the previous phase may still read the input buffers
    // Prologue: the input row, normalised when the phase folds an RMSNorm.
    // One pass over the input in L2, 8 loads in flight per thread (each thread later rescales its own
    // elements, tid + j * kCThreads, in place).
    float ss = 0.0f;
    for (int64_t base = 0; base < k; base += 8 * kCThreads) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int64_t i = base + j * kCThreads + tid;
            v[j] = i < k ? ldf(ph.x + i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int64_t i = base + j * kCThreads + tid;
            if (i < k) x.xf[i] = v[j];
            ss = fmaf(v[j], v[j], ss);
        }
    }
    if (ph.pro == MxPrologue::kNorm) {
        const float r = rsqrtf(csum(ss, red) / float(k) + ph.eps);
        for (int64_t i = tid; i < k; i += kCThreads) {
            const float v = ph.pro_w ? x.xf[i] * r * ph.pro_w[i] : x.xf[i] * r;
            x.xf[i] = v;
            if (ph.pro_out && blockIdx.x == 0) ph.pro_out[i] = v;
        }
    }
    csync();
    // 8-bit groups of 32 (quantize_q8's arithmetic) and the sums of each 16: 8 threads per group,
    // 4 consecutive values each (a warp takes 4 groups at once).
    if (k % 32 == 0 && !(P.debug & 2)) {
        const int sub = lane & 7;
        for (int64_t gb = int64_t(warp) * 4; gb < k / 32; gb += kConsumers * 4) {
            const int64_t g = gb + (lane >> 3);
            const bool ok = g < k / 32;
            const float4 v = ok ? *reinterpret_cast<const float4*>(x.xf + 32 * g + 4 * sub) : make_float4(0, 0, 0, 0);
            float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
            for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id), q2 = __float2int_rn(v.z * id),
                      q3 = __float2int_rn(v.w * id);
            int sum = q0 + q1 + q2 + q3;
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            if (ok) {
                *reinterpret_cast<uint32_t*>(x.xq + 32 * g + 4 * sub) =
                    (uint32_t(q0) & 0xFFu) | (uint32_t(q1) & 0xFFu) << 8 | (uint32_t(q2) & 0xFFu) << 16 |
                    (uint32_t(q3) & 0xFFu) << 24;
                if (sub == 0) x.xd[g] = d, x.xs[2 * g] = sum;
                if (sub == 4) x.xs[2 * g + 1] = sum;
            }
        }
    }
    csync();
    if (P.prof) prof[0] += clock64() - tp;
    Best best;
    const int group = warp / kGroupWarps;
    for (int64_t u = first_unit(ph, P.grid); u < ph.n_units; u += P.grid, ++it) {
        if (int(it % kGroups) != group) continue;  // another group's unit
        const int s = int(it % P.stages);
        const long long tw = P.prof ? clock64() : 0;
        mbar_wait(&full[s], (it / P.stages) & 1u);
        const long long tc = P.prof ? clock64() : 0;
        if (P.prof) prof[1] += tc - tw;
        const Unit t = unit_of(ph, u);
        const uint8_t* stage = ring + size_t(s) * P.stage_bytes;
        switch (P.debug & 1 ? GgmlType::kI32 : ph.mm[t.mm].type) {
#define CERA_T(T)                                  \
    case GgmlType::T:                              \
        unit_rows<GgmlType::T>(ph, t, stage, x, best); \
        break;
            CERA_T(kQ4_0) CERA_T(kQ4_1) CERA_T(kQ5_0) CERA_T(kQ5_1) CERA_T(kQ8_0) CERA_T(kQ4_K) CERA_T(kQ5_K)
            CERA_T(kQ6_K) CERA_T(kF32) CERA_T(kF16) CERA_T(kBF16)
#undef CERA_T
            default: break;
        }
        if (P.prof) prof[3] += clock64() - tc;
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
    }
    if (ph.argmax_key) {
        const unsigned long long key = best.i >= 0 ? argmax_key(best.v, best.i) : 0ull;
        if (lane == 0) red_key[warp] = key;
        csync();
        if (tid == 0) {
            unsigned long long b = 0;
            for (int w = 0; w < kConsumers; ++w) b = red_key[w] > b ? red_key[w] : b;
            if (b) atomicMax(ph.argmax_key, b);
        }
    }
}

// ------------------------------------------------------------------ the small phases
__device__ void embed_phase(const MxProgram& P, const MxPhase& ph) {
    const MxMatmul& t = ph.mm[0];
    const int64_t row = __ldcg(ph.ids);
    const int64_t k = ph.k;
    const uint8_t* q = t.q + row * t.q_row_bytes;
    const uint8_t* m = t.m ? t.m + row * t.m_row_bytes : nullptr;
    const int64_t gt = int64_t(blockIdx.x) * kCThreads + threadIdx.x, stride = int64_t(P.grid) * kCThreads;
    auto items = [&](auto traits, int block_elems) {
        using Tr = decltype(traits);
        const int64_t n_items = k / block_elems * Tr::kItems;
        for (int64_t i = gt; i < n_items; i += stride) {
            const int64_t blk = i / Tr::kItems;
            const int j = int(i % Tr::kItems);
            const auto w = Tr::template load_w<PlainLd>(q, m, blk, j);
            float va[Tr::kRun], vb[Tr::kRun];
            Tr::dequant(w, j, va, vb);
            int ea, eb;
            Tr::runs(j, ea, eb);
            float* o = ph.out + blk * block_elems;
#pragma unroll
            for (int e = 0; e < Tr::kRun; ++e) o[ea + e] = ph.scale * va[e], o[eb + e] = ph.scale * vb[e];
        }
    };
    switch (t.type) {
#define CERA_T(T)                                                    \
    case GgmlType::T:                                                \
        items(QTraits<GgmlType::T>{}, quant_layout(GgmlType::T).block_elems); \
        break;
        CERA_T(kQ4_0) CERA_T(kQ4_1) CERA_T(kQ5_0) CERA_T(kQ5_1) CERA_T(kQ8_0) CERA_T(kQ4_K) CERA_T(kQ5_K) CERA_T(kQ6_K)
#undef CERA_T
        case GgmlType::kF32:
            for (int64_t i = gt; i < k; i += stride) ph.out[i] = ph.scale * FTraits<GgmlType::kF32>::one(q, i);
            break;
        case GgmlType::kF16:
            for (int64_t i = gt; i < k; i += stride) ph.out[i] = ph.scale * FTraits<GgmlType::kF16>::one(q, i);
            break;
        case GgmlType::kBF16:
            for (int64_t i = gt; i < k; i += stride) ph.out[i] = ph.scale * FTraits<GgmlType::kBF16>::one(q, i);
            break;
        default: break;
    }
}

__device__ void conv_phase(const MxProgram& P, const MxPhase& ph) {
    const int64_t n = ph.n;
    const int L = ph.conv_l;
    for (int64_t c = int64_t(blockIdx.x) * kCThreads + threadIdx.x; c < n; c += int64_t(P.grid) * kCThreads) {
        const float bx = ldf(ph.a + c) * ldf(ph.a + 2 * n + c);
        const float* w = ph.conv_w + c * L;
        float win[kMxMaxConv];
#pragma unroll
        for (int j = 0; j < kMxMaxConv - 1; ++j) win[j] = j < L - 1 ? ldf(ph.state + j * n + c) : 0.0f;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kMxMaxConv; ++j) {
            if (j < L - 1) s = fmaf(w[j], win[j], s);
            if (j == L - 1) s = fmaf(w[j], bx, s);
        }
        ph.out[c] = ldf(ph.a + n + c) * s;
#pragma unroll
        for (int j = 0; j < kMxMaxConv - 1; ++j) {
            if (j < L - 2) ph.state[j * n + c] = win[j + 1];
            if (j == L - 2) ph.state[j * n + c] = bx;
        }
    }
}

// Warps of the whole grid over n units.
template <class F>
__device__ __forceinline__ void grid_warps(const MxProgram& P, int64_t n, F&& f) {
    const int64_t gw = int64_t(blockIdx.x) * kConsumers + (threadIdx.x >> 5), stride = int64_t(P.grid) * kConsumers;
    for (int64_t u = gw; u < n; u += stride) f(u);
}

// Head vectors are staged in a per-warp shared buffer (read with ld.cg), rotated there, written back.
__device__ __forceinline__ void stage_head(float* buf, const float* src, int hd) {
    __syncwarp();
    for (int i = threadIdx.x & 31; i < hd; i += 32) buf[i] = ldf(src + i);
    __syncwarp();
}
__device__ __forceinline__ void unstage_head(const float* buf, float* dst, int hd) {
    __syncwarp();
    for (int i = threadIdx.x & 31; i < hd; i += 32) dst[i] = buf[i];
}

__device__ void rope_store_phase(const MxProgram& P, const MxPhase& ph, float* bufs) {
    const int hd = ph.head_dim;
    const int32_t p = __ldcg(ph.pos);
    const int64_t kv_width = int64_t(ph.n_head_kv) * hd;
    const bool in_ctx = p >= 0 && p < ph.n_ctx;
    float* hb = bufs + (threadIdx.x >> 5) * kMxMaxHeadDim;
    grid_warps(P, ph.n_head + 2 * ph.n_head_kv, [&](int64_t u) {
        const int h = int(u);
        if (h < ph.n_head) {
            float* q = ph.out + int64_t(h) * hd;
            stage_head(hb, q, hd);
            head_norm_rope(hb, hd, ph.q_norm, ph.q_eps, p, ph.q_rope);
            unstage_head(hb, q, hd);
            return;
        }
        if (h < ph.n_head + ph.n_head_kv) {
            const int hk = h - ph.n_head;
            float* kv = ph.c + int64_t(hk) * hd;
            stage_head(hb, kv, hd);
            head_norm_rope(hb, hd, ph.k_norm, ph.k_eps, p, ph.k_rope);
            unstage_head(hb, kv, hd);
            if (!in_ctx) return;
            if (ph.f16) store_head(hb, static_cast<__half*>(ph.k_cache) + p * kv_width + int64_t(hk) * hd, hd);
            else store_head(hb, static_cast<float*>(ph.k_cache) + p * kv_width + int64_t(hk) * hd, hd);
            return;
        }
        const int hv = h - ph.n_head - ph.n_head_kv;
        if (!in_ctx) return;
        stage_head(hb, ph.v + int64_t(hv) * hd, hd);
        if (ph.f16) store_head(hb, static_cast<__half*>(ph.v_cache) + p * kv_width + int64_t(hv) * hd, hd);
        else store_head(hb, static_cast<float*>(ph.v_cache) + p * kv_width + int64_t(hv) * hd, hd);
    });
}

__device__ void norm_rope_phase(const MxProgram& P, const MxPhase& ph, float* bufs) {
    const int32_t p = __ldcg(ph.pos);
    float* hb = bufs + (threadIdx.x >> 5) * kMxMaxHeadDim;
    grid_warps(P, ph.n_head, [&](int64_t h) {
        float* x = ph.out + h * ph.head_dim;
        stage_head(hb, x, ph.head_dim);
        head_norm_rope(hb, ph.head_dim, ph.q_norm, ph.q_eps, p, ph.q_rope);
        unstage_head(hb, x, ph.head_dim);
    });
}

__device__ void kv_store_phase(const MxProgram& P, const MxPhase& ph) {
    const int32_t p = __ldcg(ph.pos);
    if (p < 0 || p >= ph.n_ctx) return;
    for (int64_t c = int64_t(blockIdx.x) * kCThreads + threadIdx.x; c < ph.n; c += int64_t(P.grid) * kCThreads) {
        const int64_t dst = int64_t(p) * ph.n + c;
        if (ph.f16) {
            static_cast<__half*>(ph.k_cache)[dst] = __float2half_rn(ldf(ph.a + c));
            static_cast<__half*>(ph.v_cache)[dst] = __float2half_rn(ldf(ph.v + c));
        } else {
            static_cast<float*>(ph.k_cache)[dst] = ldf(ph.a + c);
            static_cast<float*>(ph.v_cache)[dst] = ldf(ph.v + c);
        }
    }
}

// Keys of the query at pos p: [lo, p]; chunked so that the grid's warps share the work.
__device__ __forceinline__ void attn_chunks(const MxPhase& ph, int32_t p, int64_t& lo, int64_t& hi, int64_t& chunk,
                                            int& n_chunks) {
    attn_key_range(p, ph.n_ctx, ph.window, lo, hi);
    const int64_t n_keys = max(hi - lo, int64_t(0));
    chunk = (n_keys + ph.max_chunks - 1) / ph.max_chunks;
    chunk = max(int64_t(32), (chunk + 31) / 32 * 32);
    n_chunks = int((n_keys + chunk - 1) / chunk);
}

// q (shared memory) . one cached f32 key row of hd elements (hd % 4 == 0, rows 16-byte aligned).
__device__ __forceinline__ float key_dot(const float* q, const float* k, int hd) {
    float s = 0.0f;
    for (int d = 0; d < hd; d += 4) {
        const float4 f = __ldcg(reinterpret_cast<const float4*>(k + d));
        s = fmaf(q[d], f.x, fmaf(q[d + 1], f.y, fmaf(q[d + 2], f.z, fmaf(q[d + 3], f.w, s))));
    }
    return s;
}

template <class C>
__device__ __forceinline__ float kv_at(const void* cache, int64_t i) {
    if constexpr (sizeof(C) == 2) return __half2float(__ldcg(static_cast<const __half*>(cache) + i));
    else return __ldcg(static_cast<const float*>(cache) + i);
}

// One warp per (head, chunk of keys): lanes over keys for q.k (each lane reads its key's row), an
// online softmax over 32-key tiles, then lanes over dimensions for p.V with the V rows of 8 keys
// loaded before they are used (DPL = head_dim / 32 dimensions per lane).
template <class C, int DPL>
__device__ void attn_phase_t(const MxProgram& P, const MxPhase& ph, float* qbuf_all) {
    constexpr int HD = 32 * DPL;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t p = __ldcg(ph.pos);
    int64_t lo, hi, chunk;
    int n_chunks;
    attn_chunks(ph, p, lo, hi, chunk, n_chunks);
    const int group = ph.n_head / ph.n_head_kv;
    const int64_t kv_width = int64_t(ph.n_head_kv) * HD;
    float* qs = qbuf_all + warp * kMxMaxHeadDim;
    const C* kc = static_cast<const C*>(ph.k_cache);
    const C* vc = static_cast<const C*>(ph.v_cache);
    grid_warps(P, int64_t(ph.n_head) * n_chunks, [&](int64_t u) {
        const int h = int(u / n_chunks), c = int(u % n_chunks);
        const int kvh = h / group;
        __syncwarp();
#pragma unroll
        for (int i = 0; i < DPL; ++i) qs[lane + 32 * i] = ldf(ph.a + int64_t(h) * HD + lane + 32 * i) * ph.scale;
        __syncwarp();
        const int64_t k0 = lo + int64_t(c) * chunk, k1 = min(lo + int64_t(c + 1) * chunk, hi);
        float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
        for (int64_t t0 = k0; t0 < k1; t0 += 32) {
            const int64_t key = t0 + lane;
            float s = -INFINITY;
            if (key < k1) {
                const C* kr = kc + key * kv_width + int64_t(kvh) * HD;
                float dot = 0.0f;
                if constexpr (sizeof(C) == 2) {
                    uint4 raw[HD / 8];
#pragma unroll
                    for (int d = 0; d < HD / 8; ++d) raw[d] = __ldcg(reinterpret_cast<const uint4*>(kr) + d);
#pragma unroll
                    for (int d = 0; d < HD / 8; ++d) {
                        const __half2* h2 = reinterpret_cast<const __half2*>(&raw[d]);
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const float2 f = __half22float2(h2[e]);
                            dot = fmaf(qs[8 * d + 2 * e], f.x, fmaf(qs[8 * d + 2 * e + 1], f.y, dot));
                        }
                    }
                } else {
                    dot = key_dot(qs, reinterpret_cast<const float*>(kr), HD);
                }
                s = dot;
            }
            const float m_new = fmaxf(m, warp_max(s));
            const float pe = key < k1 ? __expf(s - m_new) : 0.0f;
            const float corr = __expf(m - m_new);
            l = l * corr + warp_sum(pe);
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[i] *= corr;
            const int nk = int(min(int64_t(32), k1 - t0));
            constexpr int KB = DPL >= 4 ? 4 : 8;  // keys whose V rows are loaded together
            for (int jb = 0; jb < nk; jb += KB) {
                float vv[KB][DPL];
#pragma unroll
                for (int jj = 0; jj < KB; ++jj) {
                    const int64_t row = min(t0 + jb + jj, k1 - 1);
                    const C* vr = vc + row * kv_width + int64_t(kvh) * HD;
#pragma unroll
                    for (int i = 0; i < DPL; ++i) vv[jj][i] = kv_at<C>(vr, lane + 32 * i);
                }
#pragma unroll
                for (int jj = 0; jj < KB; ++jj) {
                    const float pj = __shfl_sync(0xffffffffu, pe, (jb + jj) & 31);
                    if (jb + jj < nk) {
#pragma unroll
                        for (int i = 0; i < DPL; ++i) acc[i] = fmaf(pj, vv[jj][i], acc[i]);
                    }
                }
            }
            m = m_new;
        }
        float* out = ph.partial + (int64_t(h) * ph.max_chunks + c) * (HD + 2);
        if (lane == 0) out[0] = m, out[1] = l;
#pragma unroll
        for (int i = 0; i < DPL; ++i) out[2 + lane + 32 * i] = acc[i];
    });
}

template <class C>
__device__ void attn_phase(const MxProgram& P, const MxPhase& ph, float* qbuf) {
    switch (ph.head_dim) {
        case 32: attn_phase_t<C, 1>(P, ph, qbuf); break;
        case 64: attn_phase_t<C, 2>(P, ph, qbuf); break;
        case 128: attn_phase_t<C, 4>(P, ph, qbuf); break;
        case 256: attn_phase_t<C, 8>(P, ph, qbuf); break;
        default: break;  // the builder only accepts these
    }
}

__device__ void attn_combine_phase(const MxProgram& P, const MxPhase& ph) {
    const int lane = threadIdx.x & 31;
    const int hd = ph.head_dim, dpl = hd / 32;
    const int32_t p = __ldcg(ph.pos);
    int64_t lo, hi, chunk;
    int n_chunks;
    attn_chunks(ph, p, lo, hi, chunk, n_chunks);
    grid_warps(P, ph.n_head, [&](int64_t h) {
        const float* base = ph.partial + h * ph.max_chunks * (hd + 2);
        float M = -INFINITY;
        for (int c = lane; c < n_chunks; c += 32) M = fmaxf(M, ldf(base + int64_t(c) * (hd + 2)));
        M = warp_max(M);
        float Lsum = 0.0f, acc[kMxMaxHeadDim / 32];
#pragma unroll
        for (int i = 0; i < kMxMaxHeadDim / 32; ++i) acc[i] = 0.0f;
        for (int c = 0; c < n_chunks; ++c) {
            const float* pc = base + int64_t(c) * (hd + 2);
            const float f = __expf(ldf(pc) - M);
            Lsum += ldf(pc + 1) * f;
#pragma unroll
            for (int i = 0; i < kMxMaxHeadDim / 32; ++i)
                if (i < dpl) acc[i] = fmaf(ldf(pc + 2 + lane + 32 * i), f, acc[i]);
        }
        const float inv = Lsum > 0.0f ? 1.0f / Lsum : 0.0f;
#pragma unroll
        for (int i = 0; i < kMxMaxHeadDim / 32; ++i)
            if (i < dpl) ph.out[h * hd + lane + 32 * i] = acc[i] * inv;
    });
}

__device__ void norm_phase(const MxPhase& ph, float* red) {
    if (blockIdx.x != 0) return;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < ph.n; i += kCThreads) {
        const float v = ldf(ph.a + i);
        ss = fmaf(v, v, ss);
    }
    const float r = rsqrtf(csum(ss, red) / float(ph.n) + ph.eps);
    for (int64_t i = threadIdx.x; i < ph.n; i += kCThreads) {
        const float v = ldf(ph.a + i) * r;
        ph.out[i] = ph.pro_w ? v * ph.pro_w[i] : v;
    }
}

__device__ void elementwise_phase(const MxProgram& P, const MxPhase& ph) {
    for (int64_t i = int64_t(blockIdx.x) * kCThreads + threadIdx.x; i < ph.n; i += int64_t(P.grid) * kCThreads) {
        switch (ph.kind) {
            case MxKind::kSwiglu: {
                const float g = ldf(ph.a + i);
                ph.out[i] = g / (1.0f + __expf(-g)) * ldf(ph.b + i);
                break;
            }
            case MxKind::kAdd: ph.out[i] = ldf(ph.a + i) + ph.scale * ldf(ph.b + i); break;
            case MxKind::kScale: ph.out[i] = ldf(ph.out + i) * ph.scale; break;
            default: break;
        }
    }
}

__global__ void __launch_bounds__(kThreads, 1) decode_step_kernel(const MxProgram P) {
    extern __shared__ __align__(128) uint8_t smem[];
    uint8_t* ring = smem;
    uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarOff);
    uint64_t* empty = full + kMxMaxStages;
    if (threadIdx.x == 0) {
        for (int s = 0; s < P.stages; ++s) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kGroupWarps);
        }
        mbar_init_fence();
    }
    __syncthreads();
    if (threadIdx.x >= kCThreads) {
        producer(P, ring, full, empty, reinterpret_cast<MxPhase*>(smem + kPhaseOff) + 1);
        return;
    }
    SmemX x;
    x.xf = reinterpret_cast<float*>(smem + kXfOff);
    x.xq = reinterpret_cast<int8_t*>(smem + kXqOff);
    x.xd = reinterpret_cast<float*>(smem + kXdOff);
    x.xs = reinterpret_cast<int*>(smem + kXsOff);
    float* red = reinterpret_cast<float*>(smem + kRedOff);
    auto* red_key = reinterpret_cast<unsigned long long*>(smem + kRedOff + 64 * 4);
    uint32_t it = 0;
    unsigned n_barriers = 0;
    long long prof[4] = {0, 0, 0, 0};  // matmul prologues, waits for weights, input loads, row dots
    MxPhase* slot = reinterpret_cast<MxPhase*>(smem + kPhaseOff);
    for (int pi = 0; pi < P.n_phases; ++pi) {
        csync();  // every compute warp is done with the previous descriptor
        load_phase(&P.phases[pi], slot, threadIdx.x, kCThreads);
        // Warm this SM's cache with the next descriptor.
        if (pi + 1 < P.n_phases && threadIdx.x * 128 < int(sizeof(MxPhase)))
            asm volatile("prefetch.global.L1 [%0];" ::"l"(reinterpret_cast<const uint8_t*>(&P.phases[pi + 1]) +
                                                          threadIdx.x * 128));
        csync();
        const MxPhase& ph = *slot;
        const long long t0 = P.prof ? clock64() : 0;
        if (ph.barrier) grid_sync(P.sync, ++n_barriers, unsigned(P.grid));
        const long long t1 = P.prof ? clock64() : 0;
        switch (ph.kind) {
            case MxKind::kGemv: gemv_phase(P, ph, ring, full, empty, x, red, red_key, it, prof); break;
            case MxKind::kEmbed: embed_phase(P, ph); break;
            case MxKind::kConv: conv_phase(P, ph); break;
            case MxKind::kRopeStore: rope_store_phase(P, ph, x.xf); break;
            case MxKind::kNormRope: norm_rope_phase(P, ph, x.xf); break;
            case MxKind::kKvStore: kv_store_phase(P, ph); break;
            case MxKind::kAttn:
                csync();  // the q buffers reuse the f32 input buffer
                if (ph.f16) attn_phase<__half>(P, ph, x.xf);
                else attn_phase<float>(P, ph, x.xf);
                break;
            case MxKind::kAttnCombine: attn_combine_phase(P, ph); break;
            case MxKind::kNorm: norm_phase(ph, red); break;
            case MxKind::kSwiglu:
            case MxKind::kAdd:
            case MxKind::kScale: elementwise_phase(P, ph); break;
            case MxKind::kArgmaxFinal:
                if (blockIdx.x == 0 && threadIdx.x == 0) {
                    const unsigned long long key = __ldcg(ph.argmax_key);
                    *ph.out_i = key ? int32_t(0xFFFFFFFFu - uint32_t(key & 0xFFFFFFFFu)) : 0;
                    *ph.argmax_key = 0ull;
                }
                break;
        }
        if (P.prof && threadIdx.x == 0) {
            long long* o = P.prof + (int64_t(pi) * P.grid + blockIdx.x) * 2;
            o[0] = t1 - t0, o[1] = clock64() - t1;
        }
    }
    if (P.prof && threadIdx.x == 0) {
        long long* o = P.prof + int64_t(P.n_phases) * P.grid * 2 + blockIdx.x * 4;
        o[0] = prof[0], o[1] = prof[1], o[2] = prof[2], o[3] = prof[3];
    }
    // The last block to finish resets the counters for the next launch.
    csync();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(&P.sync[kSyncDone], 1u) == unsigned(P.grid) - 1) {
            P.sync[kSyncCount] = 0;
            P.sync[kSyncDone] = 0;
            P.sync[kSyncFlag] = 0;
            __threadfence();
        }
    }
}

}  // namespace

int mx_stages() {
    static const int n = [] {
        const char* e = std::getenv("CERA_CUDA_MX_STAGES");
        const int v = e ? std::atoi(e) : 8;
        return v == 4 || v == 8 || v == 16 ? v : 8;  // a multiple of kGroups
    }();
    return n;
}

int mx_stage_bytes() {
    static const int n = [] {
        const char* e = std::getenv("CERA_CUDA_MX_STAGE_KB");
        const int kb = e ? std::atoi(e) : 8;
        return std::min(std::max(kb, 4), kMxRingBytes / 1024 / mx_stages()) * 1024;
    }();
    return n;
}

int64_t mx_unit_rows(const MxMatmul& m, int n_mats, int stage_bytes) {
    const int64_t per_row = m.q_row_bytes + m.m_row_bytes;
    const int64_t budget = stage_bytes / n_mats - 64;  // two 16-byte windows may each add 16 + 15 bytes
    return per_row > 0 ? budget / per_row : 0;
}

int decode_program_grid() {
    static const int grid = [] {
        int dev = 0;
        cudaDeviceProp prop{};
        if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        if (prop.major != 9 || !prop.cooperativeLaunch || int(prop.sharedMemPerBlockOptin) < kSmemBytes) return 0;
        if (cudaFuncSetAttribute(decode_step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
            cudaSuccess) {
            cudaGetLastError();
            return 0;
        }
        int per_sm = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_step_kernel, kThreads, kSmemBytes) !=
                cudaSuccess ||
            per_sm < 1) {
            cudaGetLastError();
            return 0;
        }
        return prop.multiProcessorCount;
    }();
    return grid;
}

void decode_program_launch(const MxProgram& p, Stream stream) {
    CERA_CHECK(p.grid > 0 && p.grid == decode_program_grid());
    void* args[] = {const_cast<MxProgram*>(&p)};
    CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(decode_step_kernel), dim3(unsigned(p.grid)),
                                           dim3(kThreads), args, size_t(kSmemBytes), as_stream(stream)));
}

}  // namespace cera::cuda
