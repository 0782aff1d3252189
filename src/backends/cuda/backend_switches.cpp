// The CUDA backend's switches from the environment (backend_switches.h).
#include "backends/cuda/backend_switches.h"

#include <cstdlib>
#include <string_view>

#include "backends/cuda/env_switch.h"

namespace cera::cuda {

BackendSwitches backend_switches() {
    BackendSwitches s;
    s.graphs = !env_is("CERA_CUDA_GRAPHS", "0");
    s.fuse = !env_is("CERA_CUDA_FUSE", "0");
    const char* fp = std::getenv("CERA_CUDA_FUSE_PRODUCTS");
    const std::string_view fpv = fp ? fp : "";
    s.fuse_products = !s.fuse || fpv == "0" ? 0 : fpv == "all" ? 2 : 1;
    s.fuse_conv = env_int("CERA_CUDA_FUSE_CONV", -1);
    const char* np = std::getenv("CERA_CUDA_NORM_PRO");
    s.pro_mask = !s.fuse ? 0 : np ? std::atoi(np) : kProDefault;
    s.glu_stage = env_int("CERA_CUDA_GLU_STAGE", -1);
    s.glu_wide = env_int("CERA_CUDA_GLU_WIDE", -1);
    s.pro_xreg = env_int("CERA_CUDA_PRO_XREG", -1);
    s.hold_norm = !env_is("CERA_CUDA_HOLD_NORM", "0");
    s.qkv_rows = env_int("CERA_CUDA_QKV_ROWS", -1);
    s.mega = env_is("CERA_CUDA_MEGA", "1");
    s.profile = env_is("CERA_CUDA_PROFILE", "1");
    const char* mb = std::getenv("CERA_CUDA_MAILBOX");
    s.mailbox = !(mb && mb[0] == '0');
    return s;
}

}  // namespace cera::cuda
