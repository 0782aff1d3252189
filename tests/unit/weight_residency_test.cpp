// Weights are resident once on the CPU: a matrix the kernel table keeps repacked (repack.h) is read
// from its packed copy by every op, a small tensor is copied where the table repacks, and the pages of
// the mapped file under both are dropped at upload. Checked through /proc/self/pagemap and smaps
// (whether a page is mapped in this process), which needs no timing: the packed image gives back the
// GGUF bytes row by row; a matrix uploaded from a mapped file gives the same matmul and embedding
// results as one uploaded from the heap, with none of its file pages mapped before or after the ops;
// after a model is loaded and run, no page inside a repacked tensor of its GGUF is mapped, nor any
// other page of its data section than those two tensors share; and an engine that loaded and ran it
// maps no more of the file than its header. Where the CPU has no packed kernels, nothing is repacked: a
// large matrix's pages are then mapped by the ops that read it. A process that runs a model on the CPU
// has not loaded cuBLAS (a CUDA build opens it with its first CUDA backend: its start-up alone makes
// ~150 MB resident).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernel_table.h"
#include "backends/cpu/repack.h"
#include "cera/engine.h"
#include "cera/session.h"
#include "core/mmap.h"
#include "core/quant/quant.h"
#include "gguf/gguf.h"
#include "models/model.h"
#include "test_util.h"

namespace cera {
namespace {

constexpr GgmlType kPackedTypes[] = {GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,   GgmlType::kQ4_1,
                                     GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,   GgmlType::kQ4_K,
                                     GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS,
                                     GgmlType::kQ2_K, GgmlType::kQ3_K};

std::vector<uint8_t> make_weights(GgmlType type, int64_t rows, int64_t k, std::mt19937& rng) {
    std::normal_distribution<float> g(0.0f, 1.0f);
    const size_t rs = row_size(type, k);
    std::vector<uint8_t> w(rs * size_t(rows));
    std::vector<float> x(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
        for (float& v : x) v = g(rng) * (r % 3 == 0 ? 0.02f : 1.0f);
        quantize_row_ref(type, x.data(), w.data() + size_t(r) * rs, k);
    }
    return w;
}

// Pages of the whole pages inside [p, p + n) that are mapped in this process; -1 when
// /proc/self/pagemap cannot be read.
int64_t mapped_pages(const void* p, size_t n) {
    const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (uintptr_t(p) + page - 1) / page, end = (uintptr_t(p) + n) / page;
    if (end <= begin) return 0;
    const int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    std::vector<uint64_t> entries(end - begin);
    const ssize_t want = ssize_t(entries.size() * sizeof(uint64_t));
    const ssize_t got = pread(fd, entries.data(), size_t(want), off_t(begin * sizeof(uint64_t)));
    close(fd);
    if (got != want) return -1;
    int64_t present = 0;
    for (uint64_t e : entries) present += (e >> 63) & 1;
    return present;
}

TEST(WeightResidency, UnpackedRowsAreTheGgufBytes) {
    std::mt19937 rng(1);
    for (GgmlType type : kPackedTypes) {
        const bool k_quant = type_info(type).block_size == kQK_K;
        for (int64_t k : k_quant ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 96, 320}) {
            for (int64_t rows : {1, 16, 17, 33}) {
                const auto w = make_weights(type, rows, k, rng);
                const cpu::PackedView v{nullptr, cpu::packed_group_bytes(type, k)};
                std::vector<uint8_t> packed(size_t((rows + cpu::kPackRows - 1) / cpu::kPackRows) * v.group_stride);
                cpu::repack_weights(type, w.data(), rows, k, packed.data());
                const size_t rs = row_size(type, k);
                std::vector<uint8_t> row(rs);
                for (int64_t r = 0; r < rows; ++r) {
                    cpu::unpack_row(type, {packed.data(), v.group_stride}, r, k, row.data());
                    ASSERT_EQ(std::memcmp(row.data(), w.data() + size_t(r) * rs, rs), 0)
                        << type_name(type) << " k=" << k << " rows=" << rows << " row " << r;
                }
            }
        }
    }
}

// A file holding `bytes` at offset 32 (so the matrix starts and ends inside a page), mapped.
struct MappedMatrix {
    std::string path;
    MappedFile file;
    const uint8_t* data = nullptr;

    explicit MappedMatrix(const std::vector<uint8_t>& bytes) {
        path =
            (std::filesystem::temp_directory_path() / ("cera_residency_" + std::to_string(getpid()) + ".bin")).string();
        std::ofstream out(path, std::ios::binary);
        const std::vector<char> pad(32, 0);
        out.write(pad.data(), std::streamsize(pad.size()));
        out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
        out.write(pad.data(), std::streamsize(pad.size()));
        out.close();
        file = MappedFile(path);
        data = file.data() + 32;
    }
    ~MappedMatrix() { std::remove(path.c_str()); }
};

TEST(WeightResidency, MappedMatrixIsReadFromItsPackedCopyOnly) {
    std::mt19937 rng(2);
    std::normal_distribution<float> g(0.0f, 1.0f);
    const int64_t rows = 520, k = 4096, n_tokens = 5;  // over a MiB in every type: never copied whole
    for (GgmlType type : kPackedTypes) {
        SCOPED_TRACE(type_name(type));
        const auto bytes = make_weights(type, rows, k, rng);
        MappedMatrix m(bytes);
        auto be = make_cpu_backend(2);  // gone before the weights: it unregisters them
        const int64_t ne[2] = {k, rows};
        Tensor wm = be->upload_mapped_weight(type, ne, m.data);
        Tensor wh = be->upload_weight(type, ne, bytes.data());
        const bool packed = cpu::find_packed(m.data, type, rows, k).data != nullptr;
        const int64_t before = mapped_pages(m.data, bytes.size());
        if (packed && before >= 0) {
            EXPECT_EQ(before, 0);
        }

        std::vector<float> xv(size_t(n_tokens * k));
        for (float& v : xv) v = g(rng);
        Tensor x = be->alloc(GgmlType::kF32, {k, n_tokens});
        be->write(x, xv.data(), xv.size() * sizeof(float));
        Tensor ym = be->alloc(GgmlType::kF32, {rows, n_tokens}), yh = be->alloc(GgmlType::kF32, {rows, n_tokens});
        be->matmul(wm, x, Tensor{}, ym);
        be->matmul(wh, x, Tensor{}, yh);
        std::vector<float> a(size_t(rows * n_tokens)), b(a.size());
        be->read(a.data(), ym, a.size() * sizeof(float));
        be->read(b.data(), yh, b.size() * sizeof(float));
        EXPECT_EQ(a, b);  // the same packed (or plain) kernel on the same weights

        const std::vector<int32_t> idv = {0, 519, 17, 16, 3};
        Tensor ids = be->alloc(GgmlType::kI32, {int64_t(idv.size())});
        be->write(ids, idv.data(), idv.size() * sizeof(int32_t));
        Tensor e = be->alloc(GgmlType::kF32, {k, int64_t(idv.size())});
        be->embed(wm, ids, 0.5f, e);
        std::vector<float> got(static_cast<size_t>(k) * idv.size()), want(static_cast<size_t>(k));
        be->read(got.data(), e, got.size() * sizeof(float));
        for (size_t t = 0; t < idv.size(); ++t) {
            dequantize_row_ref(type, bytes.data() + size_t(idv[t]) * row_size(type, k), want.data(), k);
            for (int64_t i = 0; i < k; ++i)
                ASSERT_EQ(got[t * size_t(k) + size_t(i)], want[size_t(i)] * 0.5f) << "token " << t << " column " << i;
        }
        const int64_t after = mapped_pages(m.data, bytes.size());
        if (after < 0) continue;
        if (packed) {
            EXPECT_EQ(after, 0) << "an op read the file's bytes of a repacked matrix";
        } else {
            EXPECT_GT(after, 0) << "the plain kernel read the file, so its pages are mapped";
        }
    }
}

// Where the kernel table repacks, a small tensor from a mapped file (a norm, a conv kernel) is copied
// and its file pages dropped; elsewhere it stays a view.
TEST(WeightResidency, SmallMappedTensorIsCopiedWhereTheTableRepacks) {
    std::vector<float> v(8192);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.25f - 7.0f;
    std::vector<uint8_t> bytes(v.size() * sizeof(float));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    MappedMatrix m(bytes);
    auto be = make_cpu_backend(1);
    const int64_t ne[1] = {int64_t(v.size())};
    Tensor t = be->upload_mapped_weight(GgmlType::kF32, ne, m.data);
    std::vector<float> got(v.size());
    be->read(got.data(), t, got.size() * sizeof(float));
    EXPECT_EQ(got, v);
    bool repacks = false;
    for (const cpu::PackedKernel& k : cpu::active_table().packed) repacks = repacks || k.fn != nullptr;
    if (!repacks) {
        EXPECT_EQ(t.data, static_cast<const void*>(m.data));
        return;
    }
    EXPECT_NE(t.data, static_cast<const void*>(m.data));
    const int64_t present = mapped_pages(m.data, bytes.size());
    if (present >= 0) {
        EXPECT_EQ(present, 0);
    }
}

TEST(WeightResidency, LoadedModelKeepsNoFilePagesOfRepackedTensors) {
    ModelOptions o;
    o.n_threads = 1;
    o.n_ctx = 64;
    auto model = load_model(test::source_path("models/tiny-lfm2-Q8_0.gguf"), o);
    auto state = model->create_state();
    const std::vector<int32_t> prompt = {1, 2, 3, 500, 4000, 7};
    std::vector<float> logits(size_t(model->info().n_vocab));
    state->eval({.tokens = prompt, .logits = logits.data()});
    int32_t next = 0;
    for (int i = 0; i < 4; ++i) next = state->eval({.tokens = {&next, 1}, .head = HeadOutput::kGreedy}).token;
    int checked = 0;
    const auto& tensors = model->file().tensors();
    for (const gguf::TensorInfo& ti : tensors) {
        if (ti.ne.size() != 2 || cpu::find_packed(ti.data, ti.type, ti.ne[1], ti.ne[0]).data == nullptr) continue;
        const int64_t present = mapped_pages(ti.data, ti.n_bytes);
        if (present < 0) break;
        EXPECT_EQ(present, 0) << ti.name;
        ++checked;
    }
    if (checked == 0) GTEST_SKIP() << "no packed kernels on this CPU (or no /proc/self/pagemap): pages not checked";
    // Every tensor of this file is repacked or small (copied), so of its whole data section only the
    // pages that two tensors share can still be mapped.
    const uint8_t* begin = tensors.front().data - tensors.front().offset;
    const uint8_t* end = begin;
    for (const gguf::TensorInfo& ti : tensors) end = std::max(end, ti.data + ti.n_bytes);
    EXPECT_LE(mapped_pages(begin, size_t(end - begin)), 2 * int64_t(tensors.size()));
}

// Resident bytes of this process's mappings of `path` (/proc/self/smaps); -1 when unreadable.
int64_t mapped_file_bytes(const std::string& path) {
    std::ifstream smaps("/proc/self/smaps");
    if (!smaps) return -1;
    const std::string want = std::filesystem::canonical(path).string();
    int64_t kib = 0;
    bool in_file = false;
    for (std::string line; std::getline(smaps, line);) {
        const size_t dash = line.find('-');
        if (dash != std::string::npos && dash > 0 && line.find(' ') > dash && std::isxdigit(uint8_t(line[0])) &&
            line.find(':') > line.find(' ')) {  // a mapping's first line: "begin-end perms offset dev inode path"
            in_file = line.size() >= want.size() && line.compare(line.size() - want.size(), want.size(), want) == 0;
        } else if (in_file && line.rfind("Rss:", 0) == 0) {
            kib += std::stoll(line.substr(4));
        }
    }
    return kib * 1024;
}

// Through the public API: after an engine has loaded a model and generated, its GGUF mapping holds no
// more than the header the reader parsed and the pages two tensors share. Nothing reads the weights
// through the mapping once they are held (the engine's model fingerprint reads the file through a
// descriptor).
TEST(WeightResidency, EngineMapsOnlyTheHeaderOfAFileItHoldsInCopies) {
    if (cpu::active_table().packed[int(GgmlType::kQ8_0)].fn == nullptr)
        GTEST_SKIP() << "no packed kernels on this CPU: Q8_0 weights stay views of the mapping";
    const std::string path = test::source_path("models/tiny-lfm2-Q8_0.gguf");
    uint64_t header = 0;
    size_t n_tensors = 0;
    {
        auto f = gguf::File::open(path);
        header = f->data_offset();
        n_tensors = f->tensors().size();
    }
    auto engine = Engine::load(path, {.device = "cpu", .threads = 1, .n_ctx = 64});
    Session s(engine, 64);
    const std::vector<int32_t> prompt = {1, 2, 3, 500, 4000, 7};
    s.append_tokens(prompt);
    GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 4;
    NullSink sink;
    s.generate(g, sink);
    const int64_t bytes = mapped_file_bytes(path);
    if (bytes < 0) GTEST_SKIP() << "no /proc/self/smaps";
    const int64_t page = sysconf(_SC_PAGESIZE);
    const int64_t fault_around = 64 * 1024;  // what one fault may map beyond the header
    EXPECT_LE(bytes, int64_t(header) + page + fault_around + 2 * page * int64_t(n_tensors));
}

TEST(WeightResidency, CpuEngineLeavesCublasUnloaded) {
    EngineOptions o;
    o.device = "cpu", o.threads = 1, o.n_ctx = 64;
    auto engine = Engine::load(test::source_path("models/tiny-lfm2-Q8_0.gguf"), o);
    Session s(engine, 64);
    s.append_tokens(std::vector<int32_t>{1, 2, 3});
    GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 2;
    NullSink sink;
    s.generate(g, sink);
    std::ifstream maps("/proc/self/maps");
    if (!maps) GTEST_SKIP() << "no /proc/self/maps";
    std::string line;
    while (std::getline(maps, line)) EXPECT_EQ(line.find("libcublas"), std::string::npos) << line;
}

}  // namespace
}  // namespace cera
