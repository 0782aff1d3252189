// The collectives of CUDA ranks (backends/collectives.h), queued on each rank's stream among its ops
// (CudaBackend::enqueue). Ranks on devices of their own go through NCCL, loaded at run time as cuBLAS
// is; ranks that share a device (a split simulated on one GPU) meet through device copies, their
// streams ordered by events that the ranks' threads exchange on the host.
#include "backends/collectives.h"

#include <dlfcn.h>

#include <algorithm>
#include <barrier>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "backends/cuda/cuda_backend.h"

namespace cera {
namespace cuda {
namespace {

CudaBackend& rank_backend(Backend& be) {
    auto* cb = dynamic_cast<CudaBackend*>(&be);
    CERA_CHECK(cb, "a CUDA collective on a %s backend", device_kind_name(be.kind()));
    return *cb;
}

void check_f32(const Tensor& x, const char* what) {
    CERA_CHECK(x.type == GgmlType::kF32 && x.device == DeviceKind::kCuda, "%s: an f32 tensor on the device", what);
}

// ------------------------------------------------------------------------------- device copies

// Every collective is two meetings. At the first each rank has queued its input (an event recorded
// after it), and every stream waits for every other rank's input before reading it; at the second each
// rank has queued its part of the exchange, and every stream waits for every part before its own ops
// go on to overwrite what the others read. A rank records its event for one meeting only after every
// rank has queued its waits on that event's previous recording (the meeting in between).
class SharedDeviceComm final : public Communicator {
 public:
    explicit SharedDeviceComm(std::span<Backend* const> ranks)
        : world_(int(ranks.size())), sync_(world_), posts_(size_t(world_)), boxes_(size_t(std::max(world_ - 1, 1))) {
        for (size_t r = 0; r < ranks.size(); ++r) {
            CudaBackend& cb = rank_backend(*ranks[r]);
            CERA_CHECK(!cb.graphs(), "ranks sharing cuda:%d run without graphs (they meet on the host inside a step)",
                       cb.device());
            CUDA_CHECK(cudaSetDevice(cb.device()));
            for (cudaEvent_t& e : posts_[r].ev) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        }
        for (Box& b : boxes_)
            for (cudaEvent_t& e : b.ev) CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    ~SharedDeviceComm() override {
        for (Post& p : posts_)
            for (cudaEvent_t e : p.ev) cudaEventDestroy(e);
        for (Box& b : boxes_)
            for (cudaEvent_t e : b.ev) cudaEventDestroy(e);
    }
    int world() const override { return world_; }

    // Rank r adds up the r-th piece of every rank's x, in rank order, into rank 0's x, and copies the
    // sum into every other rank's: the ranks' pieces are disjoint, so they run side by side.
    void all_reduce(int rank, Backend& be, const Tensor& x) override {
        check_f32(x, "all_reduce");
        const int64_t n = x.n_elements();
        rank_backend(be).enqueue([this, rank, p = x.as<float>(), n](cudaStream_t s) {
            Post& me = posts_[size_t(rank)];
            me.p = p, me.n = n;
            meet(rank, 0, s);
            for (const Post& o : posts_)
                CERA_CHECK(o.n == n, "all_reduce: %lld elements on one rank, %lld on another", (long long)o.n,
                           (long long)n);
            const int64_t b = n * rank / world_, e = n * (rank + 1) / world_;
            if (e > b) {
                float* sum = posts_[0].p + b;
                for (int r = 1; r < world_; ++r) cuda::add(sum, posts_[size_t(r)].p + b, 1.0f, e - b, sum, s);
                for (int r = 1; r < world_; ++r)
                    CUDA_CHECK(cudaMemcpyAsync(posts_[size_t(r)].p + b, sum, size_t(e - b) * sizeof(float),
                                               cudaMemcpyDeviceToDevice, s));
            }
            meet(rank, 1, s);
        });
    }

    void all_gather_cols(int rank, Backend& be, const Tensor& local, const Tensor& full, int64_t col0) override {
        check_f32(local, "all_gather_cols"), check_f32(full, "all_gather_cols");
        check_gather_cols(rank, local, full, col0);
        rank_backend(be).enqueue([this, rank, local, full, col0](cudaStream_t s) {
            Post& me = posts_[size_t(rank)];
            me.p = local.as<float>(), me.n = local.ne[0], me.col0 = col0;
            meet(rank, 0, s);
            const size_t row_bytes = size_t(full.ne[0]) * sizeof(float);
            for (const Post& o : posts_)
                CUDA_CHECK(cudaMemcpy2DAsync(full.as<float>() + o.col0, row_bytes, o.p, size_t(o.n) * sizeof(float),
                                             size_t(o.n) * sizeof(float), size_t(full.rows()), cudaMemcpyDeviceToDevice,
                                             s));
            meet(rank, 1, s);
        });
    }

    // A stage boundary's box: send() posts x and its event and waits (on the host) until recv() has
    // queued its copy; the sender's stream then waits for that copy before overwriting x.
    void send(int rank, Backend& be, const Tensor& x) override {
        check_f32(x, "send");
        CERA_CHECK(rank >= 0 && rank + 1 < world_, "send: rank %d of %d", rank, world_);
        rank_backend(be).enqueue([this, rank, x](cudaStream_t s) {
            Box& b = boxes_[size_t(rank)];
            CUDA_CHECK(cudaEventRecord(b.ev[0], s));
            std::unique_lock<std::mutex> lk(b.mu);
            b.cv.wait(lk, [&] { return b.state == Box::kEmpty; });
            b.p = x.as<float>(), b.n = x.n_elements(), b.state = Box::kFull;
            b.cv.notify_all();
            b.cv.wait(lk, [&] { return b.state == Box::kCopied; });
            CUDA_CHECK(cudaStreamWaitEvent(s, b.ev[1]));
            b.state = Box::kEmpty;
            b.cv.notify_all();
            cuda::pdl_skip_next();
        });
    }
    void recv(int rank, Backend& be, const Tensor& x) override {
        check_f32(x, "recv");
        CERA_CHECK(rank >= 1 && rank < world_, "recv: rank %d of %d", rank, world_);
        rank_backend(be).enqueue([this, rank, x](cudaStream_t s) {
            Box& b = boxes_[size_t(rank - 1)];
            std::unique_lock<std::mutex> lk(b.mu);
            b.cv.wait(lk, [&] { return b.state == Box::kFull; });
            CERA_CHECK(b.n == x.n_elements(), "recv: %lld elements sent, %lld expected", (long long)b.n,
                       (long long)x.n_elements());
            CUDA_CHECK(cudaStreamWaitEvent(s, b.ev[0]));
            CUDA_CHECK(cudaMemcpyAsync(x.data, b.p, x.n_bytes(), cudaMemcpyDeviceToDevice, s));
            CUDA_CHECK(cudaEventRecord(b.ev[1], s));
            b.state = Box::kCopied;
            b.cv.notify_all();
            cuda::pdl_skip_next();
        });
    }

 private:
    struct Post {
        float* p = nullptr;
        int64_t n = 0, col0 = 0;
        cudaEvent_t ev[2] = {};
    };
    struct Box {
        enum State { kEmpty, kFull, kCopied };
        std::mutex mu;
        std::condition_variable cv;
        const float* p = nullptr;
        int64_t n = 0;
        State state = kEmpty;
        cudaEvent_t ev[2] = {};  // the sent x is ready; the receiver's copy is done
    };

    // Meeting `which` (0 or 1): this rank's queued work so far is posted, and its stream waits for
    // every other rank's.
    void meet(int rank, int which, cudaStream_t s) {
        CUDA_CHECK(cudaEventRecord(posts_[size_t(rank)].ev[which], s));
        sync_.arrive_and_wait();
        for (int r = 0; r < world_; ++r)
            if (r != rank) CUDA_CHECK(cudaStreamWaitEvent(s, posts_[size_t(r)].ev[which]));
        cuda::pdl_skip_next();  // the next kernel waits for all of it, not only for the kernel before it
    }

    int world_;
    std::barrier<> sync_;
    std::vector<Post> posts_;
    std::vector<Box> boxes_;  // [world - 1]: box r carries rank r's output to rank r + 1
};

// ------------------------------------------------------------------------------------------ NCCL

// The part of NCCL's C interface used here (nccl.h; its values are fixed by its ABI).
using NcclHandle = struct ncclComm*;
constexpr int kNcclFloat = 7, kNcclSum = 0;
#if __has_include(<nccl.h>)
}  // namespace
}  // namespace cuda
}  // namespace cera
#include <nccl.h>
static_assert(ncclFloat == cera::cuda::kNcclFloat && ncclSum == cera::cuda::kNcclSum && ncclSuccess == 0);
namespace cera {
namespace cuda {
namespace {
#endif
struct NcclApi {
    int (*comm_init_all)(NcclHandle* comms, int n, const int* devices);
    int (*comm_destroy)(NcclHandle comm);
    const char* (*error_string)(int result);
    int (*all_reduce)(const void* in, void* out, size_t count, int type, int op, NcclHandle comm, cudaStream_t s);
    int (*broadcast)(const void* in, void* out, size_t count, int type, int root, NcclHandle comm, cudaStream_t s);
    int (*send)(const void* in, size_t count, int type, int peer, NcclHandle comm, cudaStream_t s);
    int (*recv)(void* out, size_t count, int type, int peer, NcclHandle comm, cudaStream_t s);
    int (*group_start)();
    int (*group_end)();
};

const NcclApi& nccl() {
    static const NcclApi api = [] {
        const char* lib = "libnccl.so.2";
        void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        if (!h) throw_error(ErrorCode::kDevice, "cannot load %s (NCCL, for ranks on several GPUs): %s", lib, dlerror());
        auto bind = [&](auto& fn, const char* symbol) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, symbol));
            if (!fn) throw_error(ErrorCode::kDevice, "%s has no %s", lib, symbol);
        };
        NcclApi a{};
        bind(a.comm_init_all, "ncclCommInitAll");
        bind(a.comm_destroy, "ncclCommDestroy");
        bind(a.error_string, "ncclGetErrorString");
        bind(a.all_reduce, "ncclAllReduce");
        bind(a.broadcast, "ncclBroadcast");
        bind(a.send, "ncclSend");
        bind(a.recv, "ncclRecv");
        bind(a.group_start, "ncclGroupStart");
        bind(a.group_end, "ncclGroupEnd");
        return a;  // the library stays open for the process's life
    }();
    return api;
}

void nccl_check(int result, const char* what) {
    if (result != 0) throw_error(ErrorCode::kDevice, "NCCL %s: %s", what, nccl().error_string(result));
}

// One NCCL communicator a rank, made together (ncclCommInitAll) for the ranks' devices. Its collectives
// are captured into the ranks' graphs like their other ops.
class NcclComm final : public Communicator {
 public:
    explicit NcclComm(std::span<Backend* const> ranks) : world_(int(ranks.size())), comms_(ranks.size()) {
        std::vector<int> devices;
        for (Backend* be : ranks) devices.push_back(rank_backend(*be).device());
        // NVLink multicast (NVLS) stays off: its buffers take device memory the ranks' graphs do not see.
        setenv("NCCL_NVLS_ENABLE", "0", 1);
        nccl_check(nccl().comm_init_all(comms_.data(), world_, devices.data()), "init");
        scratch_.resize(ranks.size());
        for (size_t r = 0; r < ranks.size(); ++r) scratch_[r].device = devices[r];
        layout_.resize(ranks.size());
    }
    ~NcclComm() override {
        for (NcclHandle c : comms_) nccl().comm_destroy(c);
        for (Scratch& s : scratch_)
            if (s.p) cudaSetDevice(s.device), cudaFree(s.p);
    }
    int world() const override { return world_; }

    void all_reduce(int rank, Backend& be, const Tensor& x) override {
        check_f32(x, "all_reduce");
        rank_backend(be).enqueue([this, rank, p = x.data, n = size_t(x.n_elements())](cudaStream_t s) {
            nccl_check(nccl().all_reduce(p, p, n, kNcclFloat, kNcclSum, comms_[size_t(rank)], s), "all_reduce");
        });
    }

    // Each rank's [rows, w_r] is broadcast whole into a scratch of [rows, W] floats (piece after piece),
    // then copied to its columns. The ranks learn each other's widths on the host, once a call.
    void all_gather_cols(int rank, Backend& be, const Tensor& local, const Tensor& full, int64_t col0) override {
        check_f32(local, "all_gather_cols"), check_f32(full, "all_gather_cols");
        check_gather_cols(rank, local, full, col0);
        rank_backend(be).enqueue([this, rank, local, full, col0](cudaStream_t s) {
            layout_[size_t(rank)] = {local.ne[0], col0};
            sync_.arrive_and_wait();
            const int64_t rows = full.rows();
            float* tmp = grow(rank, size_t(full.n_elements()), s);
            nccl_check(nccl().group_start(), "group");
            int64_t off = 0;
            for (int r = 0; r < world_; ++r) {
                const size_t n = size_t(rows * layout_[size_t(r)].width);
                nccl_check(nccl().broadcast(r == rank ? local.data : nullptr, tmp + off, n, kNcclFloat, r,
                                            comms_[size_t(rank)], s),
                           "broadcast");
                off += int64_t(n);
            }
            nccl_check(nccl().group_end(), "group");
            off = 0;
            for (const Piece& p : layout_) {
                CUDA_CHECK(cudaMemcpy2DAsync(full.as<float>() + p.col0, size_t(full.ne[0]) * sizeof(float), tmp + off,
                                             size_t(p.width) * sizeof(float), size_t(p.width) * sizeof(float),
                                             size_t(rows), cudaMemcpyDeviceToDevice, s));
                off += rows * p.width;
            }
            sync_.arrive_and_wait();  // every rank has read the layout
        });
    }

    void send(int rank, Backend& be, const Tensor& x) override {
        check_f32(x, "send");
        rank_backend(be).enqueue([this, rank, p = x.data, n = size_t(x.n_elements())](cudaStream_t s) {
            nccl_check(nccl().send(p, n, kNcclFloat, rank + 1, comms_[size_t(rank)], s), "send");
        });
    }
    void recv(int rank, Backend& be, const Tensor& x) override {
        check_f32(x, "recv");
        rank_backend(be).enqueue([this, rank, p = x.data, n = size_t(x.n_elements())](cudaStream_t s) {
            nccl_check(nccl().recv(p, n, kNcclFloat, rank - 1, comms_[size_t(rank)], s), "recv");
        });
    }

 private:
    struct Scratch {
        float* p = nullptr;
        size_t n = 0;
        int device = 0;
    };
    struct Piece {
        int64_t width = 0, col0 = 0;
    };
    // The gather's scratch grows outside captures: a step's shape runs eagerly the first time it is seen,
    // so a recorded step finds it grown.
    float* grow(int rank, size_t n, cudaStream_t s) {
        Scratch& sc = scratch_[size_t(rank)];
        if (sc.n >= n) return sc.p;
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        CUDA_CHECK(cudaStreamIsCapturing(s, &st));
        CERA_CHECK(st == cudaStreamCaptureStatusNone, "all_gather_cols: %zu floats first seen in a recorded step", n);
        CUDA_CHECK(cudaStreamSynchronize(s));
        if (sc.p) CUDA_CHECK(cudaFree(sc.p));
        CUDA_CHECK(cudaMalloc(&sc.p, n * sizeof(float)));
        sc.n = n;
        return sc.p;
    }

    int world_;
    std::vector<NcclHandle> comms_;
    std::vector<Scratch> scratch_;
    std::vector<Piece> layout_;
    std::barrier<> sync_{world_};
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Communicator> make_cuda_communicator(std::span<Backend* const> ranks) {
    std::vector<int> devices;
    for (Backend* be : ranks) devices.push_back(cuda::rank_backend(*be).device());
    std::vector<int> sorted = devices;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end())
        return std::make_unique<cuda::NcclComm>(ranks);
    if (sorted.front() == sorted.back()) return std::make_unique<cuda::SharedDeviceComm>(ranks);
    throw_error(ErrorCode::kUnsupported, "tensor parallel: CUDA ranks on devices of their own, or all on one");
}

}  // namespace cera
