// CPU kernels: ISA choice, the matmul driver and the scalar references.
//
// matmul: activations are quantized once per call to the format the weight type's integer dot
// product needs (kernel_table.h), then rows are split across the pool's threads; each thread walks
// its rows once per block of tokens whose activations fit in L2, so every weight row is read from
// memory once per token block (once per call for decode). Types without a kernel for the active ISA
// are dequantized 16 rows at a time into a per-thread f32 scratch and go through the ISA's f32
// kernel. Weights registered with register_weight (the CPU backend does it at upload) whose type has
// a packed kernel in the active table (every type with a layout in repack.h, on AVX-512 and AVX2)
// use the packed copy instead, split over threads by 16-row groups.
#include "backends/cpu/kernels.h"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/kernel_table.h"
#include "backends/cpu/repack.h"
#include "core/check.h"
#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/quant/quant.h"

namespace cera::cpu {

bool isa_supported(Isa isa) {
    const CpuFeatures& f = cpu_features();
    switch (isa) {
        case Isa::kRef:
            return true;
        case Isa::kAvx2:
            return f.has_avx2_set();
        case Isa::kAvx512:
            return f.has_avx512_set() && f.avx512vnni;
        case Isa::kAmx:
            return f.has_avx512_set() && f.avx512vnni && f.avx512bf16 && f.amx_bf16;
    }
    return false;
}

Isa best_isa() {
    for (Isa isa : {Isa::kAmx, Isa::kAvx512, Isa::kAvx2})
        if (isa_supported(isa)) return isa;
    return Isa::kRef;
}

namespace {

Isa isa_from_env() {
    const char* env = std::getenv("CERA_CPU_ISA");
    const Isa best = best_isa();
    if (env == nullptr || *env == '\0') return best;
    const std::string_view v(env);
    Isa want;
    if (v == "ref")
        want = Isa::kRef;
    else if (v == "avx2")
        want = Isa::kAvx2;
    else if (v == "avx512")
        want = Isa::kAvx512;
    else if (v == "amx")
        want = Isa::kAmx;
    else {
        std::fprintf(stderr, "cera: warning: CERA_CPU_ISA=%s is not one of ref, avx2, avx512, amx; using %s\n", env,
                     isa_name(best));
        return best;
    }
    if (!isa_supported(want)) {
        std::fprintf(stderr, "cera: warning: CERA_CPU_ISA=%s is not supported by this CPU; using %s\n", env,
                     isa_name(best));
        return best;
    }
    return want;
}

const KernelTable& table_for(Isa isa) {
    switch (isa) {
        case Isa::kAmx:
            return kernel_table_amx();
        case Isa::kAvx512:
            return kernel_table_avx512();
        case Isa::kAvx2:
            return kernel_table_avx2();
        case Isa::kRef:
            break;
    }
    return kernel_table_ref();
}

std::atomic<const KernelTable*> g_table{nullptr};

const KernelTable& table() {
    const KernelTable* t = g_table.load(std::memory_order_acquire);
    if (t == nullptr) {
        static const Isa chosen = isa_from_env();  // env read (and warning printed) once
        t = &table_for(chosen);
        g_table.store(t, std::memory_order_release);
    }
    return *t;
}

// ---- scalar references ----

KernelTable make_ref_table() {
    KernelTable t{};
    t.isa = Isa::kRef;
    t.rms_norm = rms_norm_ref;
    t.silu_mul = silu_mul_ref;
    t.add = add_ref;
    t.axpy_rows_f16 = axpy_rows_f16_ref;
    t.dot_f32 = dot_f32_ref;
    t.softmax = softmax_ref;
    t.gelu_tanh = gelu_tanh_ref;
    t.quantize_act = quantize_act_row;
    t.attention = cpu_attention::block_ref;
    return t;
}

// Grow-only scratch buffers (allocation only the first time a size is seen).
struct Scratch {
    std::vector<uint8_t> act;
};
thread_local Scratch t_scratch;
thread_local std::vector<float> t_dequant;

constexpr int64_t kFallbackRows = 16;
constexpr size_t kActL2Budget = 256 * 1024;         // bytes of activations kept hot while the weights stream
constexpr int64_t kParallelQuantElems = 16 * 1024;  // activations worth quantizing on several threads

struct MatmulArgs {
    const KernelTable* table;
    GgmlType type;
    MatmulKernel kernel;
    const uint8_t* w;
    size_t w_stride;
    const uint8_t* act;
    size_t a_stride;
    int64_t k;
    float* y;
    int64_t ldy;
    int64_t token_block;
    PackedFn packed_fn;
    PackedView packed;
    int64_t rows;
};

// Row groups [g0, g1) of a packed weight, tokens [t0, t1).
void run_packed(const MatmulArgs& a, int64_t g0, int64_t g1, int64_t t0, int64_t t1) {
    for (int64_t tb = t0; tb < t1; tb += a.token_block) {
        const int64_t te = tb + a.token_block < t1 ? tb + a.token_block : t1;
        a.packed_fn(a.packed.data, a.packed.group_stride, g0, g1, a.rows, a.act, a.a_stride, tb, te, a.k, a.y, a.ldy);
    }
}

// Rows [r0, r1) and tokens [t0, t1) of y.
void run_tile(const MatmulArgs& a, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
    if (a.kernel.fn != nullptr) {
        for (int64_t tb = t0; tb < t1; tb += a.token_block) {
            const int64_t te = tb + a.token_block < t1 ? tb + a.token_block : t1;
            a.kernel.fn(a.w, a.w_stride, r0, r1, a.act, a.a_stride, tb, te, a.k, a.y, a.ldy);
        }
        return;
    }
    // Fallback: dequantize a few rows to f32 once, then the f32 kernel over every token block.
    const MatmulKernel& f32 = a.table->matmul[int(GgmlType::kF32)];
    std::vector<float>& buf = t_dequant;
    if (buf.size() < size_t(kFallbackRows * a.k)) buf.resize(size_t(kFallbackRows * a.k));
    for (int64_t r = r0; r < r1; r += kFallbackRows) {
        const int64_t nr = r + kFallbackRows < r1 ? kFallbackRows : r1 - r;
        for (int64_t i = 0; i < nr; ++i)
            dequantize_row_ref(a.type, a.w + size_t(r + i) * a.w_stride, buf.data() + i * a.k, a.k);
        for (int64_t tb = t0; tb < t1; tb += a.token_block) {
            const int64_t te = tb + a.token_block < t1 ? tb + a.token_block : t1;
            f32.fn(reinterpret_cast<const uint8_t*>(buf.data()), size_t(a.k) * 4, 0, nr, a.act, a.a_stride, tb, te, a.k,
                   a.y + r, a.ldy);
        }
    }
}

}  // namespace

const KernelTable& active_table() { return table(); }

const char* isa_name(Isa isa) {
    switch (isa) {
        case Isa::kRef:
            return "ref";
        case Isa::kAvx2:
            return "avx2";
        case Isa::kAvx512:
            return "avx512";
        case Isa::kAmx:
            return "amx";
    }
    return "?";
}

Isa active_isa() { return table().isa; }

void force_isa(Isa isa) {
    CERA_CHECK(isa_supported(isa), "force_isa(%s): not supported by this CPU", isa_name(isa));
    g_table.store(&table_for(isa), std::memory_order_release);
}

const KernelTable& kernel_table(Isa isa) {
    CERA_CHECK(isa_supported(isa), "kernel_table(%s): not supported by this CPU", isa_name(isa));
    return table_for(isa);
}

const KernelTable& kernel_table_ref() {
    static const KernelTable t = make_ref_table();
    return t;
}

size_t act_row_bytes(ActFormat f, int64_t k) {
    switch (f) {
        case ActFormat::kF32:
            return size_t(k) * 4;
        case ActFormat::kAct32:
            return (size_t(k) + size_t(k / 32) * 8 + 63) / 64 * 64;
        case ActFormat::kActQ8K:
            return size_t(k / kQK_K) * sizeof(BlockQ8_K);
        case ActFormat::kBF16:
            return (size_t(k + 1) / 2 * 4 + 63) / 64 * 64;
    }
    return 0;
}

void quantize_act_row(ActFormat f, const float* x, int64_t k, void* out) {
    switch (f) {
        case ActFormat::kF32:
            std::memcpy(out, x, size_t(k) * 4);
            return;
        case ActFormat::kActQ8K:
            quantize_row_ref(GgmlType::kQ8_K, x, out, k);
            return;
        case ActFormat::kBF16: {
            auto* h = static_cast<uint16_t*>(out);
            for (int64_t i = 0; i < k; ++i) h[i] = bf16_act(x[i]);
            if (k % 2 != 0) h[k] = 0;
            return;
        }
        case ActFormat::kAct32: {
            const int64_t nb = k / 32;
            auto* qs = static_cast<int8_t*>(out);
            auto* d = reinterpret_cast<float*>(qs + k);
            auto* sum = reinterpret_cast<int32_t*>(d + nb);
            for (int64_t b = 0; b < nb; ++b) {
                const float* xb = x + 32 * b;
                float amax = 0.0f;
                for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(xb[i]));
                const float db = amax / 127.0f;
                const float id = db != 0.0f ? 1.0f / db : 0.0f;
                int32_t s = 0;
                for (int i = 0; i < 32; ++i) {
                    const int q = int(std::nearbyint(xb[i] * id));
                    qs[32 * b + i] = int8_t(q);
                    s += q;
                }
                d[b] = db;
                sum[b] = s;
            }
            return;
        }
    }
}

void matmul_ref(GgmlType type, const void* w, int64_t rows, int64_t k, const float* x, int64_t n_tokens, float* y,
                int64_t ldy) {
    CERA_CHECK(ldy >= rows, "matmul_ref: ldy %lld < rows %lld", (long long)ldy, (long long)rows);
    const size_t rs = row_size(type, k);
    std::vector<float> wr(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
        dequantize_row_ref(type, static_cast<const uint8_t*>(w) + size_t(r) * rs, wr.data(), k);
        for (int64_t t = 0; t < n_tokens; ++t) {
            const float* xt = x + t * k;
            float s = 0.0f;
            for (int64_t i = 0; i < k; ++i) s += wr[size_t(i)] * xt[i];
            y[t * ldy + r] = s;
        }
    }
}

void matmul(GgmlType type, const void* w, int64_t rows, int64_t k, const float* x, int64_t n_tokens, float* y,
            int64_t ldy, ThreadPool* pool) {
    matmul(table(), type, w, rows, k, x, n_tokens, y, ldy, pool);
}

void matmul(const KernelTable& tab, GgmlType type, const void* w, int64_t rows, int64_t k, const float* x,
            int64_t n_tokens, float* y, int64_t ldy, ThreadPool* pool, bool tiles) {
    if (tab.isa == Isa::kRef) {
        matmul_ref(type, w, rows, k, x, n_tokens, y, ldy);
        return;
    }
    const TypeInfo& ti = type_info(type);
    CERA_CHECK(k % ti.block_size == 0, "matmul: k %lld is not a multiple of %s's block %lld", (long long)k, ti.name,
               (long long)ti.block_size);
    CERA_CHECK(ldy >= rows, "matmul: ldy %lld < rows %lld", (long long)ldy, (long long)rows);
    MatmulArgs a{};
    a.table = &tab;
    a.type = type;
    a.kernel = uint32_t(type) < uint32_t(kMaxTypeId) ? tab.matmul[int(type)] : MatmulKernel{};
    if (a.kernel.fn == nullptr) {
        if (!can_dequantize(type))
            throw_error(ErrorCode::kUnsupported, "matmul: no CPU kernel for weight type %s", ti.name);
        a.kernel.act = ActFormat::kF32;
    }
    a.rows = rows;
    if (uint32_t(type) < uint32_t(kMaxTypeId) && tab.packed[int(type)].fn != nullptr) {
        a.packed = find_packed(w, type, rows, k);
        if (a.packed.data != nullptr) {
            a.packed_fn = tab.packed[int(type)].fn;
            a.kernel.act = tab.packed[int(type)].act;
            a.kernel.token_block = tab.packed[int(type)].token_block;
        }
    }
    if (tiles && n_tokens >= kAmxMinTokens && uint32_t(type) < uint32_t(kMaxTypeId)) {
        if (a.packed_fn != nullptr && tab.tiles_packed[int(type)].fn != nullptr) {
            a.packed_fn = tab.tiles_packed[int(type)].fn;
            a.kernel.act = tab.tiles_packed[int(type)].act;
            a.kernel.token_block = tab.tiles_packed[int(type)].token_block;
        } else if (a.packed_fn == nullptr && tab.tiles_plain[int(type)].fn != nullptr) {
            a.kernel = tab.tiles_plain[int(type)];
        }
    }
    a.w = static_cast<const uint8_t*>(w);
    a.w_stride = row_size(type, k);
    a.k = k;
    a.y = y;
    a.ldy = ldy;
    const int n_threads = pool != nullptr ? pool->size() : 1;

    // Activations: f32 rows are used in place; the quantized formats are made once per call.
    if (a.kernel.act == ActFormat::kF32) {
        a.act = reinterpret_cast<const uint8_t*>(x);
        a.a_stride = size_t(k) * 4;
    } else {
        a.a_stride = act_row_bytes(a.kernel.act, k);
        std::vector<uint8_t>& buf = t_scratch.act;
        if (buf.size() < a.a_stride * size_t(n_tokens)) buf.resize(a.a_stride * size_t(n_tokens));
        uint8_t* act = buf.data();
        const ActFormat fmt = a.kernel.act;
        auto quant = [&](int64_t t0, int64_t t1, int) {
            for (int64_t t = t0; t < t1; ++t) tab.quantize_act(fmt, x + t * k, k, act + size_t(t) * a.a_stride);
        };
        // A hand-off to the pool costs microseconds: a few short rows (a speculative verification's) are
        // quantized here.
        if (pool != nullptr && n_threads > 1 && n_tokens > 1 && n_tokens * k >= kParallelQuantElems)
            pool->parallel_for(n_tokens, [&](int64_t t0, int64_t t1, int t) { quant(t0, t1, t); });
        else
            quant(0, n_tokens, 0);
        a.act = act;
    }
    int64_t tb = int64_t(kActL2Budget / a.a_stride);
    a.token_block = tb < 4 ? 4 : tb;
    if (a.kernel.token_block > 0) a.token_block = a.kernel.token_block;

    if (a.packed_fn != nullptr) {
        const int64_t groups = (rows + kPackRows - 1) / kPackRows;
        if (n_threads <= 1) {
            run_packed(a, 0, groups, 0, n_tokens);
        } else if (groups >= 2 * n_threads || n_tokens < 2 * n_threads) {
            pool->parallel_for(groups, [&](int64_t g0, int64_t g1, int) { run_packed(a, g0, g1, 0, n_tokens); });
        } else {
            pool->parallel_for(
                n_tokens, [&](int64_t t0, int64_t t1, int) { run_packed(a, 0, groups, t0, t1); }, 4);
        }
        return;
    }
    if (n_threads <= 1) {
        run_tile(a, 0, rows, 0, n_tokens);
        return;
    }
    if (rows >= 16 * n_threads || n_tokens < 2 * n_threads) {
        pool->parallel_for(
            rows, [&](int64_t r0, int64_t r1, int) { run_tile(a, r0, r1, 0, n_tokens); }, 16);
    } else {
        pool->parallel_for(
            n_tokens, [&](int64_t t0, int64_t t1, int) { run_tile(a, 0, rows, t0, t1); }, 4);
    }
}

// ---- row ops ----

void rms_norm_ref(const float* x, const float* w, float* y, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
    const float scale = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * (w != nullptr ? w[i] : 1.0f);
}

void silu_mul_ref(const float* g, const float* u, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

void axpy_rows_f16_ref(const uint16_t* b, int64_t ld, const float* t, int64_t r, float* y, int64_t n) {
    for (int64_t c = 0; c < n; ++c) {
        float acc = y[c];
        for (int64_t j = 0; j < r; ++j) acc += t[j] * fp16_to_fp32(b[j * ld + c]);
        y[c] = acc;
    }
}

void add_ref(const float* a, const float* b, float scale, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + scale * b[i];
}

float dot_f32_ref(const float* a, const float* b, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += double(a[i]) * b[i];
    return float(s);
}

void softmax_ref(float* x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - mx);
        sum += x[i];
    }
    const float inv = float(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void gelu_tanh_ref(const float* x, float* y, int64_t n) { gelu_host(x, y, n, GeluKind::kTanh); }

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) { table().rms_norm(x, w, y, n, eps); }
void silu_mul(const float* g, const float* u, float* y, int64_t n) { table().silu_mul(g, u, y, n); }
void add(const float* a, const float* b, float scale, float* y, int64_t n) { table().add(a, b, scale, y, n); }
float dot_f32(const float* a, const float* b, int64_t n) { return table().dot_f32(a, b, n); }
void softmax(float* x, int64_t n) { table().softmax(x, n); }

}  // namespace cera::cpu
