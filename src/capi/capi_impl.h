// Internals of the C API (include/cera/cera.h): the handle structs, the exception barrier every
// entry point goes through, and the adapter from cera::Sink to the C token callback.
#pragma once
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cera/batcher.h"
#include "cera/cera.h"
#include "cera/engine.h"
#include "cera/error.h"
#include "cera/grammar.h"
#include "cera/sampler.h"
#include "cera/session.h"

struct cera_tokenizer {
    const cera::Engine* engine = nullptr;
};

struct cera_engine {
    std::shared_ptr<cera::Engine> engine;
    cera_tokenizer tokenizer;
    cera_model_info info{};  // its strings point into engine->info(), which never changes
};

struct cera_grammar {
    std::shared_ptr<const cera::Grammar> grammar;
};

struct cera_sampler {
    cera::Sampler sampler;
};

struct cera_image {
    std::shared_ptr<cera::Engine> engine;  // the engine whose projector encoded it
    std::shared_ptr<const cera::EncodedImage> image;
};

struct cera_session {
    std::unique_ptr<cera::Session> session;
    std::string text, stop_string;  // the last generation's, for cera_generation_result
};

namespace cera::capi {

// Records the calling thread's last error and returns its status.
cera_status fail(cera_status status, std::string_view message);
cera_status status_of(ErrorCode code);

// Runs f (returning a cera_status) with every exception turned into a status and a last-error
// message: nothing thrown crosses the C boundary.
template <class F>
cera_status guard(F&& f) noexcept {
    try {
        return f();
    } catch (const Error& e) {
        return fail(status_of(e.code()), e.what());
    } catch (const std::bad_alloc&) {
        return fail(CERA_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception& e) {
        return fail(CERA_ERR_INTERNAL, e.what());
    } catch (...) {
        return fail(CERA_ERR_INTERNAL, "an unknown exception");
    }
}

// The integer a C enum argument holds. A C caller may pass any int where C++ only allows the
// enumerators' range, so the value is read as its bytes rather than loaded as the enum type.
template <class E>
int raw_enum(const E& e) {
    static_assert(sizeof(E) == sizeof(int));
    int v;
    std::memcpy(&v, &e, sizeof v);
    return v;
}

// CERA_ERR_INVALID_ARGUMENT naming the NULL argument.
cera_status null_argument(const char* function, const char* argument);

// The caller-buffer convention of cera.h for text and arrays.
cera_status copy_text(std::string_view text, char* buf, size_t capacity, size_t* len_out);
template <class T>
cera_status copy_array(const std::vector<T>& v, T* out, size_t capacity, size_t* n_out);

// The C++ options of a C options struct (validated: bad values throw cera::Error).
SamplerParams sampler_params(const cera_sampling_params& params);
GenerateOptions generate_options(const cera_generate_options* options);
void fill_result(const GenerationResult& r, const std::string& text, const std::string& stop_string,
                 cera_generation_result* out);

// Calls a C token callback for each sampled token with the text that became final with it. A false
// from the callback calls on_stop (which cancels the generation) and silences the rest.
class CallbackSink : public Sink {
 public:
    CallbackSink(cera_token_callback callback, void* user_data, std::function<void()> on_stop)
        : callback_(callback), user_data_(user_data), on_stop_(std::move(on_stop)) {}
    void on_token(int32_t token) override;
    void on_logprobs(const SampledLogprobs& logprobs) override;
    void on_text(std::string_view text) override;
    void on_done(const GenerationResult& result) override;
    bool stopped() const { return stopped_; }

 private:
    void deliver(int32_t token, std::string_view text);
    cera_token_callback callback_;
    void* user_data_;
    std::function<void()> on_stop_;
    bool stopped_ = false;
    bool pending_ = false;  // a token whose text has not come yet
    int32_t token_ = CERA_TOKEN_NULL;
    float logprob_ = 0.0f;
    std::vector<cera_token_logprob> top_;
};

}  // namespace cera::capi

template <class T>
cera_status cera::capi::copy_array(const std::vector<T>& v, T* out, size_t capacity, size_t* n_out) {
    if (n_out) *n_out = v.size();
    if (capacity < v.size())
        return fail(CERA_ERR_BUFFER_TOO_SMALL, "the buffer holds " + std::to_string(capacity) + " items, " +
                                                   std::to_string(v.size()) + " are needed");
    if (!v.empty()) {
        if (!out) return null_argument("copy", "out");
        std::copy(v.begin(), v.end(), out);
    }
    return CERA_OK;
}
