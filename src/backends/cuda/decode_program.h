// Records the ops of one single-token step (as the backend receives them) and turns them into the
// phases of a decode program (decode_step.h): folds an RMSNorm into the prologue of the matmuls that
// read it, groups matmuls sharing an input (q/k/v), pairs gate/up with their SwiGLU, folds an output
// scale, a residual add and an argmax into a matmul's row epilogue, fuses q/k RoPE with the KV
// store, and places a grid barrier only before a phase that touches memory an earlier phase since
// the last barrier wrote (or writes memory it read). Any op or shape the program does not cover
// makes the step fall back to the recorded CUDA graph. Host code only; make_decode_program() uploads
// the phases and owns the device buffers of a program.
#pragma once
#include <cstdint>
#include <memory>
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

// A recorded step compiled for replay: the device program and the buffers it owns (freed with it).
struct DecodeProgram {
    MxProgram p;
    std::vector<void*> owned;
    std::vector<int> kinds;  // profiling: kind * 2 + barrier per phase
    int replays = 0;
    DecodeProgram() = default;
    DecodeProgram(const DecodeProgram&) = delete;
    DecodeProgram& operator=(const DecodeProgram&) = delete;
    ~DecodeProgram();
};
// The recorded step as a decode program for decode_program_grid() blocks, its tables uploaded on
// `stream`; null when the step has an op the program does not cover (with `profile`, stderr says why).
std::unique_ptr<DecodeProgram> make_decode_program(DecodeRecorder& rec, Stream stream, bool profile);
// CERA_CUDA_PROFILE=1 CERA_CUDA_MX_PROF=1: where one replay spent its time, per phase kind: the mean over
// blocks of the wait at the barrier before it and of its work, in us at the SM clock of `device` (the
// slowest block's work in brackets). Waits for `stream`.
void print_decode_program_profile(const DecodeProgram& prog, Stream stream, int device);

// The placeholder build() leaves in MxPhase::argmax_key.
inline unsigned long long* mx_argmax_placeholder() { return reinterpret_cast<unsigned long long*>(uintptr_t(8)); }

}  // namespace cera::cuda
