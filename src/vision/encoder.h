// The LFM2-VL vision tower and projector, loaded from a llama.cpp mmproj GGUF (general.architecture
// "clip", clip.projector_type "lfm2") and run through the Backend ops on the text model's device:
//   x = patches · patch_embd + b + resize_bilinear_aa(position_embd, grid)     (NaFlex: one grid a piece)
//   per block:  x += Wo·Attn(Wq h, Wk h, Wv h),  h = LayerNorm(x) * ln1        (bidirectional, all patches)
//               x += W2·gelu_tanh(W1 · LayerNorm(x) * ln2)
//   x = LayerNorm(x) * post_ln                                  (when the file has post_ln)
//   y = pixel_unshuffle(x, f): each f x f block of patches becomes one row of f² n_embd
//   embeddings = mm.2 · gelu(mm.1 · LayerNorm(y) * input_norm)   [n_tokens, n_embd_text] (norm when present)
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "vision/preprocess.h"

namespace cera {
namespace gguf {
class File;
}

namespace vision {

struct VisionConfig {
    int64_t n_embd = 0;       // clip.vision.embedding_length
    int64_t n_layer = 0;      // clip.vision.block_count
    int64_t n_head = 0;       // clip.vision.attention.head_count
    int64_t head_dim = 0;     // n_embd / n_head
    int64_t n_ff = 0;         // clip.vision.feed_forward_length
    int64_t n_pos_side = 0;   // the position table is a n_pos_side x n_pos_side grid
    float eps = 1e-6f;        // clip.vision.attention.layer_norm_epsilon
    float proj_eps = 1e-5f;   // the projector's layer norm (PyTorch's default; not in the file)
    int64_t proj_hidden = 0;  // mm.1 rows
    int64_t n_embd_text = 0;  // mm.2 rows: the text model's n_embd
    ProcessorConfig proc;     // patch size, downsample factor, mean / std from the file
};

struct VisionLayer {
    Tensor ln1_w, ln1_b, ln2_w, ln2_b;  // f32 [n_embd]
    Tensor q_w, k_w, v_w, o_w;          // [n_embd, n_embd]
    Tensor q_b, k_b, v_b, o_b;          // f32 [n_embd]
    Tensor up_w, up_b, down_w, down_b;  // [n_ff, n_embd], [n_ff]; [n_embd, n_ff], [n_embd]
};

class VisionEncoder {
 public:
    // Opens and validates an mmproj file and makes its weights resident on `be`, which must outlive
    // the encoder. n_embd_text > 0: the projector must map to that width. Throws cera::Error naming the
    // key or tensor that is wrong.
    static std::unique_ptr<VisionEncoder> load(const std::string& path, Backend& be, int64_t n_embd_text = 0);
    ~VisionEncoder();

    const VisionConfig& config() const { return cfg_; }
    // ProcessorConfig::do_image_splitting (EngineOptions::image_splitting); the file does not say.
    void set_image_splitting(bool on) { cfg_.proc.do_image_splitting = on; }

    // The embeddings of an image's pieces, in order: f32 [image_tokens, n_embd_text].
    std::vector<float> encode(const ProcessedImage& img) const;
    // The vision tower's output (after post_ln) of one piece: f32 [grid_h * grid_w, n_embd].
    std::vector<float> tower(const PatchGrid& g) const;
    // Readies a device for the first image (EngineOptions::warmup): the tower and the projector run once
    // over the largest batch of tiles an encode makes and once over a single piece, so that the
    // activation buffers have the size no later encode grows them past (a growth would also start the
    // recorded layer steps over), the kernels are loaded and the products are readied for a ladder of
    // patch counts (Backend::warm_up_products).
    void warm_up() const;

 private:
    VisionEncoder() = default;
    // Pieces of one grid go through the tower together, at most this many patches (the activations
    // of a batch are ~(6 n_embd + n_ff) floats a patch: ~46 MB a 1024-patch tile of SigLIP2 400M). A
    // GPU takes fewer, fuller launches from a larger batch; on the CPU a tile's products already run
    // at the kernels' rate, so a larger batch would only hold more memory (a 1024x768 image's six
    // tiles at once: +250 MB of peak RSS, for 3% of its encode time).
    static constexpr int64_t kBatchPatchesDevice = 8192, kBatchPatchesCpu = 2048;
    static constexpr size_t kPositionGrids = 8;
    // The tower's row order of a piece's patches (see encoder.cpp): order[row] = the patch's index.
    std::vector<int64_t> unshuffle_order(const PatchGrid& g) const;
    // Runs the tower on pieces of one grid, leaving x [n_pieces * n_patches, n_embd] on the device, rows
    // in unshuffle_order a piece (activation buffer kX). `lock` holds the backend; see give_way.
    Tensor run_tower(std::span<const PatchGrid> pieces, std::unique_lock<FifoMutex>& lock) const;
    // Between the tower's layers and between batches: a thread waiting for the backend (a batch step
    // of the server's other sequences) takes it here for its turn, so that it does not wait out a whole
    // image (tens of seconds of a tiled image on a CPU).
    void give_way(std::unique_lock<FifoMutex>& lock) const;
    std::vector<float> project(const Tensor& x) const;
    // Activation buffer `slot` viewed as f32 [ne1, ne0]: kept from one encode to the next and grown when
    // a batch needs more, since freeing device memory waits for the device and drops the recorded steps
    // of the text model's decoding. Held by one encode at a time (encode_mu_).
    Tensor activation(size_t slot, int64_t ne0, int64_t ne1) const;
    // The recorded-step key of a tower layer over a batch of n_pieces pieces of a grid: the same ops on
    // the same buffers whenever the key is the same (a buffer that grows starts new keys).
    uint64_t layer_key(int layer, const PatchGrid& g, int64_t n_pieces) const;
    // The position table resized to a grid (NaFlex), rows in the tower's order: made once a grid size (a
    // few milliseconds of double arithmetic, beside an encode of tens on a GPU) and kept, for the last
    // kPositionGrids grid sizes (a tile's, and the thumbnails' that vary with the aspect ratio).
    std::shared_ptr<const std::vector<float>> positions(const PatchGrid& g) const;

    Backend* be_ = nullptr;
    std::unique_ptr<gguf::File> file_;
    VisionConfig cfg_;
    std::vector<float> patch_w_host_;  // [n_embd, p * p * 3] in the patches' (y, x, c) order
    std::vector<float> pos_host_;      // [n_pos_side, n_pos_side, n_embd]
    mutable std::mutex pos_mu_;
    mutable std::map<std::pair<int, int>, std::shared_ptr<const std::vector<float>>> pos_grids_;  // positions()
    mutable std::mutex encode_mu_;  // taken before the backend's exec mutex
    mutable std::vector<Tensor> act_;
    mutable uint64_t act_generation_ = 0;  // counts the buffers' reallocations
    uint64_t serial_ = 0;                  // new_step_serial(): this encoder's recorded steps
    mutable std::map<std::array<int64_t, 5>, uint64_t> layer_keys_;
    Tensor patch_w_, patch_b_;
    Tensor post_w_, post_b_;
    std::vector<VisionLayer> layers_;
    Tensor proj_norm_w_, proj_norm_b_, proj1_w_, proj1_b_, proj2_w_, proj2_b_;
};

}  // namespace vision
}  // namespace cera
