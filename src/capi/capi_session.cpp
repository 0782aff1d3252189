// The C API's sessions and batched requests (include/cera/cera.h).
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "capi/capi_impl.h"
#include "capi/chat.h"

using namespace cera;
using cera::capi::fail;
using cera::capi::guard;
using cera::capi::null_argument;

struct cera_batcher {
    std::shared_ptr<Engine> engine;  // the batcher's; images must come from it
    std::shared_ptr<Batcher> batcher;
};

struct cera_request {
    // Shared with the request's sink, which may outlive the handle on the batcher's thread.
    struct Shared {
        std::mutex mu;
        std::shared_ptr<Request> request;  // set right after submit, reset by cera_request_free
        bool stop = false;                 // the callback returned false
        std::string text;                  // generated so far (cera_request_poll)
    };
    std::shared_ptr<Shared> shared;
    std::shared_ptr<Request> request;
    std::string text, stop_string;
};

namespace {

// A request's sink: keeps the text for polling, then hands the event to the C callback (if any).
class RequestSink : public cera::capi::CallbackSink {
 public:
    RequestSink(cera_token_callback callback, void* user_data, std::shared_ptr<cera_request::Shared> shared)
        : CallbackSink(callback, user_data, stopper(shared)), shared_(std::move(shared)) {}
    void on_text(std::string_view text) override {
        {
            std::lock_guard<std::mutex> lk(shared_->mu);
            shared_->text += text;
        }
        CallbackSink::on_text(text);
    }

 private:
    // The callback's stop may come before submit() has returned the Request: it is remembered, and
    // submit applies it. The sink's own reference keeps the shared block alive.
    static std::function<void()> stopper(const std::shared_ptr<cera_request::Shared>& shared) {
        cera_request::Shared* sh = shared.get();
        return [sh] {
            std::lock_guard<std::mutex> lk(sh->mu);
            sh->stop = true;
            if (sh->request) sh->request->cancel();
        };
    }
    std::shared_ptr<cera_request::Shared> shared_;
};

// Queues a request. With images (possibly none), the prompt's markers are expanded first, so that a
// marker without its image is refused rather than evaluated as text.
cera_status submit(const char* fn, cera_batcher* batcher, const cera_token* prompt, size_t n_prompt,
                   const std::vector<std::shared_ptr<const EncodedImage>>* images, const cera_generate_options* options,
                   cera_token_callback callback, void* user_data, cera_request** out) {
    return guard([&] {
        if (!batcher) return null_argument(fn, "batcher");
        if (!out) return null_argument(fn, "out");
        if (!prompt && n_prompt > 0) return null_argument(fn, "prompt");
        const cera_generate_options defaults = cera_generate_default_options();
        const GenerateOptions g = cera::capi::generate_options(options ? options : &defaults);
        const std::span<const int32_t> ids(prompt, n_prompt);
        std::vector<PromptImage> placed;
        std::vector<int32_t> expanded;
        if (images) expanded = batcher->engine->expand_images(ids, *images, &placed);
        auto h = std::make_unique<cera_request>();
        h->shared = std::make_shared<cera_request::Shared>();
        auto sink = std::make_shared<RequestSink>(callback, user_data, h->shared);
        h->request =
            images ? batcher->batcher->submit(expanded, g, sink, placed) : batcher->batcher->submit(ids, g, sink);
        {
            std::lock_guard<std::mutex> lk(h->shared->mu);
            h->shared->request = h->request;
            if (h->shared->stop) h->request->cancel();
        }
        *out = h.release();
        return CERA_OK;
    });
}

}  // namespace

extern "C" {

// ---- session ----

cera_status cera_session_new(cera_engine* engine, int32_t n_ctx, cera_session** out) {
    return guard([&] {
        if (!engine) return null_argument("cera_session_new", "engine");
        if (!out) return null_argument("cera_session_new", "out");
        auto s = std::make_unique<cera_session>();
        s->session = std::make_unique<Session>(engine->engine, n_ctx);
        *out = s.release();
        return CERA_OK;
    });
}

void cera_session_free(cera_session* session) { delete session; }

cera_status cera_session_append_text(cera_session* session, const char* text, bool parse_special) {
    return guard([&] {
        if (!session) return null_argument("cera_session_append_text", "session");
        if (!text) return null_argument("cera_session_append_text", "text");
        session->session->append_text(text, parse_special);
        return CERA_OK;
    });
}

cera_status cera_session_append_text_bos(cera_session* session, const char* text, bool add_bos, bool parse_special) {
    return guard([&] {
        if (!session) return null_argument("cera_session_append_text_bos", "session");
        if (!text) return null_argument("cera_session_append_text_bos", "text");
        session->session->append_text(text, add_bos, parse_special);
        return CERA_OK;
    });
}

cera_status cera_session_append_tokens(cera_session* session, const cera_token* tokens, size_t n_tokens) {
    return guard([&] {
        if (!session) return null_argument("cera_session_append_tokens", "session");
        if (!tokens && n_tokens > 0) return null_argument("cera_session_append_tokens", "tokens");
        session->session->append_tokens(std::span<const int32_t>(tokens, n_tokens));
        return CERA_OK;
    });
}

cera_status cera_session_append_chat(cera_session* session, const cera_chat_message* messages, size_t n_messages) {
    return guard([&] {
        if (!session) return null_argument("cera_session_append_chat", "session");
        if (!messages && n_messages > 0) return null_argument("cera_session_append_chat", "messages");
        std::vector<ChatMessage> msgs;
        for (size_t i = 0; i < n_messages; ++i) {
            if (!messages[i].role || !messages[i].content)
                return fail(CERA_ERR_INVALID_ARGUMENT,
                            "cera_session_append_chat: message " + std::to_string(i) + " has a NULL role or content");
            ChatMessage& c = msgs.emplace_back();
            c.role = messages[i].role;
            c.content = messages[i].content;
        }
        session->session->append_tokens(cera::capi::chat_tokens(*session->session->engine(), msgs));
        return CERA_OK;
    });
}

cera_status cera_session_generate(cera_session* session, const cera_generate_options* options,
                                  cera_token_callback callback, void* user_data, cera_generation_result* result) {
    return guard([&] {
        if (!session) return null_argument("cera_session_generate", "session");
        const cera_generate_options defaults = cera_generate_default_options();
        const GenerateOptions g = cera::capi::generate_options(options ? options : &defaults);
        Session& s = *session->session;
        cera::capi::CallbackSink sink(callback, user_data, [&s] { s.cancel(); });
        const GenerationResult r = s.generate(g, sink);
        session->text = r.text;
        session->stop_string = r.stop_string;
        cera::capi::fill_result(r, session->text, session->stop_string, result);
        return CERA_OK;
    });
}

void cera_session_cancel(cera_session* session) {
    if (session) session->session->cancel();
}

cera_status cera_session_logits(cera_session* session, const float** logits, int32_t* n_vocab) {
    return guard([&] {
        if (!session) return null_argument("cera_session_logits", "session");
        if (!logits) return null_argument("cera_session_logits", "logits");
        const std::span<const float> row = session->session->logits();
        *logits = row.data();
        if (n_vocab) *n_vocab = int32_t(row.size());
        return CERA_OK;
    });
}

cera_status cera_session_embed(cera_session* session, const cera_token* tokens, size_t n_tokens, cera_pooling pooling,
                               float* out, size_t capacity, size_t* n_out) {
    return guard([&] {
        if (!session) return null_argument("cera_session_embed", "session");
        if (!tokens && n_tokens > 0) return null_argument("cera_session_embed", "tokens");
        const int pool = cera::capi::raw_enum(pooling);
        if (pool != CERA_POOLING_MEAN && pool != CERA_POOLING_LAST && pool != CERA_POOLING_NONE)
            return fail(CERA_ERR_INVALID_ARGUMENT,
                        "cera_session_embed: pooling " + std::to_string(pool) + " is not a cera_pooling");
        const Pooling p = pool == CERA_POOLING_MEAN   ? Pooling::kMean
                          : pool == CERA_POOLING_LAST ? Pooling::kLast
                                                      : Pooling::kNone;
        const std::vector<float> v = session->session->embed(std::span<const int32_t>(tokens, n_tokens), p);
        return cera::capi::copy_array(v, out, capacity, n_out);
    });
}

cera_status cera_session_reset(cera_session* session) {
    return guard([&] {
        if (!session) return null_argument("cera_session_reset", "session");
        session->session->reset();
        return CERA_OK;
    });
}

cera_status cera_session_truncate(cera_session* session, int32_t n) {
    return guard([&] {
        if (!session) return null_argument("cera_session_truncate", "session");
        session->session->truncate(n);
        return CERA_OK;
    });
}

cera_status cera_session_shift_context(cera_session* session, int32_t n_keep, int32_t* n_dropped) {
    return guard([&] {
        if (!session) return null_argument("cera_session_shift_context", "session");
        const int32_t n = session->session->shift_context(n_keep);
        if (n_dropped) *n_dropped = n;
        return CERA_OK;
    });
}

int32_t cera_session_position(const cera_session* s) { return s ? s->session->position() : 0; }
int32_t cera_session_n_evaluated(const cera_session* s) { return s ? s->session->n_evaluated() : 0; }
int32_t cera_session_n_ctx(const cera_session* s) { return s ? s->session->n_ctx() : 0; }

cera_status cera_session_tokens(const cera_session* session, cera_token* tokens, size_t capacity, size_t* n_out) {
    return guard([&] {
        if (!session) return null_argument("cera_session_tokens", "session");
        return cera::capi::copy_array(session->session->tokens(), tokens, capacity, n_out);
    });
}

cera_status cera_session_save_state(const cera_session* session, uint8_t** data, size_t* size) {
    return guard([&] {
        if (!session) return null_argument("cera_session_save_state", "session");
        if (!data || !size) return null_argument("cera_session_save_state", "data or size");
        const std::vector<uint8_t> bytes = session->session->save_state();
        auto* p = static_cast<uint8_t*>(std::malloc(bytes.empty() ? 1 : bytes.size()));
        if (!p) return fail(CERA_ERR_OUT_OF_MEMORY, "cera_session_save_state: out of memory");
        if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
        *data = p;
        *size = bytes.size();
        return CERA_OK;
    });
}

cera_status cera_session_load_state(cera_session* session, const uint8_t* data, size_t size) {
    return guard([&] {
        if (!session) return null_argument("cera_session_load_state", "session");
        if (!data && size > 0) return null_argument("cera_session_load_state", "data");
        session->session->load_state(std::span<const uint8_t>(data, size));
        return CERA_OK;
    });
}

cera_status cera_session_save_state_file(const cera_session* session, const char* path) {
    return guard([&] {
        if (!session) return null_argument("cera_session_save_state_file", "session");
        if (!path) return null_argument("cera_session_save_state_file", "path");
        session->session->save_state_file(path);
        return CERA_OK;
    });
}

cera_status cera_session_load_state_file(cera_session* session, const char* path) {
    return guard([&] {
        if (!session) return null_argument("cera_session_load_state_file", "session");
        if (!path) return null_argument("cera_session_load_state_file", "path");
        session->session->load_state_file(path);
        return CERA_OK;
    });
}

// ---- batcher ----

cera_batcher_options cera_batcher_default_options(void) {
    const BatcherOptions d;
    cera_batcher_options o{};
    o.parallel = d.parallel;
    o.kv_tokens = d.kv_tokens;
    o.n_ctx = d.n_ctx;
    o.block_size = d.block_size;
    o.step_tokens = d.step_tokens;
    o.max_queue = d.max_queue;
    return o;
}

cera_status cera_batcher_new(cera_engine* engine, const cera_batcher_options* options, cera_batcher** out) {
    return guard([&] {
        if (!engine) return null_argument("cera_batcher_new", "engine");
        if (!out) return null_argument("cera_batcher_new", "out");
        const cera_batcher_options o = options ? *options : cera_batcher_default_options();
        BatcherOptions bo;
        bo.parallel = o.parallel;
        bo.kv_tokens = o.kv_tokens;
        bo.n_ctx = o.n_ctx;
        bo.block_size = o.block_size;
        bo.step_tokens = o.step_tokens;
        bo.max_queue = o.max_queue;
        auto b = std::make_unique<cera_batcher>();
        b->engine = engine->engine;
        b->batcher = Batcher::create(engine->engine, bo);
        *out = b.release();
        return CERA_OK;
    });
}

void cera_batcher_free(cera_batcher* batcher) {
    try {
        delete batcher;
    } catch (...) {
        // A destructor that throws has nowhere to report to here; the thread is gone either way.
    }
}

cera_status cera_batcher_stats_get(const cera_batcher* batcher, cera_batcher_stats* out) {
    return guard([&] {
        if (!batcher) return null_argument("cera_batcher_stats_get", "batcher");
        if (!out) return null_argument("cera_batcher_stats_get", "out");
        const BatcherStats s = batcher->batcher->stats();
        *out = {};
        out->steps = s.steps;
        out->tokens_evaluated = s.tokens_evaluated;
        out->preemptions = s.preemptions;
        out->kv_blocks_total = s.kv_blocks_total;
        out->kv_blocks_free = s.kv_blocks_free;
        out->kv_block_tokens = s.kv_block_tokens;
        out->kv_bytes = s.kv_bytes;
        out->running = s.running;
        out->waiting = s.waiting;
        return CERA_OK;
    });
}

int32_t cera_batcher_n_ctx(const cera_batcher* batcher) { return batcher ? batcher->batcher->n_ctx() : 0; }

cera_status cera_batcher_submit(cera_batcher* batcher, const cera_token* prompt, size_t n_prompt,
                                const cera_generate_options* options, cera_token_callback callback, void* user_data,
                                cera_request** out) {
    return submit("cera_batcher_submit", batcher, prompt, n_prompt, nullptr, options, callback, user_data, out);
}

cera_status cera_batcher_submit_images(cera_batcher* batcher, const cera_token* prompt, size_t n_prompt,
                                       const cera_image* const* images, size_t n_images,
                                       const cera_generate_options* options, cera_token_callback callback,
                                       void* user_data, cera_request** out) {
    return guard([&] {
        if (!batcher) return null_argument("cera_batcher_submit_images", "batcher");
        if (!images && n_images > 0) return null_argument("cera_batcher_submit_images", "images");
        std::vector<std::shared_ptr<const EncodedImage>> encoded;
        for (size_t i = 0; i < n_images; ++i) {
            const std::string which = "cera_batcher_submit_images: images[" + std::to_string(i) + "]";
            if (!images[i]) return fail(CERA_ERR_INVALID_ARGUMENT, which + " is NULL");
            // An image's embeddings are rows of its own engine's width and meaning.
            if (images[i]->engine != batcher->engine)
                return fail(CERA_ERR_INVALID_ARGUMENT, which + " was encoded by another engine");
            encoded.push_back(images[i]->image);
        }
        return submit("cera_batcher_submit_images", batcher, prompt, n_prompt, &encoded, options, callback, user_data,
                      out);
    });
}

bool cera_request_done(const cera_request* request) { return request && request->request->done(); }

cera_status cera_request_poll(const cera_request* request, char* buf, size_t capacity, size_t* len_out, bool* done) {
    return guard([&] {
        if (!request) return null_argument("cera_request_poll", "request");
        const bool finished = request->request->done();  // first: once finished, the text is complete
        std::string text;
        {
            std::lock_guard<std::mutex> lk(request->shared->mu);
            text = request->shared->text;
        }
        if (done) *done = finished;
        return cera::capi::copy_text(text, buf, capacity, len_out);
    });
}

void cera_request_cancel(cera_request* request) {
    if (request) request->request->cancel();
}

cera_status cera_request_wait(cera_request* request, cera_generation_result* result) {
    return guard([&] {
        if (!request) return null_argument("cera_request_wait", "request");
        const GenerationResult r = request->request->wait();
        request->text = r.text;
        request->stop_string = r.stop_string;
        cera::capi::fill_result(r, request->text, request->stop_string, result);
        return CERA_OK;
    });
}

void cera_request_free(cera_request* request) {
    if (!request) return;
    // The callback must not run once the handle is gone (its user_data may go with it): cancel, and
    // wait for the batcher to let go of the request, which it does before its next step.
    try {
        if (!request->request->done()) request->request->cancel();
        (void)request->request->wait();
    } catch (...) {
        // The request failed: nothing is left to wait for.
    }
    {
        // The Request holds the sink, which holds the shared block: its link back to the Request goes,
        // or neither would ever be freed.
        std::lock_guard<std::mutex> lk(request->shared->mu);
        request->shared->request.reset();
    }
    delete request;
}

}  // extern "C"
