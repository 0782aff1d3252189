// Prefix cache: a hit (memory or disk) restores the exact state, so the logits after it equal
// those of a full prefill; corrupt, truncated and half-written entries are dropped, never
// loaded; the warm tier's LRU eviction keeps within its byte bound; the disk tier keeps within
// its bound; other KV types live in another namespace.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cera/engine.h"
#include "cera/session.h"
#include "runtime/prefix_cache.h"
#include "runtime/state_io.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kModel = cera::test::source_path("models/tiny-lfm2-Q8_0.gguf");
const std::string kShared = "Once upon a time, there was a little girl named Lily. She liked to play in the park.";
const std::string kTail = " One day, she saw a big red ball near the tree.";

struct TempDir {
    fs::path path;
    TempDir() {
        static int counter = 0;
        path = fs::temp_directory_path() /
               ("cera_prefix_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

std::shared_ptr<cera::Engine> engine(size_t bytes, const std::string& dir = "",
                                     cera::KvCacheType kv = cera::KvCacheType::kF32) {
    cera::EngineOptions o;
    o.device = "cpu";
    o.threads = 1;
    o.prefix_cache_bytes = bytes;
    o.prefix_cache_dir = dir;
    o.kv_type_k = o.kv_type_v = kv;
    return cera::Engine::load(kModel, o);
}

// Prefills text in a new session; returns the result and the logits after it.
struct Prefilled {
    cera::GenerationResult result;
    std::vector<float> logits;
    std::vector<int32_t> tokens;
};

Prefilled prefill(const std::shared_ptr<cera::Engine>& e, const std::string& text) {
    cera::Session s(e);
    s.append_text(text);
    cera::GenerateOptions g;
    g.max_tokens = 0;
    cera::NullSink sink;
    Prefilled p;
    p.result = s.generate(g, sink);
    const cera::SessionSnapshot snap = cera::decode_state(
        s.save_state(),
        {e->fingerprint(), cera::kv_state_code(e->options().kv_type_k, e->options().kv_type_v), e->info().n_vocab});
    p.logits = snap.logits;
    p.tokens = s.tokens();
    return p;
}

float max_diff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    float d = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
    return d;
}

std::vector<fs::path> entries(const std::string& dir) {
    std::vector<fs::path> out;
    for (const auto& it : fs::recursive_directory_iterator(dir))
        if (it.is_regular_file() && it.path().extension() == ".cstate") out.push_back(it.path());
    return out;
}

TEST(PrefixCache, WarmHitRestoresTheExactState) {
    const Prefilled want = prefill(engine(0), kShared + kTail);  // no cache: a full prefill

    auto e = engine(64 << 20);
    const Prefilled first = prefill(e, kShared);
    EXPECT_EQ(first.result.cached_tokens, 0);
    EXPECT_EQ(e->prefix_cache_stats().misses, 1u);

    const Prefilled hit = prefill(e, kShared + kTail);
    EXPECT_EQ(hit.result.cached_tokens, int32_t(first.tokens.size()));
    EXPECT_EQ(hit.result.prompt_tokens, int32_t(want.tokens.size() - first.tokens.size()));
    EXPECT_EQ(e->prefix_cache_stats().hits_memory, 1u);
    EXPECT_EQ(hit.tokens, want.tokens);
    EXPECT_LE(max_diff(hit.logits, want.logits), 1e-5f);

    // The exact same prompt again: everything is restored, logits included.
    const Prefilled again = prefill(e, kShared + kTail);
    EXPECT_EQ(again.result.prompt_tokens, 0);
    EXPECT_EQ(again.result.cached_tokens, int32_t(want.tokens.size()));
    EXPECT_LE(max_diff(again.logits, want.logits), 1e-5f);

    // A prompt sharing only part of a cached entry (not at a boundary) misses.
    const Prefilled other = prefill(e, "Once upon a time, there was a big dog.");
    EXPECT_EQ(other.result.cached_tokens, 0);
}

TEST(PrefixCache, GenerationAfterAHitMatches) {
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 24;
    cera::NullSink sink;
    auto plain = engine(0);
    cera::Session a(plain);
    a.append_text(kShared + kTail);
    const std::string want = a.generate(g, sink).text;

    auto e = engine(64 << 20);
    prefill(e, kShared);
    cera::Session b(e);
    b.append_text(kShared + kTail);
    const cera::GenerationResult r = b.generate(g, sink);
    EXPECT_GT(r.cached_tokens, 0);
    EXPECT_EQ(r.text, want);
}

TEST(PrefixCache, ChunkBoundariesAreEntries) {
    cera::EngineOptions o;
    o.device = "cpu";
    o.threads = 1;
    o.n_batch = 16;
    o.prefix_cache_bytes = 64 << 20;
    auto e = cera::Engine::load(kModel, o);
    const Prefilled a = prefill(e, kShared + kTail);
    ASSERT_GT(a.tokens.size(), 32u);
    // Another prompt sharing the first 33 tokens resumes from the 32-token chunk boundary.
    std::vector<int32_t> ids(a.tokens.begin(), a.tokens.begin() + 33);
    const std::vector<int32_t> other = e->tokenize(" And then it rained.", false);
    ids.insert(ids.end(), other.begin(), other.end());
    cera::Session s(e);
    s.append_tokens(ids);
    cera::GenerateOptions g;
    g.max_tokens = 0;
    cera::NullSink sink;
    const cera::GenerationResult r = s.generate(g, sink);
    EXPECT_EQ(r.cached_tokens, 32);
    EXPECT_EQ(r.prompt_tokens, int32_t(ids.size()) - 32);
}

// After a context shift the state is no longer that of a fresh evaluation of its tokens: it
// must never become an entry that another session would restore.
TEST(PrefixCache, ShiftedStatesAreNotStored) {
    auto e = engine(64 << 20);
    cera::Session s(e, 48);
    s.append_text(kShared);
    cera::GenerateOptions g;
    g.sampling.temperature = 0.0f;
    g.max_tokens = 60;
    g.ignore_eos = true;
    g.n_keep = 4;
    cera::NullSink sink;
    const cera::GenerationResult r = s.generate(g, sink);
    ASSERT_GE(r.context_shifts, 1);
    const uint64_t stores = e->prefix_cache_stats().stores;
    EXPECT_EQ(stores, 1u);  // the prompt, before any shift
    s.append_text(" and");
    g.max_tokens = 1;
    s.generate(g, sink);
    EXPECT_EQ(e->prefix_cache_stats().stores, stores);
    // A reset session stores again.
    s.reset();
    s.append_text("Once upon a time");
    s.generate(g, sink);
    EXPECT_EQ(e->prefix_cache_stats().stores, stores + 1);
}

TEST(PrefixCache, ColdHitFromAnotherEngine) {
    TempDir dir;
    const Prefilled want = prefill(engine(0), kShared + kTail);
    {
        auto writer = engine(0, dir.path.string());
        prefill(writer, kShared);
        EXPECT_EQ(entries(dir.path.string()).size(), 1u);
    }
    auto reader = engine(0, dir.path.string());  // a new process would see the same files
    const Prefilled hit = prefill(reader, kShared + kTail);
    EXPECT_EQ(reader->prefix_cache_stats().hits_disk, 1u);
    EXPECT_GT(hit.result.cached_tokens, 0);
    EXPECT_LE(max_diff(hit.logits, want.logits), 1e-5f);

    // Another KV type has its own namespace: no hit.
    auto f16 = engine(0, dir.path.string(), cera::KvCacheType::kF16);
    EXPECT_EQ(prefill(f16, kShared + kTail).result.cached_tokens, 0);
}

// Writes one entry for kShared into dir; returns its path.
fs::path write_entry(const std::string& dir) {
    auto e = engine(0, dir);
    prefill(e, kShared);
    auto files = entries(dir);
    EXPECT_EQ(files.size(), 1u);
    return files.empty() ? fs::path() : files[0];
}

// A damaged entry is removed and never loaded: the lookup misses.
void expect_dropped(const std::string& dir, const fs::path& file) {
    auto e = engine(0, dir);
    const Prefilled p = prefill(e, kShared + kTail);
    EXPECT_EQ(p.result.cached_tokens, 0);
    EXPECT_EQ(e->prefix_cache_stats().dropped_corrupt, 1u);
    EXPECT_EQ(e->prefix_cache_stats().hits_disk, 0u);
    // The damaged file is gone (the new prompt's own entry replaces nothing of it).
    if (fs::exists(file)) {
        // The same name can only come back as a fresh, valid entry written by this prefill.
        EXPECT_NO_THROW(cera::decode_state(cera::read_file_bytes(file.string()),
                                           {e->fingerprint(), 0u, e->info().n_vocab}));
    }
}

TEST(PrefixCache, CorruptEntryIsDropped) {
    TempDir dir;
    const fs::path file = write_entry(dir.path.string());
    {
        std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(std::streamoff(fs::file_size(file) / 2));
        char c = 0;
        f.read(&c, 1);
        c ^= 0x5a;
        f.seekp(std::streamoff(fs::file_size(file) / 2));
        f.write(&c, 1);
    }
    expect_dropped(dir.path.string(), file);
}

TEST(PrefixCache, TruncatedEntryIsDropped) {
    TempDir dir;
    const fs::path file = write_entry(dir.path.string());
    fs::resize_file(file, fs::file_size(file) / 3);
    expect_dropped(dir.path.string(), file);
}

TEST(PrefixCache, KilledWriterLeavesNothingThatLoads) {
    TempDir dir;
    const fs::path file = write_entry(dir.path.string());
    const std::vector<uint8_t> bytes = cera::read_file_bytes(file.string());
    fs::remove(file);
    // A writer killed before its rename: a partial temp file next to where the entry would be.
    {
        std::ofstream f(file.string() + ".tmp.99999.0", std::ios::binary);
        f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size() / 2));
    }
    {
        auto e = engine(0, dir.path.string());
        EXPECT_EQ(prefill(e, kShared + kTail).result.cached_tokens, 0);
        EXPECT_EQ(e->prefix_cache_stats().hits_disk, 0u);
    }
    // A partial entry under the final name (a file system without atomic rename, a crash).
    for (const auto& f : entries(dir.path.string())) fs::remove(f);
    {
        std::ofstream f(file, std::ios::binary);
        f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size() - 1));
    }
    expect_dropped(dir.path.string(), file);
}

// The warm tier alone, with synthetic states: LRU order and the byte bound.
cera::SessionSnapshot synthetic(int32_t first_token, size_t n_tokens, size_t state_bytes) {
    cera::SessionSnapshot s;
    for (size_t i = 0; i < n_tokens; ++i) s.tokens.push_back(first_token + int32_t(i));
    s.n_evaluated = int32_t(n_tokens);
    // no logits: the identity below has a large vocabulary
    s.model_state.assign(state_bytes, uint8_t(first_token));
    return s;
}

TEST(PrefixCache, LruEvictionRespectsTheByteBound) {
    const cera::StateIdentity id{42, 0, 100000};
    std::vector<uint8_t> blob;
    cera::encode_state(id, synthetic(1, 10, 1000), blob);
    const size_t entry = blob.size();
    cera::PrefixCacheConfig cfg;
    cfg.max_bytes = entry * 2 + entry / 2;  // room for two entries
    cera::PrefixCache cache(cfg, id);

    const auto a = synthetic(100, 10, 1000), b = synthetic(200, 10, 1000), c = synthetic(300, 10, 1000);
    cache.store(a);
    cache.store(b);
    EXPECT_EQ(cache.counters().memory_entries, 2u);
    ASSERT_TRUE(cache.lookup(a.tokens, 0).has_value());  // a is now the most recent
    cache.store(c);                                      // evicts b, the least recent
    const cera::PrefixCacheCounters k = cache.counters();
    EXPECT_EQ(k.evictions, 1u);
    EXPECT_EQ(k.memory_entries, 2u);
    EXPECT_LE(k.memory_bytes, cfg.max_bytes);
    EXPECT_TRUE(cache.lookup(a.tokens, 0).has_value());
    EXPECT_FALSE(cache.lookup(b.tokens, 0).has_value());
    EXPECT_TRUE(cache.lookup(c.tokens, 0).has_value());

    // A longer prompt finds its longest cached prefix; min_len excludes shorter ones.
    std::vector<int32_t> longer = a.tokens;
    longer.push_back(7);
    auto hit = cache.lookup(longer, 0);
    ASSERT_TRUE(hit.has_value());
    EXPECT_EQ(hit->snapshot.tokens, a.tokens);
    EXPECT_EQ(hit->snapshot.model_state, a.model_state);
    EXPECT_FALSE(cache.lookup(longer, a.tokens.size()).has_value());

    // An entry larger than the whole bound is not kept.
    cache.store(synthetic(400, 10, cfg.max_bytes));
    EXPECT_LE(cache.counters().memory_bytes, cfg.max_bytes);
}

TEST(PrefixCache, DiskTierRespectsItsBound) {
    TempDir dir;
    const cera::StateIdentity id{7, 0, 100000};
    std::vector<uint8_t> blob;
    cera::encode_state(id, synthetic(1, 10, 4000), blob);
    cera::PrefixCacheConfig cfg;
    cfg.dir = dir.path.string();
    cfg.max_disk_bytes = blob.size() * 3;
    cera::PrefixCache cache(cfg, id);
    for (int i = 0; i < 6; ++i) cache.store(synthetic(1000 * (i + 1), 10, 4000));
    uint64_t total = 0;
    for (const auto& f : entries(dir.path.string())) total += fs::file_size(f);
    EXPECT_LE(total, cfg.max_disk_bytes);
    EXPECT_GE(cache.counters().disk_evictions, 3u);
    // The newest survives and loads.
    EXPECT_TRUE(cache.lookup(synthetic(6000, 10, 4000).tokens, 0).has_value());

    // Another model's identity sees nothing of this namespace.
    cera::PrefixCache other(cfg, cera::StateIdentity{8, 0, 100000});
    EXPECT_FALSE(other.lookup(synthetic(6000, 10, 4000).tokens, 0).has_value());
}

}  // namespace
