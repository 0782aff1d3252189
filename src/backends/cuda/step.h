// A recorded step of the CUDA backend: the backend's ops append nodes (kernel arguments in device
// pointers) to a Step instead of launching; at the step's end, or wherever the host needs the results
// (read, write, synchronize), the fusion passes (step_fusion.cpp) rewrite the nodes and the executor
// (cuda_backend.cpp) launches what is left, in order, captured as a CUDA graph inside step_begin /
// step_end. Plain C++: the passes are tested without a GPU (tests/cuda_step_test.cpp).
//
// A node holds everything its launch needs, so a rule rewrites nodes without looking back at the ops.
// Products of up to kGemvMaxTokens tokens (GemvNode) read 8-bit rows of their input (block types);
// the last pass gives every such read a source: the 8-bit rows that the op producing the input wrote
// beside it, or a QuantizeNode.
#pragma once
#include <cstdint>
#include <functional>
#include <variant>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/lora.h"

namespace cera::cuda {

constexpr int64_t kGemvMaxTokens = 8;

// Scratch buffers of the backend. quantize_inputs hands out kXq (QuantizeNode) and kXqA / kXqB (8-bit
// rows written by the op that produces a product's input, alternating so that an op never writes the
// rows it reads); the others are taken by the launches themselves (kAttnFull: attention_full's
// operands in the form its kernel reads, encoder_ops.h).
// clang-format off
enum Slot { kXq, kXqA, kXqB, kMoeXa, kMoeXb, kW16a, kW16b, kX16, kAttn, kMoeG, kMoeU, kMoeY, kMoeR, kArgmax, kLora,
            kLoraDelta, kLoraX16, kLoraT16, kAttnFull, kSlots };
// clang-format on

// GemvArgs::xq of a block-type product until quantize_inputs gives it its rows (the kernels' support
// checks only ask whether a product reads 8-bit rows).
inline void* const kXqPending = reinterpret_cast<void*>(uintptr_t(256));

// One to kMaxSegs products sharing x / xq, the weight type (or a q/k/v mixture), k and n_y: q/k/v,
// gate/up, or one product. a[0] may carry the residual epilogue and its norm.
struct GemvNode {
    GemvArgs a[kMaxSegs];
    int n = 1;
};
// A batched product: the weight expanded to F16 (block types) and cuBLAS.
struct GemmNode {
    WeightRef w;
    int64_t rows = 0, n_tokens = 0;
    const float* x = nullptr;
    const float* bias = nullptr;
    float* y = nullptr;
    int expansion = -1;  // the executor's: this product's place among the step's expansions
};
struct NormNode {
    const float* x = nullptr;
    const float* w = nullptr;
    float eps = 0.0f;
    int64_t rows = 0, k = 0;
    float* out = nullptr;
    bool w_f32 = true;  // w is F32 or absent: the fused forms take it
    void* xq = nullptr;
};
struct RopeNode {
    float* x = nullptr;
    int64_t n_tokens = 0;
    int n_head = 0, head_dim = 0;
    const float* norm_w = nullptr;
    float eps = 0.0f;
    const int32_t* pos = nullptr;
    RopeArgs rope;
};
struct KvStoreNode {
    float* k = nullptr;
    float* v = nullptr;
    int64_t n_tokens = 0, width = 0;
    const int32_t* pos = nullptr;
    void* k_cache = nullptr;
    void* v_cache = nullptr;
    KvCodec codec = KvCodec::kF16, v_codec = KvCodec::kF16;  // of the keys, of the values
    int64_t n_ctx = 0;
};
// Each head of x (n_heads of head_dim floats) through the rotated caches' rotation, or its inverse.
struct RotateNode {
    float* x = nullptr;
    int64_t n_heads = 0;
    int head_dim = 0;
    bool inverse = false;
};
// RoPE of q (optional) and k, then the KV store, in one launch; with the q/k/v products too (products).
struct QkvRopeNode {
    QkvRopeArgs r;
    GemvArgs qkv[3];
    bool products = false;
};
// The short conv; with the one-token in_proj product that makes bcx (product).
struct ConvNode {
    const float* bcx = nullptr;
    const float* w = nullptr;
    int taps = 0;
    float* state = nullptr;
    float* state_prev = nullptr;
    int64_t n_tokens = 0, n_embd = 0;
    float* out = nullptr;
    void* xq = nullptr;
    GemvArgs in;
    bool product = false;
};
struct SwigluNode {
    const float* gate = nullptr;
    const float* up = nullptr;
    int64_t n = 0, row = 0;
    float* out = nullptr;
    void* xq = nullptr;
};
// The gate/up pair and the SwiGLU of their outputs in one launch (act and its 8-bit rows xq).
struct GluNode {
    GemvArgs g, u;
    float* act = nullptr;
    void* xq = nullptr;
};
struct AddNode {
    const float* a = nullptr;
    const float* b = nullptr;
    float scale = 1.0f;
    int64_t n = 0;
    float* out = nullptr;
};
struct AttentionNode {
    AttentionArgs a;
};
// argmax_feed of x; with the LM-head product that makes x (product).
struct PickNode {
    const float* x = nullptr;
    int64_t n = 0;
    int32_t* out = nullptr;
    int32_t* ids = nullptr;
    int32_t* pos = nullptr;
    int64_t pos_last = 0;
    GemvArgs head;
    bool product = false;
};
struct QuantizeNode {
    const float* x = nullptr;
    int64_t rows = 0, k = 0;
    void* xq = nullptr;
};
// The LoRA deltas of up to kMaxSegs products sharing the input x (f32 [n_rows, k]; lora.h). As recorded
// (one product, delta null) its segments' deltas add into y ([n_rows, n_out]) after the base product.
// hoist_lora turns a one-row node into the delta form: it runs before the base products and writes
// delta = bias + the deltas ([n_out]), which they take as their bias, so they keep their fusions; its
// x may then be made from pro_x (the RMSNorm prologue, as GemvArgs::pro_x).
struct LoraProductNode {
    std::vector<LoraSegDev> segs;
    float* y = nullptr;
    int64_t n_out = 0;
    const float* bias = nullptr;
    float* delta = nullptr;
};
struct LoraNode {
    const float* x = nullptr;
    int64_t k = 0, n_rows = 0;
    LoraProductNode p[kMaxSegs];
    int n = 1;
    const float* pro_x = nullptr;
    const float* pro_w = nullptr;
    float pro_eps = 0.0f;
    bool delta() const { return p[0].delta != nullptr; }
};
// Any other op, launched by `run`: the passes take it to write anything.
struct OtherNode {
    std::function<void()> run;
};

using Node =
    std::variant<std::monostate, GemvNode, GemmNode, NormNode, RopeNode, KvStoreNode, QkvRopeNode, ConvNode, SwigluNode,
                 GluNode, AddNode, AttentionNode, PickNode, QuantizeNode, RotateNode, LoraNode, OtherNode>;

struct Step {
    std::vector<Node> nodes;
};

// What the kernels take: the backend fills these from kernels.h, tests with stand-ins.
struct FusionCaps {
    bool (*norm_prologue)(GgmlType type, int64_t k, int n_y) = nullptr;  // gemv_norm_prologue_supported
    bool (*norm_epilogue)(const GemvArgs& a) = nullptr;                  // gemv_norm_supported
    bool (*glu)(GgmlType type, int64_t rows) = nullptr;                  // gemv_glu_supported
    bool (*glu_staged)(const GemvArgs& g, const GemvArgs& u) = nullptr;  // gemv_glu_staged
    bool (*qkv_rope)(const GemvArgs (&qkv)[3], const QkvRopeArgs& r) = nullptr;
    bool (*qkv_v_fits)(GgmlType t, GgmlType tv) = nullptr;
    bool (*conv)(const GemvArgs& in_proj, int taps) = nullptr;
    bool (*heavy_scales)(GgmlType type) = nullptr;
};

// What the passes may do: the backend's options (backend_switches.h) and kernels.
struct FusionRules {
    bool fuse = true;       // false: every pass but quantize_inputs leaves the step as recorded
    int fuse_products = 1;  // BackendSwitches::fuse_products
    int pro_mask = 0;       // BackendSwitches::pro_mask (ProKind bits)
    int glu_stage = -1, glu_wide = -1, pro_xreg = -1, qkv_rows = -1;  // the variants GluNode / QkvRopeNode take
    FusionCaps caps;
    unsigned* norm_ctr = nullptr;  // GemvArgs::norm_ctr for the residual norms
};

// The passes, in the order fuse_step applies them; each is one rule over the node list.
// One-row LoRA nodes in front of their products, in delta form (deltas in buffer(kLoraDelta, ..)), and
// those of products sharing an input (q/k/v, gate/up) as one launch.
void hoist_lora(Step& s, const FusionRules& r, const std::function<void*(Slot, size_t)>& buffer);
void group_products(Step& s, const FusionRules& r);   // products sharing an input: one launch
void fuse_glu(Step& s, const FusionRules& r);         // gate/up pair + swiglu
void fuse_residual(Step& s, const FusionRules& r);    // product + add of its output: epilogue
void fuse_norm(Step& s, const FusionRules& r);        // residual product + rms_norm of the sum
void fuse_qkv_rope(Step& s, const FusionRules& r);    // [q/k/v products +] RoPEs + KV store
void fuse_conv(Step& s, const FusionRules& r);        // in_proj product + short conv
void fuse_pick(Step& s, const FusionRules& r);        // LM head + argmax_feed
void norm_prologues(Step& s, const FusionRules& r);   // a one-token norm into the launch reading it
// Gives every 8-bit read its rows: those written beside the input by the op that made it, or a
// QuantizeNode inserted before the first reader. buffer(slot, bytes): the scratch buffer of that slot.
void quantize_inputs(Step& s, const FusionRules& r, const std::function<void*(Slot, size_t)>& buffer);
void fuse_step(Step& s, const FusionRules& r, const std::function<void*(Slot, size_t)>& buffer);

}  // namespace cera::cuda
