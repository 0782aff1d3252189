// The op harness, second part (short_conv, swiglu, add, scale, rotate_heads, argmax, top_logits, moe_route, moe_ffn;
// op_harness_test.cpp has the first): every backend op on every target (op_harness.h: the CPU backend on each kernel
// table this CPU runs; in CUDA builds with a GPU the CUDA backend and its kernel variants) over the
// one list of shapes, against scalar references computed here in double. The bounds are derived
// from the arithmetic each target does (op_harness.h, and beside each check below).
// Sequences the CUDA backend fuses, recorded steps and whole models are checked elsewhere
// (cuda_decode_test.cpp, cuda_model_test.cpp, golden/).
#include "kernels/op_harness.h"
#include "core/rotation.h"

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

// short_conv_segments: the chunks of several sequences in one call, each on its own state row, in
// scrambled slots; snapshots inside chunks (at a chunk's first token, mid-chunk, at its end) and none;
// two segments start from a snapshot row (a rewind) instead of their slot's state.
// Outputs within short_conv's bound, states and snapshots bit for bit.
TEST(OpHarness, ShortConvSegments) {
    std::mt19937 rng(18);
    struct Seg {
        int64_t n, slot;
        std::vector<int64_t> ends;  // snapshot ends
        int32_t source = -1;        // the snapshot row it starts from, -1: its slot
    };
    const std::vector<Seg> segs = {{40, 3, {16, 32}}, {1, 0, {}},    {1, 5, {1}},
                                   {7, 1, {2, 7}, 6}, {2, 4, {}, 7}, {20, 2, {20}}};
    const int64_t n_slots = 6, n_rows = 8;  // rows 6 and 7: no segment writes them
    for (int64_t n_embd : {int64_t(64), int64_t(37)}) {
        for (int64_t L : {int64_t(3), int64_t(4)}) {
            const int64_t ns = L - 1, sw = ns * n_embd;
            const std::vector<float> w = randn(size_t(n_embd * L), rng), st0 = randn(size_t(n_slots * sw), rng);
            const std::vector<float> rows0 = randn(size_t(n_rows * sw), rng);
            int64_t n_tokens = 0;
            for (const Seg& g : segs) n_tokens += g.n;
            const std::vector<float> bcx = randn(size_t(n_tokens * 3 * n_embd), rng);
            // The reference: outputs with bounds, states and snapshot rows.
            std::vector<double> out(size_t(n_tokens * n_embd)), bound(out.size());
            std::vector<float> states = st0, snaps_want = rows0;
            std::vector<int32_t> desc, snaps;
            int64_t row0 = 0, snap_row = 0;
            for (const Seg& g : segs) {
                const std::vector<float>& from = g.source >= 0 ? rows0 : st0;
                const int64_t at = g.source >= 0 ? g.source : g.slot;
                std::vector<float> pad(from.begin() + at * sw, from.begin() + (at + 1) * sw);
                for (int64_t t = 0; t < g.n; ++t)
                    for (int64_t c = 0; c < n_embd; ++c) {
                        const float* r = bcx.data() + (row0 + t) * 3 * n_embd;
                        pad.push_back(r[c] * r[2 * n_embd + c]);
                    }
                for (int64_t t = 0; t < g.n; ++t)
                    for (int64_t c = 0; c < n_embd; ++c) {
                        double acc = 0, mag = 0;
                        for (int64_t j = 0; j < L; ++j) {
                            const double term = double(w[size_t(c * L + j)]) * pad[size_t((t + j) * n_embd + c)];
                            acc += term, mag += std::fabs(term);
                        }
                        const double cg = bcx[size_t((row0 + t) * 3 * n_embd + n_embd + c)];
                        out[size_t((row0 + t) * n_embd + c)] = cg * acc;
                        bound[size_t((row0 + t) * n_embd + c)] = gamma(L + 2) * std::fabs(cg) * mag + 1e-37;
                    }
                desc.insert(desc.end(), {int32_t(row0), int32_t(g.n), int32_t(g.slot), int32_t(snaps.size() / 2),
                                         int32_t(g.ends.size()), g.source});
                for (int64_t e : g.ends) {
                    snaps.push_back(int32_t(e)), snaps.push_back(int32_t(snap_row));
                    std::copy(pad.begin() + e * n_embd, pad.begin() + (e + ns) * n_embd, snaps_want.begin() + snap_row * sw);
                    ++snap_row;
                }
                std::copy(pad.end() - sw, pad.end(), states.begin() + g.slot * sw);
                row0 += g.n;
            }
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                OnBackend ob(t);
                const Tensor W = ob.f32({L, n_embd}, w), S = ob.f32({sw, n_slots}, st0);
                const Tensor BCX = ob.f32({3 * n_embd, n_tokens}, bcx), OUT = ob.alloc(GgmlType::kF32, {n_embd, n_tokens});
                const Tensor D = ob.alloc(GgmlType::kI32, {kConvSegInts, int64_t(segs.size())}, desc.data());
                const Tensor P = ob.alloc(GgmlType::kI32, {2, int64_t(snaps.size() / 2)}, snaps.data());
                const Tensor R = ob.f32({sw, n_rows}, rows0);
                ob.be().short_conv_segments(BCX, W, S, OUT, D, P, R);
                Checker c(str(t.name, " short_conv_segments L ", L, " n_embd ", n_embd));
                const std::vector<float> y = ob.read(OUT), st = ob.read(S), sn = ob.read(R);
                for (size_t i = 0; i < y.size(); ++i) c.near(y[i], out[i], bound[i], "out ", i);
                for (size_t i = 0; i < st.size(); ++i) c.eq(st[i], states[i], "state ", i);
                for (size_t i = 0; i < sn.size(); ++i) c.eq(sn[i], snaps_want[i], "snapshot ", i);
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

// ------------------------------------------------------------------------------------ rotate_heads
// Every head through the rotated caches' rotation and back: the scalar reference is core/rotation.h's
// rotate_head (sign flips, the butterflies stage by stage, the scale), whose float operations every
// target does in the same order, so the results are equal bit for bit. The round trip returns x to
// within the two transforms' rounding: log2(n) + 2 roundings each way, of values below sum |x| / sqrt(n),
// the first transform's errors summed again by the second (sqrt(n) of them, over sqrt(n)).
TEST(OpHarness, RotateHeads) {
    std::mt19937 rng(13);
    for (int64_t hd : {int64_t(2), int64_t(32), int64_t(64), int64_t(128), int64_t(1024)}) {
        for (int64_t rows : kRowCounts) {
            const int64_t n_heads = rows % 3 + 1, width = n_heads * hd;
            if (rows * width > kMaxElems) continue;
            const std::vector<float> x = randn(size_t(rows * width), rng);
            std::vector<float> want = x;
            for (size_t h = 0; h < want.size() / size_t(hd); ++h) rotate_head(want.data() + h * size_t(hd), hd, false);
            for (const Target& t : targets()) {
                if (t.moe_only) continue;
                OnBackend ob(t);
                Tensor X = ob.f32({width, rows}, x);
                ob.be().rotate_heads(X, int(hd), false);
                const std::vector<float> y = ob.read(X);
                Checker c(str(t.name, " rotate_heads head_dim ", hd, " heads ", n_heads, " rows ", rows));
                for (size_t i = 0; i < y.size() && c.misses() < 8; ++i) c.eq(y[i], want[i], "at ", i);
                ob.be().rotate_heads(X, int(hd), true);
                const std::vector<float> back = ob.read(X);
                const double steps = std::log2(double(hd)) + 2;
                for (size_t h = 0; h < back.size() / size_t(hd) && c.misses() < 8; ++h) {
                    double mag = 0;
                    for (int64_t i = 0; i < hd; ++i) mag += std::fabs(x[h * size_t(hd) + size_t(i)]);
                    for (int64_t i = 0; i < hd; ++i) {
                        const size_t at = h * size_t(hd) + size_t(i);
                        c.near(back[at], x[at], 2 * gamma(int64_t(steps)) * mag, "back at ", at);
                    }
                }
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
            std::map<std::tuple<int, bool, bool, bool>, std::pair<std::vector<double>, std::vector<double>>> refs;
            for (const Target& t : targets()) {
                const MatmulArith a = matmul_arith(t, type, nt, /*moe=*/true);
                auto& [want, bound] = refs[{int(a.act), a.w_f16, a.x_bf16, t.cuda()}];
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

namespace cera::harness {
namespace {

// ------------------------------------------------------------------------------ paged attention
// Several sequences in one attention call over pooled caches whose blocks are shuffled (KvPaging):
// each sequence's output must equal, bit for bit, what the same target computes for it alone over a
// contiguous cache holding the same rows (the contiguous op is checked against the reference above).
// CPU targets: the CUDA backend refuses paged caches until its kernels read block tables.
TEST(OpHarness, PagedAttention) {
    std::mt19937 rng(11);
    const int block = 16, n_head = 4, n_head_kv = 2;
    // (tokens in this call, positions before them): a 70-token prefill chunk after 30 cached, three
    // decode tokens side by side, five tokens from 0, twelve after 3, one decode at 0 (on CUDA: the
    // tiled prefill kernels, a decode launch over several sequences, the decode kernels for a few
    // queries of one sequence, the per-query kernel).
    const std::vector<std::pair<int64_t, int64_t>> seqs = {{70, 30}, {1, 100}, {1, 37}, {1, 0}, {5, 0}, {12, 3}, {1, 0}};
    for (const int hd : {64, 32})
    for (GgmlType kv : {GgmlType::kF32, GgmlType::kF16}) {
        const int64_t kw = int64_t(n_head_kv) * hd, qw = int64_t(n_head) * hd;
        for (int window : {0, 24}) {
            int64_t max_blocks = 0, n_tokens = 0;
            for (auto [nt, p0] : seqs) max_blocks = std::max(max_blocks, (p0 + nt + block - 1) / block), n_tokens += nt;
            const int64_t n_blocks = int64_t(seqs.size()) * max_blocks;
            std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng);
            std::vector<int32_t> table(perm.begin(), perm.end()), seq_of, pos;
            for (size_t s = 0; s < seqs.size(); ++s)
                for (int64_t t = 0; t < seqs[s].first; ++t) seq_of.push_back(int32_t(s)), pos.push_back(int32_t(seqs[s].second + t));
            const size_t es = kv == GgmlType::kF16 ? 2 : 4;
            std::vector<uint8_t> kpool(size_t(n_blocks * block * kw) * es), vpool(kpool.size());
            for (auto* p : {&kpool, &vpool})
                for (size_t i = 0; i < p->size(); i += 2) {
                    const float f = std::normal_distribution<float>(0, 1)(rng);
                    if (es == 2) {
                        const uint16_t h = fp32_to_fp16(f);
                        std::memcpy(p->data() + i, &h, 2);
                    } else if (i % 4 == 0) {
                        std::memcpy(p->data() + i, &f, 4);
                    }
                }
            const std::vector<float> q = randn(size_t(n_tokens * qw), rng);
            AttentionParams ap;
            ap.n_head = n_head, ap.n_head_kv = n_head_kv, ap.head_dim = hd, ap.scale = 0.125f, ap.sliding_window = window;
            std::vector<int32_t> runs;
            for (auto [nt, p0] : seqs) runs.push_back(int32_t(nt));
            for (const Target& tg : targets()) {
                SCOPED_TRACE(tg.name + " " + type_name(kv) + " head_dim " + std::to_string(hd) + " window " +
                             std::to_string(window));
                OnBackend ob(tg);
                Backend& be = ob.be();
                const Tensor kp = ob.alloc(kv, {kw, n_blocks * block}, kpool.data());
                const Tensor vp = ob.alloc(kv, {kw, n_blocks * block}, vpool.data());
                const Tensor qt = ob.f32({qw, n_tokens}, q);
                const Tensor pt = ob.alloc(GgmlType::kI32, {n_tokens}, pos.data());
                const Tensor out = ob.alloc(GgmlType::kF32, {qw, n_tokens});
                AttentionParams paged = ap;
                paged.paging.seq = ob.alloc(GgmlType::kI32, {n_tokens}, seq_of.data());
                paged.paging.block_table = ob.alloc(GgmlType::kI32, {max_blocks, int64_t(seqs.size())}, table.data());
                paged.paging.block_size = block;
                paged.paging.runs = runs;
                be.attention(qt, kp, vp, pt, paged, out);
                std::vector<float> got(static_cast<size_t>(n_tokens * qw));
                be.read(got.data(), out, got.size() * 4);
                int64_t t0 = 0;
                for (size_t s = 0; s < seqs.size(); ++s) {
                    const auto [nt, p0] = seqs[s];
                    const int64_t n_ctx = p0 + nt;
                    std::vector<uint8_t> kc(size_t(n_ctx * kw) * es), vc(kc.size());
                    for (int64_t p = 0; p < n_ctx; ++p) {
                        const int64_t row = int64_t(table[s * size_t(max_blocks) + size_t(p / block)]) * block + p % block;
                        std::memcpy(kc.data() + size_t(p * kw) * es, kpool.data() + size_t(row * kw) * es, size_t(kw) * es);
                        std::memcpy(vc.data() + size_t(p * kw) * es, vpool.data() + size_t(row * kw) * es, size_t(kw) * es);
                    }
                    const Tensor kct = ob.alloc(kv, {kw, n_ctx}, kc.data()), vct = ob.alloc(kv, {kw, n_ctx}, vc.data());
                    const Tensor qs = ob.f32({qw, nt}, std::vector<float>(q.begin() + t0 * qw, q.begin() + (t0 + nt) * qw));
                    const Tensor ps = ob.alloc(GgmlType::kI32, {nt}, pos.data() + t0);
                    const Tensor os = ob.alloc(GgmlType::kF32, {qw, nt});
                    be.attention(qs, kct, vct, ps, ap, os);
                    std::vector<float> want(static_cast<size_t>(nt * qw));
                    be.read(want.data(), os, want.size() * 4);
                    // The CPU computes each query alike either way; CUDA may split a paged query's keys
                    // differently (its key range is planned for the table's longest sequence).
                    for (size_t i = 0; i < want.size(); ++i) {
                        if (tg.cuda())
                            ASSERT_NEAR(got[size_t(t0 * qw) + i], want[i], 1e-5f) << "sequence " << s << " element " << i;
                        else
                            ASSERT_EQ(got[size_t(t0 * qw) + i], want[i]) << "sequence " << s << " element " << i;
                    }
                    t0 += nt;
                }
            }
        }
    }
}

}  // namespace
}  // namespace cera::harness
