// GGUF reader: header, metadata, tensor infos and the data section.
//
// Every read goes through Cursor, which checks the remaining bytes first. Counts
// are bounded by what the remaining bytes could hold before anything is
// allocated, so a hostile file can neither read out of bounds nor make the
// reader allocate far more than the file's own size. Tensor regions are checked
// for range, alignment and overlap once all infos are known.
#include "gguf/gguf.h"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "core/utf8.h"
#include "gguf/keys.h"

namespace cera::gguf {

const char* value_type_name(ValueType t) {
    switch (t) {
        case ValueType::kU8: return "u8";
        case ValueType::kI8: return "i8";
        case ValueType::kU16: return "u16";
        case ValueType::kI16: return "i16";
        case ValueType::kU32: return "u32";
        case ValueType::kI32: return "i32";
        case ValueType::kF32: return "f32";
        case ValueType::kBool: return "bool";
        case ValueType::kString: return "string";
        case ValueType::kArray: return "array";
        case ValueType::kU64: return "u64";
        case ValueType::kI64: return "i64";
        case ValueType::kF64: return "f64";
    }
    return "unknown";
}

// ---- Value ----

bool Value::is_integer() const {
    switch (type) {
        case ValueType::kU8:
        case ValueType::kI8:
        case ValueType::kU16:
        case ValueType::kI16:
        case ValueType::kU32:
        case ValueType::kI32:
        case ValueType::kU64:
        case ValueType::kI64: return true;
        default: return false;
    }
}

static bool is_unsigned_type(ValueType t) {
    return t == ValueType::kU8 || t == ValueType::kU16 || t == ValueType::kU32 || t == ValueType::kU64;
}

int64_t Value::as_int() const {
    if (is_integer()) {
        if (is_unsigned_type(type)) {
            uint64_t u = std::get<uint64_t>(v);
            if (u > uint64_t(std::numeric_limits<int64_t>::max()))
                throw_error(ErrorCode::kInvalidFile, "value %" PRIu64 " does not fit i64", u);
            return int64_t(u);
        }
        return std::get<int64_t>(v);
    }
    throw_error(ErrorCode::kInvalidFile, "expected an integer, got %s", value_type_name(type));
}

uint64_t Value::as_uint() const {
    if (is_integer()) {
        if (is_unsigned_type(type)) return std::get<uint64_t>(v);
        int64_t i = std::get<int64_t>(v);
        if (i < 0) throw_error(ErrorCode::kInvalidFile, "value %" PRId64 " is negative, expected unsigned", i);
        return uint64_t(i);
    }
    throw_error(ErrorCode::kInvalidFile, "expected an integer, got %s", value_type_name(type));
}

double Value::as_double() const {
    if (is_float()) return std::get<double>(v);
    if (is_integer()) return is_unsigned_type(type) ? double(std::get<uint64_t>(v)) : double(std::get<int64_t>(v));
    throw_error(ErrorCode::kInvalidFile, "expected a number, got %s", value_type_name(type));
}

const std::string& Value::as_string() const {
    if (type != ValueType::kString)
        throw_error(ErrorCode::kInvalidFile, "expected string, got %s", value_type_name(type));
    return std::get<std::string>(v);
}

const Array& Value::as_array() const {
    if (type != ValueType::kArray)
        throw_error(ErrorCode::kInvalidFile, "expected array, got %s", value_type_name(type));
    return *std::get<std::shared_ptr<Array>>(v);
}

int64_t TensorInfo::n_elements() const {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
}

// ---- parsing ----

namespace {

constexpr uint32_t kMaxArrayDepth = 8;       // nesting levels of arrays within arrays
constexpr uint32_t kMaxDims = 4;             // GGML_MAX_DIMS
constexpr uint64_t kMaxKeyLength = 65535;    // the GGUF spec's bound on key length
constexpr size_t kMinKvBytes = 8 + 1 + 4 + 1;          // key length, 1-byte key, type, smallest value
constexpr size_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name len, name, n_dims, ne0, type, offset

bool valid_value_type(uint32_t t) { return t <= uint32_t(ValueType::kF64); }

// Smallest encoded size of one value of type t (for bounding counts).
size_t min_value_bytes(ValueType t) {
    switch (t) {
        case ValueType::kU8:
        case ValueType::kI8:
        case ValueType::kBool: return 1;
        case ValueType::kU16:
        case ValueType::kI16: return 2;
        case ValueType::kU32:
        case ValueType::kI32:
        case ValueType::kF32: return 4;
        case ValueType::kU64:
        case ValueType::kI64:
        case ValueType::kF64:
        case ValueType::kString: return 8;
        case ValueType::kArray: return 12;
    }
    return 1;
}

// A printable excerpt of a name for error messages: at most 64 bytes, control bytes escaped.
std::string printable(std::string_view s) {
    std::string out;
    const bool valid = utf8::is_valid(s);
    size_t cut = std::min<size_t>(s.size(), 64);
    while (valid && cut < s.size() && cut > 0 && (uint8_t(s[cut]) & 0xC0) == 0x80) --cut;  // whole characters only
    for (size_t i = 0; i < cut; ++i) {
        uint8_t c = uint8_t(s[i]);
        if (c < 0x20 || c == 0x7F || (c >= 0x80 && !valid)) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    if (cut < s.size()) out += "...";
    return out;
}

class Parser {
   public:
    Parser(const uint8_t* data, size_t size, const std::string& path) : p_(data), size_(size), path_(path) {}

    [[noreturn]] void fail(const char* fmt, ...) const __attribute__((format(printf, 2, 3))) {
        va_list ap;
        va_start(ap, fmt);
        char buf[512];
        std::vsnprintf(buf, sizeof buf, fmt, ap);
        va_end(ap);
        throw Error(ErrorCode::kInvalidFile, path_ + ": " + buf);
    }

    size_t pos() const { return pos_; }
    size_t remaining() const { return size_ - pos_; }

    void need(size_t n, const char* what) const {
        if (n > remaining())
            fail("%s: needs %zu bytes at offset %zu but only %zu remain (file size %zu)", what, n, pos_, remaining(),
                 size_);
    }

    template <typename T>
    T read(const char* what) {
        need(sizeof(T), what);
        T v;
        std::memcpy(&v, p_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return v;
    }

    std::string read_string(const char* what) {
        uint64_t len = read<uint64_t>(what);
        if (len > remaining())
            fail("%s: string length %" PRIu64 " at offset %zu exceeds the %zu bytes left in the file", what, len,
                 pos_ - 8, remaining());
        std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(len));
        pos_ += size_t(len);
        return s;
    }

    // Reads one value of type t; `ctx` names the key for errors.
    Value read_value(ValueType t, const std::string& key, uint32_t depth) {
        Value val;
        val.type = t;
        const char* what = "metadata value";
        switch (t) {
            case ValueType::kU8: val.v = uint64_t(read<uint8_t>(what)); break;
            case ValueType::kI8: val.v = int64_t(read<int8_t>(what)); break;
            case ValueType::kU16: val.v = uint64_t(read<uint16_t>(what)); break;
            case ValueType::kI16: val.v = int64_t(read<int16_t>(what)); break;
            case ValueType::kU32: val.v = uint64_t(read<uint32_t>(what)); break;
            case ValueType::kI32: val.v = int64_t(read<int32_t>(what)); break;
            case ValueType::kU64: val.v = read<uint64_t>(what); break;
            case ValueType::kI64: val.v = read<int64_t>(what); break;
            case ValueType::kF32: val.v = double(read<float>(what)); break;
            case ValueType::kF64: val.v = read<double>(what); break;
            case ValueType::kBool: {
                uint8_t b = read<uint8_t>(what);
                if (b > 1)
                    fail("key '%s': bool value %u at offset %zu is neither 0 nor 1", printable(key).c_str(), b, pos_ - 1);
                val.v = b == 1;
                break;
            }
            case ValueType::kString: val.v = read_string(what); break;
            case ValueType::kArray: {
                if (depth >= kMaxArrayDepth)
                    fail("key '%s': arrays nested deeper than %u levels", printable(key).c_str(), kMaxArrayDepth);
                uint32_t et = read<uint32_t>("array element type");
                if (!valid_value_type(et))
                    fail("key '%s': unknown array element type %u at offset %zu", printable(key).c_str(), et, pos_ - 4);
                uint64_t n = read<uint64_t>("array length");
                ValueType elem = ValueType(et);
                uint64_t max_n = remaining() / min_value_bytes(elem);
                if (n > max_n)
                    fail("key '%s': array of %" PRIu64 " %s is longer than the %zu bytes left in the file could hold",
                         printable(key).c_str(), n, value_type_name(elem), remaining());
                auto arr = std::make_shared<Array>();
                arr->elem_type = elem;
                arr->items.reserve(size_t(n));
                for (uint64_t i = 0; i < n; ++i) arr->items.push_back(read_value(elem, key, depth + 1));
                val.v = std::move(arr);
                break;
            }
        }
        return val;
    }

   private:
    const uint8_t* p_;
    size_t size_;
    size_t pos_ = 0;
    const std::string& path_;
};

}  // namespace

std::unique_ptr<File> File::open(const std::string& path) {
    std::unique_ptr<File> f(new File());
    f->map_ = MappedFile(path);
    f->path_ = path;
    f->parse(f->map_.data(), f->map_.size());
    return f;
}

std::unique_ptr<File> File::from_memory(const uint8_t* data, size_t size, std::string name) {
    std::unique_ptr<File> f(new File());
    f->path_ = std::move(name);
    f->parse(data, size);
    return f;
}

void File::parse(const uint8_t* data, size_t size) {
    size_ = size;
    Parser in(data, size, path_);
    if (size == 0 || data == nullptr) in.fail("empty file (0 bytes), not a GGUF file");
    if (size < 4) in.fail("file of %zu bytes is too short for the GGUF magic", size);
    if (std::memcmp(data, "GGUF", 4) != 0) {
        in.fail("bad magic 0x%02x%02x%02x%02x, expected \"GGUF\" (not a GGUF file)", data[0], data[1], data[2],
                data[3]);
    }
    in.read<uint32_t>("magic");
    version_ = in.read<uint32_t>("header version");
    if (version_ == 1)
        throw Error(ErrorCode::kUnsupported, path_ + ": GGUF version 1 is not supported (expected 2 or 3)");
    if (version_ == 0x02000000u || version_ == 0x03000000u)
        throw Error(ErrorCode::kUnsupported, path_ + ": big-endian GGUF files are not supported");
    if (version_ != 2 && version_ != 3) in.fail("unknown GGUF version %u (expected 2 or 3)", version_);
    uint64_t n_tensors = in.read<uint64_t>("header tensor count");
    uint64_t n_kv = in.read<uint64_t>("header metadata count");
    if (n_kv > in.remaining() / kMinKvBytes)
        in.fail("metadata count %" PRIu64 " is more than the %zu remaining bytes could hold", n_kv, in.remaining());
    if (n_tensors > in.remaining() / kMinTensorInfoBytes)
        in.fail("tensor count %" PRIu64 " is more than the %zu remaining bytes could hold", n_tensors,
                in.remaining());

    // ---- metadata ----
    kv_.reserve(size_t(n_kv));
    for (uint64_t i = 0; i < n_kv; ++i) {
        size_t key_at = in.pos();
        std::string key = in.read_string("metadata key");
        if (key.empty()) in.fail("metadata entry %" PRIu64 " at offset %zu has an empty key", i, key_at);
        if (key.size() > kMaxKeyLength)
            in.fail("metadata key at offset %zu is %zu bytes long (at most %" PRIu64 ")", key_at, key.size(),
                    kMaxKeyLength);
        if (!utf8::is_valid(key)) in.fail("metadata key '%s' at offset %zu is not valid UTF-8", printable(key).c_str(), key_at);
        uint32_t t = in.read<uint32_t>("metadata value type");
        if (!valid_value_type(t))
            in.fail("key '%s': unknown value type %u at offset %zu", printable(key).c_str(), t, in.pos() - 4);
        Value v = in.read_value(ValueType(t), key, 0);
        if (!kv_index_.emplace(key, kv_.size()).second) in.fail("duplicate metadata key '%s'", printable(key).c_str());
        kv_.emplace_back(std::move(key), std::move(v));
    }

    // ---- alignment ----
    if (const Value* a = find(keys::kAlignment)) {
        if (a->type != ValueType::kU32)
            in.fail("key 'general.alignment': expected u32, got %s", value_type_name(a->type));
        uint64_t al = a->as_uint();
        if (al == 0 || (al & (al - 1)) != 0)
            in.fail("key 'general.alignment': %" PRIu64 " is not a non-zero power of two", al);
        alignment_ = al;
    }

    // ---- tensor infos ----
    tensors_.reserve(size_t(n_tensors));
    for (uint64_t i = 0; i < n_tensors; ++i) {
        size_t at = in.pos();
        TensorInfo ti;
        ti.name = in.read_string("tensor name");
        const std::string pname = printable(ti.name);
        if (ti.name.empty()) in.fail("tensor %" PRIu64 " at offset %zu has an empty name", i, at);
        uint32_t n_dims = in.read<uint32_t>("tensor n_dims");
        if (n_dims < 1 || n_dims > kMaxDims)
            in.fail("tensor '%s': n_dims %u is outside [1, %u]", pname.c_str(), n_dims, kMaxDims);
        ti.ne.resize(n_dims);
        int64_t n_el = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            uint64_t ne = in.read<uint64_t>("tensor dimension");
            if (ne == 0) in.fail("tensor '%s': dimension %u is zero", pname.c_str(), d);
            if (ne > uint64_t(std::numeric_limits<int64_t>::max()))
                in.fail("tensor '%s': dimension %u is %" PRIu64 " (negative as int64)", pname.c_str(), d, ne);
            if (__builtin_mul_overflow(n_el, int64_t(ne), &n_el))
                in.fail("tensor '%s': element count overflows int64", pname.c_str());
            ti.ne[d] = int64_t(ne);
        }
        uint32_t type_id = in.read<uint32_t>("tensor type");
        const TypeInfo* tinfo = type_info(type_id);
        if (!tinfo) in.fail("tensor '%s': unknown tensor type %u", pname.c_str(), type_id);
        ti.type = tinfo->type;
        if (ti.ne[0] % tinfo->block_size != 0)
            in.fail("tensor '%s': ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRId64, pname.c_str(),
                    ti.ne[0], tinfo->name, tinfo->block_size);
        unsigned __int128 nb = (unsigned __int128)(uint64_t(n_el / tinfo->block_size)) * tinfo->type_size;
        if (nb > size) in.fail("tensor '%s': %s data of %" PRId64 " elements is larger than the file (size %zu)",
                               pname.c_str(), tinfo->name, n_el, size);
        ti.n_bytes = size_t(nb);
        ti.offset = in.read<uint64_t>("tensor offset");
        if (!tensor_index_.emplace(ti.name, tensors_.size()).second)
            in.fail("duplicate tensor name '%s'", pname.c_str());
        tensors_.push_back(std::move(ti));
    }

    // ---- data section ----
    uint64_t pos = in.pos();
    uint64_t padded = (pos + alignment_ - 1) / alignment_ * alignment_;  // pos < 2^48, alignment < 2^32: no overflow
    data_offset_ = padded;
    if (tensors_.empty()) return;
    if (data_offset_ > size)
        in.fail("data section starts at offset %" PRIu64 ", past the end of the file (size %zu)", data_offset_, size);
    const uint64_t data_bytes = size - data_offset_;
    for (TensorInfo& ti : tensors_) {
        if (ti.offset % alignment_ != 0)
            in.fail("tensor '%s': data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                    printable(ti.name).c_str(), ti.offset, alignment_);
        if (ti.offset > data_bytes || ti.n_bytes > data_bytes - ti.offset) {
            if (ti.offset > std::numeric_limits<uint64_t>::max() - data_offset_ - ti.n_bytes)
                in.fail("tensor '%s': data offset %" PRIu64 " + %zu bytes lies outside the file (size %zu)",
                        printable(ti.name).c_str(), ti.offset, ti.n_bytes, size);
            in.fail("tensor '%s': data [%" PRIu64 ", %" PRIu64 ") lies outside the file (size %zu)",
                    printable(ti.name).c_str(), data_offset_ + ti.offset, data_offset_ + ti.offset + ti.n_bytes, size);
        }
        ti.data = data + data_offset_ + ti.offset;
    }
    std::vector<size_t> order(tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return tensors_[a].offset != tensors_[b].offset ? tensors_[a].offset < tensors_[b].offset : a < b;
    });
    for (size_t k = 1; k < order.size(); ++k) {
        const TensorInfo& prev = tensors_[order[k - 1]];
        const TensorInfo& cur = tensors_[order[k]];
        if (prev.offset + prev.n_bytes > cur.offset)
            in.fail("tensor '%s': data at offset %" PRIu64 " overlaps tensor '%s' at [%" PRIu64 ", %" PRIu64 ")",
                    printable(cur.name).c_str(), cur.offset, printable(prev.name).c_str(), prev.offset,
                    prev.offset + prev.n_bytes);
    }
}

// ---- lookups and typed getters ----

const Value* File::find(std::string_view key) const {
    auto it = kv_index_.find(std::string(key));
    return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const TensorInfo* File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(std::string(name));
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

[[noreturn]] void missing(const std::string& path, std::string_view key) {
    throw Error(ErrorCode::kMissing, path + ": required key '" + std::string(key) + "' is missing");
}

[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const char* expected, const Value& v) {
    std::string got = value_type_name(v.type);
    if (v.type == ValueType::kArray) got = std::string("array of ") + value_type_name(v.as_array().elem_type);
    throw Error(ErrorCode::kInvalidFile,
                path + ": key '" + std::string(key) + "': expected " + expected + ", got " + got);
}

int64_t int_value(const std::string& path, std::string_view key, const Value& v, const char* expected) {
    if (!v.is_integer()) wrong_type(path, key, expected, v);
    if (v.type == ValueType::kU64 && std::get<uint64_t>(v.v) > uint64_t(std::numeric_limits<int64_t>::max()))
        throw Error(ErrorCode::kInvalidFile, path + ": key '" + std::string(key) + "': value " +
                                                 std::to_string(std::get<uint64_t>(v.v)) + " does not fit " + expected);
    return v.as_int();
}

}  // namespace

uint32_t File::get_u32(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing(path_, key);
    int64_t i = int_value(path_, key, *v, "u32");
    if (i < 0 || i > int64_t(std::numeric_limits<uint32_t>::max()))
        throw Error(ErrorCode::kInvalidFile,
                    path_ + ": key '" + std::string(key) + "': value " + std::to_string(i) + " does not fit u32");
    return uint32_t(i);
}

uint32_t File::get_u32(std::string_view key, uint32_t fallback) const { return has(key) ? get_u32(key) : fallback; }

int64_t File::get_i64(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing(path_, key);
    return int_value(path_, key, *v, "i64");
}

int64_t File::get_i64(std::string_view key, int64_t fallback) const { return has(key) ? get_i64(key) : fallback; }

float File::get_f32(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing(path_, key);
    if (!v->is_float() && !v->is_integer()) wrong_type(path_, key, "f32", *v);
    return float(v->as_double());
}

float File::get_f32(std::string_view key, float fallback) const { return has(key) ? get_f32(key) : fallback; }

bool File::get_bool(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing(path_, key);
    if (v->type != ValueType::kBool) wrong_type(path_, key, "bool", *v);
    return std::get<bool>(v->v);
}

bool File::get_bool(std::string_view key, bool fallback) const { return has(key) ? get_bool(key) : fallback; }

std::string File::get_string(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing(path_, key);
    if (v->type != ValueType::kString) wrong_type(path_, key, "string", *v);
    return std::get<std::string>(v->v);
}

std::string File::get_string(std::string_view key, const std::string& fallback) const {
    return has(key) ? get_string(key) : fallback;
}

std::vector<std::string> File::get_string_array(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing(path_, key);
    if (v->type != ValueType::kArray || v->as_array().elem_type != ValueType::kString)
        wrong_type(path_, key, "array of string", *v);
    std::vector<std::string> out;
    out.reserve(v->as_array().items.size());
    for (const Value& e : v->as_array().items) out.push_back(std::get<std::string>(e.v));
    return out;
}

std::vector<int64_t> File::get_int_array(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing(path_, key);
    if (v->type != ValueType::kArray) wrong_type(path_, key, "array of integers", *v);
    const Array& a = v->as_array();
    Value probe;
    probe.type = a.elem_type;
    if (!probe.is_integer()) wrong_type(path_, key, "array of integers", *v);
    std::vector<int64_t> out;
    out.reserve(a.items.size());
    for (const Value& e : a.items) out.push_back(int_value(path_, key, e, "i64"));
    return out;
}

std::vector<float> File::get_f32_array(std::string_view key) const {
    const Value* v = find(key);
    if (!v) missing(path_, key);
    if (v->type != ValueType::kArray) wrong_type(path_, key, "array of f32", *v);
    const Array& a = v->as_array();
    Value probe;
    probe.type = a.elem_type;
    if (!probe.is_float() && !probe.is_integer()) wrong_type(path_, key, "array of f32", *v);
    std::vector<float> out;
    out.reserve(a.items.size());
    for (const Value& e : a.items) out.push_back(float(e.as_double()));
    return out;
}

}  // namespace cera::gguf
