// libFuzzer target for the GGUF reader. Any input must parse or throw
// cera::Error; a file that parses must keep its tensors inside the buffer,
// answer every typed getter without crashing, and survive a write/read round
// trip through the writer unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cera/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"

namespace {

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "gguf_fuzz: property violated: %s\n", what);
    std::abort();
}

void poke_getters(const cera::gguf::File& f, const std::string& key) {
    try { (void)f.get_u32(key); } catch (const cera::Error&) {}
    try { (void)f.get_i64(key); } catch (const cera::Error&) {}
    try { (void)f.get_f32(key); } catch (const cera::Error&) {}
    try { (void)f.get_bool(key); } catch (const cera::Error&) {}
    try { (void)f.get_string(key); } catch (const cera::Error&) {}
    try { (void)f.get_string_array(key); } catch (const cera::Error&) {}
    try { (void)f.get_int_array(key); } catch (const cera::Error&) {}
    try { (void)f.get_f32_array(key); } catch (const cera::Error&) {}
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    std::unique_ptr<cera::gguf::File> f;
    try {
        f = cera::gguf::File::from_memory(data, size, "fuzz");
    } catch (const cera::Error& e) {
        if (std::strchr(e.what(), '\n') || !*e.what()) fail("error message is empty or spans lines");
        return 0;
    }
    volatile uint8_t sink = 0;
    for (const auto& t : f->tensors()) {
        if (t.data < data || t.n_bytes > size_t(data + size - t.data)) fail("tensor data outside the buffer");
        if (t.n_bytes > 0) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
    }
    for (const auto& kv : f->metadata()) poke_getters(*f, kv.first);

    // The round trip writes the file again, padded to its alignment: a valid file of a few bytes can
    // ask for a 2 GiB alignment (its data section is empty). Past 1 MiB the rewrite is not tried,
    // so that one input cannot take the target's memory and time.
    if (f->alignment() > (uint64_t(1) << 20)) return 0;
    cera::gguf::Writer w;
    for (const auto& [k, v] : f->metadata()) w.set(k, v);
    for (const auto& t : f->tensors())
        w.add_tensor(t.name, t.type, t.ne, std::span<const uint8_t>(t.data, t.n_bytes));
    std::vector<uint8_t> bytes = w.to_bytes();
    std::unique_ptr<cera::gguf::File> g;
    try {
        g = cera::gguf::File::from_memory(bytes.data(), bytes.size(), "rewritten");
    } catch (const cera::Error& e) {
        std::fprintf(stderr, "%s\n", e.what());
        fail("a rewritten file does not parse");
    }
    if (g->metadata().size() != f->metadata().size() || g->tensors().size() != f->tensors().size())
        fail("round trip changed the counts");
    for (size_t i = 0; i < f->tensors().size(); ++i) {
        const auto& a = f->tensors()[i];
        const auto& b = g->tensors()[i];
        if (a.name != b.name || a.type != b.type || a.ne != b.ne || a.n_bytes != b.n_bytes ||
            std::memcmp(a.data, b.data, a.n_bytes) != 0)
            fail("round trip changed a tensor");
    }
    for (size_t i = 0; i < f->metadata().size(); ++i)
        if (f->metadata()[i].first != g->metadata()[i].first) fail("round trip changed a key");
    return 0;
}
