// Backend's through-the-host defaults (argmax, short_conv_segments, lora_segments) and the host
// references they run. They live in an archive of their own (cera_backend_host) because every backend,
// the CUDA one included, inherits them.
#include <limits>
#include <vector>

#include "backends/backend.h"
#include "core/check.h"
#include "core/fp16.h"

namespace cera {

const char* device_kind_name(DeviceKind kind) {
    switch (kind) {
        case DeviceKind::kCpu:
            return "cpu";
        case DeviceKind::kCuda:
            return "cuda";
    }
    return "?";
}

void argmax_rows_host(const float* x, int64_t rows, int64_t n, int32_t* out) {
    for (int64_t r = 0; r < rows; ++r, x += n) {
        // Eight independent running maxima (no serial dependency; `v > m ? v : m` never takes a NaN and
        // compiles to vector max instructions), then the first index holding the maximum.
        float m[8];
        for (float& v : m) v = -std::numeric_limits<float>::infinity();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
        float best = -std::numeric_limits<float>::infinity();
        for (; i < n; ++i) best = x[i] > best ? x[i] : best;
        for (float v : m) best = v > best ? v : best;
        int32_t id = 0;  // every value NaN
        for (i = 0; i < n; ++i)
            if (x[i] == best) {
                id = int32_t(i);
                break;
            }
        out[r] = id;
    }
}

void argmax_via_host(Backend& be, const Tensor& x, const Tensor& out) {
    CERA_CHECK(x.type == GgmlType::kF32 && out.type == GgmlType::kI32, "argmax: x must be f32 and out i32");
    CERA_CHECK(out.n_elements() >= x.rows(), "argmax: out holds %lld ids for %lld rows", (long long)out.n_elements(),
               (long long)x.rows());
    be.synchronize();
    std::vector<float> host(size_t(x.n_elements()));
    std::vector<int32_t> ids(size_t(x.rows()));
    be.read(host.data(), x, host.size() * sizeof(float));
    argmax_rows_host(host.data(), x.rows(), x.ne[0], ids.data());
    be.write(out, ids.data(), ids.size() * sizeof(int32_t));
}

void short_conv_segments_via_host(Backend& be, const Tensor& bcx, const Tensor& w, const Tensor& states,
                                  const Tensor& out, const Tensor& segs, const Tensor& snaps, const Tensor& snapshots) {
    const int64_t n_embd = out.ne[0], L = w.ne[0], n_seg = segs.ne[1];
    CERA_CHECK(segs.type == GgmlType::kI32 && segs.ne[0] == kConvSegInts && states.ne[0] == (L - 1) * n_embd &&
                   bcx.ne[0] == 3 * n_embd && (!snapshots || snapshots.ne[0] == states.ne[0]),
               "short_conv_segments: segs i32 [n_seg, 6], states and snapshots rows of (L - 1) * n_embd");
    std::vector<int32_t> sg(static_cast<size_t>(kConvSegInts * n_seg)), sn;
    be.read(sg.data(), segs, sg.size() * sizeof(int32_t));
    if (snaps) {
        sn.resize(static_cast<size_t>(snaps.n_elements()));
        be.read(sn.data(), snaps, sn.size() * sizeof(int32_t));
    }
    for (int64_t i = 0; i < n_seg; ++i) {
        const int32_t* d = sg.data() + kConvSegInts * i;
        const int64_t start = d[0], n = d[1];
        CERA_CHECK(start >= 0 && n >= 1 && start + n <= bcx.rows() && d[2] >= 0 && d[2] < states.rows() && d[3] >= 0 &&
                       (d[4] == 0 || size_t(2 * (d[3] + d[4])) <= sn.size()) && d[5] >= -1 &&
                       (d[5] < 0 || (snapshots && d[5] < snapshots.rows())),
                   "short_conv_segments: segment %lld (start %d, n %d, slot %d, snapshots %d at %d, source %d)",
                   (long long)i, d[0], d[1], d[2], d[4], d[3], d[5]);
        if (d[5] >= 0) be.copy(states.row_slice(d[2], 1), snapshots.row_slice(d[5], 1));
        const Tensor state = states.row_slice(d[2], 1).reshaped(n_embd, L - 1);
        int64_t r0 = 0;  // the rows up to each snapshot, then the rest
        auto run = [&](int64_t r1) {
            if (r1 > r0) be.short_conv(bcx.row_slice(start + r0, r1 - r0), w, state, out.row_slice(start + r0, r1 - r0));
            r0 = r1;
        };
        for (int32_t j = d[3]; j < d[3] + d[4]; ++j) {
            const int64_t end = sn[size_t(2 * j)], row = sn[size_t(2 * j + 1)];
            CERA_CHECK(end >= r0 && end <= n && row >= 0 && row < snapshots.rows(),
                       "short_conv_segments: snapshot %d (end %lld, row %lld)", j, (long long)end, (long long)row);
            run(end);
            be.copy(snapshots.row_slice(row, 1), states.row_slice(d[2], 1));
        }
        run(n);
    }
}

void lora_segments_host(const float* x, int64_t k, std::span<const LoraSegment> segs, float* y, int64_t n_out) {
    std::vector<double> t;
    for (const LoraSegment& sg : segs) {
        const int64_t r = sg.a.ne[1];
        const float* a = sg.a.as<const float>();
        const float* bt = sg.bt.as<const float>();
        t.assign(size_t(r), 0.0);
        for (int64_t row = sg.start; row < sg.start + sg.n; ++row) {
            const float* xr = x + row * k;
            for (int64_t j = 0; j < r; ++j) {
                double acc = 0.0;
                for (int64_t i = 0; i < k; ++i) acc += double(a[j * k + i]) * double(xr[i]);
                t[size_t(j)] = acc;
            }
            float* yr = y + row * n_out;
            for (int64_t o = 0; o < n_out; ++o) {
                double acc = 0.0;
                for (int64_t j = 0; j < r; ++j) acc += double(bt[j * n_out + o]) * t[size_t(j)];
                yr[o] += float(double(sg.scale) * acc);
            }
        }
    }
}

void lora_segments_via_host(Backend& be, const Tensor& x, std::span<const LoraSegment> segs, const Tensor& y) {
    const int64_t k = x.ne[0], n_out = y.ne[0];
    for (const LoraSegment& sg : segs)
        CERA_CHECK((sg.a.type == GgmlType::kF32 || sg.a.type == GgmlType::kF16) &&
                       (sg.bt.type == GgmlType::kF32 || sg.bt.type == GgmlType::kF16) &&
                       sg.a.ne[0] == k && sg.bt.ne[1] == sg.a.ne[1] && sg.bt.ne[0] == n_out && sg.start >= 0 &&
                       sg.n >= 0 && sg.start + sg.n <= x.rows() && x.rows() == y.rows(),
                   "lora_segments: segment rows %lld+%lld, a {%lld, %lld}, bt {%lld, %lld}, x ne0 %lld, y ne0 %lld",
                   (long long)sg.start, (long long)sg.n, (long long)sg.a.ne[0], (long long)sg.a.ne[1],
                   (long long)sg.bt.ne[0], (long long)sg.bt.ne[1], (long long)k, (long long)n_out);
    if (segs.empty()) return;
    be.synchronize();
    std::vector<float> xh(size_t(x.n_elements())), yh(size_t(y.n_elements()));
    be.read(xh.data(), x, xh.size() * sizeof(float));
    be.read(yh.data(), y, yh.size() * sizeof(float));
    // Each segment's weights on the host, read once per distinct tensor.
    std::vector<std::vector<float>> held;
    std::vector<LoraSegment> host(segs.begin(), segs.end());
    std::vector<uint16_t> half;
    for (LoraSegment& sg : host) {
        for (Tensor* t : {&sg.a, &sg.bt}) {
            held.emplace_back(size_t(t->n_elements()));
            if (t->type == GgmlType::kF16) {
                half.resize(held.back().size());
                be.read(half.data(), *t, half.size() * sizeof(uint16_t));
                for (size_t i = 0; i < half.size(); ++i) held.back()[i] = fp16_to_fp32(half[i]);
            } else {
                be.read(held.back().data(), *t, held.back().size() * sizeof(float));
            }
            t->data = held.back().data();
            t->type = GgmlType::kF32;
        }
    }
    lora_segments_host(xh.data(), k, host, yh.data(), n_out);
    be.write(y, yh.data(), yh.size() * sizeof(float));
}

void argmax_feed_via_host(Backend& be, const Tensor& x, const Tensor& out, const Tensor& ids, const Tensor& pos) {
    CERA_CHECK(x.rows() == 1 && ids.type == GgmlType::kI32 && pos.type == GgmlType::kI32 && ids.n_elements() >= 1 &&
                   pos.n_elements() >= 1,
               "argmax_feed: one row of logits, i32 ids and positions");
    be.argmax(x, out);
    int32_t id = 0, last = 0;
    be.read(&id, out, sizeof id);
    be.read(&last, pos, sizeof last, size_t(pos.n_elements() - 1) * sizeof(int32_t));
    ++last;
    be.write(ids, &id, sizeof id);
    be.write(pos, &last, sizeof last);
}

}  // namespace cera
