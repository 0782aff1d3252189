// The CPU's MoE SwiGLU experts (Backend::moe_ffn, and moe_ffn_lora with LoRA deltas on the experts'
// products): the (token, slot) pairs are grouped by expert so that each expert's weights are read once a
// step, its routed rows gathered, run through gate / up / SwiGLU / down, and scattered back weighted.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/kernel_table.h"

namespace cera {
class ThreadPool;
}

namespace cera::cpu {

// Buffers grown to the largest step seen and then reused.
struct MoeScratch {
    std::vector<int32_t> count, order, fill;  // slots per expert (prefix sums), slots by expert, fill cursors
    std::vector<float> x, g, u, y, t;         // an expert's gathered rows, gate, up, down out; LoRA's A·in
};

// Backend::moe_ffn (segs empty) and moe_ffn_lora on the kernels of `table`; observer (or null) sees each
// expert product's input rows.
void moe_experts(const KernelTable& table, ThreadPool* pool, MatmulObserver* observer, MoeScratch& s, const Tensor& x,
                 const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps, const Tensor& ids,
                 const Tensor& weights, std::span<const MoeLoraSegment> segs, const Tensor& out);

}  // namespace cera::cpu
