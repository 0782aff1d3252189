// Vocabulary from a Hugging Face tokenizer.json (+ tokenizer_config.json).
// Supported: model BPE; normalizer none / NFC / Prepend("▁") + Replace(" ", "▁"); pre-tokenizer
// none / ByteLevel / Split(GPT-2, Llama 3 or Qwen2 regex) + ByteLevel. Anything else throws
// kUnsupported naming the component, rather than tokenizing differently.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/vocab_io.h"

namespace cera {
namespace {

using json = nlohmann::json;

constexpr const char* kRegexGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kRegexLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kRegexQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw_error(ErrorCode::kIo, "cannot open %s", path.c_str());
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

json read_json(const std::string& path) {
    json j = json::parse(read_text(path), nullptr, false);
    if (j.is_discarded()) throw_error(ErrorCode::kParse, "%s: not valid JSON", path.c_str());
    return j;
}

// SAX handler that streams model.vocab and model.merges (the bulk of a tokenizer.json) into flat
// vectors and builds an ordinary JSON tree of everything else, with null in their place.
class TokenizerJsonSax {
   public:
    explicit TokenizerJsonSax(json& root) : dom_(root, false) {}

    std::vector<std::pair<std::string, int64_t>> vocab;
    std::vector<std::pair<std::string, std::string>> merges;
    bool has_vocab = false, has_merges = false;
    std::string error;  // a malformed vocab or merges entry

    bool null() { return mode_ == Mode::kDom ? dom_.null() : bad("null"); }
    bool boolean(bool v) { return mode_ == Mode::kDom ? dom_.boolean(v) : bad("boolean"); }
    bool number_integer(json::number_integer_t v) {
        if (mode_ == Mode::kVocab && nest_ == 0) {
            vocab.emplace_back(std::move(key_), v);
            return true;
        }
        return mode_ == Mode::kDom ? dom_.number_integer(v) : bad("number");
    }
    bool number_unsigned(json::number_unsigned_t v) {
        if (mode_ == Mode::kVocab && nest_ == 0) {
            vocab.emplace_back(std::move(key_), v > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(v));
            return true;
        }
        return mode_ == Mode::kDom ? dom_.number_unsigned(v) : bad("number");
    }
    bool number_float(json::number_float_t v, const std::string& s) {
        return mode_ == Mode::kDom ? dom_.number_float(v, s) : bad("number " + s);
    }
    bool string(std::string& v) {
        if (mode_ == Mode::kMerges) {
            if (in_pair_) {
                pair_.push_back(std::move(v));
                return true;
            }
            const size_t sp = v.size() > 1 ? v.find(' ', 1) : std::string::npos;
            if (sp == std::string::npos || sp + 1 >= v.size()) return bad("merge '" + v + "' (not 'left right')");
            merges.emplace_back(v.substr(0, sp), v.substr(sp + 1));
            return true;
        }
        return mode_ == Mode::kDom ? dom_.string(v) : bad("string '" + v + "'");
    }
    bool binary(json::binary_t& v) { return mode_ == Mode::kDom ? dom_.binary(v) : bad("binary"); }
    bool start_object(std::size_t n) {
        if (mode_ != Mode::kDom) {
            ++nest_;
            return mode_ == Mode::kVocab ? bad("nested object") : bad("object");
        }
        if (opens_ == Mode::kVocab) {
            opens_ = Mode::kDom;
            mode_ = Mode::kVocab;
            has_vocab = true;
            return dom_.null();
        }
        opens_ = Mode::kDom;
        stack_.push_back(std::move(pending_));
        return dom_.start_object(n);
    }
    bool key(std::string& k) {
        if (mode_ == Mode::kVocab) {
            key_ = std::move(k);
            return true;
        }
        if (mode_ != Mode::kDom) return bad("key");
        opens_ = Mode::kDom;
        if (stack_.size() == 2 && stack_[1] == "model") {
            if (k == "vocab") opens_ = Mode::kVocab;
            if (k == "merges") opens_ = Mode::kMerges;
        }
        pending_ = k;
        return dom_.key(k);
    }
    bool end_object() {
        if (mode_ == Mode::kVocab && nest_ == 0) {
            mode_ = Mode::kDom;
            return true;
        }
        if (mode_ != Mode::kDom) return --nest_, true;
        stack_.pop_back();
        return dom_.end_object();
    }
    bool start_array(std::size_t n) {
        if (mode_ == Mode::kMerges) {
            if (in_pair_) return bad("nested array in a merge");
            in_pair_ = true;
            pair_.clear();
            return true;
        }
        if (mode_ != Mode::kDom) return bad("array");
        if (opens_ == Mode::kMerges) {
            opens_ = Mode::kDom;
            mode_ = Mode::kMerges;
            has_merges = true;
            return dom_.null();
        }
        opens_ = Mode::kDom;
        stack_.push_back(std::move(pending_));
        return dom_.start_array(n);
    }
    bool end_array() {
        if (mode_ == Mode::kMerges) {
            if (!in_pair_) {
                mode_ = Mode::kDom;
                return true;
            }
            in_pair_ = false;
            if (pair_.size() != 2) return bad("merge with " + std::to_string(pair_.size()) + " parts");
            merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
            return true;
        }
        if (mode_ != Mode::kDom) return bad("array end");
        stack_.pop_back();
        return dom_.end_array();
    }
    bool parse_error(std::size_t pos, const std::string& token, const nlohmann::detail::exception& e) {
        error = e.what();
        return false;
    }

   private:
    enum class Mode { kDom, kVocab, kMerges };
    bool bad(const std::string& what) {
        if (error.empty()) {
            error = (mode_ == Mode::kVocab ? "model.vocab: unexpected " : "model.merges: unexpected ") + what;
            if (mode_ == Mode::kMerges) error += " at merge " + std::to_string(merges.size());
        }
        return false;
    }

    nlohmann::detail::json_sax_dom_parser<json> dom_;
    Mode mode_ = Mode::kDom;
    Mode opens_ = Mode::kDom;  // what the value after the current key opens
    std::vector<std::string> stack_;
    std::string pending_, key_;
    std::vector<std::string> pair_;
    bool in_pair_ = false;
    int nest_ = 0;
};

[[noreturn]] void unsupported(const std::string& path, const std::string& what) {
    throw_error(ErrorCode::kUnsupported, "%s: unsupported %s", path.c_str(), what.c_str());
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].get<std::string>() : ""; }

// A token written as "text" or {"content": "text"} in tokenizer_config.json; "" for null.
std::string token_text(const json& j) {
    if (j.is_string()) return j.get<std::string>();
    if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
    return "";
}

void apply_normalizer(const json& n, VocabData& d, const std::string& path) {
    if (n.is_null()) return;
    const std::string t = type_of(n);
    if (t == "Sequence") {
        for (const json& x : n.at("normalizers")) apply_normalizer(x, d, path);
    } else if (t == "NFC") {
        d.nfc = true;
    } else if (t == "Prepend" && n.value("prepend", "") == "\xE2\x96\x81") {
        d.add_space_prefix = true;
    } else if (t == "Replace" && n.contains("pattern") && n["pattern"].value("String", "") == " " &&
               n.value("content", "") == "\xE2\x96\x81") {
        d.escape_whitespace = true;
    } else {
        unsupported(path, "normalizer " + n.dump());
    }
}

void apply_pre_tokenizer(const json& p, VocabData& d, bool& byte_level, const std::string& path) {
    if (p.is_null()) return;
    const std::string t = type_of(p);
    if (t == "Sequence") {
        for (const json& x : p.at("pretokenizers")) apply_pre_tokenizer(x, d, byte_level, path);
    } else if (t == "ByteLevel") {
        byte_level = true;
        if (p.value("add_prefix_space", false)) unsupported(path, "ByteLevel with add_prefix_space");
        if (p.value("use_regex", true)) {
            if (d.pre != PreTokenizer::kNone) unsupported(path, "ByteLevel regex after a Split");
            d.pre = PreTokenizer::kGpt2;
        }
    } else if (t == "Split") {
        const std::string regex = p.contains("pattern") ? p["pattern"].value("Regex", "") : "";
        if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
            unsupported(path, "Split behaviour " + p.dump());
        if (regex == kRegexQwen2) {
            d.pre = PreTokenizer::kQwen2;
        } else if (regex == kRegexLlama3) {
            d.pre = PreTokenizer::kLlama3;
        } else if (regex == kRegexGpt2) {
            d.pre = PreTokenizer::kGpt2;
        } else {
            unsupported(path, "split regex " + regex);
        }
    } else {
        unsupported(path, "pre_tokenizer " + p.dump());
    }
}

}  // namespace

VocabData vocab_data_from_hf_json(const std::string& tokenizer_json_path, const std::string& config_path) {
    const std::string& path = tokenizer_json_path;
    json j;
    TokenizerJsonSax sax(j);
    {
        const std::string text = read_text(path);
        const bool ok = json::sax_parse(text, &sax);
        if (!ok && sax.error.find("model.") == 0)
            throw_error(ErrorCode::kInvalidFile, "%s: %s", path.c_str(), sax.error.c_str());
        if (!ok) throw_error(ErrorCode::kParse, "%s: not valid JSON: %s", path.c_str(), sax.error.c_str());
    }
    VocabData d;
    d.model = VocabModel::kBpe;
    d.pre = PreTokenizer::kNone;
    try {
        const json& m = j.at("model");
        if (type_of(m) != "BPE") unsupported(path, "model type '" + type_of(m) + "' (only BPE)");
        if (!m.value("continuing_subword_prefix", json()).is_null() && m["continuing_subword_prefix"] != "")
            unsupported(path, "continuing_subword_prefix");
        if (!m.value("end_of_word_suffix", json()).is_null() && m["end_of_word_suffix"] != "")
            unsupported(path, "end_of_word_suffix");

        // Tokens: the model vocabulary plus added tokens, by id.
        if (!sax.has_vocab) throw_error(ErrorCode::kInvalidFile, "%s: model.vocab is missing", path.c_str());
        if (!sax.has_merges) throw_error(ErrorCode::kInvalidFile, "%s: model.merges is missing", path.c_str());
        const auto& vocab = sax.vocab;
        const json empty = json::array();
        const json& added = j.contains("added_tokens") ? j["added_tokens"] : empty;
        int64_t n = 0;
        auto check_id = [&](int64_t id, const std::string& text) {
            if (id < 0 || id >= kMaxVocabSize)
                throw_error(ErrorCode::kInvalidFile, "%s: token '%s' has id %lld, outside [0, %lld)", path.c_str(),
                            text.c_str(), (long long)id, (long long)kMaxVocabSize);
            n = std::max(n, id + 1);
        };
        for (const auto& [text, id] : vocab) check_id(id, text);
        for (const json& a : added) check_id(a.at("id").get<int64_t>(), a.at("content").get<std::string>());
        d.tokens.assign(size_t(n), std::string());
        d.types.assign(size_t(n), TokenType::kUnused);
        std::vector<bool> set(size_t(n), false);
        for (auto& [text, id64] : sax.vocab) {
            const size_t id = size_t(id64);
            if (set[id])
                throw_error(ErrorCode::kInvalidFile, "%s: id %zu is used by two tokens", path.c_str(), id);
            set[id] = true;
            d.tokens[id] = std::move(text);
            d.types[id] = TokenType::kNormal;
        }
        for (const json& a : added) {
            const size_t id = size_t(a.at("id").get<int64_t>());
            d.tokens[id] = a.at("content").get<std::string>();
            set[id] = true;
            const bool special = a.value("special", false);
            d.types[id] = special ? TokenType::kControl : TokenType::kUserDefined;
            if (a.value("lstrip", false)) d.lstrip.push_back(int32_t(id));
            if (a.value("rstrip", false)) d.rstrip.push_back(int32_t(id));
        }
        for (size_t i = 0; i < set.size(); ++i) {
            if (!set[i]) d.tokens[i] = "[HOLE_" + std::to_string(i) + "]";  // an id nothing uses
        }

        // Merges: "left right" strings or [left, right] pairs (split by the SAX handler).
        d.merges = std::move(sax.merges);
        d.byte_fallback = m.value("byte_fallback", false);
        d.ignore_merges = m.value("ignore_merges", false);
        d.fuse_unk = m.value("fuse_unk", false);
        if (m.contains("unk_token") && m["unk_token"].is_string()) {
            const std::string unk = m["unk_token"].get<std::string>();
            for (size_t i = 0; i < d.tokens.size(); ++i) {
                if (d.tokens[i] == unk) d.unk = int32_t(i);
            }
        }

        apply_normalizer(j.value("normalizer", json()), d, path);
        bool byte_level = false;
        apply_pre_tokenizer(j.value("pre_tokenizer", json()), d, byte_level, path);
        if (type_of(j.value("decoder", json())) == "ByteLevel") byte_level = true;
        d.byte_encode = byte_level;
        if (byte_level && (d.escape_whitespace || d.add_space_prefix))
            unsupported(path, "combination of ByteLevel and a '\xE2\x96\x81' normalizer");
        if (!byte_level && d.pre != PreTokenizer::kNone) unsupported(path, "Split without ByteLevel");
        d.clean_spaces = j.value("clean_up_tokenization_spaces", false);

        auto find_text = [&](const std::string& text) -> int32_t {
            if (text.empty()) return kNoToken;
            for (size_t i = 0; i < d.tokens.size(); ++i) {
                if (d.tokens[i] == text) return int32_t(i);
            }
            throw_error(ErrorCode::kInvalidFile, "%s: special token '%s' is not in the vocabulary", path.c_str(),
                        text.c_str());
        };

        // BOS/EOS from a TemplateProcessing post-processor: "$A" between special tokens.
        const json post = j.value("post_processor", json());
        if (type_of(post) == "TemplateProcessing" && post.contains("single")) {
            const json& single = post["single"];
            for (size_t i = 0; i < single.size(); ++i) {
                if (!single[i].contains("SpecialToken")) continue;
                const int32_t id = find_text(single[i]["SpecialToken"].value("id", ""));
                if (i == 0) {
                    d.bos = id;
                    d.add_bos = true;
                } else if (i + 1 == single.size()) {
                    d.eos = id;
                    d.add_eos = true;
                }
            }
        }

        // tokenizer_config.json: explicit add_bos/add_eos, token names, chat template.
        std::string cfg_path = config_path;
        if (cfg_path.empty()) {
            const auto guess = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
            if (std::filesystem::exists(guess)) cfg_path = guess.string();
        }
        if (!cfg_path.empty()) {
            const json c = read_json(cfg_path);
            if (c.contains("bos_token") && !token_text(c["bos_token"]).empty()) d.bos = find_text(token_text(c["bos_token"]));
            if (c.contains("eos_token") && !token_text(c["eos_token"]).empty()) d.eos = find_text(token_text(c["eos_token"]));
            if (c.contains("pad_token") && !token_text(c["pad_token"]).empty()) d.pad = find_text(token_text(c["pad_token"]));
            if (c.contains("unk_token") && !token_text(c["unk_token"]).empty()) d.unk = find_text(token_text(c["unk_token"]));
            if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean()) d.add_bos = c["add_bos_token"].get<bool>();
            if (c.contains("add_eos_token") && c["add_eos_token"].is_boolean()) d.add_eos = c["add_eos_token"].get<bool>();
            if (c.contains("clean_up_tokenization_spaces") && c["clean_up_tokenization_spaces"].is_boolean())
                d.clean_spaces = c["clean_up_tokenization_spaces"].get<bool>();
            if (c.contains("chat_template")) {
                const json& t = c["chat_template"];
                if (t.is_string()) {
                    d.chat_template = t.get<std::string>();
                } else if (t.is_array()) {
                    for (const json& x : t) {
                        if (x.value("name", "") == "default") d.chat_template = x.value("template", "");
                    }
                }
            }
        }
    } catch (const json::exception& e) {
        throw_error(ErrorCode::kInvalidFile, "%s: malformed tokenizer.json: %s", path.c_str(), e.what());
    }
    return d;
}

}  // namespace cera
