// cuBLAS, opened at run time by the first CUDA backend rather than linked: loading libcublasLt makes
// about 150 MB resident (its own start-up), which every process of a CUDA-enabled build would pay,
// also one that never touches a GPU.
#pragma once
#include <cublas_v2.h>

namespace cera::cuda {

// The entry points the backend calls (cublas_v2.h names: cublasCreate is cublasCreate_v2 and so on).
struct CublasApi {
    decltype(&::cublasCreate) create;
    decltype(&::cublasDestroy) destroy;
    decltype(&::cublasSetStream) set_stream;
    decltype(&::cublasSetWorkspace) set_workspace;
    decltype(&::cublasSgemm) sgemm;
    // cublasGemmEx is overloaded in C++ (an inline one takes a cudaDataType compute type): the
    // exported one.
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                              const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
};

// Opens the cuBLAS of the CUDA major version this build was compiled against on the first call
// (thread-safe) and returns its entry points; throws a kDevice Error naming the library when it
// cannot be loaded or lacks one of them.
const CublasApi& cublas();

}  // namespace cera::cuda
