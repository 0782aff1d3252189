#include "core/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "core/check.h"

namespace cera {

MappedFile::MappedFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_error(ErrorCode::kIo, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        throw_error(ErrorCode::kIo, "'%s' is not a regular file", path.c_str());
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int err = errno;
            ::close(fd);
            throw_error(ErrorCode::kIo, "cannot map '%s': %s", path.c_str(), std::strerror(err));
        }
        data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
}

MappedFile::~MappedFile() { reset(); }

void release_mapped_pages(const void* p, size_t bytes) {
    const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
    const uintptr_t begin = (uintptr_t(p) + page - 1) & ~(page - 1);
    const uintptr_t end = (uintptr_t(p) + bytes) & ~(page - 1);
    if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);  // failure keeps them
}

namespace {
constexpr size_t kHugeBufferBytes = size_t(4) << 20;  // two huge pages
}  // namespace

void* map_zero_pages(size_t bytes) {
    void* p = ::mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Buffers of several huge pages take them where the kernel offers them only on request (transparent
    // huge pages in `madvise` mode): one fault then maps 2 MiB instead of 4 KiB, and a first touch of
    // fresh memory costs ~11 us a 4 KiB page on virtual machines (a KV cache filled at 0.4 GB/s).
    if (bytes >= kHugeBufferBytes) ::madvise(p, bytes, MADV_HUGEPAGE);  // failure keeps small pages
    return p;
}

void unmap_pages(void* p, size_t bytes) { ::munmap(p, std::max<size_t>(bytes, 1)); }

void MappedFile::reset() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
}

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
    o.data_ = nullptr;
    o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
    if (this != &o) {
        reset();
        data_ = o.data_;
        size_ = o.size_;
        path_ = std::move(o.path_);
        o.data_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

}  // namespace cera
