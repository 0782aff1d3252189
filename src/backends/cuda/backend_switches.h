// What a CUDA backend (cuda_backend.cpp) may fuse and which kernels it picks, made once from its
// options (backend.h: CudaOptions). Tests build backends with other options side by side.
#pragma once

#include "backends/backend.h"

namespace cera::cuda {

// The launches that make a one-token norm after a residual product in their prologue (take_prologue)
// rather than leave it to that product's launch: a mask of these.
enum ProKind { kProGluStaged = 1, kProQkv = 2, kProConv = 4, kProGluWave = 8, kProDefault = 7 };

struct BackendSwitches {
    bool graphs = true;
    bool fuse = true;  // false: no grouped or fused launches, no 8-bit side outputs
    // Products fused with their consumer (gemv_fused.cu): q/k/v + RoPE + KV store for every block type,
    // in_proj + short conv for Q5_K / Q6_K (heavy_scales), whose scale decoding the conv's launch
    // overlaps; Q4_K's 32-element items stay unfused, as Q4_0. 0: never, 1: those, 2: every type.
    int fuse_products = 1;
    int pro_mask = kProDefault;  // ProKind mask (0 without fusion)
    int glu_stage = -1;          // GemvArgs::glu_stage, -1: the kernel's default
    int glu_wide = -1;           // GemvArgs::glu_wide
    int pro_xreg = -1;           // GemvArgs::pro_xreg
    int qkv_rows = -1;           // QkvRopeArgs::rows_kernel
    bool head_stream = true;     // GemvArgs::no_stream when false
    bool moe_grouped = true;
    int moe_tile_rows = 0;
    bool profile = false;
};

inline BackendSwitches backend_switches(const CudaOptions& o) {
    const CudaVariants& v = o.variants;
    BackendSwitches s;
    s.graphs = o.graphs;
    s.fuse = o.fuse;
    s.fuse_products = !o.fuse ? 0 : v.fuse_all_products ? 2 : 1;
    s.pro_mask = !o.fuse ? 0 : v.norm_prologues >= 0 ? v.norm_prologues : kProDefault;
    s.glu_stage = v.glu_registers ? 0 : -1;
    s.glu_wide = v.glu_narrow ? 0 : -1;
    s.pro_xreg = v.pro_smem ? 0 : -1;
    s.qkv_rows = v.qkv_head_blocks ? 0 : -1;
    s.head_stream = !v.head_register;
    s.moe_grouped = !v.moe_per_slot;
    s.moe_tile_rows = v.moe_tile_rows;
    s.profile = o.profile;
    return s;
}

}  // namespace cera::cuda
