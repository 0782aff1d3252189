#include "backends/cpu/moe.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "core/quant/quant.h"
#include "core/threadpool.h"

namespace cera::cpu {
namespace {

template <typename T>
void grow(std::vector<T>& v, size_t n) {
    if (v.size() < n) v.resize(n);
}

// Adds product p's LoRA deltas for expert e to out: rows [0, cnt) of `in` (k wide) and `out` (n_out wide)
// are the expert's routed slots, s.order[b + i], in token order, so a segment's rows are one run.
void add_expert_lora(const KernelTable& table, ThreadPool* pool, MoeScratch& s, std::span<const MoeLoraSegment> segs,
                     int p, int64_t e, int64_t b, int64_t cnt, int slots, const float* in, int64_t k, float* out,
                     int64_t n_out) {
    for (const MoeLoraSegment& sg : segs) {
        if (!sg.a[p] || sg.n == 0) continue;
        int64_t i0 = 0;
        while (i0 < cnt && s.order[size_t(b + i0)] / slots < sg.start) ++i0;
        int64_t i1 = i0;
        while (i1 < cnt && s.order[size_t(b + i1)] / slots < sg.start + sg.n) ++i1;
        if (i1 == i0) continue;
        const int64_t r = sg.a[p].ne[1], n = i1 - i0;
        grow(s.t, size_t(n * r));
        float* t = s.t.data();
        const uint8_t* a = sg.a[p].as<const uint8_t>() + size_t(e) * size_t(r) * row_size(sg.a[p].type, k);
        cpu::matmul(table, sg.a[p].type, a, r, k, in + i0 * k, n, t, r, pool);
        for (int64_t i = 0; i < n * r; ++i) t[i] *= sg.scale[p];
        const size_t bt_off = size_t(e) * size_t(r) * size_t(n_out);
        for (int64_t row = 0; row < n; ++row) {
            float* y = out + (i0 + row) * n_out;
            if (sg.bt[p].type == GgmlType::kF16) {
                table.axpy_rows_f16(sg.bt[p].as<const uint16_t>() + bt_off, n_out, t + row * r, r, y, n_out);
                continue;
            }
            for (int64_t j = 0; j < r; ++j)
                table.add(y, sg.bt[p].as<const float>() + bt_off + size_t(j * n_out), t[row * r + j], y, n_out);
        }
    }
}

}  // namespace

void moe_experts(const KernelTable& table, ThreadPool* pool, MatmulObserver* observer, MoeScratch& s, const Tensor& x,
                 const Tensor& gate_exps, const Tensor& up_exps, const Tensor& down_exps, const Tensor& ids,
                 const Tensor& weights, std::span<const MoeLoraSegment> segs, const Tensor& out) {
    moe_lora_checked(segs, gate_exps, up_exps, down_exps, x.rows());
    const int64_t n_tokens = x.rows(), n_embd = x.ne[0], n_ff = gate_exps.ne[1], n_expert = gate_exps.ne[2];
    const int k = int(ids.ne[0]);
    const int32_t* id = ids.as<const int32_t>();
    const float* wt = weights.as<const float>();
    // Group the (token, slot) pairs by expert so each expert's weights are read once per batch.
    grow(s.count, size_t(n_expert + 1));
    grow(s.order, size_t(n_tokens * k));
    std::fill(s.count.begin(), s.count.begin() + n_expert + 1, 0);
    for (int64_t i = 0; i < n_tokens * k; ++i) ++s.count[id[i] + 1];
    for (int64_t e = 0; e < n_expert; ++e) s.count[e + 1] += s.count[e];
    grow(s.fill, size_t(n_expert));
    std::copy(s.count.begin(), s.count.begin() + n_expert, s.fill.begin());
    for (int64_t i = 0; i < n_tokens * k; ++i) s.order[s.fill[id[i]]++] = int32_t(i);

    grow(s.x, size_t(n_tokens * k) * n_embd);
    grow(s.g, size_t(n_tokens * k) * n_ff);
    grow(s.u, size_t(n_tokens * k) * n_ff);
    grow(s.y, size_t(n_tokens * k) * n_embd);
    std::memset(out.data, 0, out.n_bytes());
    const size_t gate_stride = row_size(gate_exps.type, n_embd) * n_ff;
    const size_t up_stride = row_size(up_exps.type, n_embd) * n_ff;
    const size_t down_stride = row_size(down_exps.type, n_ff) * n_embd;
    for (int64_t e = 0; e < n_expert; ++e) {
        const int64_t b = s.count[e], cnt = s.count[e + 1] - b;
        if (cnt == 0) continue;
        for (int64_t i = 0; i < cnt; ++i)
            std::memcpy(s.x.data() + i * n_embd, x.as<const float>() + (s.order[b + i] / k) * n_embd,
                        size_t(n_embd) * sizeof(float));
        if (observer) {
            observer->observe(gate_exps, e, s.x.data(), cnt);
            observer->observe(up_exps, e, s.x.data(), cnt);
        }
        cpu::matmul(table, gate_exps.type, gate_exps.as<const uint8_t>() + e * gate_stride, n_ff, n_embd, s.x.data(),
                    cnt, s.g.data(), n_ff, pool);
        cpu::matmul(table, up_exps.type, up_exps.as<const uint8_t>() + e * up_stride, n_ff, n_embd, s.x.data(), cnt,
                    s.u.data(), n_ff, pool);
        if (!segs.empty()) {
            add_expert_lora(table, pool, s, segs, 0, e, b, cnt, k, s.x.data(), n_embd, s.g.data(), n_ff);
            add_expert_lora(table, pool, s, segs, 1, e, b, cnt, k, s.x.data(), n_embd, s.u.data(), n_ff);
        }
        table.silu_mul(s.g.data(), s.u.data(), s.g.data(), cnt * n_ff);
        if (observer) observer->observe(down_exps, e, s.g.data(), cnt);
        cpu::matmul(table, down_exps.type, down_exps.as<const uint8_t>() + e * down_stride, n_embd, n_ff, s.g.data(),
                    cnt, s.y.data(), n_embd, pool);
        if (!segs.empty()) add_expert_lora(table, pool, s, segs, 2, e, b, cnt, k, s.g.data(), n_ff, s.y.data(), n_embd);
        for (int64_t i = 0; i < cnt; ++i) {
            const int32_t slot = s.order[b + i];
            const float w = wt[slot];
            float* o = out.as<float>() + (slot / k) * n_embd;
            const float* y = s.y.data() + i * n_embd;
            for (int64_t c = 0; c < n_embd; ++c) o[c] += w * y[c];
        }
    }
}

}  // namespace cera::cpu
