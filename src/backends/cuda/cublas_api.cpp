#include "backends/cuda/cublas_api.h"

#include <dlfcn.h>

#include <string>
#include <type_traits>

#include "core/check.h"

// The symbol behind a cublas_v2.h name (a macro for most of them).
#define CERA_CUBLAS_SYMBOL(name) CERA_CUBLAS_STR(name)
#define CERA_CUBLAS_STR(name) #name

namespace cera::cuda {

const CublasApi& cublas() {
    static const CublasApi api = [] {
        const std::string lib = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
        void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!h)
            throw_error(ErrorCode::kDevice, "cannot load %s (cuBLAS, needed by the CUDA backend): %s", lib.c_str(),
                        dlerror());
        auto bind = [&](auto& fn, const char* symbol) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, symbol));
            if (!fn) throw_error(ErrorCode::kDevice, "%s has no %s", lib.c_str(), symbol);
        };
        CublasApi a{};
        bind(a.create, CERA_CUBLAS_SYMBOL(cublasCreate));
        bind(a.destroy, CERA_CUBLAS_SYMBOL(cublasDestroy));
        bind(a.set_stream, CERA_CUBLAS_SYMBOL(cublasSetStream));
        bind(a.set_workspace, CERA_CUBLAS_SYMBOL(cublasSetWorkspace));
        bind(a.sgemm, CERA_CUBLAS_SYMBOL(cublasSgemm));
        bind(a.gemm_ex, CERA_CUBLAS_SYMBOL(cublasGemmEx));
        return a;  // the library stays open for the process's life
    }();
    return api;
}

}  // namespace cera::cuda
