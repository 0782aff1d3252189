// One decode step as one persistent kernel ("decode program"): the ops of a recorded single-token
// step become a list of phases that every block of one grid (one block per SM) walks in order,
// with a grid-wide barrier only where a phase reads what an earlier one wrote. Plain C++ (no CUDA
// types): the program is built on the host (decode_program.cpp) and run by decode_step.cu.
//
// Why: batch-1 decode of a ~1B model is ~100 dependent steps of a few microseconds each. As
// separate kernels every step pays a launch boundary and starts its weight reads only when it
// starts. Here one producer warp per block streams the block's share of every matmul's weights,
// phase after phase, into a ring of shared-memory stages with bulk copies (cp.async.bulk, completed
// on mbarriers), never waiting at grid barriers: the next layers' weights are in flight while the
// current phase computes, so HBM streams continuously and a phase boundary costs a barrier.
// Status (bench/NOTES.md): correct (tests compare it with the graph path and the CPU), but on the
// H200 a step still takes ~1.1-1.4 ms against ~0.62 ms for the graph of fused kernels: per phase the
// input read after a barrier, the quantization and the short per-unit dots are latency-bound, and
// every barrier waits for the slowest block. Opt-in (CERA_CUDA_MEGA=1) while that is worked on.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cuda/kernels.h"

namespace cera::cuda {

// Limits of the decode program (a step outside them runs as a CUDA graph of the usual kernels).
constexpr int kMxMaxK = 16384;     // input length of a matmul (f32 and 8-bit copies in shared memory)
constexpr int kMxMaxMm = 3;        // matmuls sharing one input in a phase (q/k/v)
constexpr int kMxMaxHeadDim = 256;  // attention head size (a multiple of 32)
constexpr int kMxMaxConv = 8;      // short-conv kernel length

enum class MxKind : int32_t {
    kEmbed,        // out = scale * table[ids[0]]
    kGemv,         // matmuls sharing one input, with a prologue on the input and epilogues per row
    kConv,         // LFM2 short conv of one token, state rolled in place
    kRopeStore,    // per-head norm + RoPE of q and k, then k and v appended to the cache
    kNormRope,     // per-head norm + RoPE of one tensor
    kKvStore,      // k and v appended to the cache
    kAttn,         // attention of one query: partial softmax sums per (head, key chunk)
    kAttnCombine,  // merges the chunks of every head into out
    kNorm,         // rms_norm of one row
    kSwiglu,       // out = silu(g) * u
    kAdd,          // out = a + scale * b
    kScale,        // x *= s
    kArgmaxFinal,  // out[0] = the index packed in the argmax key; the key is reset
};

// The input prologue of a kGemv phase, computed by every block into shared memory.
enum class MxPrologue : int32_t {
    kNone,  // in = x
    kNorm,  // in = rms_norm(x) * w; block 0 also writes it to pro_out
};

struct MxMatmul {
    GgmlType type = GgmlType::kF32;
    const uint8_t* q = nullptr;  // first row's quants (float types: the row data)
    const uint8_t* m = nullptr;  // first row's scales (block types), else null
    int64_t rows = 0;
    int64_t q_row_bytes = 0, m_row_bytes = 0;
    int64_t unit_rows = 0;  // rows per work unit (one ring stage)
    int64_t n_units = 0;
    const float* bias = nullptr;
    float* y = nullptr;
    float out_scale = 1.0f;       // y = (W in + bias) * out_scale
    const float* res_a = nullptr;  // residual epilogue: res_out = res_a + res_scale * y
    float* res_out = nullptr;
    float res_scale = 1.0f;
};

struct alignas(16) MxPhase {
    MxKind kind = MxKind::kGemv;
    int32_t barrier = 0;  // a grid barrier before this phase
    // kGemv
    MxPrologue pro = MxPrologue::kNone;
    const float* x = nullptr;  // the input row (kNone / kNorm)
    const float* pro_w = nullptr;
    float eps = 0.0f;
    float* pro_out = nullptr;
    int64_t k = 0;
    int32_t n_mm = 0;
    int32_t glu = 0;  // mm[0] = gate, mm[1] = up (same rows, paired units): act = silu(gate) * up
    float* act = nullptr;
    MxMatmul mm[kMxMaxMm];
    int64_t n_units = 0;  // all matmuls' units (glu: mm[0]'s)
    int32_t rot = 0;      // unit u runs on block (u + rot) % grid
    unsigned long long* argmax_key = nullptr;  // also fold the rows' argmax into this key
    // kEmbed (table as an mm[0]-style weight), kConv, kRopeStore, kNormRope, kKvStore, kAttn, ...
    const int32_t* ids = nullptr;
    const int32_t* pos = nullptr;
    float scale = 1.0f;
    float* out = nullptr;
    int64_t n = 0;  // row length / element count
    const float* a = nullptr;
    const float* b = nullptr;
    float* c = nullptr;  // second output (k for kRopeStore)
    const float* v = nullptr;
    // conv
    const float* conv_w = nullptr;
    float* state = nullptr;
    int32_t conv_l = 0;
    // rope / attention
    int32_t n_head = 0, n_head_kv = 0, head_dim = 0;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
    float q_eps = 0.0f, k_eps = 0.0f;
    RopeArgs q_rope, k_rope;
    void* k_cache = nullptr;
    void* v_cache = nullptr;
    int32_t f16 = 1;
    int64_t n_ctx = 0;
    int32_t window = 0;
    float* partial = nullptr;  // [n_head, max_chunks, head_dim + 2]
    int32_t max_chunks = 0;
    int32_t* out_i = nullptr;  // kArgmaxFinal
};

struct MxProgram {
    const MxPhase* phases = nullptr;  // device memory
    int32_t n_phases = 0;
    unsigned* sync = nullptr;  // device, kMxSyncWords zeroed words: barrier arrivals, flag, blocks done

    int32_t grid = 0;
    int32_t stages = 8;
    int32_t stage_bytes = 8192;
    int32_t debug = 0;  // timing experiments (CERA_CUDA_MX_DEBUG): 1 skip the row dots, 2 skip the input quantization
    long long* prof = nullptr;  // or [n_phases + 1, grid, 2] SM clocks (profiling; the last row: matmul
                                // prologues, waits for weights)
};

constexpr int kMxSyncWords = 64;

// Ring geometry, and the launch (a cooperative grid of `grid` blocks, one per SM).
// The ring is kMxRingBytes of shared memory cut into `stages` stages (MxProgram::stages, 2..16).
constexpr int kMxRingBytes = 128 * 1024;
constexpr int kMxMaxStages = 16;
int mx_stages();       // CERA_CUDA_MX_STAGES (4, 8, 16), else 8
int mx_stage_bytes();  // CERA_CUDA_MX_STAGE_KB, else 8 KB (stages * stage bytes <= kMxRingBytes)
int decode_program_grid();  // blocks the program is built for (0: cannot run here)
// Rows per ring stage for n_mats paired matrices.
int64_t mx_unit_rows(const MxMatmul& m, int n_mats, int stage_bytes);
void decode_program_launch(const MxProgram& p, Stream stream);

}  // namespace cera::cuda
