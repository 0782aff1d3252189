// The CUDA backend's switches from the environment (backend_switches.h).
#include "backends/cuda/backend_switches.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace cera::cuda {

namespace {
bool is(const char* name, const char* value) {
    const char* e = std::getenv(name);
    return e && std::strcmp(e, value) == 0;
}
int number(const char* name, int fallback) {
    const char* e = std::getenv(name);
    return e && *e ? std::atoi(e) : fallback;
}
}  // namespace

BackendSwitches backend_switches() {
    BackendSwitches s;
    s.graphs = !is("CERA_CUDA_GRAPHS", "0");
    s.fuse = !is("CERA_CUDA_FUSE", "0");
    const char* fp = std::getenv("CERA_CUDA_FUSE_PRODUCTS");
    const std::string_view fpv = fp ? fp : "";
    s.fuse_products = !s.fuse || fpv == "0" ? 0 : fpv == "all" ? 2 : 1;
    s.fuse_conv = number("CERA_CUDA_FUSE_CONV", -1);
    const char* np = std::getenv("CERA_CUDA_NORM_PRO");
    s.pro_mask = !s.fuse ? 0 : np ? std::atoi(np) : kProDefault;
    s.glu_stage = number("CERA_CUDA_GLU_STAGE", -1);
    s.glu_wide = number("CERA_CUDA_GLU_WIDE", -1);
    s.hold_norm = !is("CERA_CUDA_HOLD_NORM", "0");
    s.qkv_rows = number("CERA_CUDA_QKV_ROWS", -1);
    s.mega = is("CERA_CUDA_MEGA", "1");
    s.profile = is("CERA_CUDA_PROFILE", "1");
    const char* mb = std::getenv("CERA_CUDA_MAILBOX");
    s.mailbox = !(mb && mb[0] == '0');
    return s;
}

}  // namespace cera::cuda
