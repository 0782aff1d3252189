// Saved session states: header with checksums, payload, atomic writes.
#include "runtime/state_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "gguf/gguf.h"

namespace cera {
namespace {

constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kP5 = 0x27D4EB2F165667C5ull;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t load64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
inline uint32_t load32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}
inline uint64_t round64(uint64_t acc, uint64_t in) { return rotl(acc + in * kP2, 31) * kP1; }
inline uint64_t merge64(uint64_t acc, uint64_t v) { return (acc ^ round64(0, v)) * kP1 + kP4; }

constexpr char kMagic[8] = {'C', 'E', 'R', 'A', 'S', 'T', 'A', 'T'};
constexpr uint32_t kVersion = 1;

struct StateHeader {
    char magic[8];
    uint32_t version;
    uint32_t header_bytes;  // sizeof(StateHeader)
    uint64_t fingerprint;
    uint32_t kv_type;
    int32_t n_vocab;
    int32_t n_tokens;
    int32_t n_evaluated;
    uint32_t has_logits;
    uint32_t reserved;
    uint64_t model_state_bytes;
    uint64_t payload_bytes;
    uint64_t payload_hash;  // hash64 of the payload
    uint64_t header_hash;   // hash64 of the header bytes before this field
};
static_assert(sizeof(StateHeader) == 80);

}  // namespace

uint32_t kv_state_code(KvCacheType k, KvCacheType v) {
    return k == v ? uint32_t(k) : 256 + 16 * uint32_t(k) + uint32_t(v);
}

std::string kv_state_name(uint32_t code) {
    if (code < 256) return kv_cache_type_name(KvCacheType(code));
    return std::string(kv_cache_type_name(KvCacheType((code - 256) / 16))) + "-" +
           kv_cache_type_name(KvCacheType((code - 256) % 16));
}

uint64_t hash64(const void* data, size_t n, uint64_t seed) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    const uint8_t* const end = p + n;
    uint64_t h;
    if (n >= 32) {
        uint64_t v1 = seed + kP1 + kP2, v2 = seed + kP2, v3 = seed, v4 = seed - kP1;
        const uint8_t* const limit = end - 32;
        do {
            v1 = round64(v1, load64(p));
            v2 = round64(v2, load64(p + 8));
            v3 = round64(v3, load64(p + 16));
            v4 = round64(v4, load64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
        h = merge64(h, v1);
        h = merge64(h, v2);
        h = merge64(h, v3);
        h = merge64(h, v4);
    } else {
        h = seed + kP5;
    }
    h += uint64_t(n);
    for (; p + 8 <= end; p += 8) h = rotl(h ^ round64(0, load64(p)), 27) * kP1 + kP4;
    if (p + 4 <= end) {
        h = rotl(h ^ (uint64_t(load32(p)) * kP1), 23) * kP2 + kP3;
        p += 4;
    }
    for (; p < end; ++p) h = rotl(h ^ (uint64_t(*p) * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
}

uint64_t model_fingerprint(const gguf::File& f) {
    uint64_t h = hash64(nullptr, 0, uint64_t(f.file_size()));
    const auto& tensors = f.tensors();
    // A mapped file is read through a descriptor: the CPU backend drops the mapped pages of the weights
    // it holds in a copy of its own, and a read through the mapping would map them again (up to a large
    // folio per read).
    const int fd = f.mapped() ? ::open(f.path().c_str(), O_RDONLY | O_CLOEXEC) : -1;
    std::vector<uint8_t> buf;
    const uint8_t* start = nullptr;
    auto hash_at = [&](const uint8_t* p, size_t n) {
        buf.resize(n);
        if (fd >= 0 && ::pread(fd, buf.data(), n, off_t(p - start)) == ssize_t(n)) return hash64(buf.data(), n, h);
        return hash64(p, n, h);
    };
    if (!tensors.empty() && tensors[0].data) {
        // The mapping starts data_offset + offset bytes before the first tensor's data.
        start = tensors[0].data - tensors[0].offset - f.data_offset();
        h = hash_at(start, size_t(f.data_offset()));
    }
    for (const auto& t : tensors) {
        h = hash64(t.name.data(), t.name.size(), h);
        const uint64_t shape[6] = {uint64_t(t.type), t.offset, t.n_bytes, uint64_t(t.ne.size()),
                                   t.ne.empty() ? 0 : uint64_t(t.ne[0]), uint64_t(t.n_elements())};
        h = hash64(shape, sizeof shape, h);
        if (t.data && t.n_bytes > 0) {
            const size_t k = std::min<size_t>(64, t.n_bytes);
            h = hash_at(t.data, k);                          // the first bytes
            h = hash_at(t.data + t.n_bytes - k, k);          // the last bytes
            h = hash_at(t.data + t.n_bytes / 2 - k / 2, k);  // and the middle
        }
    }
    if (fd >= 0) ::close(fd);
    return h;
}

void encode_state(const StateIdentity& id, const SessionSnapshot& snap, std::vector<uint8_t>& out) {
    StateHeader hd{};
    std::memcpy(hd.magic, kMagic, sizeof kMagic);
    hd.version = kVersion;
    hd.header_bytes = sizeof(StateHeader);
    hd.fingerprint = id.fingerprint;
    hd.kv_type = id.kv_type;
    hd.n_vocab = id.n_vocab;
    hd.n_tokens = int32_t(snap.tokens.size());
    hd.n_evaluated = snap.n_evaluated;
    hd.has_logits = snap.logits.empty() ? 0 : 1;
    CERA_CHECK(snap.logits.empty() || snap.logits.size() == size_t(id.n_vocab));
    hd.model_state_bytes = snap.model_state.size();
    const size_t tok_bytes = snap.tokens.size() * 4, logit_bytes = snap.logits.size() * 4;
    hd.payload_bytes = tok_bytes + logit_bytes + snap.model_state.size();
    out.resize(sizeof hd + hd.payload_bytes);
    uint8_t* p = out.data() + sizeof hd;
    if (tok_bytes) std::memcpy(p, snap.tokens.data(), tok_bytes);
    if (logit_bytes) std::memcpy(p + tok_bytes, snap.logits.data(), logit_bytes);
    if (!snap.model_state.empty())
        std::memcpy(p + tok_bytes + logit_bytes, snap.model_state.data(), snap.model_state.size());
    hd.payload_hash = hash64(p, hd.payload_bytes);
    hd.header_hash = hash64(&hd, offsetof(StateHeader, header_hash));
    std::memcpy(out.data(), &hd, sizeof hd);
}

SessionSnapshot decode_state(std::span<const uint8_t> bytes, const StateIdentity& expect) {
    StateHeader hd{};
    if (bytes.size() < sizeof hd)
        throw_error(ErrorCode::kInvalidFile, "saved state: %zu bytes is shorter than its header", bytes.size());
    std::memcpy(&hd, bytes.data(), sizeof hd);
    if (std::memcmp(hd.magic, kMagic, sizeof kMagic) != 0)
        throw_error(ErrorCode::kInvalidFile, "saved state: not a cera state (bad magic)");
    if (hd.version != kVersion)
        throw_error(ErrorCode::kInvalidFile, "saved state: version %u, this build reads version %u", hd.version,
                    kVersion);
    if (hd.header_bytes != sizeof hd || hd.header_hash != hash64(&hd, offsetof(StateHeader, header_hash)))
        throw_error(ErrorCode::kInvalidFile, "saved state: corrupt header (checksum mismatch)");
    if (hd.fingerprint != expect.fingerprint)
        throw_error(ErrorCode::kInvalidFile,
                    "saved state: made by a different model (fingerprint %016llx, this model %016llx)",
                    (unsigned long long)hd.fingerprint, (unsigned long long)expect.fingerprint);
    if (hd.kv_type != expect.kv_type)
        throw_error(ErrorCode::kInvalidFile, "saved state: KV cache type %s, this engine uses %s",
                    kv_state_name(hd.kv_type).c_str(), kv_state_name(expect.kv_type).c_str());
    if (hd.n_vocab != expect.n_vocab)
        throw_error(ErrorCode::kInvalidFile, "saved state: vocabulary of %d tokens, the model has %d", hd.n_vocab,
                    expect.n_vocab);
    if (hd.n_tokens < 0 || hd.n_evaluated < 0 || hd.n_evaluated > hd.n_tokens)
        throw_error(ErrorCode::kInvalidFile, "saved state: bad token counts (%d evaluated of %d)", hd.n_evaluated,
                    hd.n_tokens);
    const uint64_t tok_bytes = uint64_t(hd.n_tokens) * 4, logit_bytes = hd.has_logits ? uint64_t(hd.n_vocab) * 4 : 0;
    if (hd.payload_bytes != tok_bytes + logit_bytes + hd.model_state_bytes)
        throw_error(ErrorCode::kInvalidFile, "saved state: inconsistent sizes in the header");
    if (bytes.size() - sizeof hd != hd.payload_bytes)
        throw_error(ErrorCode::kInvalidFile, "saved state: %zu payload bytes, the header says %llu (truncated?)",
                    bytes.size() - sizeof hd, (unsigned long long)hd.payload_bytes);
    const uint8_t* p = bytes.data() + sizeof hd;
    if (hash64(p, hd.payload_bytes) != hd.payload_hash)
        throw_error(ErrorCode::kInvalidFile, "saved state: corrupt data (checksum mismatch)");
    SessionSnapshot s;
    s.tokens.resize(size_t(hd.n_tokens));
    if (tok_bytes) std::memcpy(s.tokens.data(), p, tok_bytes);
    s.n_evaluated = hd.n_evaluated;
    if (logit_bytes) {
        s.logits.resize(size_t(hd.n_vocab));
        std::memcpy(s.logits.data(), p + tok_bytes, logit_bytes);
    }
    s.model_state.assign(p + tok_bytes + logit_bytes, p + hd.payload_bytes);
    for (int32_t t : s.tokens)
        if (t < 0 || t >= expect.n_vocab)
            throw_error(ErrorCode::kInvalidFile, "saved state: token id %d outside the vocabulary", t);
    return s;
}

void write_file_atomic(const std::string& path, std::span<const uint8_t> bytes, bool durable) {
    static std::atomic<uint64_t> counter{0};
    const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw_error(ErrorCode::kIo, "cannot create %s: %s", tmp.c_str(), std::strerror(errno));
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int err = errno;
            ::close(fd);
            ::unlink(tmp.c_str());
            throw_error(ErrorCode::kIo, "cannot write %s: %s", tmp.c_str(), std::strerror(err));
        }
        done += size_t(n);
    }
    if ((durable && ::fsync(fd) != 0) || ::close(fd) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw_error(ErrorCode::kIo, "cannot write %s: %s", tmp.c_str(), std::strerror(err));
    }
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err = errno;
        ::unlink(tmp.c_str());
        throw_error(ErrorCode::kIo, "cannot rename %s to %s: %s", tmp.c_str(), path.c_str(), std::strerror(err));
    }
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_error(ErrorCode::kIo, "cannot open %s: %s", path.c_str(), std::strerror(errno));
    std::vector<uint8_t> out;
    const off_t size = ::lseek(fd, 0, SEEK_END);
    if (size > 0) out.reserve(size_t(size));
    ::lseek(fd, 0, SEEK_SET);
    uint8_t buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int err = errno;
            ::close(fd);
            throw_error(ErrorCode::kIo, "cannot read %s: %s", path.c_str(), std::strerror(err));
        }
        if (n == 0) break;
        out.insert(out.end(), buf, buf + n);
    }
    ::close(fd);
    return out;
}

}  // namespace cera
