// Records the ops of one single-token step (as the backend receives them) and turns them into the
// phases of a decode program (decode_step.h): folds an RMSNorm into the prologue of the matmuls that
// read it, groups matmuls sharing an input (q/k/v), pairs gate/up with their SwiGLU, folds an output
// scale, a residual add and an argmax into a matmul's row epilogue, fuses q/k RoPE with the KV
// store, and places a grid barrier only before a phase that touches memory an earlier phase since
// the last barrier wrote (or writes memory it read). Any op or shape the program does not cover
// makes the step fall back to the recorded CUDA graph. Host code only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/decode_step.h"

namespace cera::cuda {

class DecodeRecorder {
   public:
    DecodeRecorder();
    ~DecodeRecorder();
    void embed(const WeightRef& table, const int32_t* ids, int64_t n_ids, float scale, float* out);
    void rms_norm(const float* x, int64_t rows, int64_t n, const float* w, float eps, float* out);
    void matmul(const WeightRef& w, int64_t rows, const float* x, int64_t n_tokens, const float* bias, float* out);
    void norm_rope(float* x, int64_t n_tokens, int n_head, int head_dim, const float* norm_w, float eps,
                   const int32_t* pos, const RopeArgs& rope);
    void kv_store(const float* k, const float* v, int64_t n_tokens, int64_t width, const int32_t* pos, void* k_cache,
                  void* v_cache, bool f16, int64_t n_ctx);
    void attention(const AttentionArgs& a);
    void short_conv(const float* bcx, const float* w, int L, float* state, int64_t n_tokens, int64_t n_embd,
                    float* out);
    void swiglu(const float* gate, const float* up, int64_t n, float* out);
    void add(const float* a, const float* b, float scale, int64_t n, float* out);
    void scale(float* x, float s, int64_t n);
    void argmax(const float* x, int64_t rows, int64_t n, int32_t* out);
    void unsupported(const std::string& what);

    bool ok() const { return why_.empty(); }
    const std::string& why() const { return why_; }

    // The phases for a grid of `grid` blocks. Attention phases get `partial` = null and
    // max_chunks set: the caller allocates partial_floats() floats and sets it; a phase with an
    // argmax_key gets a non-null placeholder the caller replaces with a zeroed device word.
    bool build(int grid, std::vector<MxPhase>& phases);
    size_t partial_floats() const { return partial_floats_; }

    struct Op;  // one recorded call

   private:
    std::vector<Op> ops_;
    std::string why_;
    size_t partial_floats_ = 0;
};

// The placeholder build() leaves in MxPhase::argmax_key.
inline unsigned long long* mx_argmax_placeholder() { return reinterpret_cast<unsigned long long*>(uintptr_t(8)); }

}  // namespace cera::cuda
