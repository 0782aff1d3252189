// The C API's version, errors, engine, tokenizer, chat templates and grammars (include/cera/cera.h).
// Every entry point runs inside capi::guard(), so no exception leaves the library.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "capi/capi_impl.h"
#include "capi/chat.h"
#include "cera/perplexity.h"

#ifndef CERA_VERSION_STRING
#error "CERA_VERSION_STRING comes from CMake (the project's version)"
#endif

using namespace cera;
using cera::capi::guard;
using cera::capi::null_argument;

namespace cera::capi {

namespace {
thread_local std::string t_last_error;
}

cera_status fail(cera_status status, std::string_view message) {
    try {
        t_last_error.assign(message);
    } catch (...) {
        // Keeping the status matters more than keeping the message when even that allocation fails.
    }
    return status;
}

cera_status status_of(ErrorCode code) {
    switch (code) {
        case ErrorCode::kInvalidArgument:
            return CERA_ERR_INVALID_ARGUMENT;
        case ErrorCode::kIo:
            return CERA_ERR_IO;
        case ErrorCode::kInvalidFile:
            return CERA_ERR_INVALID_FILE;
        case ErrorCode::kUnsupported:
            return CERA_ERR_UNSUPPORTED;
        case ErrorCode::kMissing:
            return CERA_ERR_MISSING;
        case ErrorCode::kOutOfRange:
            return CERA_ERR_OUT_OF_RANGE;
        case ErrorCode::kParse:
            return CERA_ERR_PARSE;
        case ErrorCode::kDevice:
            return CERA_ERR_DEVICE;
        case ErrorCode::kCancelled:
            return CERA_ERR_CANCELLED;
        case ErrorCode::kOverCapacity:
            return CERA_ERR_OVER_CAPACITY;
    }
    return CERA_ERR_INTERNAL;
}

cera_status null_argument(const char* function, const char* argument) {
    return fail(CERA_ERR_INVALID_ARGUMENT, std::string(function) + ": " + argument + " is NULL");
}

cera_status copy_text(std::string_view text, char* buf, size_t capacity, size_t* len_out) {
    if (len_out) *len_out = text.size();
    if (capacity <= text.size())  // the NUL needs its byte too
        return fail(CERA_ERR_BUFFER_TOO_SMALL, "the buffer holds " + std::to_string(capacity) + " bytes, " +
                                                   std::to_string(text.size() + 1) + " are needed");
    if (!buf) return null_argument("copy", "buf");
    std::memcpy(buf, text.data(), text.size());
    buf[text.size()] = '\0';
    return CERA_OK;
}

void CallbackSink::deliver(int32_t token, std::string_view text) {
    if (stopped_ || !callback_) return;
    cera_token_event ev{};
    ev.token = token;
    ev.text = text.data();
    ev.text_len = text.size();
    ev.logprob = logprob_;
    ev.top = top_.empty() ? nullptr : top_.data();
    ev.n_top = int32_t(top_.size());
    if (!callback_(&ev, user_data_)) {
        stopped_ = true;
        if (on_stop_) on_stop_();
    }
}

void CallbackSink::on_token(int32_t token) {
    if (pending_) deliver(token_, {});  // the previous token brought no text
    pending_ = true;
    token_ = token;
    logprob_ = 0.0f;
    top_.clear();
}

void CallbackSink::on_logprobs(const SampledLogprobs& lp) {
    logprob_ = lp.token.logprob;
    top_.clear();
    for (const TokenLogprob& t : lp.top) top_.push_back({t.id, t.logprob});
}

void CallbackSink::on_text(std::string_view text) {
    deliver(pending_ ? token_ : CERA_TOKEN_NULL, text);
    pending_ = false;
}

void CallbackSink::on_done(const GenerationResult&) {
    if (pending_) deliver(token_, {});
    pending_ = false;
}

SamplerParams sampler_params(const cera_sampling_params& s) {
    SamplerParams p;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.repeat_penalty = s.repeat_penalty;
    p.frequency_penalty = s.frequency_penalty;
    p.presence_penalty = s.presence_penalty;
    p.penalty_last_n = s.penalty_last_n;
    p.seed = s.seed;
    if (s.n_logit_bias > 0 && !s.logit_bias)
        throw Error(ErrorCode::kInvalidArgument, "sampling: n_logit_bias > 0 but logit_bias is NULL");
    for (size_t i = 0; i < s.n_logit_bias; ++i) p.logit_bias.emplace_back(s.logit_bias[i].token, s.logit_bias[i].bias);
    return p;
}

GenerateOptions generate_options(const cera_generate_options* o) {
    GenerateOptions g;
    if (!o) return g;
    for (const void* r : o->reserved)
        if (r) throw Error(ErrorCode::kInvalidArgument, "generate options: the reserved fields must be NULL");
    g.max_tokens = o->max_tokens;
    g.sampling = sampler_params(o->sampling);
    if (o->n_stop > 0 && !o->stop)
        throw Error(ErrorCode::kInvalidArgument, "generate options: n_stop > 0 but stop is NULL");
    for (size_t i = 0; i < o->n_stop; ++i) {
        if (!o->stop[i])
            throw Error(ErrorCode::kInvalidArgument, "generate options: stop[" + std::to_string(i) + "] is NULL");
        g.stop.emplace_back(o->stop[i]);
    }
    g.ignore_eos = o->ignore_eos;
    g.n_keep = o->n_keep;
    g.logprobs = o->logprobs;
    if (o->grammar) g.grammar = o->grammar->grammar;
    g.device_greedy = o->device_greedy;
    g.device_sampling = o->device_sampling;
    g.decode_ahead = o->decode_ahead;
    if (o->adapter) g.adapter = o->adapter;
    return g;
}

void fill_result(const GenerationResult& r, const std::string& text, const std::string& stop_string,
                 cera_generation_result* out) {
    if (!out) return;
    *out = {};
    out->finish = cera_finish_reason(int(r.finish));
    out->prompt_tokens = r.prompt_tokens;
    out->generated_tokens = r.generated_tokens;
    out->decode_steps = r.decode_steps;
    out->cached_tokens = r.cached_tokens;
    out->context_shifts = r.context_shifts;
    out->prefill_seconds = r.prefill_seconds;
    out->decode_seconds = r.decode_seconds;
    out->text = text.c_str();
    out->text_len = text.size();
    out->stop_string = stop_string.c_str();
}

}  // namespace cera::capi

static_assert(int(FinishReason::kNone) == CERA_FINISH_NONE && int(FinishReason::kEos) == CERA_FINISH_EOS &&
              int(FinishReason::kStop) == CERA_FINISH_STOP && int(FinishReason::kLength) == CERA_FINISH_LENGTH &&
              int(FinishReason::kContextFull) == CERA_FINISH_CONTEXT_FULL &&
              int(FinishReason::kCancelled) == CERA_FINISH_CANCELLED);

extern "C" {

const char* cera_version(void) { return CERA_VERSION_STRING; }
int cera_abi_version(void) { return CERA_ABI_VERSION; }

const char* cera_status_name(cera_status status) {
    switch (cera::capi::raw_enum(status)) {
        case CERA_OK:
            return "ok";
        case CERA_ERR_INVALID_ARGUMENT:
            return "invalid argument";
        case CERA_ERR_IO:
            return "i/o error";
        case CERA_ERR_INVALID_FILE:
            return "invalid file";
        case CERA_ERR_UNSUPPORTED:
            return "unsupported";
        case CERA_ERR_MISSING:
            return "missing";
        case CERA_ERR_OUT_OF_RANGE:
            return "out of range";
        case CERA_ERR_PARSE:
            return "parse error";
        case CERA_ERR_DEVICE:
            return "device error";
        case CERA_ERR_CANCELLED:
            return "cancelled";
        case CERA_ERR_OVER_CAPACITY:
            return "over capacity";
        case CERA_ERR_BUFFER_TOO_SMALL:
            return "buffer too small";
        case CERA_ERR_OUT_OF_MEMORY:
            return "out of memory";
        case CERA_ERR_INTERNAL:
            return "internal error";
    }
    return "unknown status";
}

const char* cera_last_error(void) { return cera::capi::t_last_error.c_str(); }

void cera_free(void* ptr) { std::free(ptr); }

const char* cera_finish_reason_name(cera_finish_reason reason) {
    const int r = cera::capi::raw_enum(reason);
    if (r < CERA_FINISH_NONE || r > CERA_FINISH_CANCELLED) return "unknown";
    return finish_reason_name(FinishReason(r));
}

// ---- engine ----

static_assert(int(KvCacheType::kQ4_0) == CERA_KV_Q4_0 && int(KvCacheType::kQ8_0) == CERA_KV_Q8_0 &&
              int(KvCacheType::kBF16) == CERA_KV_BF16 && int(KvCacheType::kF16) == CERA_KV_F16 &&
              int(KvCacheType::kTq4) == CERA_KV_TQ4 && int(KvCacheType::kTq3) == CERA_KV_TQ3 &&
              int(KvCacheType::kKivi4) == CERA_KV_KIVI4);

cera_engine_options cera_engine_default_options(void) {
    const EngineOptions d;
    cera_engine_options o{};
    o.device = "auto";
    o.threads = d.threads;
    o.n_ctx = d.n_ctx;
    o.kv_type = cera_kv_type(d.kv_type_k);
    o.n_batch = d.n_batch;
    o.prefix_cache_bytes = d.prefix_cache_bytes;
    o.prefix_cache_dir = nullptr;
    o.prefix_cache_dir_bytes = d.prefix_cache_dir_bytes;
    o.gpu_profile = d.gpu_profile;
    o.mmproj = nullptr;
    o.lora = nullptr;
    o.n_lora = 0;
    o.lora_cache_bytes = d.lora_cache_bytes;
    o.load_progress = nullptr;
    o.load_progress_user_data = nullptr;
    return o;
}

cera_status cera_engine_load(const char* path, const cera_engine_options* options, cera_engine** out) {
    return guard([&] {
        if (!path) return null_argument("cera_engine_load", "path");
        if (!out) return null_argument("cera_engine_load", "out");
        const cera_engine_options o = options ? *options : cera_engine_default_options();
        if (o.n_lora > 0 && !o.lora)
            return cera::capi::fail(CERA_ERR_INVALID_ARGUMENT, "cera_engine_load: n_lora > 0 but lora is NULL");
        const int kv_type = cera::capi::raw_enum(o.kv_type);
        if (kv_type < CERA_KV_F32 || kv_type > CERA_KV_KIVI4)
            return cera::capi::fail(CERA_ERR_INVALID_ARGUMENT, "cera_engine_load: kv_type " + std::to_string(kv_type) +
                                                                   " is none of CERA_KV_F32 ... CERA_KV_KIVI4");
        EngineOptions eo;
        eo.device = o.device ? o.device : "auto";
        eo.threads = o.threads;
        eo.n_ctx = o.n_ctx;
        eo.kv_type_k = eo.kv_type_v = KvCacheType(kv_type);
        eo.n_batch = o.n_batch;
        eo.prefix_cache_bytes = size_t(o.prefix_cache_bytes);
        eo.prefix_cache_dir = o.prefix_cache_dir ? o.prefix_cache_dir : "";
        eo.prefix_cache_dir_bytes = o.prefix_cache_dir_bytes;
        eo.gpu_profile = o.gpu_profile;
        eo.mmproj = o.mmproj ? o.mmproj : "";
        for (size_t i = 0; i < o.n_lora; ++i) {
            if (!o.lora[i].path)
                return cera::capi::fail(CERA_ERR_INVALID_ARGUMENT,
                                        "cera_engine_load: lora[" + std::to_string(i) + "].path is NULL");
            eo.lora.push_back({o.lora[i].path, o.lora[i].scale});
        }
        eo.lora_cache_bytes = o.lora_cache_bytes;
        if (o.load_progress)
            eo.on_load_progress = [cb = o.load_progress, user = o.load_progress_user_data](
                                      uint64_t done, uint64_t total) { cb(done, total, user); };
        auto h = std::make_unique<cera_engine>();
        h->engine = Engine::load(path, eo);
        h->tokenizer.engine = h->engine.get();
        const EngineInfo& i = h->engine->info();
        cera_model_info& m = h->info;
        m.path = i.path.c_str();
        m.architecture = i.architecture.c_str();
        m.name = i.name.c_str();
        m.weight_type = i.weight_type.c_str();
        m.device = i.device.c_str();
        m.on_gpu = i.on_gpu;
        m.has_chat_template = i.has_chat_template;
        m.n_params = i.n_params;
        m.weight_bytes = i.weight_bytes;
        m.decode_bytes_per_token = i.decode_bytes_per_token;
        m.n_vocab = i.n_vocab;
        m.n_embd = i.n_embd;
        m.n_layer = i.n_layer;
        m.n_ctx_train = i.n_ctx_train;
        m.n_ctx = i.n_ctx;
        *out = h.release();
        return CERA_OK;
    });
}

void cera_engine_free(cera_engine* engine) { delete engine; }

const cera_model_info* cera_engine_info(const cera_engine* engine) { return engine ? &engine->info : nullptr; }

cera_status cera_engine_metadata(const cera_engine* engine, const char* key, char* buf, size_t capacity,
                                 size_t* len_out) {
    return guard([&] {
        if (!engine) return null_argument("cera_engine_metadata", "engine");
        if (!key) return null_argument("cera_engine_metadata", "key");
        const auto keys = engine->engine->metadata_keys();
        if (std::find(keys.begin(), keys.end(), key) == keys.end())
            return cera::capi::fail(CERA_ERR_MISSING, std::string("no metadata key '") + key + "'");
        return cera::capi::copy_text(engine->engine->metadata(key), buf, capacity, len_out);
    });
}

size_t cera_engine_metadata_count(const cera_engine* engine) {
    try {
        return engine ? engine->engine->metadata_keys().size() : 0;
    } catch (...) {
        return 0;
    }
}

cera_status cera_engine_metadata_key(const cera_engine* engine, size_t i, char* buf, size_t capacity, size_t* len_out) {
    return guard([&] {
        if (!engine) return null_argument("cera_engine_metadata_key", "engine");
        const auto keys = engine->engine->metadata_keys();
        if (i >= keys.size())
            return cera::capi::fail(CERA_ERR_OUT_OF_RANGE, "cera_engine_metadata_key: key " + std::to_string(i) +
                                                               " of " + std::to_string(keys.size()));
        return cera::capi::copy_text(keys[i], buf, capacity, len_out);
    });
}

uint64_t cera_engine_fingerprint(const cera_engine* engine) { return engine ? engine->engine->fingerprint() : 0; }

cera_perplexity_options cera_perplexity_default_options(void) {
    const cera::PerplexityOptions d;
    cera_perplexity_options o{};
    o.n_ctx = d.n_ctx;
    o.n_chunks = d.n_chunks;
    o.bos_per_window = d.bos_per_window;
    return o;
}

cera_status cera_perplexity(cera_engine* engine, const cera_token* tokens, size_t n_tokens,
                            const cera_perplexity_options* options, cera_perplexity_result* out) {
    return guard([&] {
        if (!engine) return null_argument("cera_perplexity", "engine");
        if (!tokens && n_tokens > 0) return null_argument("cera_perplexity", "tokens");
        if (!out) return null_argument("cera_perplexity", "out");
        const cera_perplexity_options o = options ? *options : cera_perplexity_default_options();
        cera::PerplexityOptions po;
        po.n_ctx = o.n_ctx;
        po.n_chunks = o.n_chunks;
        po.bos_per_window = o.bos_per_window;
        if (o.save_base) po.save_base = o.save_base;
        if (o.compare_base) po.compare_base = o.compare_base;
        const auto r = cera::perplexity(*engine->engine, std::span<const int32_t>(tokens, n_tokens), po,
                                        [&](int32_t c, const cera::PerplexityResult& now) {
                                            if (o.on_chunk)
                                                o.on_chunk(c, now.n_chunks_total, now.running.back(), o.user_data);
                                        });
        cera_perplexity_result x{};
        x.n_ctx = r.n_ctx;
        x.n_chunks = r.n_chunks;
        x.n_scored = r.n_scored;
        x.ppl = r.ppl;
        x.ppl_err = r.ppl_err;
        x.seconds = r.seconds;
        x.has_kl = r.has_kl;
        const cera::KlStats& k = r.kl;
        x.ppl_base = k.ppl_base;
        x.ln_ratio = k.ln_ratio, x.ln_ratio_err = k.ln_ratio_err;
        x.ppl_ratio = k.ppl_ratio, x.ppl_ratio_err = k.ppl_ratio_err;
        x.kld = k.kld, x.kld_err = k.kld_err;
        x.kld_max = k.kld_max, x.kld_p99 = k.kld_p99, x.kld_median = k.kld_median, x.kld_min = k.kld_min;
        x.same_top = k.same_top, x.same_top_err = k.same_top_err;
        x.rms_dp = k.rms_dp, x.rms_dp_err = k.rms_dp_err;
        *out = x;
        return CERA_OK;
    });
}

cera_status cera_engine_device_memory(const cera_engine* engine, cera_device_memory* out) {
    return guard([&] {
        if (!engine) return null_argument("cera_engine_device_memory", "engine");
        if (!out) return null_argument("cera_engine_device_memory", "out");
        const DeviceMemory m = engine->engine->device_memory();
        *out = {m.weights, m.buffers, m.scratch};
        return CERA_OK;
    });
}

cera_status cera_engine_prefix_cache_stats(const cera_engine* engine, cera_prefix_cache_stats* out) {
    return guard([&] {
        if (!engine) return null_argument("cera_engine_prefix_cache_stats", "engine");
        if (!out) return null_argument("cera_engine_prefix_cache_stats", "out");
        const PrefixCacheStats p = engine->engine->prefix_cache_stats();
        *out = {p.hits_memory,    p.hits_disk,       p.misses,         p.stores,      p.evictions,
                p.disk_evictions, p.dropped_corrupt, p.memory_entries, p.memory_bytes};
        return CERA_OK;
    });
}

const cera_tokenizer* cera_engine_tokenizer(const cera_engine* engine) { return engine ? &engine->tokenizer : nullptr; }

// ---- tokenizer ----

cera_status cera_tokenize(const cera_tokenizer* tokenizer, const char* text, size_t text_len, bool add_bos,
                          bool parse_special, cera_token* tokens, size_t capacity, size_t* n_out) {
    return guard([&] {
        if (!tokenizer) return null_argument("cera_tokenize", "tokenizer");
        if (!text && text_len > 0) return null_argument("cera_tokenize", "text");
        const std::vector<int32_t> ids =
            tokenizer->engine->tokenize(std::string_view(text ? text : "", text_len), add_bos, parse_special);
        return cera::capi::copy_array(ids, tokens, capacity, n_out);
    });
}

cera_status cera_detokenize(const cera_tokenizer* tokenizer, const cera_token* tokens, size_t n_tokens,
                            bool render_special, char* buf, size_t capacity, size_t* len_out) {
    return guard([&] {
        if (!tokenizer) return null_argument("cera_detokenize", "tokenizer");
        if (!tokens && n_tokens > 0) return null_argument("cera_detokenize", "tokens");
        const int32_t n_vocab = tokenizer->engine->info().n_vocab;
        for (size_t i = 0; i < n_tokens; ++i)
            if (tokens[i] < 0 || tokens[i] >= n_vocab)
                return cera::capi::fail(CERA_ERR_OUT_OF_RANGE,
                                        "cera_detokenize: token id " + std::to_string(tokens[i]) +
                                            " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
        const std::string text =
            tokenizer->engine->detokenize(std::span<const int32_t>(tokens, n_tokens), render_special);
        return cera::capi::copy_text(text, buf, capacity, len_out);
    });
}

cera_status cera_token_text(const cera_tokenizer* tokenizer, cera_token token, char* buf, size_t capacity,
                            size_t* len_out) {
    return guard([&] {
        if (!tokenizer) return null_argument("cera_token_text", "tokenizer");
        const int32_t n_vocab = tokenizer->engine->info().n_vocab;
        if (token < 0 || token >= n_vocab)
            return cera::capi::fail(CERA_ERR_OUT_OF_RANGE, "cera_token_text: token id " + std::to_string(token) +
                                                               " is outside the vocabulary");
        return cera::capi::copy_text(tokenizer->engine->token_text(token), buf, capacity, len_out);
    });
}

cera_status cera_token_bytes(const cera_tokenizer* tokenizer, cera_token token, char* buf, size_t capacity,
                             size_t* len_out) {
    return guard([&] {
        if (!tokenizer) return null_argument("cera_token_bytes", "tokenizer");
        return cera::capi::copy_text(tokenizer->engine->token_bytes(token), buf, capacity, len_out);
    });
}

int32_t cera_tokenizer_n_vocab(const cera_tokenizer* t) { return t ? t->engine->info().n_vocab : 0; }
cera_token cera_token_bos(const cera_tokenizer* t) { return t ? t->engine->bos_token() : CERA_TOKEN_NULL; }
cera_token cera_token_eos(const cera_tokenizer* t) { return t ? t->engine->eos_token() : CERA_TOKEN_NULL; }
bool cera_tokenizer_add_bos(const cera_tokenizer* t) { return t && t->engine->add_bos(); }

bool cera_token_is_eog(const cera_tokenizer* t, cera_token token) {
    if (!t || token < 0 || token >= t->engine->info().n_vocab) return false;
    try {
        return t->engine->is_eog(token);
    } catch (...) {
        return false;
    }
}

// ---- chat ----

cera_status cera_chat_apply_template(const cera_engine* engine, const char* template_source,
                                     const cera_chat_message* messages, size_t n_messages, bool add_generation_prompt,
                                     char* buf, size_t capacity, size_t* len_out) {
    return guard([&] {
        if (!engine) return null_argument("cera_chat_apply_template", "engine");
        if (!messages && n_messages > 0) return null_argument("cera_chat_apply_template", "messages");
        std::vector<ChatMessage> msgs;
        for (size_t i = 0; i < n_messages; ++i) {
            if (!messages[i].role || !messages[i].content)
                return cera::capi::fail(
                    CERA_ERR_INVALID_ARGUMENT,
                    "cera_chat_apply_template: message " + std::to_string(i) + " has a NULL role or content");
            ChatMessage& c = msgs.emplace_back();
            c.role = messages[i].role;
            c.content = messages[i].content;
        }
        const std::string source = template_source ? template_source : "";
        const std::string text =
            cera::capi::render_chat(*engine->engine, template_source ? &source : nullptr, msgs, add_generation_prompt);
        return cera::capi::copy_text(text, buf, capacity, len_out);
    });
}

// ---- grammars ----

cera_status cera_grammar_from_gbnf(const char* gbnf, const char* root, cera_grammar** out) {
    return guard([&] {
        if (!gbnf) return null_argument("cera_grammar_from_gbnf", "gbnf");
        if (!out) return null_argument("cera_grammar_from_gbnf", "out");
        auto g = std::make_unique<cera_grammar>();
        g->grammar = Grammar::parse(gbnf, root ? root : "root");
        *out = g.release();
        return CERA_OK;
    });
}

cera_status cera_grammar_from_json_schema(const char* schema_json, cera_grammar** out) {
    return guard([&] {
        if (!schema_json) return null_argument("cera_grammar_from_json_schema", "schema_json");
        if (!out) return null_argument("cera_grammar_from_json_schema", "out");
        auto g = std::make_unique<cera_grammar>();
        g->grammar = Grammar::from_json_schema(schema_json);
        *out = g.release();
        return CERA_OK;
    });
}

cera_status cera_grammar_json(bool any_value, cera_grammar** out) {
    return guard([&] {
        if (!out) return null_argument("cera_grammar_json", "out");
        auto g = std::make_unique<cera_grammar>();
        g->grammar = Grammar::json(any_value);
        *out = g.release();
        return CERA_OK;
    });
}

cera_status cera_json_schema_to_gbnf(const char* schema_json, char* buf, size_t capacity, size_t* len_out) {
    return guard([&] {
        if (!schema_json) return null_argument("cera_json_schema_to_gbnf", "schema_json");
        return cera::capi::copy_text(Grammar::json_schema_to_gbnf(schema_json), buf, capacity, len_out);
    });
}

cera_status cera_grammar_lazy(const char* gbnf, const char* trigger, cera_grammar** out) {
    return guard([&] {
        if (!gbnf) return null_argument("cera_grammar_lazy", "gbnf");
        if (!trigger) return null_argument("cera_grammar_lazy", "trigger");
        if (!out) return null_argument("cera_grammar_lazy", "out");
        auto g = std::make_unique<cera_grammar>();
        g->grammar = Grammar::lazy(gbnf, trigger);
        *out = g.release();
        return CERA_OK;
    });
}

cera_status cera_grammar_trigger(const cera_grammar* grammar, char* buf, size_t capacity, size_t* len_out) {
    return guard([&] {
        if (!grammar) return null_argument("cera_grammar_trigger", "grammar");
        return cera::capi::copy_text(grammar->grammar->trigger(), buf, capacity, len_out);
    });
}

cera_status cera_grammar_gbnf(const cera_grammar* grammar, char* buf, size_t capacity, size_t* len_out) {
    return guard([&] {
        if (!grammar) return null_argument("cera_grammar_gbnf", "grammar");
        return cera::capi::copy_text(grammar->grammar->gbnf(), buf, capacity, len_out);
    });
}

cera_status cera_grammar_match(const cera_grammar* grammar, const char* text, size_t text_len, int64_t* where) {
    return guard([&] {
        if (!grammar) return null_argument("cera_grammar_match", "grammar");
        if (!text && text_len > 0) return null_argument("cera_grammar_match", "text");
        if (!where) return null_argument("cera_grammar_match", "where");
        *where = grammar->grammar->match(std::string_view(text ? text : "", text_len));
        return CERA_OK;
    });
}

void cera_grammar_free(cera_grammar* grammar) { delete grammar; }

// ---- sampler ----

cera_status cera_sampler_new(const cera_sampling_params* params, int32_t n_vocab, cera_sampler** out) {
    return guard([&] {
        if (!params) return null_argument("cera_sampler_new", "params");
        if (!out) return null_argument("cera_sampler_new", "out");
        if (n_vocab <= 0)
            return cera::capi::fail(CERA_ERR_INVALID_ARGUMENT,
                                    "cera_sampler_new: n_vocab = " + std::to_string(n_vocab) + " must be > 0");
        auto s = std::make_unique<cera_sampler>(cera_sampler{Sampler(cera::capi::sampler_params(*params), n_vocab)});
        *out = s.release();
        return CERA_OK;
    });
}

void cera_sampler_free(cera_sampler* sampler) { delete sampler; }

cera_token cera_sampler_sample(cera_sampler* sampler, const float* logits, const uint64_t* allowed) {
    if (!sampler || !logits) return CERA_TOKEN_NULL;
    return sampler->sampler.sample(logits, allowed);  // never throws
}

cera_status cera_sampler_distribution(cera_sampler* sampler, const float* logits, const uint64_t* allowed,
                                      cera_token_prob* out, size_t capacity, size_t* n_out) {
    return guard([&] {
        if (!sampler) return null_argument("cera_sampler_distribution", "sampler");
        if (!logits) return null_argument("cera_sampler_distribution", "logits");
        const auto d = sampler->sampler.distribution(logits, allowed);
        std::vector<cera_token_prob> v(d.size());
        for (size_t i = 0; i < d.size(); ++i) v[i] = {d[i].id, d[i].logit, d[i].p};
        return cera::capi::copy_array(v, out, capacity, n_out);
    });
}

cera_status cera_sampler_log_probs(cera_sampler* sampler, const float* logits, cera_token token, int32_t n_top,
                                   cera_token_logprob* top, float* logprob) {
    return guard([&] {
        if (!sampler) return null_argument("cera_sampler_log_probs", "sampler");
        if (!logits) return null_argument("cera_sampler_log_probs", "logits");
        if (!logprob) return null_argument("cera_sampler_log_probs", "logprob");
        if (n_top < 0) throw cera::Error(cera::ErrorCode::kInvalidArgument, "cera_sampler_log_probs: n_top < 0");
        if (n_top > 0 && !top) return null_argument("cera_sampler_log_probs", "top");
        if (token < 0 || token >= sampler->sampler.n_vocab())
            throw cera::Error(cera::ErrorCode::kOutOfRange,
                              "cera_sampler_log_probs: token " + std::to_string(token) + " outside the vocabulary");
        std::vector<cera::TokenLogprob> t(size_t(std::min(n_top, sampler->sampler.n_vocab())));
        *logprob = sampler->sampler.log_probs(logits, token, int32_t(t.size()), t.data());
        for (size_t i = 0; i < t.size(); ++i) top[i] = {t[i].id, t[i].logprob};
        for (size_t i = t.size(); i < size_t(n_top); ++i) top[i] = {CERA_TOKEN_NULL, 0.0f};
        return CERA_OK;
    });
}

void cera_sampler_accept(cera_sampler* sampler, cera_token token) {
    if (sampler && token >= 0 && token < sampler->sampler.n_vocab()) sampler->sampler.accept(token);
}

void cera_sampler_reset(cera_sampler* sampler) {
    if (sampler) sampler->sampler.reset();
}

cera_generate_options cera_generate_default_options(void) {
    const GenerateOptions d;
    cera_generate_options o{};
    o.max_tokens = d.max_tokens;
    o.sampling.temperature = d.sampling.temperature;
    o.sampling.top_k = d.sampling.top_k;
    o.sampling.top_p = d.sampling.top_p;
    o.sampling.min_p = d.sampling.min_p;
    o.sampling.repeat_penalty = d.sampling.repeat_penalty;
    o.sampling.frequency_penalty = d.sampling.frequency_penalty;
    o.sampling.presence_penalty = d.sampling.presence_penalty;
    o.sampling.penalty_last_n = d.sampling.penalty_last_n;
    o.sampling.seed = d.sampling.seed;
    o.ignore_eos = d.ignore_eos;
    o.n_keep = d.n_keep;
    o.logprobs = d.logprobs;
    o.device_greedy = d.device_greedy;
    o.device_sampling = d.device_sampling;
    o.decode_ahead = d.decode_ahead;
    return o;
}

}  // extern "C"
