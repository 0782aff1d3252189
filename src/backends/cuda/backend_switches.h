// The switches a CUDA backend (cuda_backend.cpp) reads from the environment when it is made: what the
// decode fusion may do, and which kernels it picks, for A/B runs (README) and for tests that compare
// one backend's kernels with another's in one process.
#pragma once

namespace cera::cuda {

// The launches that make a one-token norm after a residual product in their prologue (take_prologue)
// rather than leave it to that product's launch (bench/NOTES.md): a mask of these. The fused in_proj +
// conv (K-quants) joined the default with the 8-warp pair and the GEMV carveouts: lfm2-1.2b Q4_K
// +0.5%, the others even (it was -1% before them).
enum ProKind { kProGluStaged = 1, kProQkv = 2, kProConv = 4, kProGluWave = 8, kProDefault = 7 };

struct BackendSwitches {
    bool graphs = true;  // CERA_CUDA_GRAPHS=0: every step runs eagerly
    bool fuse = true;    // CERA_CUDA_FUSE=0: no grouped or fused launches, no 8-bit side outputs
    // Products fused with their consumer (gemv_fused.cu), where each measured faster (bench/NOTES.md):
    // q/k/v + RoPE + KV store for every block type, in_proj + short conv for Q5_K / Q6_K
    // (heavy_scales; Q4_K's 32-element items unfused, as Q4_0: lfm2-1.2b +1.2%). 0: never, 1: where it
    // measured faster (fuses_product), 2: always (CERA_CUDA_FUSE_PRODUCTS=0|all).
    int fuse_products = 1;
    int fuse_conv = -1;             // CERA_CUDA_FUSE_CONV=0|1: in_proj + conv fused for no / every type
    int pro_mask = kProDefault;     // CERA_CUDA_NORM_PRO (ProKind mask; 0 without fusion)
    int glu_stage = -1;             // CERA_CUDA_GLU_STAGE (GemvArgs::glu_stage), -1: the kernel's default
    int glu_wide = -1;              // CERA_CUDA_GLU_WIDE (GemvArgs::glu_wide)
    int pro_xreg = -1;              // CERA_CUDA_PRO_XREG (GemvArgs::pro_xreg)
    bool hold_norm = true;          // CERA_CUDA_HOLD_NORM=0: a norm after no residual product is launched
    int qkv_rows = -1;              // CERA_CUDA_QKV_ROWS (QkvRopeArgs::rows_kernel)
    bool mega = false;              // CERA_CUDA_MEGA=1: decode programs instead of graphs
    bool profile = false;           // CERA_CUDA_PROFILE=1: GPU and host time per decode step
    bool mailbox = true;            // CERA_CUDA_MAILBOX=0: the pick is copied back on the stream
};

BackendSwitches backend_switches();

}  // namespace cera::cuda
