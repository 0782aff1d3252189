// GGUF writer: serializes metadata and tensor infos little-endian as GGUF v3,
// then each tensor's data at offsets aligned to the file's alignment.
#include "gguf/writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "core/check.h"
#include "gguf/keys.h"

namespace cera::gguf {

// ---- value builders ----

namespace {
Value make(ValueType t, uint64_t x) {
    Value v;
    v.type = t;
    v.v = x;
    return v;
}
Value make_signed(ValueType t, int64_t x) {
    Value v;
    v.type = t;
    v.v = x;
    return v;
}
}  // namespace

Value value_u8(uint8_t x) { return make(ValueType::kU8, x); }
Value value_i8(int8_t x) { return make_signed(ValueType::kI8, x); }
Value value_u16(uint16_t x) { return make(ValueType::kU16, x); }
Value value_i16(int16_t x) { return make_signed(ValueType::kI16, x); }
Value value_u32(uint32_t x) { return make(ValueType::kU32, x); }
Value value_i32(int32_t x) { return make_signed(ValueType::kI32, x); }
Value value_u64(uint64_t x) { return make(ValueType::kU64, x); }
Value value_i64(int64_t x) { return make_signed(ValueType::kI64, x); }

Value value_f32(float x) {
    Value v;
    v.type = ValueType::kF32;
    v.v = double(x);
    return v;
}

Value value_f64(double x) {
    Value v;
    v.type = ValueType::kF64;
    v.v = x;
    return v;
}

Value value_bool(bool x) {
    Value v;
    v.type = ValueType::kBool;
    v.v = x;
    return v;
}

Value value_string(std::string x) {
    Value v;
    v.type = ValueType::kString;
    v.v = std::move(x);
    return v;
}

Value value_array(ValueType elem, std::vector<Value> items) {
    auto a = std::make_shared<Array>();
    a->elem_type = elem;
    a->items = std::move(items);
    Value v;
    v.type = ValueType::kArray;
    v.v = std::move(a);
    return v;
}

Value value_string_array(const std::vector<std::string>& xs) {
    std::vector<Value> items;
    items.reserve(xs.size());
    for (const auto& s : xs) items.push_back(value_string(s));
    return value_array(ValueType::kString, std::move(items));
}

Value value_i32_array(std::span<const int32_t> xs) {
    std::vector<Value> items;
    items.reserve(xs.size());
    for (int32_t x : xs) items.push_back(value_i32(x));
    return value_array(ValueType::kI32, std::move(items));
}

Value value_f32_array(std::span<const float> xs) {
    std::vector<Value> items;
    items.reserve(xs.size());
    for (float x : xs) items.push_back(value_f32(x));
    return value_array(ValueType::kF32, std::move(items));
}

// ---- Writer ----

void Writer::set(std::string_view key, Value v) {
    if (key.empty()) throw_error(ErrorCode::kInvalidArgument, "GGUF writer: empty metadata key");
    if (key == keys::kAlignment) {  // the data layout follows the key, as a reader will
        if (v.type != ValueType::kU32)
            throw_error(ErrorCode::kInvalidArgument, "GGUF writer: general.alignment must be u32, got %s",
                        value_type_name(v.type));
        const uint64_t a = v.as_uint();
        if (a == 0 || (a & (a - 1)) != 0)
            throw_error(ErrorCode::kInvalidArgument, "GGUF writer: alignment %llu is not a non-zero power of two",
                        (unsigned long long)a);
        alignment_ = uint32_t(a);
    }
    for (auto& [k, old] : kv_) {
        if (k == key) {
            old = std::move(v);
            return;
        }
    }
    kv_.emplace_back(std::string(key), std::move(v));
}

void Writer::remove(std::string_view key) {
    if (key == keys::kAlignment) alignment_ = 32;
    for (auto it = kv_.begin(); it != kv_.end(); ++it) {
        if (it->first == key) {
            kv_.erase(it);
            return;
        }
    }
}

void Writer::set_alignment(uint32_t alignment) {
    set(keys::kAlignment, value_u32(alignment));  // set() checks for a non-zero power of two
}

Writer::Tensor& Writer::new_tensor(std::string name, GgmlType type, std::vector<int64_t> ne) {
    if (name.empty()) throw_error(ErrorCode::kInvalidArgument, "GGUF writer: empty tensor name");
    for (const auto& t : tensors_)
        if (t.name == name) throw_error(ErrorCode::kInvalidArgument, "GGUF writer: duplicate tensor '%s'", name.c_str());
    if (ne.empty() || ne.size() > 4)
        throw_error(ErrorCode::kInvalidArgument, "GGUF writer: tensor '%s' has %zu dimensions (expected 1..4)",
                    name.c_str(), ne.size());
    int64_t n = 1;
    for (int64_t d : ne) {
        if (d < 1 || __builtin_mul_overflow(n, d, &n))
            throw_error(ErrorCode::kInvalidArgument, "GGUF writer: tensor '%s' has a bad dimension %lld", name.c_str(),
                        (long long)d);
    }
    const TypeInfo& ti = type_info(type);
    if (ne[0] % ti.block_size != 0)
        throw_error(ErrorCode::kInvalidArgument,
                    "GGUF writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %lld", name.c_str(),
                    (long long)ne[0], ti.name, (long long)ti.block_size);
    Tensor t;
    t.name = std::move(name);
    t.type = type;
    t.ne = std::move(ne);
    t.n_bytes = size_t(n / ti.block_size) * ti.type_size;
    tensors_.push_back(std::move(t));
    return tensors_.back();
}

void Writer::add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, std::span<const uint8_t> bytes) {
    Tensor& t = new_tensor(std::move(name), type, std::move(ne));
    if (bytes.size() != t.n_bytes) {
        std::string n = t.name;
        size_t want = t.n_bytes;
        tensors_.pop_back();
        throw_error(ErrorCode::kInvalidArgument, "GGUF writer: tensor '%s' needs %zu bytes, got %zu", n.c_str(), want,
                    bytes.size());
    }
    t.bytes.assign(bytes.begin(), bytes.end());
}

void Writer::add_tensor(std::string name, GgmlType type, std::vector<int64_t> ne, FillFn fill) {
    Tensor& t = new_tensor(std::move(name), type, std::move(ne));
    t.fill = std::move(fill);
}

namespace {

class Bytes {
   public:
    template <typename T>
    void put(T x) {
        const size_t at = buf_.size();
        buf_.resize(at + sizeof(T));
        std::memcpy(buf_.data() + at, &x, sizeof(T));
    }
    void put_string(std::string_view s) {
        put<uint64_t>(s.size());
        const size_t at = buf_.size();
        buf_.resize(at + s.size());
        if (!s.empty()) std::memcpy(buf_.data() + at, s.data(), s.size());
    }
    void pad_to(uint64_t alignment) {
        while (buf_.size() % alignment) buf_.push_back(0);
    }
    std::vector<uint8_t>& data() { return buf_; }

   private:
    std::vector<uint8_t> buf_;
};

void put_value(Bytes& out, const std::string& key, const Value& v, ValueType want) {
    if (v.type != want)
        throw_error(ErrorCode::kInvalidArgument, "GGUF writer: key '%s': array item of type %s in an array of %s",
                    key.c_str(), value_type_name(v.type), value_type_name(want));
    switch (v.type) {
        case ValueType::kU8: out.put<uint8_t>(uint8_t(v.as_uint())); break;
        case ValueType::kI8: out.put<int8_t>(int8_t(v.as_int())); break;
        case ValueType::kU16: out.put<uint16_t>(uint16_t(v.as_uint())); break;
        case ValueType::kI16: out.put<int16_t>(int16_t(v.as_int())); break;
        case ValueType::kU32: out.put<uint32_t>(uint32_t(v.as_uint())); break;
        case ValueType::kI32: out.put<int32_t>(int32_t(v.as_int())); break;
        case ValueType::kU64: out.put<uint64_t>(std::get<uint64_t>(v.v)); break;
        case ValueType::kI64: out.put<int64_t>(std::get<int64_t>(v.v)); break;
        case ValueType::kF32: out.put<float>(float(std::get<double>(v.v))); break;
        case ValueType::kF64: out.put<double>(std::get<double>(v.v)); break;
        case ValueType::kBool: out.put<uint8_t>(std::get<bool>(v.v) ? 1 : 0); break;
        case ValueType::kString: out.put_string(std::get<std::string>(v.v)); break;
        case ValueType::kArray: {
            const Array& a = v.as_array();
            out.put<uint32_t>(uint32_t(a.elem_type));
            out.put<uint64_t>(a.items.size());
            for (const Value& item : a.items) put_value(out, key, item, a.elem_type);
            break;
        }
    }
}

}  // namespace

std::vector<uint8_t> Writer::header_bytes() const {
    Bytes out;
    out.put<uint32_t>(0x46554747);  // "GGUF"
    out.put<uint32_t>(3);
    out.put<uint64_t>(tensors_.size());
    out.put<uint64_t>(kv_.size());
    for (const auto& [key, v] : kv_) {
        out.put_string(key);
        out.put<uint32_t>(uint32_t(v.type));
        put_value(out, key, v, v.type);
    }
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
        out.put_string(t.name);
        out.put<uint32_t>(uint32_t(t.ne.size()));
        for (int64_t d : t.ne) out.put<uint64_t>(uint64_t(d));
        out.put<uint32_t>(uint32_t(t.type));
        out.put<uint64_t>(offset);
        offset += (t.n_bytes + alignment_ - 1) / alignment_ * alignment_;
    }
    out.pad_to(alignment_);
    return std::move(out.data());
}

template <typename Sink, typename OnTensor>
void Writer::emit(Sink& sink, OnTensor& on_tensor) const {
    std::vector<uint8_t> head = header_bytes();
    sink(head.data(), head.size());
    std::vector<uint8_t> buf;
    static const uint8_t kZeros[256] = {};
    for (const Tensor& t : tensors_) {
        if (t.fill) {
            buf.assign(t.n_bytes, 0);
            t.fill(buf.data(), buf.size());
            sink(buf.data(), buf.size());
        } else {
            sink(t.bytes.data(), t.bytes.size());
        }
        size_t pad = (alignment_ - t.n_bytes % alignment_) % alignment_;
        while (pad > 0) {
            size_t n = std::min(pad, sizeof kZeros);
            sink(kZeros, n);
            pad -= n;
        }
        on_tensor(t);
    }
}

std::vector<uint8_t> Writer::to_bytes() const {
    std::vector<uint8_t> out;
    auto sink = [&](const uint8_t* p, size_t n) { out.insert(out.end(), p, p + n); };
    auto on_tensor = [](const Tensor&) {};
    emit(sink, on_tensor);
    return out;
}

void Writer::write(const std::string& path, const ProgressFn& progress) const {
    const std::string tmp = path + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw_error(ErrorCode::kIo, "cannot create '%s': %s", tmp.c_str(), std::strerror(errno));
    std::unique_ptr<std::FILE, int (*)(std::FILE*)> guard(f, std::fclose);
    bool ok = true;
    uint64_t total = 0, done = 0;
    for (const Tensor& t : tensors_) total += t.n_bytes;
    auto sink = [&](const uint8_t* p, size_t n) {
        if (ok && n > 0 && std::fwrite(p, 1, n, f) != n) ok = false;
    };
    auto tensor_done = [&](const Tensor& t) {
        done += t.n_bytes;
        if (progress) progress(done, total);
    };
    try {
        emit(sink, tensor_done);
    } catch (...) {
        guard.reset();
        std::remove(tmp.c_str());
        throw;
    }
    int err = ok ? 0 : errno;
    if (std::fclose(guard.release()) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        std::remove(tmp.c_str());
        throw_error(ErrorCode::kIo, "cannot write '%s': %s", tmp.c_str(), std::strerror(err));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        err = errno;
        std::remove(tmp.c_str());
        throw_error(ErrorCode::kIo, "cannot rename '%s' to '%s': %s", tmp.c_str(), path.c_str(), std::strerror(err));
    }
}

}  // namespace cera::gguf
