// A read-only memory-mapped file. Move-only; unmaps on destruction.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace cera {

class MappedFile {
   public:
    MappedFile() = default;
    // Maps the whole file read-only; throws cera::Error (kIo) naming the path.
    explicit MappedFile(const std::string& path);
    ~MappedFile();
    MappedFile(MappedFile&& other) noexcept;
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }

   private:
    void reset();
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

// Drops this process's pages of the whole pages inside [p, p + bytes) of a read-only private file
// mapping (a MappedFile's): they stop counting in its resident memory, and a later read maps them
// from the file again, unchanged. Never for anonymous or written memory, whose pages would come
// back as zeros. The partial pages at either end stay (they belong to the neighbours too).
void release_mapped_pages(const void* p, size_t bytes);

// Fresh anonymous pages for `bytes` (at least one byte): the kernel zero-fills a page when it is first
// touched, so a large buffer costs memory and time only where it is written (in 2 MiB huge pages from
// 4 MiB up, where the kernel has them). Throws std::bad_alloc.
// unmap_pages(p, bytes) gives them back.
void* map_zero_pages(size_t bytes);
void unmap_pages(void* p, size_t bytes);

}  // namespace cera
