// Error checks for CUDA runtime and cuBLAS calls, shared by the kernel files and the backend (host
// compiler): a failing call becomes a cera::Error naming the call and the CUDA message.
#pragma once
#include <cuda_runtime.h>

#include "core/check.h"

#define CUDA_CHECK(call)                                                                       \
    do {                                                                                       \
        cudaError_t err_ = (call);                                                             \
        CERA_CHECK(err_ == cudaSuccess, "CUDA error %s: %s", #call, cudaGetErrorString(err_)); \
    } while (0)
#define CUBLAS_CHECK(call)                                                                \
    do {                                                                                  \
        cublasStatus_t st_ = (call);                                                      \
        CERA_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error %d: %s", int(st_), #call); \
    } while (0)
