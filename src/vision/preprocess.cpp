// See preprocess.h. The rounding follows Python's (round half to even), as the processor's does.
#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "core/check.h"
#include "core/threadpool.h"

namespace cera::vision {
namespace {

// The preprocessing pool: up to 8 threads, made at the first image that needs them, one pass at a time
// (its mutex).
ThreadPool& preprocess_pool() {
    static ThreadPool pool(std::clamp(int(std::thread::hardware_concurrency()), 1, 8));
    return pool;
}
std::mutex g_pool_mu;

// fn(begin, end) over [0, n) in contiguous parts of at least `grain` items on the preprocessing pool,
// the caller among its threads; fn does not call it again. Each part's results depend on its items
// alone; a part's exception reaches the caller after every part has ended.
template <typename Fn>
void parallel_parts(int n, int grain, Fn fn) {
    grain = std::max(grain, 1);
    if (n < 2 * grain) return fn(0, n);
    std::lock_guard<std::mutex> lock(g_pool_mu);
    ThreadPool& pool = preprocess_pool();
    std::vector<std::exception_ptr> errors(static_cast<size_t>(pool.size()));
    pool.parallel_for(
        n,
        [&](int64_t b, int64_t e, int t) {
            try {
                fn(int(b), int(e));
            } catch (...) {
                errors[size_t(t)] = std::current_exception();
            }
        },
        grain);
    for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
}

int round_by_factor(double v, int f) { return int(std::nearbyint(v / f)) * f; }

// The source span and normalised triangle-filter weights of each output index (PyTorch's
// antialiased bilinear: the filter widens by the scale when shrinking).
struct AaTaps {
    std::vector<int> start, size;
    std::vector<double> w;  // [out, max_size]
    int max_size = 0;
};

AaTaps aa_taps(int in, int out) {
    AaTaps t;
    const double scale = double(in) / out;
    const double support = scale >= 1.0 ? scale : 1.0;
    const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    t.max_size = int(std::ceil(support)) * 2 + 1;
    t.start.resize(size_t(out));
    t.size.resize(size_t(out));
    t.w.assign(size_t(out) * size_t(t.max_size), 0.0);
    for (int i = 0; i < out; ++i) {
        const double center = scale * (i + 0.5);
        const int xmin = std::max(int(int64_t(center - support + 0.5)), 0);
        const int xsize = std::min(int(int64_t(center + support + 0.5)), in) - xmin;
        double total = 0.0;
        double* w = &t.w[size_t(i) * size_t(t.max_size)];
        for (int j = 0; j < xsize && j < t.max_size; ++j) {
            const double x = (j + xmin - center + 0.5) * invscale;
            const double a = std::abs(x);
            w[j] = a < 1.0 ? 1.0 - a : 0.0;
            total += w[j];
        }
        if (total != 0.0)
            for (int j = 0; j < xsize && j < t.max_size; ++j) w[j] /= total;
        t.start[size_t(i)] = xmin;
        t.size[size_t(i)] = std::min(xsize, t.max_size);
    }
    return t;
}

// The weights as 16-bit fixed point with as many fraction bits as the largest one allows.
struct FixedTaps {
    std::vector<int16_t> w;
    int precision = 0;
};

FixedTaps to_fixed(const AaTaps& t) {
    double w_max = 0.0;
    for (double v : t.w) w_max = std::max(w_max, v);
    FixedTaps f;
    int p = 0;
    for (; p < 15; ++p) {
        const int next = int(0.5 + w_max * double(1 << (p + 1)));
        if (next >= (1 << 15)) break;
    }
    f.precision = p;
    f.w.resize(t.w.size());
    for (size_t i = 0; i < t.w.size(); ++i) {
        const double v = t.w[i] * double(1 << p);
        f.w[i] = int16_t(v < 0 ? int(-0.5 + v) : int(0.5 + v));
    }
    return f;
}

uint8_t clamp_u8(int32_t v) { return uint8_t(std::clamp(v, 0, 255)); }

// One pass along x (horizontal) or y: src [h, w, 3] -> dst. Integer sums, so the order of the terms is
// free: a horizontal pass walks each row's taps in place, a vertical one adds whole source rows into a
// row of sums (contiguous, vectorised).
RgbImage pass(const RgbImage& src, int out, bool horizontal) {
    const int in = horizontal ? src.width : src.height;
    const AaTaps taps = aa_taps(in, out);
    const FixedTaps fx = to_fixed(taps);
    RgbImage dst;
    dst.width = horizontal ? out : src.width;
    dst.height = horizontal ? src.height : out;
    dst.rgb.resize(size_t(dst.width) * size_t(dst.height) * 3);
    const int32_t half = fx.precision > 0 ? 1 << (fx.precision - 1) : 0;
    const size_t ms = size_t(taps.max_size);
    // Rows in parts on several threads: a tile-sized image's pass is milliseconds of single-core work.
    const int grain = std::max(1, (1 << 20) / std::max(1, dst.width * int(ms)));
    if (horizontal) {
        parallel_parts(dst.height, grain, [&](int y0, int y1) {
            for (int y = y0; y < y1; ++y) {
                const uint8_t* row = &src.rgb[size_t(y) * size_t(src.width) * 3];
                uint8_t* o = &dst.rgb[size_t(y) * size_t(dst.width) * 3];
                for (int x = 0; x < dst.width; ++x) {
                    const int16_t* w = &fx.w[size_t(x) * ms];
                    const uint8_t* p = row + size_t(taps.start[size_t(x)]) * 3;
                    int32_t a0 = half, a1 = half, a2 = half;
                    for (int j = 0; j < taps.size[size_t(x)]; ++j, p += 3) {
                        a0 += int32_t(w[j]) * p[0];
                        a1 += int32_t(w[j]) * p[1];
                        a2 += int32_t(w[j]) * p[2];
                    }
                    o[3 * x] = clamp_u8(a0 >> fx.precision);
                    o[3 * x + 1] = clamp_u8(a1 >> fx.precision);
                    o[3 * x + 2] = clamp_u8(a2 >> fx.precision);
                }
            }
        });
        return dst;
    }
    const size_t n = size_t(src.width) * 3;
    parallel_parts(dst.height, grain, [&](int y0, int y1) {
        std::vector<int32_t> acc(n);
        for (int y = y0; y < y1; ++y) {
            std::fill(acc.begin(), acc.end(), half);
            const int16_t* w = &fx.w[size_t(y) * ms];
            for (int j = 0; j < taps.size[size_t(y)]; ++j) {
                const uint8_t* r = &src.rgb[size_t(taps.start[size_t(y)] + j) * n];
                const int32_t wj = w[j];
                for (size_t i = 0; i < n; ++i) acc[i] += wj * r[i];
            }
            uint8_t* o = &dst.rgb[size_t(y) * n];
            for (size_t i = 0; i < n; ++i) o[i] = clamp_u8(acc[i] >> fx.precision);
        }
    });
    return dst;
}

PatchGrid patchify(const RgbImage& img, const ProcessorConfig& cfg) {
    const int p = cfg.patch_size;
    CERA_CHECK(img.width % p == 0 && img.height % p == 0, "patchify: %dx%d is not a multiple of %d", img.width,
               img.height, p);
    PatchGrid g;
    g.grid_h = img.height / p;
    g.grid_w = img.width / p;
    const size_t dim = size_t(p) * size_t(p) * 3;
    g.patches.resize(size_t(g.grid_h) * size_t(g.grid_w) * dim);
    float scale[3], shift[3];
    for (int c = 0; c < 3; ++c) {
        scale[c] = 1.0f / (255.0f * cfg.std[size_t(c)]);
        shift[c] = cfg.mean[size_t(c)] / cfg.std[size_t(c)];
    }
    for (int gy = 0; gy < g.grid_h; ++gy)
        for (int gx = 0; gx < g.grid_w; ++gx) {
            float* o = &g.patches[(size_t(gy) * size_t(g.grid_w) + size_t(gx)) * dim];
            for (int y = 0; y < p; ++y)
                for (int x = 0; x < p; ++x)
                    for (int c = 0; c < 3; ++c) {
                        const uint8_t v =
                            img.rgb[(size_t(gy * p + y) * size_t(img.width) + size_t(gx * p + x)) * 3 + size_t(c)];
                        *o++ = float(v) * scale[c] - shift[c];
                    }
        }
    return g;
}

RgbImage crop(const RgbImage& img, int x0, int y0, int w, int h) {
    RgbImage out;
    out.width = w;
    out.height = h;
    out.rgb.resize(size_t(w) * size_t(h) * 3);
    for (int y = 0; y < h; ++y)
        std::copy_n(&img.rgb[(size_t(y0 + y) * size_t(img.width) + size_t(x0)) * 3], size_t(w) * 3,
                    &out.rgb[size_t(y) * size_t(w) * 3]);
    return out;
}

// The tile grid {cols, rows} whose aspect ratio is closest to the image's (ties: the larger grid when
// the image covers more than half of it), among min_tiles..max_tiles tiles, smallest grids first.
std::pair<int, int> tile_grid(int h, int w, const ProcessorConfig& cfg) {
    std::vector<std::pair<int, int>> ratios;
    std::set<std::pair<int, int>> seen;
    for (int n = cfg.min_tiles; n <= cfg.max_tiles; ++n)
        for (int a = 1; a <= n; ++a)
            for (int b = 1; b <= n; ++b)
                if (a * b >= cfg.min_tiles && a * b <= cfg.max_tiles && seen.insert({a, b}).second)
                    ratios.push_back({a, b});
    std::stable_sort(ratios.begin(), ratios.end(),
                     [](const auto& x, const auto& y) { return x.first * x.second < y.first * y.second; });
    const double aspect = double(w) / h;
    double best_diff = INFINITY;
    std::pair<int, int> best{1, 1};
    const double area = double(w) * h;
    for (const auto& r : ratios) {
        const double diff = std::abs(aspect - double(r.first) / r.second);
        if (diff < best_diff) {
            best_diff = diff;
            best = r;
        } else if (diff == best_diff) {
            const double target = double(cfg.tile_size) * cfg.tile_size * r.first * r.second;
            if (area > 0.5 * target) best = r;
        }
    }
    return best;
}

}  // namespace

std::array<int, 2> smart_resize(int h, int w, const ProcessorConfig& cfg) {
    const int f = cfg.patch_size * cfg.downsample;
    const double min_px =
        double(cfg.min_image_tokens) * cfg.patch_size * cfg.patch_size * cfg.downsample * cfg.downsample;
    const double max_px =
        double(cfg.max_image_tokens) * cfg.patch_size * cfg.patch_size * cfg.downsample * cfg.downsample;
    int hb = std::max(f, round_by_factor(h, f));
    int wb = std::max(f, round_by_factor(w, f));
    if (double(hb) * wb > max_px) {
        const double beta = std::sqrt(double(h) * w / max_px);
        hb = std::max(f, int(std::floor(h / beta / f)) * f);
        wb = std::max(f, int(std::floor(w / beta / f)) * f);
    } else if (double(hb) * wb < min_px) {
        const double beta = std::sqrt(min_px / (double(h) * w));
        hb = int(std::ceil(h * beta / f)) * f;
        wb = int(std::ceil(w * beta / f)) * f;
    }
    return {hb, wb};
}

RgbImage resize_bilinear_aa(const RgbImage& img, int out_w, int out_h) {
    CERA_CHECK(out_w > 0 && out_h > 0);
    RgbImage cur = img;
    if (out_w != cur.width) cur = pass(cur, out_w, /*horizontal=*/true);
    if (out_h != cur.height) cur = pass(cur, out_h, /*horizontal=*/false);
    return cur;
}

void resize_bilinear_aa_f32(const float* src, int in_h, int in_w, int ch, float* dst, int out_h, int out_w) {
    const AaTaps tx = aa_taps(in_w, out_w), ty = aa_taps(in_h, out_h);
    const size_t n = size_t(ch);
    std::vector<double> mid(size_t(in_h) * size_t(out_w) * n, 0.0);
    // Each element sums its taps in their order, starting from 0, whatever the loop order or the
    // split into parts: the result is the same on any number of threads. The channels are the inner
    // loop of both passes (contiguous, vectorised); a grid's table is otherwise milliseconds of work.
    const int grain = std::max(1, (1 << 20) / std::max(1, out_w * ch * std::max(tx.max_size, ty.max_size)));
    parallel_parts(in_h, grain, [&](int y0, int y1) {
        for (int y = y0; y < y1; ++y)
            for (int x = 0; x < out_w; ++x) {
                double* m = &mid[(size_t(y) * size_t(out_w) + size_t(x)) * n];
                for (int j = 0; j < tx.size[size_t(x)]; ++j) {
                    const double w = tx.w[size_t(x) * size_t(tx.max_size) + size_t(j)];
                    const float* s = src + (size_t(y) * size_t(in_w) + size_t(tx.start[size_t(x)] + j)) * n;
                    for (size_t c = 0; c < n; ++c) m[c] += w * s[c];
                }
            }
    });
    parallel_parts(out_h, grain, [&](int y0, int y1) {
        std::vector<double> acc(n);
        for (int y = y0; y < y1; ++y)
            for (int x = 0; x < out_w; ++x) {
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int j = 0; j < ty.size[size_t(y)]; ++j) {
                    const double w = ty.w[size_t(y) * size_t(ty.max_size) + size_t(j)];
                    const double* m = &mid[(size_t(ty.start[size_t(y)] + j) * size_t(out_w) + size_t(x)) * n];
                    for (size_t c = 0; c < n; ++c) acc[c] += w * m[c];
                }
                float* d = dst + (size_t(y) * size_t(out_w) + size_t(x)) * n;
                for (size_t c = 0; c < n; ++c) d[c] = float(acc[c]);
            }
    });
}

int piece_tokens(const PatchGrid& g, int f) { return ((g.grid_h + f - 1) / f) * ((g.grid_w + f - 1) / f); }

int image_tokens(const ProcessedImage& img, int f) {
    int n = 0;
    for (const PatchGrid& g : img.pieces) n += piece_tokens(g, f);
    return n;
}

ProcessedImage preprocess(const RgbImage& img, const ProcessorConfig& cfg) {
    CERA_CHECK(img.width > 0 && img.height > 0 && img.rgb.size() == size_t(img.width) * size_t(img.height) * 3);
    const int h = img.height, w = img.width;
    const int f = cfg.patch_size * cfg.downsample;
    const bool splitting = cfg.do_image_splitting && !(cfg.min_tiles == 1 && cfg.max_tiles == 1);
    const double hb = std::max(cfg.patch_size, round_by_factor(h, f));
    const double wb = std::max(cfg.patch_size, round_by_factor(w, f));
    const bool large = hb * wb > double(cfg.max_image_tokens) * cfg.patch_size * cfg.patch_size * cfg.downsample *
                                     cfg.downsample * cfg.max_pixels_tolerance;
    const auto [new_h, new_w] = smart_resize(h, w, cfg);
    // An extreme aspect ratio makes the smart resize overshoot the encoder's patch budget (the processor
    // would then cut patches off when it pads): refused instead.
    const int64_t max_patches =
        std::max<int64_t>(int64_t(cfg.max_image_tokens) * cfg.downsample * cfg.downsample,
                          int64_t(cfg.tile_size / cfg.patch_size) * (cfg.tile_size / cfg.patch_size));
    const int64_t patches = int64_t(new_h / cfg.patch_size) * (new_w / cfg.patch_size);
    if (patches > max_patches)
        throw_error(ErrorCode::kInvalidArgument,
                    "image: %d x %d pixels has too extreme an aspect ratio (%lld patches after resizing, at most %lld)",
                    w, h, (long long)patches, (long long)max_patches);
    ProcessedImage out;
    if (large && splitting) {
        const auto [gc, gr] = tile_grid(h, w, cfg);
        const RgbImage big = resize_bilinear_aa(img, cfg.tile_size * gc, cfg.tile_size * gr);
        out.rows = gr;
        out.cols = gc;
        out.pieces.resize(size_t(gr * gc));
        const int cols = gc, t = cfg.tile_size;  // clang before 16 captures no structured binding
        parallel_parts(gr * gc, 1, [&](int i0, int i1) {
            for (int i = i0; i < i1; ++i)
                out.pieces[size_t(i)] = patchify(crop(big, (i % cols) * t, (i / cols) * t, t, t), cfg);
        });
        if (cfg.use_thumbnail && gr * gc != 1) {
            out.thumbnail = true;
            out.pieces.push_back(patchify(resize_bilinear_aa(img, new_w, new_h), cfg));
        }
    } else {
        out.pieces.push_back(patchify(resize_bilinear_aa(img, new_w, new_h), cfg));
    }
    return out;
}

std::string image_prompt_text(const ProcessedImage& img, int f, const std::string& image_token) {
    auto tokens = [&](const PatchGrid& g) {
        std::string s;
        for (int i = 0, n = piece_tokens(g, f); i < n; ++i) s += image_token;
        return s;
    };
    std::string s = "<|image_start|>";
    if (img.rows > 1 || img.cols > 1) {
        for (int r = 0; r < img.rows; ++r)
            for (int c = 0; c < img.cols; ++c) {
                s += "<|img_row_" + std::to_string(r + 1) + "_col_" + std::to_string(c + 1) + "|>";
                s += tokens(img.pieces[size_t(r * img.cols + c)]);
            }
        if (img.thumbnail) s += "<|img_thumbnail|>" + tokens(img.pieces.back());
    } else {
        s += tokens(img.pieces.front());
    }
    return s + "<|image_end|>";
}

}  // namespace cera::vision
