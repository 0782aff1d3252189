// See encoder.h. Activations live in buffers the encoder keeps (activation()), sized by the largest
// batch of pieces seen: batches differ in size (tiles, thumbnails, single images).
#include "vision/encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/check.h"
#include "core/fp16.h"
#include "gguf/gguf.h"
#include "models/arch.h"
#include "models/loader.h"

namespace cera::vision {
namespace {

// Reads an F32 or F16 tensor of exactly `n` elements into host floats.
std::vector<float> host_f32(const gguf::File& f, const std::string& name, int64_t n) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (!t) throw_error(ErrorCode::kMissing, "mmproj: missing tensor %s", name.c_str());
    if (t->n_elements() != n)
        throw_error(ErrorCode::kInvalidFile, "mmproj: tensor %s has %lld elements, expected %lld", name.c_str(),
                    (long long)t->n_elements(), (long long)n);
    std::vector<float> out(static_cast<size_t>(n));
    if (t->type == GgmlType::kF32) {
        std::memcpy(out.data(), t->data, size_t(n) * sizeof(float));
    } else if (t->type == GgmlType::kF16) {
        for (int64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, t->data + 2 * i, 2);
            out[size_t(i)] = fp16_to_fp32(h);
        }
    } else {
        throw_error(ErrorCode::kUnsupported, "mmproj: tensor %s has type %s, expected F32 or F16", name.c_str(),
                    type_name(t->type));
    }
    return out;
}

int64_t positive(const gguf::File& f, const char* key) {
    const int64_t v = f.get_i64(key);
    if (v <= 0) throw_error(ErrorCode::kInvalidFile, "mmproj: %s = %lld, must be positive", key, (long long)v);
    return v;
}

// The buffers of activation(), by slot.
enum Slot : size_t { kX, kIn, kPos, kH, kQ, kK, kV, kA, kFf, kHid, kOut, kSlots };

}  // namespace

// The weights stay with the backend, which releases them when it goes; the activations go now.
VisionEncoder::~VisionEncoder() {
    if (!be_) return;
    std::lock_guard<FifoMutex> lock(be_->exec_mutex());
    for (Tensor& t : act_) be_->free(t);
}

Tensor VisionEncoder::activation(size_t slot, int64_t ne0, int64_t ne1) const {
    Tensor& t = act_[slot];
    if (t.n_elements() < ne0 * ne1) {
        be_->free(t);
        t = be_->alloc(GgmlType::kF32, {ne0 * ne1});
        ++act_generation_;
    }
    return t.reshaped(ne0, ne1);
}

uint64_t VisionEncoder::layer_key(int layer, const PatchGrid& g, int64_t n_pieces) const {
    const std::array<int64_t, 5> what{int64_t(act_generation_), g.grid_h, g.grid_w, n_pieces, layer};
    auto [it, added] = layer_keys_.emplace(what, layer_keys_.size() + 1);
    CERA_CHECK(it->second < (uint64_t(1) << kStepKeyBits), "encoder: recorded-step keys run out");
    return serial_ << kStepKeyBits | it->second;
}

std::unique_ptr<VisionEncoder> VisionEncoder::load(const std::string& path, Backend& be, int64_t n_embd_text) {
    std::unique_ptr<VisionEncoder> e(new VisionEncoder());
    e->file_ = gguf::File::open(path);
    const gguf::File& f = *e->file_;
    if (f.architecture() != "clip")
        throw_error(ErrorCode::kInvalidFile, "mmproj %s: general.architecture = \"%s\", expected \"clip\"",
                    path.c_str(), f.architecture().c_str());
    const std::string proj = f.get_string("clip.projector_type", "");
    if (proj != "lfm2")
        throw_error(ErrorCode::kUnsupported, "mmproj %s: clip.projector_type = \"%s\", only \"lfm2\" is supported",
                    path.c_str(), proj.c_str());
    if (!f.get_bool("clip.has_vision_encoder", false))
        throw_error(ErrorCode::kInvalidFile, "mmproj %s: clip.has_vision_encoder is not true", path.c_str());
    VisionConfig& c = e->cfg_;
    c.n_embd = positive(f, "clip.vision.embedding_length");
    c.n_layer = positive(f, "clip.vision.block_count");
    c.n_head = positive(f, "clip.vision.attention.head_count");
    c.n_ff = positive(f, "clip.vision.feed_forward_length");
    const int64_t image_size = positive(f, "clip.vision.image_size");
    const int64_t patch = positive(f, "clip.vision.patch_size");
    c.eps = f.get_f32("clip.vision.attention.layer_norm_epsilon");
    if (!(c.eps > 0.0f) || !std::isfinite(c.eps))
        throw_error(ErrorCode::kInvalidFile, "mmproj: clip.vision.attention.layer_norm_epsilon = %g, must be > 0",
                    double(c.eps));
    if (c.n_embd % c.n_head != 0)
        throw_error(ErrorCode::kInvalidFile,
                    "mmproj: clip.vision.embedding_length = %lld is not divisible by "
                    "clip.vision.attention.head_count = %lld",
                    (long long)c.n_embd, (long long)c.n_head);
    c.head_dim = c.n_embd / c.n_head;
    if (patch > 64 || image_size % patch != 0)
        throw_error(ErrorCode::kInvalidFile,
                    "mmproj: clip.vision.patch_size = %lld does not divide image_size = %lld "
                    "(or is over 64)",
                    (long long)patch, (long long)image_size);
    c.n_pos_side = image_size / patch;
    c.proc.patch_size = int(patch);
    const int64_t factor = f.get_i64("clip.vision.projector.scale_factor", 2);
    if (factor < 1 || factor > 8)
        throw_error(ErrorCode::kInvalidFile, "mmproj: clip.vision.projector.scale_factor = %lld, expected 1..8",
                    (long long)factor);
    c.proc.downsample = int(factor);
    // Normalisation: finite means, positive standard deviations, one a channel.
    auto channels = [&](const char* key, std::array<float, 3>& out, bool positive_only) {
        const std::vector<float> v = f.get_f32_array(key);
        if (v.size() != 3) throw_error(ErrorCode::kInvalidFile, "mmproj: %s has %zu values, expected 3", key, v.size());
        for (size_t i = 0; i < 3; ++i) {
            if (!std::isfinite(v[i]) || (positive_only && !(v[i] > 0.0f)))
                throw_error(ErrorCode::kInvalidFile, "mmproj: %s[%zu] = %g is not usable", key, i, double(v[i]));
            out[i] = v[i];
        }
    };
    channels("clip.vision.image_mean", c.proc.mean, false);
    channels("clip.vision.image_std", c.proc.std, true);

    WeightLoader wl(f, be);
    const int64_t n = c.n_embd, pdim = patch * patch * 3;
    // Patch embedding: stored as a conv kernel ne {p, p, 3, n_embd} (x fastest, then y, then channel);
    // the patches come as (y, x, c), so the rows are reordered once here.
    {
        const gguf::TensorInfo* t = f.find_tensor("v.patch_embd.weight");
        if (!t) throw_error(ErrorCode::kMissing, "mmproj: missing tensor v.patch_embd.weight");
        if (t->ne.size() != 4 || t->ne[0] != patch || t->ne[1] != patch || t->ne[2] != 3 || t->ne[3] != n)
            throw_error(ErrorCode::kInvalidFile, "mmproj: v.patch_embd.weight must have ne {%lld, %lld, 3, %lld}",
                        (long long)patch, (long long)patch, (long long)n);
        const std::vector<float> w = host_f32(f, "v.patch_embd.weight", n * pdim);
        e->patch_w_host_.resize(w.size());
        for (int64_t o = 0; o < n; ++o)
            for (int64_t ch = 0; ch < 3; ++ch)
                for (int64_t y = 0; y < patch; ++y)
                    for (int64_t x = 0; x < patch; ++x)
                        e->patch_w_host_[size_t(o * pdim + (y * patch + x) * 3 + ch)] =
                            w[size_t(((o * 3 + ch) * patch + y) * patch + x)];
        const int64_t ne[2] = {pdim, n};
        e->patch_w_ = be.upload_weight(GgmlType::kF32, ne, e->patch_w_host_.data());
    }
    e->patch_b_ = wl.f32("v.patch_embd.bias", {n});
    e->pos_host_ = host_f32(f, "v.position_embd.weight", c.n_pos_side * c.n_pos_side * n);
    e->layers_.resize(size_t(c.n_layer));
    for (int64_t il = 0; il < c.n_layer; ++il) {
        VisionLayer& l = e->layers_[size_t(il)];
        const std::string p = "v.blk." + std::to_string(il) + ".";
        l.ln1_w = wl.f32(p + "ln1.weight", {n});
        l.ln1_b = wl.f32(p + "ln1.bias", {n});
        l.ln2_w = wl.f32(p + "ln2.weight", {n});
        l.ln2_b = wl.f32(p + "ln2.bias", {n});
        l.q_w = wl.matrix(p + "attn_q.weight", {n, n});
        l.k_w = wl.matrix(p + "attn_k.weight", {n, n});
        l.v_w = wl.matrix(p + "attn_v.weight", {n, n});
        l.o_w = wl.matrix(p + "attn_out.weight", {n, n});
        l.q_b = wl.f32(p + "attn_q.bias", {n});
        l.k_b = wl.f32(p + "attn_k.bias", {n});
        l.v_b = wl.f32(p + "attn_v.bias", {n});
        l.o_b = wl.f32(p + "attn_out.bias", {n});
        l.up_w = wl.matrix(p + "ffn_up.weight", {n, c.n_ff});
        l.up_b = wl.f32(p + "ffn_up.bias", {c.n_ff});
        l.down_w = wl.matrix(p + "ffn_down.weight", {c.n_ff, n});
        l.down_b = wl.f32(p + "ffn_down.bias", {n});
    }
    // Optional: a tower cut before its last block (LFM2-VL's) may come without its final norm.
    e->post_w_ = wl.f32_optional("v.post_ln.weight", {n});
    e->post_b_ = wl.f32_optional("v.post_ln.bias", {n});
    const int64_t in = n * factor * factor;
    // Optional: projectors without the layer norm (projector_use_layernorm = false) leave it out.
    e->proj_norm_w_ = wl.f32_optional("mm.input_norm.weight", {in});
    e->proj_norm_b_ = wl.f32_optional("mm.input_norm.bias", {in});
    const gguf::TensorInfo* m1 = f.find_tensor("mm.1.weight");
    const gguf::TensorInfo* m2 = f.find_tensor("mm.2.weight");
    if (!m1 || !m2) throw_error(ErrorCode::kMissing, "mmproj: missing tensor %s", m1 ? "mm.2.weight" : "mm.1.weight");
    if (m1->ne.size() != 2 || m2->ne.size() != 2)
        throw_error(ErrorCode::kInvalidFile, "mmproj: mm.1.weight and mm.2.weight must be matrices");
    c.proj_hidden = m1->ne[1];
    c.n_embd_text = m2->ne[1];
    if (n_embd_text > 0 && c.n_embd_text != n_embd_text)
        throw_error(ErrorCode::kInvalidFile,
                    "mmproj: the projector maps to %lld dimensions, the text model's embeddings have %lld",
                    (long long)c.n_embd_text, (long long)n_embd_text);
    e->proj1_w_ = wl.matrix("mm.1.weight", {in, c.proj_hidden});
    e->proj1_b_ = wl.f32("mm.1.bias", {c.proj_hidden});
    e->proj2_w_ = wl.matrix("mm.2.weight", {c.proj_hidden, c.n_embd_text});
    e->proj2_b_ = wl.f32("mm.2.bias", {c.n_embd_text});
    // An image is encoded alone, so its products may take the backend's fastest kernels whatever they do to
    // batch invariance.
    for (const VisionLayer& l : e->layers_)
        for (const Tensor* w : {&l.q_w, &l.k_w, &l.v_w, &l.o_w, &l.up_w, &l.down_w}) be.allow_batch_variance(*w);
    for (const Tensor* w : {&e->patch_w_, &e->proj1_w_, &e->proj2_w_}) be.allow_batch_variance(*w);
    e->be_ = &be;
    e->serial_ = new_step_serial();
    e->act_.resize(kSlots);
    return e;
}

// The patch order inside the tower: the pixel unshuffle's. Patch (i f + di, j f + dj) of a grid goes to
// row (i ow + j) f² + di f + dj, so that the f² patches of one projector token are consecutive rows and
// the tower's output, seen as [n_tokens, f² n_embd], is the unshuffled input of the projector with no
// copy. The tower is the same function of its rows in any order: every op but attention works a row at
// a time, and attention is bidirectional over all of a piece's patches with no mask; the position
// embedding is added per patch before it.
std::vector<int64_t> VisionEncoder::unshuffle_order(const PatchGrid& g) const {
    const int f = cfg_.proc.downsample;
    if (g.grid_h % f != 0 || g.grid_w % f != 0)
        throw_error(ErrorCode::kInvalidArgument, "encoder: a %d x %d patch grid does not divide by the factor %d",
                    g.grid_h, g.grid_w, f);
    const int64_t oh = g.grid_h / f, ow = g.grid_w / f;
    std::vector<int64_t> src(size_t(g.grid_h) * size_t(g.grid_w));  // src[row] = the natural index
    for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j)
            for (int di = 0; di < f; ++di)
                for (int dj = 0; dj < f; ++dj)
                    src[size_t(((i * ow + j) * f + di) * f + dj)] = (i * f + di) * g.grid_w + j * f + dj;
    return src;
}

void VisionEncoder::give_way(std::unique_lock<FifoMutex>& lock) const {
    if (!be_->exec_mutex().contended()) return;
    be_->synchronize();  // what this encode queued runs before the other holder queues its own
    lock.unlock();
    lock.lock();  // after the waiter's turn (the lock goes in order)
}

Tensor VisionEncoder::run_tower(std::span<const PatchGrid> pieces, std::unique_lock<FifoMutex>& lock) const {
    Backend& be = *be_;
    const VisionConfig& c = cfg_;
    const PatchGrid& g = pieces.front();
    const int64_t np = int64_t(g.grid_h) * g.grid_w, n = c.n_embd, n_pieces = int64_t(pieces.size());
    const int64_t rows = np * n_pieces;
    const int64_t pdim = int64_t(c.proc.patch_size) * c.proc.patch_size * 3;
    for (const PatchGrid& p : pieces)
        CERA_CHECK(p.grid_h == g.grid_h && p.grid_w == g.grid_w && int64_t(p.patches.size()) == np * pdim,
                   "encoder: a batch of %lld-patch pieces", (long long)np);
    const std::vector<int64_t> order = unshuffle_order(g);
    const Tensor x = activation(kX, n, rows);
    {
        // Patches in the tower's order, the pieces one after another (every float written).
        const auto host = std::make_unique_for_overwrite<float[]>(size_t(rows * pdim));
        for (int64_t b = 0; b < n_pieces; ++b)
            for (int64_t r = 0; r < np; ++r)
                std::memcpy(host.get() + (b * np + r) * pdim,
                            pieces[size_t(b)].patches.data() + order[size_t(r)] * pdim, size_t(pdim) * sizeof(float));
        const Tensor in = activation(kIn, pdim, rows);
        be.write(in, host.get(), size_t(rows * pdim) * sizeof(float));
        be.matmul(patch_w_, in, patch_b_, x);
        // NaFlex: the square position table resized to this grid, sent once and added to every piece.
        const std::shared_ptr<const std::vector<float>> pos = positions(g);
        const Tensor pt = activation(kPos, n, np);
        be.write(pt, pos->data(), size_t(np * n) * sizeof(float));
        for (int64_t b = 0; b < n_pieces; ++b) be.add(x.row_slice(b * np, np), pt, 1.0f, x.row_slice(b * np, np));
    }
    const Tensor h = activation(kH, n, rows), q = activation(kQ, n, rows), k = activation(kK, n, rows),
                 v = activation(kV, n, rows), a = activation(kA, n, rows), ff = activation(kFf, c.n_ff, rows);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    // A batch of tiles runs each layer as a recorded step: the same ops on the same buffers for every
    // batch of this shape, which a device backend replays as one launch instead of ~15 + n_pieces (a
    // tiled image's host side otherwise outlasts its kernels). Tiles have one grid, so their batches have
    // a handful of shapes; a single piece (a thumbnail, an image that is not split) has as many as
    // aspect ratios, gains little, and runs its ops as they come. Between layers an encode gives way.
    const bool record = n_pieces > 1;
    for (size_t il = 0; il < layers_.size(); ++il) {
        const VisionLayer& l = layers_[il];
        if (record && be.step_begin(layer_key(int(il), g, n_pieces))) {
            give_way(lock);
            continue;
        }
        be.layer_norm(x, l.ln1_w, l.ln1_b, c.eps, h);
        be.matmul(l.q_w, h, l.q_b, q);
        be.matmul(l.k_w, h, l.k_b, k);
        be.matmul(l.v_w, h, l.v_b, v);
        for (int64_t b = 0; b < n_pieces; ++b)  // each piece's patches see only each other
            be.attention_full(q.row_slice(b * np, np), k.row_slice(b * np, np), v.row_slice(b * np, np), int(c.n_head),
                              int(c.head_dim), scale, a.row_slice(b * np, np));
        be.matmul(l.o_w, a, l.o_b, h);
        be.add(x, h, 1.0f, x);
        be.layer_norm(x, l.ln2_w, l.ln2_b, c.eps, h);
        be.matmul(l.up_w, h, l.up_b, ff);
        be.gelu(ff, GeluKind::kTanh, ff);
        be.matmul(l.down_w, ff, l.down_b, h);
        be.add(x, h, 1.0f, x);
        if (record) be.step_end();
        give_way(lock);
    }
    if (post_w_) be.layer_norm(x, post_w_, post_b_, c.eps, x);
    return x;
}

std::shared_ptr<const std::vector<float>> VisionEncoder::positions(const PatchGrid& g) const {
    std::lock_guard<std::mutex> lock(pos_mu_);
    const std::pair<int, int> key{g.grid_h, g.grid_w};
    if (pos_grids_.size() >= kPositionGrids && !pos_grids_.count(key)) pos_grids_.clear();
    auto& slot = pos_grids_[key];
    if (!slot) {
        const VisionConfig& c = cfg_;
        const int64_t np = int64_t(g.grid_h) * g.grid_w, n = c.n_embd;
        std::vector<float> pos(static_cast<size_t>(np * n));
        resize_bilinear_aa_f32(pos_host_.data(), int(c.n_pos_side), int(c.n_pos_side), int(n), pos.data(), g.grid_h,
                               g.grid_w);
        const std::vector<int64_t> order = unshuffle_order(g);
        auto rows = std::make_shared<std::vector<float>>(pos.size());
        for (int64_t r = 0; r < np; ++r)
            std::memcpy(rows->data() + r * n, pos.data() + order[size_t(r)] * n, size_t(n) * sizeof(float));
        slot = std::move(rows);
    }
    return slot;
}

void VisionEncoder::warm_up() const {
    const ProcessorConfig& pc = cfg_.proc;
    const int side = std::max(pc.tile_size / pc.patch_size / pc.downsample, 1) * pc.downsample;
    PatchGrid tile;
    tile.grid_h = tile.grid_w = side;
    const int64_t np = int64_t(side) * side, pdim = int64_t(pc.patch_size) * pc.patch_size * 3;
    tile.patches.assign(size_t(np * pdim), 0.0f);
    const int64_t cap = be_->kind() == DeviceKind::kCpu ? kBatchPatchesCpu : kBatchPatchesDevice;
    const std::vector<PatchGrid> batch(size_t(std::max<int64_t>(cap / np, 1)), tile);
    std::lock_guard<std::mutex> encoding(encode_mu_);
    std::unique_lock<FifoMutex> lock(be_->exec_mutex());
    (void)project(run_tower(batch, lock));
    (void)project(run_tower({&tile, 1}, lock));
    // Pieces and tile batches come in many patch counts (a piece's with its aspect ratio).
    be_->warm_up_products(product_count_ladder(cap));
}

std::vector<float> VisionEncoder::tower(const PatchGrid& g) const {
    std::lock_guard<std::mutex> encoding(encode_mu_);
    std::unique_lock<FifoMutex> lock(be_->exec_mutex());
    const Tensor x = run_tower({&g, 1}, lock);
    std::vector<float> rows(static_cast<size_t>(x.n_elements()));
    be_->read(rows.data(), x, rows.size() * sizeof(float));
    // Back to the patches' row-major order.
    const std::vector<int64_t> order = unshuffle_order(g);
    const size_t n = size_t(cfg_.n_embd);
    std::vector<float> out(rows.size());
    for (size_t r = 0; r < order.size(); ++r)
        std::memcpy(out.data() + size_t(order[r]) * n, rows.data() + r * n, n * sizeof(float));
    return out;
}

// x: the tower's rows of a batch, in the unshuffle's order (see unshuffle_order); its values are used up.
std::vector<float> VisionEncoder::project(const Tensor& x) const {
    Backend& be = *be_;
    const VisionConfig& c = cfg_;
    const int64_t ff = int64_t(c.proc.downsample) * c.proc.downsample, in = c.n_embd * ff;
    const int64_t nt = x.rows() / ff;
    const Tensor y = x.reshaped(in, nt);
    if (proj_norm_w_) be.layer_norm(y, proj_norm_w_, proj_norm_b_, c.proj_eps, y);
    const Tensor hid = activation(kHid, c.proj_hidden, nt), out = activation(kOut, c.n_embd_text, nt);
    be.matmul(proj1_w_, y, proj1_b_, hid);
    be.gelu(hid, GeluKind::kErf, hid);
    be.matmul(proj2_w_, hid, proj2_b_, out);
    std::vector<float> host(static_cast<size_t>(out.n_elements()));
    be.read(host.data(), out, host.size() * sizeof(float));
    return host;
}

std::vector<float> VisionEncoder::encode(const ProcessedImage& img) const {
    std::lock_guard<std::mutex> encoding(encode_mu_);
    std::unique_lock<FifoMutex> lock(be_->exec_mutex());
    std::vector<float> all;
    const std::vector<PatchGrid>& pieces = img.pieces;
    const int64_t cap = be_->kind() == DeviceKind::kCpu ? kBatchPatchesCpu : kBatchPatchesDevice;
    for (size_t first = 0, last; first < pieces.size(); first = last) {
        // A batch: consecutive pieces of one grid (a tiled image's tiles), up to `cap` patches.
        const int64_t np = int64_t(pieces[first].grid_h) * pieces[first].grid_w;
        for (last = first + 1; last < pieces.size() && pieces[last].grid_h == pieces[first].grid_h &&
                               pieces[last].grid_w == pieces[first].grid_w && int64_t(last - first + 1) * np <= cap;)
            ++last;
        if (first > 0) give_way(lock);
        const Tensor x = run_tower({pieces.data() + first, last - first}, lock);
        const std::vector<float> e = project(x);
        all.insert(all.end(), e.begin(), e.end());
    }
    return all;
}

}  // namespace cera::vision
