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
// Rows pos[t] of the caches take k[t] and v[t] in the cache's type, bit for bit as the reference
// conversions write them (quantize_row_ref: f16 and bf16 rounded to nearest even, CUDA's __float2half_rn
// and __float2bfloat16_rn being the same rounding; Q8_0, Q4_0 and Q3_KV blocks with the reference quantizers'
// arithmetic). Rows no position names keep what they held.
TEST(OpHarness, KvStore) {
    std::mt19937 rng(6);
    for (int64_t width : kLengths) {
        for (int64_t n_ctx : kRowCounts) {
            for (int64_t nt : kTokenCounts) {
                if (nt > n_ctx || n_ctx * width > kMaxElems) continue;
                for (auto [kv, vt] : kv_pairs()) {
                    if (width % type_info(kv).block_size != 0 || width % type_info(vt).block_size != 0) continue;
                    std::vector<float> k = randn(size_t(nt * width), rng), v = randn(size_t(nt * width), rng);
                    // A row of zeros whose first is -0: the block types' scale keeps the reference's sign.
                    if (nt > 1) std::fill(k.begin(), k.begin() + width, 0.0f), k[0] = -0.0f;
                    std::vector<int32_t> all(static_cast<size_t>(n_ctx));
                    std::iota(all.begin(), all.end(), 0);
                    std::shuffle(all.begin(), all.end(), rng);
                    const std::vector<int32_t> pos(all.begin(), all.begin() + nt);  // distinct, scattered
                    const size_t rb = row_size(kv, width), vrb = row_size(vt, width);
                    const std::vector<uint8_t> before(size_t(n_ctx) * rb, 0x5A), v_before(size_t(n_ctx) * vrb, 0x5A);
                    std::vector<uint8_t> want_k(before), want_v(v_before);
                    for (int64_t t = 0; t < nt; ++t)
                        for (auto [src, dst, ty] : {std::tuple{&k, &want_k, kv}, std::tuple{&v, &want_v, vt}}) {
                            const float* row = src->data() + t * width;
                            const size_t b = row_size(ty, width);
                            uint8_t* at = dst->data() + size_t(pos[size_t(t)]) * b;
                            if (ty == GgmlType::kF32) std::memcpy(at, row, b);
                            else quantize_row_ref(ty, row, at, width);
                        }
                    for (const Target& t : targets()) {
                        if (t.moe_only) continue;
                        OnBackend ob(t);
                        Tensor K = ob.f32({width, nt}, k), V = ob.f32({width, nt}, v), P = ob.i32({nt}, pos);
                        Tensor KC = ob.alloc(kv, {width, n_ctx}, before.data()),
                               VC = ob.alloc(vt, {width, n_ctx}, v_before.data());
                        ob.be().kv_store(K, V, P, KC, VC);
                        Checker c(str(t.name, " kv_store ", type_name(kv), "/", type_name(vt), " width ", width,
                                      " n_ctx ", n_ctx, " n_tokens ", nt));
                        const auto got_k = ob.read<uint8_t>(KC), got_v = ob.read<uint8_t>(VC);
                        for (size_t i = 0; i < got_k.size() && c.misses() < 8; ++i)
                            c.eq(int(got_k[i]), int(want_k[i]), "k cache byte ", i);
                        for (size_t i = 0; i < got_v.size() && c.misses() < 8; ++i)
                            c.eq(int(got_v[i]), int(want_v[i]), "v cache byte ", i);
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
//    product; below f16's normal range 2^-25 absolute per operand), and decodes the caches of the other
//    types into f16 tiles: each k and v element rounded to f16 (2^-11 relative, 2^-25 absolute); its
//    decode kernel takes q over a Q8_0 cache in 8-bit blocks of 32 (integer dot products).
// The caches are written directly in their type, and the reference reads the values they hold.
TEST(OpHarness, Attention) {
    std::mt19937 rng(7);
    struct Heads {
        int n_head, n_head_kv;
    };
    const Heads heads[] = {{1, 1}, {4, 1}, {6, 2}};  // no grouping, GQA 4, GQA 3 over two kv heads
    // Heads that are not a multiple of a block (CPU only): several share a block of the cache's row, or
    // one starts inside a block and ends inside the next.
    const Heads narrow_heads[] = {{8, 4}, {4, 4}, {6, 2}};
    const int windows[] = {0, int(kRowCounts[1]), int(kRowCounts[2])};
    const int64_t narrow[] = {8, 24, 48};
    std::vector<int64_t> head_dims;
    for (int64_t hd : kLengths)
        if (hd % 32 == 0 && hd <= 256) head_dims.push_back(hd);
    head_dims.insert(head_dims.end(), std::begin(narrow), std::end(narrow));
    int n_case = 0;
    for (int64_t hd : head_dims) {
        for (auto [kv, vt] : kv_pairs()) {
            for (int64_t n_ctx : {kRowCounts[2], kRowCounts[3], kLengths[7]}) {
                for (int64_t nt : kTokenCounts) {
                    const Heads hh = (hd % 32 ? narrow_heads : heads)[size_t(n_case) % std::size(heads)];
                    const int window = windows[size_t(n_case / 3) % std::size(windows)];
                    ++n_case;
                    if (nt > n_ctx || nt * hh.n_head * n_ctx * hd > 2 * kMaxMacs) continue;
                    if ((type_info(kv).block_size > 1 || type_info(vt).block_size > 1) && hh.n_head_kv * hd % 32 != 0)
                        continue;
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
                    // Cache contents: random rows in the cache's type (kb, vb), and the values they hold (kf, vf).
                    std::vector<float> kf = randn(size_t(n_ctx * kw), rng), vf = randn(size_t(n_ctx * kw), rng);
                    std::vector<uint8_t> kb(size_t(n_ctx) * row_size(kv, kw)), vb(size_t(n_ctx) * row_size(vt, kw));
                    for (auto [f, bytes, ty] : {std::tuple{&kf, &kb, kv}, std::tuple{&vf, &vb, vt}}) {
                        if (ty == GgmlType::kF32) {
                            std::memcpy(bytes->data(), f->data(), bytes->size());
                            continue;
                        }
                        quantize_row_ref(ty, f->data(), bytes->data(), n_ctx * kw);
                        dequantize_row_ref(ty, bytes->data(), f->data(), n_ctx * kw);
                    }
                    // CUDA's tensor-core kernel rounds the decoded values of these types to f16.
                    const bool rounds16 = kv != GgmlType::kF32 && kv != GgmlType::kF16;
                    const std::vector<float> q = randn(size_t(nt * qw), rng);
                    const float scale = float(1.0 / std::sqrt(double(hd)));
                    // Reference: o, and per element M, sum_j p_j e_j-free parts (the score errors and the
                    // exp errors depend on the target: kept per key).
                    const int64_t rows = nt * hh.n_head;
                    std::vector<double> o(static_cast<size_t>(rows * hd)), M(o.size());
                    struct Key {
                        double p, qk, ksum, arg;  // weight, scale sum |q_i k_i|, sum |k_i|, s_j - m
                        double q8;                // CUDA's 8-bit q over a Q8_0 cache: the score's bound
                    };
                    std::vector<std::vector<Key>> keys(static_cast<size_t>(rows));
                    std::vector<double> vmax(o.size(), 0.0);  // max_j |v_j| per element
                    std::vector<double> qabs(static_cast<size_t>(rows), 0.0);  // scale sum_i |q_i| per row
                    for (int64_t r = 0; r < rows; ++r)
                        for (int64_t i = 0; i < hd; ++i) qabs[size_t(r)] += scale * std::fabs(q[size_t(r * hd + i)]);
                    for (int64_t r = 0; r < rows; ++r) {
                        const int64_t t = r / hh.n_head;
                        const int h = int(r % hh.n_head), hk = h / (hh.n_head / hh.n_head_kv);
                        const int32_t end = pos[size_t(t)] + 1, begin = window > 0 ? std::max(0, end - window) : 0;
                        std::vector<Key>& ks = keys[size_t(r)];
                        double m = -INFINITY;
                        for (int32_t j = begin; j < end; ++j) {
                            double s = 0, sa = 0, ksum = 0, q8 = 0;
                            for (int64_t i = 0; i < hd; ++i) {
                                const double kk = kf[size_t(j * kw + hk * hd + i)],
                                             a = double(q[size_t(r * hd + i)]) * kk;
                                s += a, sa += std::fabs(a), ksum += std::fabs(kk);
                            }
                            // q * scale rounded to 8 bits per block of 32: half a step of the block's
                            // scale max |q scale| / 127 (and a little for the float x / d) per element.
                            for (int64_t b0 = 0; hd % 32 == 0 && b0 < hd; b0 += 32) {
                                double qm = 0, kb = 0;
                                for (int64_t i = b0; i < b0 + 32; ++i) {
                                    qm = std::max(qm, std::fabs(double(q[size_t(r * hd + i)]) * scale));
                                    kb += std::fabs(double(kf[size_t(j * kw + hk * hd + i)]));
                                }
                                q8 += 0.501 * qm / 127.0 * kb;
                            }
                            ks.push_back({s * scale, sa * scale, ksum, 0, q8});
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
                        str("attention ", type_name(kv), "/", type_name(vt), " head_dim ", hd, " heads ", hh.n_head, "/", hh.n_head_kv,
                            " window ", window, " n_ctx ", n_ctx, " n_tokens ", nt);
                    for (const Target& t : targets()) {
                        if (t.moe_only || (t.cuda() && hd % 32 != 0)) continue;
                        OnBackend ob(t);
                        Tensor Q = ob.f32({qw, nt}, q), P = ob.i32({nt}, pos);
                        Tensor KC = ob.alloc(kv, {kw, n_ctx}, kb.data()), VC = ob.alloc(vt, {kw, n_ctx}, vb.data());
                        Tensor out = ob.alloc(GgmlType::kF32, {qw, nt});
                        AttentionParams ap;
                        ap.n_head = hh.n_head, ap.n_head_kv = hh.n_head_kv, ap.head_dim = int(hd), ap.scale = scale;
                        ap.sliding_window = window;
                        ob.be().attention(Q, KC, VC, P, ap, out);
                        const std::vector<float> y = ob.read(out);
                        Checker c(str(t.name, " ", what));
                        // CUDA's kernels for one type (tensor cores, 8-bit q); a pair of types takes the
                        // per-query kernel, in f32.
                        const bool mma = t.cuda() && kv == vt;
                        for (int64_t r = 0; r < rows && c.misses() < 8; ++r) {
                            const std::vector<Key>& ks = keys[size_t(r)];
                            const int64_t n = int64_t(ks.size());
                            const int64_t rescales =
                                !t.cuda() ? (t.table->isa == cpu::Isa::kAvx512 || t.table->isa == cpu::Isa::kAmx
                                                 ? (n + 15) / 16
                                                 : 0)
                                          : n + 32;
                            std::vector<double> e(ks.size());
                            for (size_t j = 0; j < ks.size(); ++j) {
                                e[j] = gamma(hd + 2) * ks[j].qk + exp_err(t, ks[j].arg);
                                if (mma) e[j] += 0x1p-21 * ks[j].qk + kF16Sub * ks[j].ksum;
                                if (mma && rounds16) e[j] += kU16 * ks[j].qk + kF16Sub * qabs[size_t(r)];
                                if (mma && kv == GgmlType::kQ8_0) e[j] += ks[j].q8 + 4 * kU * ks[j].qk;
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
                                if (mma && rounds16) b += kU16 * md + kF16Sub;
                                c.near(y[at], o[at], b, "token ", r / hh.n_head, " head ", r % hh.n_head, " dim ", d);
                            }
                        }
                    }
                }
            }
        }
    }
}

}  // namespace
}  // namespace cera::harness
