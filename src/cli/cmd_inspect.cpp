// `cera inspect -m FILE [--json]`: a GGUF file's metadata, tensor table, totals
// and an architecture summary, as text or as one JSON object.
#include <CLI/CLI.hpp>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/parse_args.h"
#include "gguf/gguf.h"
#include "gguf/keys.h"

namespace cera::cli {
namespace {

using gguf::Array;
using gguf::File;
using gguf::Value;
using gguf::ValueType;
using json = nlohmann::ordered_json;

constexpr size_t kJsonMaxArray = 64;  // longer arrays become {"type", "len"}
constexpr size_t kTextMaxArray = 8;   // longer arrays become "[array of N type]"
constexpr size_t kTextMaxString = 96;

// llama.cpp's llama_ftype names for general.file_type.
const char* file_type_name(int64_t ft) {
    switch (ft) {
        case 0: return "ALL_F32";
        case 1: return "MOSTLY_F16";
        case 2: return "MOSTLY_Q4_0";
        case 3: return "MOSTLY_Q4_1";
        case 7: return "MOSTLY_Q8_0";
        case 8: return "MOSTLY_Q5_0";
        case 9: return "MOSTLY_Q5_1";
        case 10: return "MOSTLY_Q2_K";
        case 11: return "MOSTLY_Q3_K_S";
        case 12: return "MOSTLY_Q3_K_M";
        case 13: return "MOSTLY_Q3_K_L";
        case 14: return "MOSTLY_Q4_K_S";
        case 15: return "MOSTLY_Q4_K_M";
        case 16: return "MOSTLY_Q5_K_S";
        case 17: return "MOSTLY_Q5_K_M";
        case 18: return "MOSTLY_Q6_K";
        case 19: return "MOSTLY_IQ2_XXS";
        case 20: return "MOSTLY_IQ2_XS";
        case 21: return "MOSTLY_Q2_K_S";
        case 22: return "MOSTLY_IQ3_XS";
        case 23: return "MOSTLY_IQ3_XXS";
        case 24: return "MOSTLY_IQ1_S";
        case 25: return "MOSTLY_IQ4_NL";
        case 26: return "MOSTLY_IQ3_S";
        case 27: return "MOSTLY_IQ3_M";
        case 28: return "MOSTLY_IQ2_S";
        case 29: return "MOSTLY_IQ2_M";
        case 30: return "MOSTLY_IQ4_XS";
        case 31: return "MOSTLY_IQ1_M";
        case 32: return "MOSTLY_BF16";
        case 36: return "MOSTLY_TQ1_0";
        case 37: return "MOSTLY_TQ2_0";
        case 38: return "MOSTLY_MXFP4_MOE";
        default: return "unknown";
    }
}

json value_json(const Value& v) {
    switch (v.type) {
        case ValueType::kU8:
        case ValueType::kU16:
        case ValueType::kU32:
        case ValueType::kU64: return std::get<uint64_t>(v.v);
        case ValueType::kI8:
        case ValueType::kI16:
        case ValueType::kI32:
        case ValueType::kI64: return std::get<int64_t>(v.v);
        case ValueType::kF32:
        case ValueType::kF64: return std::get<double>(v.v);
        case ValueType::kBool: return std::get<bool>(v.v);
        case ValueType::kString: return std::get<std::string>(v.v);
        case ValueType::kArray: {
            const Array& a = v.as_array();
            if (a.items.size() > kJsonMaxArray)
                return json{{"type", gguf::value_type_name(a.elem_type)}, {"len", a.items.size()}};
            json out = json::array();
            for (const Value& item : a.items) out.push_back(value_json(item));
            return out;
        }
    }
    return nullptr;
}

// A string for the text view: quoted, control bytes escaped, long strings cut.
std::string quoted(const std::string& s) {
    std::string out = "\"";
    for (size_t i = 0; i < s.size(); ++i) {
        if (i == kTextMaxString) {
            out += "...\" (" + std::to_string(s.size()) + " bytes)";
            return out;
        }
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c == '\n') {
            out += "\\n";
        } else if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    return out + "\"";
}

std::string value_text(const Value& v) {
    switch (v.type) {
        case ValueType::kString: return quoted(std::get<std::string>(v.v));
        case ValueType::kBool: return std::get<bool>(v.v) ? "true" : "false";
        case ValueType::kF32:
        case ValueType::kF64: {
            char buf[64];
            std::snprintf(buf, sizeof buf, "%.9g", std::get<double>(v.v));
            return buf;
        }
        case ValueType::kArray: {
            const Array& a = v.as_array();
            if (a.items.size() > kTextMaxArray)
                return "[array of " + std::to_string(a.items.size()) + " " + gguf::value_type_name(a.elem_type) + "]";
            std::string out = "[";
            for (size_t i = 0; i < a.items.size(); ++i) out += (i ? ", " : "") + value_text(a.items[i]);
            return out + "]";
        }
        default:
            return v.is_integer() && (v.type == ValueType::kU8 || v.type == ValueType::kU16 ||
                                      v.type == ValueType::kU32 || v.type == ValueType::kU64)
                       ? std::to_string(std::get<uint64_t>(v.v))
                       : std::to_string(std::get<int64_t>(v.v));
    }
}

std::string type_text(const Value& v) {
    if (v.type != ValueType::kArray) return gguf::value_type_name(v.type);
    return std::string("arr[") + gguf::value_type_name(v.as_array().elem_type) + "]";
}

std::string shape_text(const std::vector<int64_t>& ne) {
    std::string out = "[";
    for (size_t i = 0; i < ne.size(); ++i) out += (i ? ", " : "") + std::to_string(ne[i]);
    return out + "]";
}

// A scalar, or the per-layer values of an array (head_count_kv for hybrid models), as JSON.
json arch_field(const File& f, const std::string& key) {
    const Value* v = f.find(key);
    if (!v) return nullptr;
    return value_json(*v);
}

// The architecture summary: one ordered JSON object used by both views.
json arch_summary(const File& f) {
    const std::string arch = f.architecture();
    json s;
    s["arch"] = arch.empty() ? json(nullptr) : json(arch);
    if (const Value* n = f.find(gguf::keys::kName); n && n->type == ValueType::kString) s["name"] = n->as_string();
    auto k = [&](const char* suffix) { return gguf::keys::arch_key(arch, suffix); };
    s["n_layer"] = arch_field(f, k("block_count"));
    s["n_embd"] = arch_field(f, k("embedding_length"));
    s["n_ff"] = arch_field(f, k("feed_forward_length"));
    s["n_head"] = arch_field(f, k("attention.head_count"));
    s["n_head_kv"] = arch_field(f, k("attention.head_count_kv"));
    s["n_ctx"] = arch_field(f, k("context_length"));
    if (f.has(k("expert_count"))) {
        s["n_expert"] = arch_field(f, k("expert_count"));
        s["n_expert_used"] = arch_field(f, k("expert_used_count"));
    }
    // The vocabulary size: the token list, else {arch}.vocab_size, else the embedding's rows.
    json n_vocab = nullptr;
    if (const Value* t = f.find(gguf::keys::kTokTokens); t && t->type == ValueType::kArray)
        n_vocab = t->as_array().items.size();
    else if (f.has(k("vocab_size")))
        n_vocab = arch_field(f, k("vocab_size"));
    else if (const auto* e = f.find_tensor("token_embd.weight"); e && e->ne.size() >= 2)
        n_vocab = e->ne[1];
    s["n_vocab"] = n_vocab;
    if (const Value* ft = f.find(gguf::keys::kFileType); ft && ft->is_integer()) {
        s["file_type"] = ft->as_int();
        s["file_type_name"] = file_type_name(ft->as_int());
    } else {
        s["file_type"] = nullptr;
    }
    return s;
}

struct Totals {
    int64_t n_params = 0;
    uint64_t n_bytes = 0;
};

Totals totals(const File& f) {
    Totals t;
    for (const auto& ti : f.tensors()) {
        t.n_params += ti.n_elements();
        t.n_bytes += ti.n_bytes;
    }
    return t;
}

void print_json(const File& f) {
    json out;
    out["path"] = f.path();
    out["version"] = f.version();
    out["file_size"] = f.file_size();
    out["alignment"] = f.alignment();
    out["data_offset"] = f.data_offset();
    out["n_kv"] = f.metadata().size();
    out["n_tensors"] = f.tensors().size();
    json meta = json::object();
    for (const auto& [key, v] : f.metadata()) meta[key] = value_json(v);
    out["metadata"] = std::move(meta);
    json tensors = json::array();
    for (const auto& t : f.tensors()) {
        tensors.push_back(
            {{"name", t.name}, {"type", type_name(t.type)}, {"shape", t.ne}, {"offset", t.offset}, {"bytes", t.n_bytes}});
    }
    out["tensors"] = std::move(tensors);
    Totals tot = totals(f);
    out["n_params"] = tot.n_params;
    out["n_bytes"] = tot.n_bytes;
    out["summary"] = arch_summary(f);
    // Strings are bytes as stored; invalid UTF-8 is replaced rather than failing the dump.
    std::string text = out.dump(1, ' ', false, json::error_handler_t::replace);
    std::printf("%s\n", text.c_str());
}

void print_text(const File& f) {
    std::printf("%s: GGUF v%u, %zu bytes, alignment %" PRIu64 ", data at offset %" PRIu64 "\n", f.path().c_str(),
                f.version(), f.file_size(), f.alignment(), f.data_offset());

    std::printf("\nmetadata (%zu keys):\n", f.metadata().size());
    size_t key_w = 0;
    for (const auto& kv : f.metadata()) key_w = std::max(key_w, std::min<size_t>(kv.first.size(), 48));
    for (const auto& [key, v] : f.metadata())
        std::printf("  %-*s %-11s %s\n", int(key_w), quoted(key).substr(1, quoted(key).size() - 2).c_str(),
                    type_text(v).c_str(), value_text(v).c_str());

    std::printf("\ntensors (%zu):\n", f.tensors().size());
    size_t name_w = 4;
    for (const auto& t : f.tensors()) name_w = std::max(name_w, std::min<size_t>(t.name.size(), 48));
    if (!f.tensors().empty())
        std::printf("  %-*s %-7s %-24s %12s %12s\n", int(name_w), "name", "type", "shape", "bytes", "offset");
    for (const auto& t : f.tensors())
        std::printf("  %-*s %-7s %-24s %12zu %12" PRIu64 "\n", int(name_w), t.name.c_str(), type_name(t.type),
                    shape_text(t.ne).c_str(), t.n_bytes, t.offset);

    Totals tot = totals(f);
    std::printf("\ntotals: %zu tensors, %" PRId64 " parameters (%.2fM), %" PRIu64 " bytes (%.2f MiB)\n",
                f.tensors().size(), tot.n_params, double(tot.n_params) / 1e6, tot.n_bytes,
                double(tot.n_bytes) / (1 << 20));

    json s = arch_summary(f);
    std::printf("\nsummary:\n");
    for (const auto& [k, v] : s.items()) {
        if (v.is_null()) continue;
        std::printf("  %-14s %s\n", k.c_str(), v.is_string() ? v.get<std::string>().c_str() : v.dump().c_str());
    }
}

int run_inspect(const std::vector<std::string>& args) {
    CLI::App app{"Prints a GGUF file's metadata, tensors and architecture summary.", "cera inspect"};
    std::string model;
    std::string positional;
    bool as_json = false;
    app.add_option("-m,--model", model, "GGUF file to inspect");
    app.add_option("file", positional, "GGUF file (instead of -m)");
    app.add_flag("--json", as_json, "print one JSON object");
    if (int rc = parse_args(app, args, "inspect", [&] {
            if (model.empty()) model = positional;
            else if (!positional.empty()) throw CLI::ValidationError("give the file once, with -m or as an argument");
            if (model.empty()) throw CLI::RequiredError("-m FILE");
        });
        rc >= 0)
        return rc;
    auto f = File::open(model);
    if (as_json)
        print_json(*f);
    else
        print_text(*f);
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(inspect, "inspect", "metadata, tensors and shape summary of a GGUF file", run_inspect);

}  // namespace cera::cli
