// The op harness: every backend op on every target (op_harness.h: the CPU backend on each kernel
// table this CPU runs; in CUDA builds with a GPU the CUDA backend and its kernel variants) over the
// one list of shapes, against scalar references computed here in double. The bounds are derived
// from the arithmetic each target does (op_harness.h, and beside each check below).
// Sequences the CUDA backend fuses, recorded steps and whole models are checked elsewhere
// (cuda_decode_test.cpp, cuda_model_test.cpp, golden/).
#include "kernels/op_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace cera::harness {
namespace {

const auto* const kReleaseBackends = ::testing::AddGlobalTestEnvironment(new ReleaseBackends);

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Work per case at most, so that the CPU part stays within a minute on two cores: multiply-adds
// of a matmul (rows * k * n_tokens), elements of a weight or activation.
constexpr int64_t kMaxMacs = int64_t(1) << 22;
constexpr int64_t kMaxElems = int64_t(1) << 21;

bool fits(GgmlType type, int64_t k) { return k % type_info(type).block_size == 0; }

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
Weight make_weight(GgmlType type, int64_t rows, int64_t k, std::mt19937& rng, float sd = 1.0f) {
    std::vector<float> wf = randn(size_t(rows * k), rng, sd);
    for (int64_t r = 0; r < rows; r += 3)
        for (int64_t i = 0; i < k; ++i) wf[size_t(r * k + i)] *= 0.02f;
    Weight m{type, rows, k, weight_bytes(type, wf, rows, k, rng), {}, {}};
    m.w = dequant(type, m.bytes, rows, k);
    m.off = zero_code_offsets(type, m.bytes, rows, k);
    return m;
}

// Gaussian activations with an outlier every 61 values (blocks whose 8-bit scale one value sets).
std::vector<float> activations(size_t n, std::mt19937& rng) {
    std::vector<float> x = randn(n, rng);
    for (size_t i = 3; i < n; i += 61) x[i] *= 8.0f;
    return x;
}

// ------------------------------------------------------------------------------------------ matmul
// Each output twice: against the product of the operands as the target rounds them (the scalar
// activation quantizer, f16), within the float error alone (float_bound); and against the product
// of the f32 operands, within that plus the rounding of the activations (product_bound).
TEST(OpHarness, Matmul) {
    std::mt19937 rng(1);
    for (GgmlType type : kWeightTypes) {
        for (int64_t k : kLengths) {
            if (!fits(type, k)) continue;
            for (int64_t rows : kRowCounts) {
                if (rows * k > kMaxElems) continue;
                const Weight w = make_weight(type, rows, k, rng);
                for (int64_t nt : kTokenCounts) {
                    if (rows * k * nt > kMaxMacs) continue;
                    const std::string shape = str(type_name(type), " rows ", rows, " k ", k, " n_tokens ", nt);
                    const std::vector<float> x = activations(size_t(nt * k), rng);
                    const bool with_bias = (k + nt) % 2 == 1;
                    const std::vector<float> bias = randn(size_t(rows), rng);
                    std::vector<double> xa(x.size());
                    for (size_t i = 0; i < x.size(); ++i) xa[i] = std::fabs(double(x[i]));
                    for (const Target& t : targets()) {
                        if (t.moe_only) continue;
                        const MatmulArith a = matmul_arith(t, type, nt);
                        OnBackend ob(t);
                        Tensor W = ob.weight(type, {k, rows}, w.bytes.data());
                        Tensor X = ob.f32({k, nt}, x);
                        Tensor B = with_bias ? ob.f32({rows}, bias) : Tensor{};
                        Tensor Y = ob.alloc(GgmlType::kF32, {rows, nt});
                        ob.be().matmul(W, X, B, Y);
                        const std::vector<float> y = ob.read(Y);
                        Checker c(str(t.name, " matmul ", shape));
                        for (int64_t tok = 0; tok < nt && c.misses() < 8; ++tok) {
                            const std::vector<double> xm = model_activations(a, x.data() + tok * k, k);
                            for (int64_t r = 0; r < rows; ++r) {
                                const double b = with_bias ? bias[size_t(r)] : 0.0;
                                const double got = y[size_t(tok * rows + r)];
                                const DotTerms m = dot_terms(w.row(r), w.row_off(r), xm.data(), k);
                                c.near(got, m.exact + b, float_bound(a, m, k, b), "rounded operands, token ", tok,
                                       " row ", r);
                                double exact = b;
                                for (int64_t i = 0; i < k; ++i) exact += double(w.row(r)[i]) * x[size_t(tok * k + i)];
                                c.near(got, exact,
                                       product_bound(a, w.row(r), w.row_off(r), xa.data() + tok * k, k) +
                                           kU * std::fabs(b),
                                       "f32 operands, token ", tok, " row ", r);
                            }
                        }
                    }
                }
            }
        }
    }
}

// The rounded-operand bound is not vacuous: on every kernel path it is below what one 32-block of a
// 4096-long product contributes (the largest of the row's 128), so a kernel that drops or repeats a
// block fails it.
TEST(OpHarness, MatmulBoundCatchesADroppedBlock) {
    std::mt19937 rng(2);
    for (GgmlType type : {GgmlType::kF32, GgmlType::kQ4_0, GgmlType::kQ4_K}) {
        const int64_t k = kLengths[7];
        const Weight w = make_weight(type, 4, k, rng);
        const std::vector<float> x = activations(size_t(k), rng);
        for (const Target& t : targets()) {
            const MatmulArith a = matmul_arith(t, type, 1);
            const std::vector<double> xm = model_activations(a, x.data(), k);
            const DotTerms m = dot_terms(w.row(1), w.row_off(1), xm.data(), k);
            double largest = 0;
            for (int64_t b0 = 0; b0 < k; b0 += 32) {
                double part = 0;
                for (int64_t i = b0; i < b0 + 32; ++i) part += double(w.row(1)[i]) * xm[size_t(i)];
                largest = std::max(largest, std::fabs(part));
            }
            EXPECT_GT(largest, float_bound(a, m, k, 0.0)) << t.name << " " << type_name(type);
        }
    }
}

// In CUDA builds: which CUDA targets the ops above ran on, or why none.
TEST(OpHarness, CudaTargets) {
#if defined(CERA_TEST_HAVE_CUDA)
    std::string why;
    if (cuda_devices(&why).empty()) GTEST_SKIP() << "no CUDA device (" << why << "): the CUDA targets did not run";
    int n = 0;
    for (const Target& t : targets()) n += t.cuda();
    EXPECT_GT(n, 0);
#else
    GTEST_SKIP() << "built without the CUDA backend";
#endif
}

// ------------------------------------------------------------------------------------------- embed
// out[t] = scale * dequantize(row ids[t]). The CPU dequantizes with the reference (exact) and rounds
// the product with scale (u); CUDA may evaluate a block's d * q - m with other roundings or a fused
// multiply-add: 8u of |w| + 2 |offset| covers both evaluations; types expanded to F16 at upload add
// the f16 rounding of w.
TEST(OpHarness, Embed) {
    std::mt19937 rng(3);
    int n_case = 0;
    for (GgmlType type : kWeightTypes) {
        for (int64_t n_embd : kLengths) {
            if (!fits(type, n_embd)) continue;
            for (int64_t n_vocab : kRowCounts) {
                if (n_vocab * n_embd > kMaxElems) continue;
                const int64_t nt = kTokenCounts[size_t(n_case++) % std::size(kTokenCounts)];
                const float scale = n_case % 2 ? 1.0f : 0.375f;
                const Weight w = make_weight(type, n_vocab, n_embd, rng);
                std::vector<int32_t> ids(static_cast<size_t>(nt));
                for (auto& id : ids) id = int32_t(rng() % uint32_t(n_vocab));
                ids[0] = int32_t(n_vocab - 1);
                const std::string shape =
                    str(type_name(type), " n_vocab ", n_vocab, " n_embd ", n_embd, " n_tokens ", nt);
                for (const Target& t : targets()) {
                    if (t.moe_only) continue;
                    const MatmulArith a = matmul_arith(t, type, 1);
                    OnBackend ob(t);
                    Tensor table = ob.weight(type, {n_embd, n_vocab}, w.bytes.data());
                    Tensor I = ob.i32({nt}, ids);
                    Tensor out = ob.alloc(GgmlType::kF32, {n_embd, nt});
                    ob.be().embed(table, I, scale, out);
                    const std::vector<float> y = ob.read(out);
                    Checker c(str(t.name, " embed ", shape));
                    for (int64_t j = 0; j < nt; ++j)
                        for (int64_t i = 0; i < n_embd; ++i) {
                            const double v = w.row(ids[size_t(j)])[i], o = w.row_off(ids[size_t(j)])[i];
                            double bound = kU * std::fabs(scale * v);
                            if (t.cuda()) bound += 8 * kU * scale * (std::fabs(v) + 2 * o);
                            if (a.w_f16) bound += (kU16 * std::fabs(v) + kF16Sub) * scale;
                            c.near(y[size_t(j * n_embd + i)], scale * v, bound, "token ", j, " element ", i);
                        }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------- rms_norm
// With and without a weight, and in place (out aliasing x): norm_err of |ref| (op_harness.h).
TEST(OpHarness, RmsNorm) {
    std::mt19937 rng(4);
    int n_case = 0;
    for (int64_t n : kLengths) {
        for (int64_t rows : kRowCounts) {
            if (rows * n > kMaxElems) continue;
            const int variant = n_case++ % 3;  // 0: weighted, 1: no weight, 2: weighted, in place
            const float eps = variant == 1 ? 1e-6f : 1e-5f;
            const std::vector<float> x = randn(size_t(rows * n), rng, 3.0f), nw = randn(size_t(n), rng);
            std::vector<double> ref(x.size());
            for (int64_t r = 0; r < rows; ++r) {
                double ss = 0;
                for (int64_t i = 0; i < n; ++i) ss += double(x[size_t(r * n + i)]) * x[size_t(r * n + i)];
                const double inv = 1.0 / std::sqrt(ss / double(n) + double(eps));
                for (int64_t i = 0; i < n; ++i)
                    ref[size_t(r * n + i)] = x[size_t(r * n + i)] * inv * (variant == 1 ? 1.0 : double(nw[size_t(i)]));
            }
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                OnBackend ob(t);
                Tensor X = ob.f32({n, rows}, x), W = ob.f32({n}, nw);
                Tensor out = variant == 2 ? X : ob.alloc(GgmlType::kF32, {n, rows});
                ob.be().rms_norm(X, variant == 1 ? Tensor{} : W, eps, out);
                const std::vector<float> y = ob.read(out);
                Checker c(str(t.name, " rms_norm n ", n, " rows ", rows, " variant ", variant));
                const double e = norm_err(t, n);
                for (size_t i = 0; i < y.size(); ++i) c.near(y[i], ref[i], e * std::fabs(ref[i]) + 1e-37, "at ", i);
            }
        }
    }
}

// --------------------------------------------------------------------------------------- norm_rope
// Per (token, head): the optional RMSNorm (relative error e_n = norm_err), then the rotation of
// pairs by angles computed in double and rounded to f32 (u each), a c - b s and a s + b c (three
// roundings at most): (e_n + 4u) (|a c| + |b s|); the angle in double is off by a few 2^-53 |theta|.
// Dimensions past n_rot keep their normed value.
TEST(OpHarness, NormRope) {
    std::mt19937 rng(5);
    int n_case = 0;
    for (int64_t head_dim : kLengths) {
        if (head_dim % 2 || head_dim > 256) continue;
        for (RopeMode mode : {RopeMode::kNorm, RopeMode::kNeox, RopeMode::kNone}) {
            for (bool partial : {false, true}) {
                if (partial && mode == RopeMode::kNone) continue;
                for (bool norm : {true, false}) {
                    const int64_t nt = kTokenCounts[size_t(n_case) % std::size(kTokenCounts)];
                    const int n_head = n_case % 2 ? 7 : 1;
                    const bool factors = n_case % 3 == 0;
                    ++n_case;
                    RopeParams rope;
                    rope.mode = mode;
                    rope.n_rot = mode == RopeMode::kNone ? 0 : int(partial ? head_dim / 2 : head_dim);
                    rope.freq_base = n_case % 2 ? 10000.0f : 1000000.0f;
                    rope.freq_scale = n_case % 4 == 1 ? 0.25f : 1.0f;
                    const int half = rope.n_rot / 2;
                    std::vector<float> ff(static_cast<size_t>(std::max(1, half)));
                    for (auto& f : ff) f = 1.0f + float(rng() % 8);
                    const int64_t width = n_head * head_dim;
                    const std::vector<float> x = randn(size_t(nt * width), rng), nw = randn(size_t(head_dim), rng);
                    std::vector<int32_t> pos(static_cast<size_t>(nt));
                    for (auto& p : pos) p = int32_t(rng() % 4096);
                    pos[0] = 0, pos.back() = 4095;
                    // The reference, and per element the magnitudes its bound scales: |a c| + |b s| of a
                    // rotated pair (rot), |v| of a dimension that is only normed (kept), the angle's error.
                    std::vector<double> ref(x.size()), rot(x.size(), 0.0), kept(x.size(), 0.0), dth(x.size(), 0.0);
                    for (int64_t r = 0; r < nt * n_head; ++r) {
                        double* v = ref.data() + r * head_dim;
                        for (int64_t i = 0; i < head_dim; ++i) v[i] = x[size_t(r * head_dim + i)];
                        if (norm) {
                            double ss = 0;
                            for (int64_t i = 0; i < head_dim; ++i) ss += v[i] * v[i];
                            const double inv = 1.0 / std::sqrt(ss / double(head_dim) + 1e-6);
                            for (int64_t i = 0; i < head_dim; ++i) v[i] *= inv * nw[size_t(i)];
                        }
                        const size_t o = size_t(r * head_dim);
                        for (int64_t i = 0; i < head_dim; ++i) kept[o + size_t(i)] = std::fabs(v[i]);
                        const double position = double(pos[size_t(r / n_head)]) * rope.freq_scale;
                        for (int i = 0; i < half; ++i) {
                            double theta = position * std::pow(double(rope.freq_base), -2.0 * i / rope.n_rot);
                            if (factors) theta /= ff[size_t(i)];
                            const int i0 = mode == RopeMode::kNorm ? 2 * i : i;
                            const int i1 = mode == RopeMode::kNorm ? 2 * i + 1 : i + half;
                            const double cs = std::cos(theta), sn = std::sin(theta), a = v[i0], b = v[i1];
                            v[i0] = a * cs - b * sn;
                            v[i1] = a * sn + b * cs;
                            kept[o + size_t(i0)] = kept[o + size_t(i1)] = 0.0;
                            rot[o + size_t(i0)] = std::fabs(a * cs) + std::fabs(b * sn);
                            rot[o + size_t(i1)] = std::fabs(a * sn) + std::fabs(b * cs);
                            dth[o + size_t(i0)] = dth[o + size_t(i1)] =
                                8 * 0x1p-53 * std::fabs(theta) * (std::fabs(a) + std::fabs(b));
                        }
                    }
                    const std::string what =
                        str("norm_rope mode ", int(mode), " head_dim ", head_dim, " n_rot ", rope.n_rot, " n_head ",
                            n_head, " n_tokens ", nt, norm ? " norm" : "", factors ? " factors" : "");
                    for (const Target& t : targets()) {
                        if (t.moe_only) continue;
                        OnBackend ob(t);
                        Tensor X = ob.f32({width, nt}, x), NW = ob.f32({head_dim}, nw), P = ob.i32({nt}, pos);
                        Tensor FF = ob.f32({int64_t(ff.size())}, ff);
                        RopeParams rp = rope;
                        if (factors) rp.freq_factors = FF;
                        ob.be().norm_rope(X, n_head, int(head_dim), norm ? NW : Tensor{}, 1e-6f, P, rp);
                        const std::vector<float> y = ob.read(X);
                        const double en = norm ? norm_err(t, head_dim) : 0.0;
                        Checker c(str(t.name, " ", what));
                        for (size_t i = 0; i < y.size(); ++i)
                            c.near(y[i], ref[i], (en + 4 * kU) * rot[i] + en * kept[i] + dth[i] + 1e-37, "at ", i);
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------- kv_store
// Rows pos[t] of the caches take k[t] and v[t]: the same f32 bits, or f32 -> f16 rounded to nearest
// even (the conversion of core/fp16.h; CUDA's __float2half_rn is the same rounding), bit for bit.
// Rows no position names keep what they held.
TEST(OpHarness, KvStore) {
    std::mt19937 rng(6);
    for (int64_t width : kLengths) {
        for (int64_t n_ctx : kRowCounts) {
            for (int64_t nt : kTokenCounts) {
                if (nt > n_ctx || n_ctx * width > kMaxElems) continue;
                for (GgmlType kv : {GgmlType::kF32, GgmlType::kF16}) {
                    const std::vector<float> k = randn(size_t(nt * width), rng), v = randn(size_t(nt * width), rng);
                    std::vector<int32_t> all(static_cast<size_t>(n_ctx));
                    std::iota(all.begin(), all.end(), 0);
                    std::shuffle(all.begin(), all.end(), rng);
                    const std::vector<int32_t> pos(all.begin(), all.begin() + nt);  // distinct, scattered
                    const size_t es = kv == GgmlType::kF16 ? 2 : 4;
                    const std::vector<uint8_t> before(size_t(n_ctx * width) * es, 0x5A);
                    std::vector<uint8_t> want_k(before), want_v(before);
                    for (int64_t t = 0; t < nt; ++t)
                        for (int64_t i = 0; i < width; ++i) {
                            const size_t at = (size_t(pos[size_t(t)]) * size_t(width) + size_t(i)) * es;
                            for (auto [src, dst] : {std::pair{&k, &want_k}, std::pair{&v, &want_v}}) {
                                const float f = (*src)[size_t(t * width + i)];
                                if (es == 2) {
                                    const uint16_t h = fp32_to_fp16(f);
                                    std::memcpy(dst->data() + at, &h, 2);
                                } else {
                                    std::memcpy(dst->data() + at, &f, 4);
                                }
                            }
                        }
                    for (const Target& t : targets()) {
                        if (t.moe_only) continue;
                        OnBackend ob(t);
                        Tensor K = ob.f32({width, nt}, k), V = ob.f32({width, nt}, v), P = ob.i32({nt}, pos);
                        Tensor KC = ob.alloc(kv, {width, n_ctx}, before.data()),
                               VC = ob.alloc(kv, {width, n_ctx}, before.data());
                        ob.be().kv_store(K, V, P, KC, VC);
                        Checker c(str(t.name, " kv_store ", type_name(kv), " width ", width, " n_ctx ", n_ctx,
                                      " n_tokens ", nt));
                        const auto got_k = ob.read<uint8_t>(KC), got_v = ob.read<uint8_t>(VC);
                        for (size_t i = 0; i < got_k.size(); i += es) {
                            c.eq(std::memcmp(&got_k[i], &want_k[i], es), 0, "k cache byte ", i);
                            c.eq(std::memcmp(&got_v[i], &want_v[i], es), 0, "v cache byte ", i);
                        }
                    }
                }
            }
        }
    }
}

// --------------------------------------------------------------------------------------- attention
// Per query row (token t, head h) over keys j in [begin, end) (causal, window-limited), with the
// exact scores s_j, weights p_j and output o = sum_j p_j v_j, and per dimension M = sum_j p_j |v_j|:
//  - a score is an f32 dot of head_dim products, scaled: ds_j <= gamma(head_dim + 2) scale sum|q k|;
//    exp(s_j - m) is off by exp_err; a common shift of every score cancels in the softmax, so weight
//    j is off by at most e_j = ds_j + exp_err relative, which moves o by sum_j p_j e_j (|v_j| + |o|);
//  - the two f32 sums (numerator and normaliser) of n keys: gamma(n + 2) (M + |o|), the final scale 2u;
//  - kernels with an online softmax rescale their partial sums when the running maximum grows: each
//    rescale by an exp that is off by exp_err(0) reweights what came before it, plus two roundings:
//    (exp_err(0) + 2u) (M + |o|) per rescale. The reference and AVX2 tables find the maximum first
//    (none); AVX-512 tiles 16 keys (ceil(n / 16)); CUDA kernels may rescale at any key (n, plus the
//    merge of the splits);
//  - CUDA's tensor-core kernel sends q and p as f16 hi + lo pairs (22-bit operands: 2^-21 relative per
//    product; below f16's normal range 2^-25 absolute per operand).
// The caches are written directly with values representable in their type, so no rounding of k or v.
TEST(OpHarness, Attention) {
    std::mt19937 rng(7);
    struct Heads {
        int n_head, n_head_kv;
    };
    const Heads heads[] = {{1, 1}, {4, 1}, {6, 2}};  // no grouping, GQA 4, GQA 3 over two kv heads
    const int windows[] = {0, int(kRowCounts[1]), int(kRowCounts[2])};
    int n_case = 0;
    for (int64_t hd : kLengths) {
        if (hd % 32 || hd > 256) continue;
        for (GgmlType kv : {GgmlType::kF32, GgmlType::kF16}) {
            for (int64_t n_ctx : {kRowCounts[2], kRowCounts[3], kLengths[7]}) {
                for (int64_t nt : kTokenCounts) {
                    const Heads hh = heads[size_t(n_case) % std::size(heads)];
                    const int window = windows[size_t(n_case / 3) % std::size(windows)];
                    ++n_case;
                    if (nt > n_ctx || nt * hh.n_head * n_ctx * hd > 2 * kMaxMacs) continue;
                    // Positions: decode at the end, at 0 and in the middle; a short run to the end; scattered;
                    // a prefill run from 0.
                    std::vector<int32_t> pos;
                    if (nt == 1)
                        pos = {int32_t(n_case % 3 == 0 ? 0 : n_case % 3 == 1 ? n_ctx - 1 : n_ctx / 2)};
                    else if (nt <= 3)
                        for (int64_t i = 0; i < nt; ++i) pos.push_back(int32_t(n_ctx - nt + i));
                    else if (nt <= 17)
                        for (int64_t i = 0; i < nt; ++i) pos.push_back(int32_t(rng() % uint32_t(n_ctx)));
                    else
                        for (int64_t i = 0; i < nt; ++i) pos.push_back(int32_t(i));
                    const int64_t kw = hh.n_head_kv * hd, qw = hh.n_head * hd;
                    // Cache contents: f16-representable values when the cache is F16.
                    std::vector<float> kf = randn(size_t(n_ctx * kw), rng), vf = randn(size_t(n_ctx * kw), rng);
                    std::vector<uint16_t> kh, vh;
                    if (kv == GgmlType::kF16) {
                        for (auto* f : {&kf, &vf})
                            for (float& e : *f) e = fp16_to_fp32(fp32_to_fp16(e));
                        for (float e : kf) kh.push_back(fp32_to_fp16(e));
                        for (float e : vf) vh.push_back(fp32_to_fp16(e));
                    }
                    const std::vector<float> q = randn(size_t(nt * qw), rng);
                    const float scale = float(1.0 / std::sqrt(double(hd)));
                    // Reference: o, and per element M, sum_j p_j e_j-free parts (the score errors and the
                    // exp errors depend on the target: kept per key).
                    const int64_t rows = nt * hh.n_head;
                    std::vector<double> o(static_cast<size_t>(rows * hd)), M(o.size());
                    struct Key {
                        double p, qk, ksum, arg;  // weight, scale sum |q_i k_i|, sum |k_i|, s_j - m
                    };
                    std::vector<std::vector<Key>> keys(static_cast<size_t>(rows));
                    std::vector<double> vmax(o.size(), 0.0);  // max_j |v_j| per element
                    for (int64_t r = 0; r < rows; ++r) {
                        const int64_t t = r / hh.n_head;
                        const int h = int(r % hh.n_head), hk = h / (hh.n_head / hh.n_head_kv);
                        const int32_t end = pos[size_t(t)] + 1, begin = window > 0 ? std::max(0, end - window) : 0;
                        std::vector<Key>& ks = keys[size_t(r)];
                        double m = -INFINITY;
                        for (int32_t j = begin; j < end; ++j) {
                            double s = 0, sa = 0, ksum = 0;
                            for (int64_t i = 0; i < hd; ++i) {
                                const double kk = kf[size_t(j * kw + hk * hd + i)],
                                             a = double(q[size_t(r * hd + i)]) * kk;
                                s += a, sa += std::fabs(a), ksum += std::fabs(kk);
                            }
                            ks.push_back({s * scale, sa * scale, ksum, 0});
                            m = std::max(m, s * scale);
                        }
                        double l = 0;
                        for (Key& key : ks) key.arg = key.p - m, key.p = std::exp(key.arg), l += key.p;
                        for (Key& key : ks) key.p /= l;
                        for (int64_t d = 0; d < hd; ++d) {
                            double acc = 0, mag = 0, vm = 0;
                            for (int32_t j = begin; j < end; ++j) {
                                const double vv = vf[size_t(j * kw + hk * hd + d)];
                                acc += ks[size_t(j - begin)].p * vv, mag += ks[size_t(j - begin)].p * std::fabs(vv);
                                vm = std::max(vm, std::fabs(vv));
                            }
                            o[size_t(r * hd + d)] = acc, M[size_t(r * hd + d)] = mag, vmax[size_t(r * hd + d)] = vm;
                        }
                    }
                    const std::string what =
                        str("attention ", type_name(kv), " head_dim ", hd, " heads ", hh.n_head, "/", hh.n_head_kv,
                            " window ", window, " n_ctx ", n_ctx, " n_tokens ", nt);
                    for (const Target& t : targets()) {
                        if (t.moe_only) continue;
                        OnBackend ob(t);
                        Tensor Q = ob.f32({qw, nt}, q), P = ob.i32({nt}, pos);
                        const void* kb = kv == GgmlType::kF16 ? static_cast<const void*>(kh.data()) : kf.data();
                        const void* vb = kv == GgmlType::kF16 ? static_cast<const void*>(vh.data()) : vf.data();
                        Tensor KC = ob.alloc(kv, {kw, n_ctx}, kb), VC = ob.alloc(kv, {kw, n_ctx}, vb);
                        Tensor out = ob.alloc(GgmlType::kF32, {qw, nt});
                        AttentionParams ap;
                        ap.n_head = hh.n_head, ap.n_head_kv = hh.n_head_kv, ap.head_dim = int(hd), ap.scale = scale;
                        ap.sliding_window = window;
                        ob.be().attention(Q, KC, VC, P, ap, out);
                        const std::vector<float> y = ob.read(out);
                        Checker c(str(t.name, " ", what));
                        const bool mma = t.cuda();
                        for (int64_t r = 0; r < rows && c.misses() < 8; ++r) {
                            const std::vector<Key>& ks = keys[size_t(r)];
                            const int64_t n = int64_t(ks.size());
                            const int64_t rescales =
                                !t.cuda() ? (t.table->isa == cpu::Isa::kAvx512 ? (n + 15) / 16 : 0) : n + 32;
                            std::vector<double> e(ks.size());
                            for (size_t j = 0; j < ks.size(); ++j) {
                                e[j] = gamma(hd + 2) * ks[j].qk + exp_err(t, ks[j].arg);
                                if (mma) e[j] += 0x1p-21 * ks[j].qk + kF16Sub * ks[j].ksum;
                            }
                            const int32_t begin = pos[size_t(r / hh.n_head)] + 1 - int32_t(n);
                            const int hk = int(r % hh.n_head) / (hh.n_head / hh.n_head_kv);
                            for (int64_t d = 0; d < hd; ++d) {
                                const size_t at = size_t(r * hd + d);
                                const double od = std::fabs(o[at]), md = M[at];
                                double b = 0;
                                for (size_t j = 0; j < ks.size(); ++j)
                                    b += ks[j].p * e[j] *
                                         (std::fabs(double(vf[size_t((begin + int64_t(j)) * kw + hk * hd + d)])) + od);
                                b += (gamma(n + 2) + double(rescales) * (exp_err(t, 0.0) + 2 * kU)) * (md + od) +
                                     2 * kU * od;
                                if (mma) b += 0x1p-21 * md + double(n) * kF16Sub * vmax[at];
                                c.near(y[at], o[at], b, "token ", r / hh.n_head, " head ", r % hh.n_head, " dim ", d);
                            }
                        }
                    }
                }
            }
        }
    }
}

// -------------------------------------------------------------------------------------- short_conv
// Chunks of 1, 3, 17, 64 and 1 tokens on one rolling state. The state holds f32(B X) rows: it must
// equal the reference's bit for bit (one correctly rounded product), and state_prev the state before
// the call. out = C sum_j w_j pad_j: L products, their sum and the product with C, plus B X where a
// kernel fuses it: gamma(L + 2) |C| sum_j |w_j pad_j|.
TEST(OpHarness, ShortConv) {
    std::mt19937 rng(8);
    const int64_t chunks[] = {kTokenCounts[0], kTokenCounts[1], kTokenCounts[2], kTokenCounts[3], kTokenCounts[0]};
    int n_case = 0;
    for (int64_t n_embd : kLengths) {
        const int64_t L = n_case++ % 2 ? 3 : 4, n_state = L - 1;
        const std::vector<float> w = randn(size_t(n_embd * L), rng), state0 = randn(size_t(n_state * n_embd), rng);
        // The reference over the chunks: outputs, bounds and the state after each.
        std::vector<std::vector<float>> bcx, states{state0};
        std::vector<std::vector<double>> outs, bounds;
        for (int64_t nt : chunks) {
            bcx.push_back(randn(size_t(nt * 3 * n_embd), rng));
            const std::vector<float>& in = bcx.back();
            std::vector<float> pad(states.back());
            for (int64_t t = 0; t < nt; ++t)
                for (int64_t c = 0; c < n_embd; ++c)
                    pad.push_back(in[size_t(t * 3 * n_embd + c)] * in[size_t(t * 3 * n_embd + 2 * n_embd + c)]);
            std::vector<double> o(static_cast<size_t>(nt * n_embd)), b(o.size());
            for (int64_t t = 0; t < nt; ++t)
                for (int64_t c = 0; c < n_embd; ++c) {
                    double acc = 0, mag = 0;
                    for (int64_t j = 0; j < L; ++j) {
                        const double term = double(w[size_t(c * L + j)]) * pad[size_t((t + j) * n_embd + c)];
                        acc += term, mag += std::fabs(term);
                    }
                    const double cg = in[size_t(t * 3 * n_embd + n_embd + c)];
                    o[size_t(t * n_embd + c)] = cg * acc;
                    b[size_t(t * n_embd + c)] = gamma(L + 2) * std::fabs(cg) * mag + 1e-37;
                }
            outs.push_back(o), bounds.push_back(b);
            states.emplace_back(pad.end() - n_state * n_embd, pad.end());
        }
        for (const Target& t : targets()) {
            if (t.moe_only) continue;
            OnBackend ob(t);
            Tensor W = ob.f32({L, n_embd}, w), S = ob.f32({n_embd, n_state}, state0);
            Tensor SP = ob.alloc(GgmlType::kF32, {n_embd, n_state});
            for (size_t ci = 0; ci < std::size(chunks); ++ci) {
                const int64_t nt = chunks[ci];
                Tensor BCX = ob.f32({3 * n_embd, nt}, bcx[ci]), OUT = ob.alloc(GgmlType::kF32, {n_embd, nt});
                const bool prev = ci % 2 == 1;
                ob.be().short_conv(BCX, W, S, OUT, prev ? SP : Tensor{});
                Checker c(str(t.name, " short_conv L ", L, " n_embd ", n_embd, " chunk ", ci, " of ", nt, " tokens"));
                const std::vector<float> y = ob.read(OUT), st = ob.read(S);
                for (size_t i = 0; i < y.size(); ++i) c.near(y[i], outs[ci][i], bounds[ci][i], "out ", i);
                for (size_t i = 0; i < st.size(); ++i) c.eq(st[i], states[ci + 1][i], "state ", i);
                if (prev) {
                    const std::vector<float> sp = ob.read(SP);
                    for (size_t i = 0; i < sp.size(); ++i) c.eq(sp[i], states[ci][i], "state_prev ", i);
                }
            }
        }
    }
}

// ------------------------------------------------------------------------------------ swiglu, add, scale
// swiglu: g / (1 + e) * u with e = exp(-g) off by exp_err, which moves 1 + e by exp_err e / (1 + e)
// relative; plus the sum, the division and the product: 3u, and 1u spare. Out separate, aliasing
// gate, aliasing up. Gates include -100 (exp overflows to inf on some kernels: the result is 0
// against ~1e-42), 100 and 0.
TEST(OpHarness, Swiglu) {
    std::mt19937 rng(9);
    int n_case = 0;
    for (int64_t n : kLengths) {
        for (int64_t rows : kRowCounts) {
            if (rows * n > kMaxElems) continue;
            const int alias = n_case++ % 3;
            std::vector<float> g = randn(size_t(rows * n), rng, 4.0f);
            const std::vector<float> u = randn(g.size(), rng);
            if (g.size() >= 3) g[0] = -100.0f, g[1] = 100.0f, g[2] = 0.0f;
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                OnBackend ob(t);
                Tensor G = ob.f32({n, rows}, g), U = ob.f32({n, rows}, u);
                Tensor out = alias == 1 ? G : alias == 2 ? U : ob.alloc(GgmlType::kF32, {n, rows});
                ob.be().swiglu(G, U, out);
                const std::vector<float> y = ob.read(out);
                Checker c(str(t.name, " swiglu n ", n, " rows ", rows, " alias ", alias));
                for (size_t i = 0; i < y.size(); ++i) {
                    const double e = std::exp(-double(g[i])), ref = double(g[i]) / (1.0 + e) * u[i];
                    const double rel = std::isinf(e) ? 0.0 : exp_err(t, -g[i]) * e / (1.0 + e);
                    c.near(y[i], ref, (rel + 4 * kU) * std::fabs(ref) + 1e-37, "at ", i);
                }
            }
        }
    }
}

// add: a + s b, one product and one sum (or one fused multiply-add): 2u (|a| + |s b|). Out separate,
// aliasing a, aliasing b. scale: x s is one correctly rounded product: equal to f32(x * s).
TEST(OpHarness, AddAndScale) {
    std::mt19937 rng(10);
    int n_case = 0;
    const float scales[] = {1.0f, 0.375f, -2.0f};
    for (int64_t n : kLengths) {
        for (int64_t rows : kRowCounts) {
            if (rows * n > kMaxElems) continue;
            const int alias = n_case % 3;
            const float s = scales[size_t(n_case / 3) % std::size(scales)];
            ++n_case;
            const std::vector<float> a = randn(size_t(rows * n), rng), b = randn(a.size(), rng, 3.0f);
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                OnBackend ob(t);
                Tensor A = ob.f32({n, rows}, a), B = ob.f32({n, rows}, b);
                Tensor out = alias == 1 ? A : alias == 2 ? B : ob.alloc(GgmlType::kF32, {n, rows});
                ob.be().add(A, B, s, out);
                std::vector<float> y = ob.read(out);
                Checker c(str(t.name, " add n ", n, " rows ", rows, " scale ", s, " alias ", alias));
                for (size_t i = 0; i < y.size(); ++i)
                    c.near(y[i], double(a[i]) + double(s) * b[i], 2 * kU * (std::fabs(a[i]) + std::fabs(s * b[i])),
                           "at ", i);
                ob.be().scale(out, -s * 1.5f);
                const std::vector<float> z = ob.read(out);
                for (size_t i = 0; i < z.size(); ++i)
                    c.eq(z[i], float(double(y[i]) * double(-s * 1.5f)), "scale at ", i);
            }
        }
    }
}

// ------------------------------------------------------------------------------- argmax, top_logits
// The lowest index of the largest non-NaN value, 0 when every value is NaN: exact.
int32_t argmax_ref(const float* x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i)
        if (!std::isnan(x[i]) && (best < 0 || x[i] > x[best])) best = i;
    return best < 0 ? 0 : int32_t(best);
}

// Rows of every kind for a length n: random; all negative; planted ties of the maximum; a tie at the
// two last places; constant; -0 with one +0 (equal: the first wins); NaN and -inf sprinkled; two
// +inf; all -inf; all NaN; NaN then -inf at the end; a coarse grid (many ties) with NaN and +-inf.
std::vector<float> special_rows(int64_t n, std::mt19937& rng, int64_t* n_rows) {
    const int kinds = 12;
    std::vector<float> x = randn(size_t(n * kinds), rng, 3.0f);
    std::uniform_int_distribution<int64_t> at(0, n - 1);
    auto row = [&](int r) { return x.data() + r * n; };
    for (int64_t i = 0; i < n; ++i) row(1)[i] = -std::fabs(row(1)[i]) - 1.0f;
    for (int i = 0; i < 3; ++i) row(2)[at(rng)] = 50.0f;
    row(3)[n - 1] = 60.0f, row(3)[std::max<int64_t>(0, n - 2)] = 60.0f;
    std::fill(row(4), row(4) + n, -2.5f);
    std::fill(row(5), row(5) + n, -0.0f), row(5)[at(rng)] = 0.0f;
    for (int i = 0; i < 4; ++i) row(6)[at(rng)] = kNan, row(6)[at(rng)] = -kInf;
    row(7)[at(rng)] = kInf, row(7)[at(rng)] = kInf;
    std::fill(row(8), row(8) + n, -kInf);
    std::fill(row(9), row(9) + n, kNan);
    std::fill(row(10), row(10) + n, kNan), row(10)[n - 1] = -kInf;
    for (int64_t i = 0; i < n; ++i) {
        const uint32_t c = rng() % 100;
        row(11)[i] = c == 0 ? kNan : c == 1 ? -kInf : c == 2 ? kInf : std::round(row(11)[i] * 2.0f) / 2.0f;
    }
    *n_rows = kinds;
    return x;
}

// argmax over [rows, n], over single rows (views at unaligned offsets), and argmax_feed of each row:
// out[0] = ids[0] = the pick, pos[0] = pos[last] + 1, the rest of ids and pos untouched.
TEST(OpHarness, Argmax) {
    std::mt19937 rng(11);
    for (int64_t n : kLengths) {
        int64_t rows = 0;
        const std::vector<float> x = special_rows(n, rng, &rows);
        for (const Target& t : targets()) {
            if (t.moe_only) continue;
            OnBackend ob(t);
            Tensor X = ob.f32({n, rows}, x), out = ob.alloc(GgmlType::kI32, {rows});
            ob.be().argmax(X, out);
            const std::vector<int32_t> got = ob.read<int32_t>(out);
            Checker c(str(t.name, " argmax n ", n));
            for (int64_t r = 0; r < rows; ++r) c.eq(got[size_t(r)], argmax_ref(x.data() + r * n, n), "row ", r);
            Tensor ids = ob.alloc(GgmlType::kI32, {3}), pos = ob.alloc(GgmlType::kI32, {3});
            for (int64_t r = 0; r < rows; ++r) {
                const int32_t want = argmax_ref(x.data() + r * n, n);
                ob.be().argmax(X.row_slice(r, 1), out);
                c.eq(ob.read<int32_t>(out)[0], want, "row ", r, " alone");
                const std::vector<int32_t> ids0 = {-1, 7, 8}, pos0 = {40, 41, int32_t(42 + r)};
                ob.be().write(ids, ids0.data(), 12), ob.be().write(pos, pos0.data(), 12);
                ob.be().argmax_feed(X.row_slice(r, 1), out, ids, pos);
                const auto o = ob.read<int32_t>(out), i1 = ob.read<int32_t>(ids), p1 = ob.read<int32_t>(pos);
                c.eq(o[0], want, "row ", r, " argmax_feed out");
                const int32_t want_ids[3] = {want, 7, 8}, want_pos[3] = {int32_t(43 + r), 41, int32_t(42 + r)};
                for (size_t i = 0; i < 3; ++i) {
                    c.eq(i1[i], want_ids[i], "row ", r, " argmax_feed ids[", i, "]");
                    c.eq(p1[i], want_pos[i], "row ", r, " argmax_feed pos[", i, "]");
                }
            }
        }
    }
}

// The first m candidates (values above -inf, NaN never) by value descending then index ascending,
// their values' bits, and the gathered values' bits (NaN outside the row): exact.
TEST(OpHarness, TopLogits) {
    std::mt19937 rng(12);
    for (int64_t n : kLengths) {
        int64_t rows = 0;
        const std::vector<float> x = special_rows(n, rng, &rows);
        std::vector<int32_t> gather(17);
        for (auto& g : gather) g = int32_t(int64_t(rng() % uint32_t(n + 5)) - 2);
        for (int64_t r = 0; r < rows; ++r) {
            const float* xr = x.data() + r * n;
            std::vector<int32_t> cand;
            for (int64_t i = 0; i < n; ++i)
                if (!std::isnan(xr[i]) && xr[i] > -kInf) cand.push_back(int32_t(i));
            std::stable_sort(cand.begin(), cand.end(), [&](int32_t a, int32_t b) { return xr[a] > xr[b]; });
            for (int32_t m : {int32_t(kRowCounts[0]), int32_t(kRowCounts[1]), int32_t(kRowCounts[2])}) {
                const int64_t n_g = r % 2 ? int64_t(gather.size()) : 0;
                const int64_t out_n = 1 + 2 * int64_t(m) + n_g;
                const int32_t cnt = int32_t(std::min<size_t>(size_t(m), cand.size()));
                for (const Target& t : targets()) {
                    if (t.moe_only) continue;
                    OnBackend ob(t);
                    Tensor X = ob.f32({n}, std::vector<float>(xr, xr + n));
                    Tensor G = n_g ? ob.i32({n_g}, gather) : Tensor{};
                    Tensor out = ob.alloc(GgmlType::kI32, {out_n});
                    ob.be().top_logits(X, m, G, out);
                    const std::vector<int32_t> o = ob.read<int32_t>(out);
                    Checker c(str(t.name, " top_logits n ", n, " row kind ", r, " m ", m, " n_g ", n_g));
                    if (!c.eq(o[0], cnt, "count")) continue;
                    for (int32_t j = 0; j < cnt; ++j) {
                        c.eq(o[size_t(1 + j)], cand[size_t(j)], "rank ", j);
                        c.eq(uint32_t(o[size_t(1 + m + j)]), fp32_to_bits(xr[cand[size_t(j)]]), "value of rank ", j);
                    }
                    for (int64_t g = 0; g < n_g; ++g) {
                        const int32_t i = gather[size_t(g)];
                        const uint32_t bits = uint32_t(o[size_t(1 + 2 * m + g)]);
                        if (i >= 0 && i < n)
                            c.eq(bits, fp32_to_bits(xr[i]), "gather ", g);
                        else
                            c.eq(std::isnan(fp32_from_bits(bits)), true, "gather ", g, " outside the row");
                    }
                }
            }
        }
    }
}

// --------------------------------------------------------------------------------------- moe_route
// ids exact; weights p_e (renormalised, scaled): p is off by pe = exp_err + (n_expert + 3)u
// (softmax: an exp and a sum of n_expert terms) or exp_err + 2u (sigmoid), a renormalised weight by
// 2 pe + (k + 1)u, the scaling by u. Logits are drawn until the k + 1 best selection scores are
// apart by 1e-4 of the largest (over 2 (pe + 2u) (|p| + |bias|) on every target), so that the choice
// and its order are decided by the reference alone.
TEST(OpHarness, MoeRoute) {
    std::mt19937 rng(13);
    int n_case = 0;
    for (int64_t n_expert : kLengths) {
        if (n_expert < 7 || n_expert > 256) continue;
        for (int64_t nt : kTokenCounts) {
            const int k = int(std::min<int64_t>(n_expert, std::array<int64_t, 4>{1, 2, 4, 7}[size_t(n_case) % 4]));
            MoeParams mp;
            mp.n_expert = int(n_expert), mp.n_expert_used = k;
            mp.gating = n_case % 2 ? MoeGating::kSigmoid : MoeGating::kSoftmax;
            mp.normalize_weights = n_case % 3 != 0;
            mp.weights_scale = n_case % 5 == 0 ? 2.5f : 1.0f;
            const bool with_bias = n_case % 4 >= 2;
            ++n_case;
            const std::vector<float> bias = randn(size_t(n_expert), rng, 0.1f);
            std::vector<float> logits(static_cast<size_t>(nt * n_expert));
            std::vector<int32_t> ids(static_cast<size_t>(nt * k));
            std::vector<double> wts(ids.size()), args(logits.size());
            for (int64_t t = 0; t < nt; ++t) {
                float* l = logits.data() + t * n_expert;
                for (int tries = 0;; ++tries) {
                    ASSERT_LT(tries, 1000);
                    for (int64_t e = 0; e < n_expert; ++e) l[e] = std::normal_distribution<float>(0.0f, 2.0f)(rng);
                    std::vector<double> p(static_cast<size_t>(n_expert)), sel(p.size());
                    double mx = -INFINITY, sum = 0;
                    for (int64_t e = 0; e < n_expert; ++e) mx = std::max(mx, double(l[e]));
                    for (int64_t e = 0; e < n_expert; ++e) {
                        args[size_t(t * n_expert + e)] = mp.gating == MoeGating::kSigmoid ? -double(l[e]) : l[e] - mx;
                        p[size_t(e)] = mp.gating == MoeGating::kSigmoid ? 1.0 / (1.0 + std::exp(-double(l[e])))
                                                                        : std::exp(l[e] - mx);
                        sum += p[size_t(e)];
                    }
                    if (mp.gating == MoeGating::kSoftmax)
                        for (double& v : p) v /= sum;
                    std::vector<int32_t> order(static_cast<size_t>(n_expert));
                    std::iota(order.begin(), order.end(), 0);
                    double big = 0;
                    for (int64_t e = 0; e < n_expert; ++e) {
                        sel[size_t(e)] = p[size_t(e)] + (with_bias ? bias[size_t(e)] : 0.0);
                        big = std::max(big, std::fabs(sel[size_t(e)]));
                    }
                    std::stable_sort(order.begin(), order.end(),
                                     [&](int32_t a, int32_t b) { return sel[size_t(a)] > sel[size_t(b)]; });
                    bool apart = true;
                    for (int j = 0; j + 1 <= k && j + 1 < n_expert; ++j)
                        apart =
                            apart && sel[size_t(order[size_t(j)])] - sel[size_t(order[size_t(j + 1)])] >= 1e-4 * big;
                    if (!apart) continue;
                    double chosen = 0;
                    for (int j = 0; j < k; ++j) chosen += p[size_t(order[size_t(j)])];
                    for (int j = 0; j < k; ++j) {
                        ids[size_t(t * k + j)] = order[size_t(j)];
                        wts[size_t(t * k + j)] =
                            p[size_t(order[size_t(j)])] / (mp.normalize_weights ? chosen : 1.0) * mp.weights_scale;
                    }
                    break;
                }
            }
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                OnBackend ob(t);
                Tensor L = ob.f32({n_expert, nt}, logits), B = ob.f32({n_expert}, bias);
                Tensor I = ob.alloc(GgmlType::kI32, {k, nt}), W = ob.alloc(GgmlType::kF32, {k, nt});
                ob.be().moe_route(L, with_bias ? B : Tensor{}, mp, I, W);
                const std::vector<int32_t> gi = ob.read<int32_t>(I);
                const std::vector<float> gw = ob.read(W);
                Checker c(str(t.name, " moe_route n_expert ", n_expert, " k ", k, " n_tokens ", nt,
                              mp.gating == MoeGating::kSigmoid ? " sigmoid" : " softmax", with_bias ? " bias" : "",
                              mp.normalize_weights ? " normalized" : "", " scale ", mp.weights_scale));
                for (int64_t tk = 0; tk < nt; ++tk) {
                    double pe = 0;
                    for (int64_t e = 0; e < n_expert; ++e)
                        pe = std::max(pe, exp_err(t, args[size_t(tk * n_expert + e)]));
                    pe += mp.gating == MoeGating::kSigmoid ? 2 * kU : double(n_expert + 3) * kU;
                    for (int j = 0; j < k; ++j) {
                        const size_t at = size_t(tk * k + j);
                        c.eq(gi[at], ids[at], "token ", tk, " id ", j);
                        c.near(gw[at], wts[at], (2 * pe + double(k + 3) * kU) * std::fabs(wts[at]), "token ", tk,
                               " weight ", j);
                    }
                }
            }
        }
    }
}

// ----------------------------------------------------------------------------------------- moe_ffn
// out[t] = sum_j w_j down_e(silu(gate_e x) * up_e x), e = ids[t][j]. The bound follows the error
// through: the gate and up products g, u within B_g, B_u (product_bound); h = silu(g) u within
// B_h = 1.1 B_g (|u| + B_u) + |silu(g)| B_u (|silu'| <= 1.1) plus SwiGLU's own error (as in Swiglu) on
// the perturbed values; the down product within sum_r |W_cr| B_h,r (its input's error) plus
// product_bound on activations up to |h| + B_h; the weighted sum of k rows: gamma(k + 2).
struct MoeCase {
    int64_t n_embd, n_ff, n_expert, k, nt;
    const Weight *gate, *up, *down;  // [n_expert * n_ff, n_embd], [n_expert * n_embd, n_ff]
    const std::vector<float>* x;
    const std::vector<int32_t>* ids;
    const std::vector<float>* wts;
};

void moe_reference(const MoeCase& m, const Target& t, const MatmulArith& a, std::vector<double>& out,
                   std::vector<double>& bound) {
    out.assign(size_t(m.nt * m.n_embd), 0.0);
    bound.assign(out.size(), 0.0);
    std::vector<double> mag(out.size(), 0.0), h(size_t(m.n_ff)), bh(h.size()), ha(h.size()), xa(size_t(m.n_embd));
    for (int64_t tk = 0; tk < m.nt; ++tk) {
        const float* x = m.x->data() + tk * m.n_embd;
        for (int64_t i = 0; i < m.n_embd; ++i) xa[size_t(i)] = std::fabs(double(x[i]));
        for (int64_t j = 0; j < m.k; ++j) {
            const int64_t e = (*m.ids)[size_t(tk * m.k + j)];
            const double w = (*m.wts)[size_t(tk * m.k + j)];
            for (int64_t r = 0; r < m.n_ff; ++r) {
                const int64_t row = e * m.n_ff + r;
                double g = 0, u = 0;
                for (int64_t i = 0; i < m.n_embd; ++i)
                    g += double(m.gate->row(row)[i]) * x[i], u += double(m.up->row(row)[i]) * x[i];
                const double bg = product_bound(a, m.gate->row(row), m.gate->row_off(row), xa.data(), m.n_embd);
                const double bu = product_bound(a, m.up->row(row), m.up->row_off(row), xa.data(), m.n_embd);
                const double sg = g / (1.0 + std::exp(-g)), dsg = 1.1 * bg;
                const double own = exp_err(t, std::fabs(g) + bg) + 4 * kU;
                h[size_t(r)] = sg * u;
                bh[size_t(r)] =
                    dsg * (std::fabs(u) + bu) + std::fabs(sg) * bu + own * (std::fabs(sg) + dsg) * (std::fabs(u) + bu);
                ha[size_t(r)] = std::fabs(h[size_t(r)]) + bh[size_t(r)];
            }
            for (int64_t c = 0; c < m.n_embd; ++c) {
                const int64_t row = e * m.n_embd + c;
                double y = 0, by = 0;
                for (int64_t r = 0; r < m.n_ff; ++r) {
                    y += double(m.down->row(row)[r]) * h[size_t(r)];
                    by += std::fabs(double(m.down->row(row)[r])) * bh[size_t(r)];
                }
                by += product_bound(a, m.down->row(row), m.down->row_off(row), ha.data(), m.n_ff);
                const size_t at = size_t(tk * m.n_embd + c);
                out[at] += w * y;
                bound[at] += std::fabs(w) * by;
                mag[at] += std::fabs(w) * (std::fabs(y) + by);
            }
        }
    }
    for (size_t i = 0; i < out.size(); ++i) bound[i] += gamma(m.k + 2) * mag[i] + 1e-37;
}

TEST(OpHarness, MoeFfn) {
    std::mt19937 rng(14);
    const int64_t n_expert = kLengths[1], k = 2;
    for (GgmlType type : kWeightTypes) {
        // Row lengths from the list: 96 and 7 for float types, 32 and 96 for 32-blocks, 256 for K-quants.
        const int64_t block = type_info(type).block_size;
        const int64_t n_embd = block == 1 ? kLengths[3] : block == 32 ? kLengths[2] : kLengths[4];
        const int64_t n_ff = block == 1 ? kLengths[1] : block == 32 ? kLengths[3] : kLengths[4];
        const Weight gate = make_weight(type, n_expert * n_ff, n_embd, rng, 0.1f);
        const Weight up = make_weight(type, n_expert * n_ff, n_embd, rng, 0.1f);
        const Weight down = make_weight(type, n_expert * n_embd, n_ff, rng, 0.1f);
        for (int64_t nt : kTokenCounts) {
            if (nt * k * 3 * n_ff * n_embd > 2 * kMaxMacs) continue;
            const std::vector<float> x = activations(size_t(nt * n_embd), rng);
            std::vector<int32_t> ids;
            std::vector<float> wts;
            for (int64_t tk = 0; tk < nt; ++tk) {
                // k distinct experts; expert n_expert - 1 never chosen, expert 0 by most tokens.
                std::vector<int32_t> pick(static_cast<size_t>(n_expert - 2));
                std::iota(pick.begin(), pick.end(), 1);
                std::shuffle(pick.begin(), pick.end(), rng);
                if (rng() % 4 != 0) pick.insert(pick.begin(), 0);
                for (int64_t j = 0; j < k; ++j) {
                    ids.push_back(pick[size_t(j)]);
                    wts.push_back(0.1f + 0.9f * float(rng() % 1000) / 1000.0f);
                }
            }
            const MoeCase mc{n_embd, n_ff, n_expert, k, nt, &gate, &up, &down, &x, &ids, &wts};
            std::map<std::tuple<int, bool, bool>, std::pair<std::vector<double>, std::vector<double>>> refs;
            for (const Target& t : targets()) {
                const MatmulArith a = matmul_arith(t, type, nt, /*moe=*/true);
                auto& [want, bound] = refs[{int(a.act), a.w_f16, t.cuda()}];
                if (want.empty()) moe_reference(mc, t, a, want, bound);
                OnBackend ob(t);
                Tensor G = ob.weight(type, {n_embd, n_ff, n_expert}, gate.bytes.data());
                Tensor U = ob.weight(type, {n_embd, n_ff, n_expert}, up.bytes.data());
                Tensor D = ob.weight(type, {n_ff, n_embd, n_expert}, down.bytes.data());
                Tensor X = ob.f32({n_embd, nt}, x), I = ob.i32({k, nt}, ids), W = ob.f32({k, nt}, wts);
                Tensor out = ob.alloc(GgmlType::kF32, {n_embd, nt});
                ob.be().moe_ffn(X, G, U, D, I, W, out);
                const std::vector<float> y = ob.read(out);
                Checker c(
                    str(t.name, " moe_ffn ", type_name(type), " n_embd ", n_embd, " n_ff ", n_ff, " n_tokens ", nt));
                for (size_t i = 0; i < y.size(); ++i) c.near(y[i], want[i], bound[i], "at ", i);
            }
        }
    }
}

}  // namespace
}  // namespace cera::harness
