// The op harness's shared pieces (op_harness_test.cpp): the one list of shapes every op draws from,
// the backends under test with a model of what each one's arithmetic does, random data, weights in
// every type, and the scalar pieces the error bounds are made of.
//
// Every check compares a backend op with a scalar reference computed here in double (or with the
// reference dequantizers of core/quant), never with another fast kernel, and allows the error the
// target's arithmetic can make, derived beside each bound from these unit roundoffs:
//   u   = 2^-24, f32 round to nearest; a sum of n products in f32, in any order, is off by at most
//         gamma(n) = n u / (1 - n u) times the sum of their magnitudes;
//   u16 = 2^-11, f16 round to nearest (and 2^-25 absolute in its subnormal range).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/kernel_table.h"
#include "backends/cpu/kernels.h"
#include "backends/device.h"
#include "core/fp16.h"
#include "core/quant/quant.h"
#include "kernels/test_weights.h"
#if defined(CERA_TEST_HAVE_CUDA)
#include "backends/cuda/kernels.h"
#endif

namespace cera::harness {

constexpr double kU = 0x1p-24;       // f32 unit roundoff
constexpr double kU16 = 0x1p-11;     // f16 unit roundoff
constexpr double kF16Sub = 0x1p-25;  // the largest f16 rounding error below its normal range
constexpr double kUBf16 = 0x1p-8;    // bf16 unit roundoff
constexpr double kF32Sub = 0x1p-126;  // the largest f32 subnormal flushed to zero
inline double gamma(int64_t n) { return double(n) * kU / (1.0 - double(n) * kU); }

// ------------------------------------------------------------------------------------------ shapes
// The one list of sizes: row lengths (k, n_embd, n_ff, head_dim, vocabulary and expert counts are
// drawn from it, each op taking the lengths its types and kernels allow), row counts and batch sizes.
// Odd sizes, sizes that are not a multiple of 32 or 256, length 1, and long rows.
inline constexpr int64_t kLengths[] = {1, 7, 32, 96, 256, 288, 768, 4096, 4097};
inline constexpr int64_t kRowCounts[] = {1, 7, 33, 513};
inline constexpr int64_t kTokenCounts[] = {1, 3, 17, 64};

// Every KV cache type (the rotated ones are Q4_0 and Q3_KV rows).
inline constexpr GgmlType kKvTypes[] = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16,
                                        GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ3_KV};
// Types of keys and values: each type for both, and each with the next one (the last with the first).
inline std::vector<std::pair<GgmlType, GgmlType>> kv_pairs() {
    std::vector<std::pair<GgmlType, GgmlType>> p;
    for (size_t i = 0; i < std::size(kKvTypes); ++i) {
        p.emplace_back(kKvTypes[i], kKvTypes[i]);
        p.emplace_back(kKvTypes[i], kKvTypes[(i + 1) % std::size(kKvTypes)]);
    }
    return p;
}

// Every weight type the engine reads (core/quant's table less Q8_1 and Q8_K, activation formats).
inline constexpr GgmlType kWeightTypes[] = {
    GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,   GgmlType::kQ4_1,
    GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K,   GgmlType::kQ3_K,
    GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
};

// ----------------------------------------------------------------------------------------- targets
// A backend configuration under test.
struct Target {
    std::string name;
    BackendOptions opts;
    const cpu::KernelTable* table = nullptr;  // CPU: the kernel table it computes with
    bool moe_only = false;                    // a CUDA variant that changes moe_ffn's kernels only
    bool batch_variant = false;               // its weights allow_batch_variance (the CPU's tile kernels)
    bool cuda() const { return opts.device == DeviceKind::kCuda; }
};

// The CPU backend on every kernel table this CPU runs (the best one with one thread too: the
// drivers' single-thread paths), and in CUDA builds with a GPU the CUDA backend with its default
// options, with fusion off, and with each CudaVariants setting that changes the kernel of a single
// op: moe_per_slot and moe_tile_rows (moe_ffn). The others (glu_*, pro_smem, norm_prologues,
// fuse_all_products, qkv_head_blocks) change only launches that fuse a sequence of ops, which
// cuda_decode_test.cpp checks; head_register only products of 32 MB and more (cuda_kernels_test.cpp).
inline const std::vector<Target>& targets() {
    static const std::vector<Target> all = [] {
        std::vector<Target> t;
        const std::pair<cpu::Isa, CpuIsa> isas[] = {{cpu::Isa::kRef, CpuIsa::kRef},
                                                    {cpu::Isa::kAvx2, CpuIsa::kAvx2},
                                                    {cpu::Isa::kAvx512, CpuIsa::kAvx512},
                                                    {cpu::Isa::kAmx, CpuIsa::kAmx}};
        for (const auto& [isa, opt] : isas) {
            if (!cpu::isa_supported(isa)) continue;
            Target c;
            c.name = std::string("cpu-") + cpu::isa_name(isa);
            c.opts.device = DeviceKind::kCpu;
            c.opts.cpu_isa = opt;
            c.opts.n_threads = isa == cpu::Isa::kRef ? 1 : 2;
            c.table = &cpu::kernel_table(isa);
            t.push_back(c);
        }
        if (t.back().table->isa != cpu::Isa::kRef) {
            Target one = t.back();
            one.name += "-1thread";
            one.opts.n_threads = 1;
            t.push_back(one);
        }
        if (cpu::isa_supported(cpu::Isa::kAmx)) {  // the AMX table's tile kernels
            Target tiles = t[t.size() - 2];
            tiles.name += "-tiles";
            tiles.batch_variant = true;
            t.push_back(tiles);
        }
#if defined(CERA_TEST_HAVE_CUDA)
        if (!cuda_devices().empty()) {
            auto add = [&](const char* name, bool moe_only, auto set) {
                Target c;
                c.name = name;
                c.opts.device = DeviceKind::kCuda;
                c.moe_only = moe_only;
                set(c.opts.cuda);
                t.push_back(c);
            };
            add("cuda", false, [](CudaOptions&) {});
            add("cuda-unfused", false, [](CudaOptions& o) { o.fuse = false; });
            add("cuda-moe-per-slot", true, [](CudaOptions& o) { o.variants.moe_per_slot = true; });
            add("cuda-moe-tile24", true, [](CudaOptions& o) { o.variants.moe_tile_rows = 24; });
            add("cuda-moe-tile128", true, [](CudaOptions& o) { o.variants.moe_tile_rows = 128; });
        }
#endif
        return t;
    }();
    return all;
}

// The CUDA backends OnBackend keeps, one per target; released when the tests end (ReleaseBackends),
// before the CUDA runtime is torn down.
inline std::map<std::string, std::unique_ptr<Backend>>& kept_backends() {
    static std::map<std::string, std::unique_ptr<Backend>> kept;
    return kept;
}
class ReleaseBackends : public ::testing::Environment {
 public:
    void TearDown() override { kept_backends().clear(); }
};

// A backend of a target for one case, and the tensors the case makes on it. CPU backends are made
// afresh for each case (so that no weight registration outlives the host bytes it was made from);
// a CUDA backend is made once per target and the case's tensors are freed when it ends.
class OnBackend {
 public:
    explicit OnBackend(const Target& t) : batch_variant_(t.batch_variant) {
        if (!t.cuda()) {
            own_ = create_backend(t.opts);
            be_ = own_.get();
            return;
        }
        auto& b = kept_backends()[t.name];
        if (!b) b = create_backend(t.opts);
        be_ = b.get();
    }
    ~OnBackend() {
        if (own_) return;
        for (Tensor& t : made_) be_->free(t);
    }
    OnBackend(const OnBackend&) = delete;
    OnBackend& operator=(const OnBackend&) = delete;

    Backend& be() { return *be_; }
    Tensor alloc(GgmlType type, std::initializer_list<int64_t> ne, const void* bytes = nullptr) {
        Tensor t = be_->alloc(type, ne);
        if (bytes) be_->write(t, bytes, t.n_bytes());
        made_.push_back(t);
        return t;
    }
    Tensor f32(std::initializer_list<int64_t> ne, const std::vector<float>& v) {
        return alloc(GgmlType::kF32, ne, v.data());
    }
    Tensor i32(std::initializer_list<int64_t> ne, const std::vector<int32_t>& v) {
        return alloc(GgmlType::kI32, ne, v.data());
    }
    // host must outlive the backend (the CPU backend keeps a view of it).
    Tensor weight(GgmlType type, std::initializer_list<int64_t> ne, const void* host) {
        const std::vector<int64_t> dims(ne);
        Tensor t = be_->upload_weight(type, dims, host);
        if (batch_variant_) be_->allow_batch_variance(t);
        made_.push_back(t);
        return t;
    }
    template <class T = float>
    std::vector<T> read(const Tensor& t) {
        std::vector<T> v(static_cast<size_t>(t.n_bytes() / sizeof(T)));
        be_->read(v.data(), t, v.size() * sizeof(T));
        return v;
    }

 private:
    std::unique_ptr<Backend> own_;
    Backend* be_ = nullptr;
    std::vector<Tensor> made_;
    bool batch_variant_ = false;
};

// ------------------------------------------------------------------------ what the kernels compute
// What a target's matmul does to its operands, for a weight type and batch size.
//   CPU: the kernel table's entry for the type (kernel_table.h): activations in 32-blocks (Q4_0, Q4_1,
//   Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS on AVX2 and AVX-512), in Q8_K 256-blocks (Q4_K / Q5_K on AVX2, K-quants on
//   AVX-512), or f32 (float weights, the reference table, and the types a table dequantizes to f32
//   first).
//   CUDA (cuda_backend.cpp): up to kCudaGemvMaxTokens tokens (and every MoE product) a GEMV with
//   activations in 32-blocks for block types, f32 for float weights; larger batches cuBLAS on
//   f16 operands (F32 weights: SGEMM). A type without a CUDA kernel is expanded to F16 at upload.
struct MatmulArith {
    cpu::ActFormat act = cpu::ActFormat::kF32;  // activations rounded to 8 bits in this format
    bool w_f16 = false;                         // weights rounded to f16
    bool x_f16 = false;                         // activations rounded to f16
    bool x_bf16 = false;                        // activations rounded to bf16 (cpu::bf16_act)
    // AMX tiles (kernels_amx.cpp): each product as xh wh + xl wh + xh wl of bf16 halves, 3k terms a sum
    bool split_bf16 = false;
    int act_block() const { return act == cpu::ActFormat::kAct32 ? 32 : act == cpu::ActFormat::kActQ8K ? kQK_K : 0; }
};
constexpr int64_t kCudaGemvMaxTokens = 8;  // cuda_backend.cpp's kGemvMaxTokens

inline MatmulArith matmul_arith(const Target& t, GgmlType type, int64_t n_tokens, bool moe = false) {
    MatmulArith a;
    const int id = int(type);
    if (!t.cuda()) {
        const cpu::KernelTable& tab = *t.table;
        if (tab.isa == cpu::Isa::kRef) return a;
        // A registered weight takes the packed kernel where the table has one; it reads the same
        // activation format as the plain kernel of the type.
        if (tab.packed[id].fn)
            a.act = tab.packed[id].act;
        else if (tab.matmul[id].fn)
            a.act = tab.matmul[id].act;
        if (a.act == cpu::ActFormat::kBF16) a.act = cpu::ActFormat::kF32, a.x_bf16 = true;
        a.split_bf16 = t.batch_variant && tab.isa == cpu::Isa::kAmx &&
                       (type == GgmlType::kF16 || type == GgmlType::kBF16 || type == GgmlType::kF32) &&
                       n_tokens >= cpu::kAmxMinTokens;
        return a;
    }
#if defined(CERA_TEST_HAVE_CUDA)
    const bool has_kernel = cuda::weight_type_supported(type);
    if (!has_kernel) a.w_f16 = true;  // expanded to F16 at upload
    if (moe || n_tokens <= kCudaGemvMaxTokens) {
        if (has_kernel && !cuda::is_float_type(type)) a.act = cpu::ActFormat::kAct32;
    } else if (type != GgmlType::kF32) {
        a.x_f16 = true;
        a.w_f16 = a.w_f16 || type != GgmlType::kF16;
    }
#endif
    return a;
}

// Bound on the relative error of a target's exp(x) (softmax, SwiGLU, router):
//   CPU: the polynomial exps (kernels_avx512.cpp, kernels_attention_avx*.cpp) truncate a
//   degree-6 series on |r| <= ln2/2: (ln2/2)^7 / 7! = 1.2e-7, plus at most four roundings in the
//   range reduction and the last Horner steps (4u); std::exp is within 1 ulp (2u).
//   CUDA: __expf is within 2 + 1.173 |x| ulp (the CUDA programming guide), ulp <= 2^-23 relative,
//   which also covers expf (2 ulp) and ex2.approx (2^-22).
inline double exp_err(const Target& t, double x) {
    if (!t.cuda()) return 1.2e-7 + 4 * kU;
    return (2.0 + 1.2 * std::fabs(x)) * 0x1p-23;
}

// Bound on the relative error of an RMSNorm's output x / sqrt(mean(x^2) + eps) * w over n values:
// the f32 sum of squares (n u, all terms positive), the division by n and the + eps (2u, halved
// by the square root), then 1 / sqrt (CPU: sqrt and a division, 2u; CUDA: rsqrtf, 2 ulp = 4u),
// then the two products (2u).
inline double norm_err(const Target& t, int64_t n) {
    return (double(n) + 2.0) / 2.0 * kU + (t.cuda() ? 4 * kU : 2 * kU) + 2 * kU;
}

// -------------------------------------------------------------------------------------------- data

// GGUF bytes of a [rows, k] weight of `type` made from f32 values by the reference quantizer.
inline std::vector<uint8_t> weight_bytes(GgmlType type, const std::vector<float>& w, int64_t rows, int64_t k) {
    const size_t rb = row_size(type, k);
    std::vector<uint8_t> out(rb * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) quantize_row_ref(type, w.data() + r * k, out.data() + size_t(r) * rb, k);
    return out;
}

// |the value of the code 0| of every element (its block's zero offset: -8 d for Q4_0, m for Q4_1,
// -dmin m for Q4_K, ...; 0 for float types). A kernel may add a block's codes and its offset as two
// float terms, each up to |w| + |offset| in size, so the float error bounds use both.
inline std::vector<float> zero_code_offsets(GgmlType type, const std::vector<uint8_t>& bytes, int64_t rows, int64_t k) {
    struct Field {
        size_t at, n;
    };
    std::vector<Field> codes;
    switch (type) {
        case GgmlType::kQ4_0:
            codes = {{offsetof(BlockQ4_0, qs), 16}};
            break;
        case GgmlType::kQ4_1:
            codes = {{offsetof(BlockQ4_1, qs), 16}};
            break;
        case GgmlType::kQ5_0:
            codes = {{offsetof(BlockQ5_0, qh), 4}, {offsetof(BlockQ5_0, qs), 16}};
            break;
        case GgmlType::kQ5_1:
            codes = {{offsetof(BlockQ5_1, qh), 4}, {offsetof(BlockQ5_1, qs), 16}};
            break;
        case GgmlType::kQ8_0:
            codes = {{offsetof(BlockQ8_0, qs), 32}};
            break;
        case GgmlType::kQ2_K:
            codes = {{offsetof(BlockQ2_K, qs), 64}};
            break;
        case GgmlType::kQ3_K:
            codes = {{offsetof(BlockQ3_K, hmask), 32}, {offsetof(BlockQ3_K, qs), 64}};
            break;
        case GgmlType::kQ4_K:
            codes = {{offsetof(BlockQ4_K, qs), 128}};
            break;
        case GgmlType::kQ5_K:
            codes = {{offsetof(BlockQ5_K, qh), 32}, {offsetof(BlockQ5_K, qs), 128}};
            break;
        case GgmlType::kQ6_K:
            codes = {{offsetof(BlockQ6_K, ql), 128}, {offsetof(BlockQ6_K, qh), 64}};
            break;
        default:
            return std::vector<float>(size_t(rows * k), 0.0f);
    }
    std::vector<uint8_t> zeroed(bytes);
    const size_t bs = type_info(type).type_size;
    for (size_t b = 0; b < zeroed.size(); b += bs)
        for (const Field& f : codes) std::memset(&zeroed[b + f.at], 0, f.n);
    std::vector<float> off = dequant(type, zeroed, rows, k);
    for (float& v : off) v = std::fabs(v);
    return off;
}

// x as a target's matmul sees it: rounded to 8 bits per block by the scalar quantize_act_row (every
// kernel table's quantizer writes its bytes, and CUDA's quantize_q8 computes d = amax / 127 and
// rint(x / d) the same way), or rounded to f16, or as is. Products d * q exact in double.
inline std::vector<double> model_activations(const MatmulArith& a, const float* x, int64_t k) {
    std::vector<double> out(static_cast<size_t>(k));
    if (a.act == cpu::ActFormat::kAct32) {
        std::vector<uint8_t> buf(cpu::act_row_bytes(a.act, k));
        cpu::quantize_act_row(a.act, x, k, buf.data());
        const auto* qs = reinterpret_cast<const int8_t*>(buf.data());
        const auto* d = reinterpret_cast<const float*>(buf.data() + k);
        for (int64_t i = 0; i < k; ++i) out[size_t(i)] = double(d[i / 32]) * qs[i];
    } else if (a.act == cpu::ActFormat::kActQ8K) {
        std::vector<BlockQ8_K> buf(size_t(k / kQK_K));
        cpu::quantize_act_row(a.act, x, k, buf.data());
        for (int64_t i = 0; i < k; ++i)
            out[size_t(i)] = double(buf[size_t(i / kQK_K)].d) * buf[size_t(i / kQK_K)].qs[i % kQK_K];
    } else if (a.x_f16) {
        for (int64_t i = 0; i < k; ++i) out[size_t(i)] = fp16_to_fp32(fp32_to_fp16(x[i]));
    } else if (a.x_bf16) {
        for (int64_t i = 0; i < k; ++i) out[size_t(i)] = bf16_to_fp32(cpu::bf16_act(x[i]));
    } else {
        for (int64_t i = 0; i < k; ++i) out[size_t(i)] = x[i];
    }
    return out;
}

// The sums a dot product's error bound is made of, for weights w (dequantized), their zero-code
// offsets and activations x.
struct DotTerms {
    double exact = 0;  // sum w_i x_i
    double mag = 0;    // sum |w_i x_i| + sum |off_i x_i| * 2: the float terms' magnitudes
    double sum_w = 0;  // sum |w_i|
    double sum_x = 0;  // sum |x_i|
};
template <class X>
inline DotTerms dot_terms(const float* w, const float* off, const X* x, int64_t k) {
    DotTerms d;
    for (int64_t i = 0; i < k; ++i) {
        const double p = double(w[i]) * double(x[i]);
        d.exact += p;
        d.mag += std::fabs(p) + 2.0 * std::fabs(double(off[i]) * double(x[i]));
        d.sum_w += std::fabs(double(w[i]));
        d.sum_x += std::fabs(double(x[i]));
    }
    return d;
}

// The error of a product on AMX tiles (MatmulArith::split_bf16) whose terms have magnitudes summing to
// mag: x = xh + xl leaves 2^-16 |x| (xl rounded to bf16), w = wh + wl is exact for an F16 or BF16
// weight, and the missing xl wl is at most 2^-16 |x w|; the 3k bf16 products are exact in f32 and
// their sum rounds as f32 sums do (terms up to (1 + 2^-7) |x w|); subnormal operands are flushed.
inline double split_bf16_bound(double mag, double sum_w, double sum_x, int64_t k) {
    return (0x1p-15 + gamma(3 * k + 4)) * (1.0 + 0x1p-7) * mag + kF32Sub * (sum_w + sum_x);
}

// The float error of one output of a product as the target computes it from its (rounded) operands:
// the k products and their sum, a bias and the block scales (gamma(k + 4) of the terms' magnitudes,
// offsets included), plus f16 rounding of the weights where the target does it (u16 relative, and
// 2^-25 absolute below f16's normal range, times the other operand).
inline double float_bound(const MatmulArith& a, const DotTerms& d, int64_t k, double bias) {
    double b = gamma(k + 4) * (d.mag + std::fabs(bias));
    if (a.split_bf16) b = split_bf16_bound(d.mag, d.sum_w, d.sum_x, k) + gamma(k + 4) * std::fabs(bias);
    if (a.w_f16) b += kU16 * d.mag + kF16Sub * d.sum_x;
    if (a.x_bf16) b += kF32Sub * (d.sum_w + d.sum_x);  // vdpbf16ps flushes subnormal operands
    return b;
}

// Bound on |y - sum w_i x_i| for a product the target computes on activations x~ with
// |x~_i| <= xa_i (the f32 x, or an upper bound on an input that carries an error of its own):
//  - the 8-bit rounding of x per block b: each x_i is d_b q_i with |x_i - d_b q_i| <= d_b / 2,
//    d_b = A_b / 127 (A_b the block's largest |x|), so the dot moves by at most
//    sum_b A_b / 254 * W_b (W_b = sum of the block's |w_i|); the factor 1 + 1e-4 covers d_b and
//    1 / d_b rounded to f32 (the codes are rint(x_i * f32(1 / d_b)), off by 254 u relative at most),
//    and the float terms grow with |x~_i| <= xa_i + A_b / 254;
//  - f16 rounding of either operand: u16 relative, 2^-25 absolute below f16's normal range;
//  - the float terms, as float_bound.
inline double product_bound(const MatmulArith& a, const float* w, const float* off, const double* xa, int64_t k) {
    double mag = 0, sum_w = 0, sum_x = 0, q8 = 0;
    for (int64_t i = 0; i < k; ++i) {
        mag += (std::fabs(double(w[i])) + 2.0 * std::fabs(double(off[i]))) * xa[i];
        sum_w += std::fabs(double(w[i]));
        sum_x += xa[i];
    }
    if (const int bl = a.act_block()) {
        for (int64_t b0 = 0; b0 < k; b0 += bl) {
            double amax = 0, wsum = 0, osum = 0;
            for (int64_t i = b0; i < b0 + bl; ++i) {
                amax = std::max(amax, xa[i]);
                wsum += std::fabs(double(w[i]));
                osum += std::fabs(double(off[i]));
            }
            q8 += amax / 254.0 * wsum;
            mag += amax / 254.0 * (wsum + 2.0 * osum);
            sum_x += amax / 254.0 * double(bl);
        }
        q8 *= 1.0 + 1e-4;
    }
    double b = a.split_bf16 ? split_bf16_bound(mag, sum_w, sum_x, k) : gamma(k + 4) * mag + q8;
    if (a.w_f16) b += kU16 * mag + kF16Sub * sum_x;
    if (a.x_f16) b += kU16 * mag + kF16Sub * sum_w;
    // bf16: u = 2^-8 relative; subnormals of f32 flushed to zero (an absolute 2^-126 each), on the
    // activations by their rounding and on the weights by vdpbf16ps
    if (a.x_bf16) b += kUBf16 * mag + kF32Sub * (sum_w + sum_x);
    return b;
}

// ------------------------------------------------------------------------------------------ checks
template <class... A>
std::string str(const A&... a) {
    std::ostringstream s;
    (s << ... << a);
    return s.str();
}

// Compares values against references and bounds; reports the first few misses of one case.
class Checker {
 public:
    explicit Checker(std::string what) : what_(std::move(what)) {}
    ~Checker() {
        if (misses_ > kShown) ADD_FAILURE() << what_ << ": " << misses_ << " values outside their bounds";
    }
    // |got - want| <= bound (a NaN or infinity in got fails). `where` is formatted only for a miss.
    template <class... W>
    bool near(double got, double want, double bound, const W&... where) {
        if (std::fabs(got - want) <= bound) return true;
        if (++misses_ <= kShown)
            ADD_FAILURE() << what_ << ": " << str(where...) << ": got " << got << ", want " << want << " +- " << bound
                          << " (off by " << std::fabs(got - want) << ")";
        return false;
    }
    template <class T, class... W>
    bool eq(const T& got, const T& want, const W&... where) {
        if (got == want) return true;
        if (++misses_ <= kShown)
            ADD_FAILURE() << what_ << ": " << str(where...) << ": got " << got << ", want " << want;
        return false;
    }
    int misses() const { return misses_; }

 private:
    static constexpr int kShown = 4;
    std::string what_;
    int misses_ = 0;
};

// What the op tests share: limits on the work of a case, random weights and activations.
inline constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

// Work per case at most, so that the CPU part stays within a minute on two cores: multiply-adds
// of a matmul (rows * k * n_tokens), elements of a weight or activation.
inline constexpr int64_t kMaxMacs = int64_t(1) << 22;
inline constexpr int64_t kMaxElems = int64_t(1) << 21;

inline bool fits(GgmlType type, int64_t k) { return k % type_info(type).block_size == 0; }

// A random weight of `type` and its reference values: gaussian rows, every third one 50 times
// smaller (rows of small weights next to large ones).
struct Weight {
    GgmlType type;
    int64_t rows, k;
    std::vector<uint8_t> bytes;
    std::vector<float> w;    // dequantize_row_ref of the bytes: the values the op must use
    std::vector<float> off;  // zero_code_offsets
    const float* row(int64_t r) const { return w.data() + r * k; }
    const float* row_off(int64_t r) const { return off.data() + r * k; }
};
inline Weight make_weight(GgmlType type, int64_t rows, int64_t k, std::mt19937& rng, float sd = 1.0f) {
    std::vector<float> wf = randn(size_t(rows * k), rng, sd);
    for (int64_t r = 0; r < rows; r += 3)
        for (int64_t i = 0; i < k; ++i) wf[size_t(r * k + i)] *= 0.02f;
    Weight m{type, rows, k, weight_bytes(type, wf, rows, k), {}, {}};
    m.w = dequant(type, m.bytes, rows, k);
    m.off = zero_code_offsets(type, m.bytes, rows, k);
    return m;
}

// Gaussian activations with an outlier every 61 values (blocks whose 8-bit scale one value sets).
inline std::vector<float> activations(size_t n, std::mt19937& rng) {
    std::vector<float> x = randn(n, rng);
    for (size_t i = 3; i < n; i += 61) x[i] *= 8.0f;
    return x;
}

}  // namespace cera::harness
