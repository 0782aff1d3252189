// The C API's LoRA adapters and images (include/cera/cera.h): named adapters of an engine, images
// given to a session, and encoded images for batcher prompts.
#include <string>

#include "capi/capi_impl.h"

using namespace cera;
using cera::capi::fail;
using cera::capi::guard;
using cera::capi::null_argument;

namespace {

// The strings of the last cera_adapter_info handed out on this thread: the engine's list may change
// at any time on other threads, so the caller gets copies that stay put.
thread_local AdapterInfo t_adapter_info;

}  // namespace

extern "C" {

// ---- adapters ----

cera_status cera_engine_load_adapter(cera_engine* engine, const char* name, const char* path, float scale) {
    return guard([&] {
        if (!engine) return null_argument("cera_engine_load_adapter", "engine");
        if (!name) return null_argument("cera_engine_load_adapter", "name");
        if (!path) return null_argument("cera_engine_load_adapter", "path");
        engine->engine->load_adapter(name, path, scale);
        return CERA_OK;
    });
}

cera_status cera_engine_unload_adapter(cera_engine* engine, const char* name) {
    return guard([&] {
        if (!engine) return null_argument("cera_engine_unload_adapter", "engine");
        if (!name) return null_argument("cera_engine_unload_adapter", "name");
        if (!engine->engine->unload_adapter(name))
            return fail(CERA_ERR_MISSING, std::string("cera_engine_unload_adapter: no adapter named '") + name + "'");
        return CERA_OK;
    });
}

size_t cera_engine_adapter_count(const cera_engine* engine) {
    try {
        return engine ? engine->engine->adapters().size() : 0;
    } catch (...) {
        return 0;
    }
}

cera_status cera_engine_adapter_info(const cera_engine* engine, size_t i, cera_adapter_info* out) {
    return guard([&] {
        if (!engine) return null_argument("cera_engine_adapter_info", "engine");
        if (!out) return null_argument("cera_engine_adapter_info", "out");
        std::vector<AdapterInfo> list = engine->engine->adapters();
        if (i >= list.size())
            return fail(CERA_ERR_OUT_OF_RANGE, "cera_engine_adapter_info: adapter " + std::to_string(i) + " of " +
                                                   std::to_string(list.size()));
        t_adapter_info = std::move(list[i]);
        out->name = t_adapter_info.name.c_str();
        out->path = t_adapter_info.path.c_str();
        out->scale = t_adapter_info.scale;
        out->n_tensors = t_adapter_info.n_tensors;
        out->rank = t_adapter_info.rank;
        return CERA_OK;
    });
}

// ---- images ----

bool cera_engine_has_vision(const cera_engine* engine) { return engine && engine->engine->has_vision(); }

cera_status cera_engine_encode_image(cera_engine* engine, const uint8_t* data, size_t size, cera_image** out) {
    return guard([&] {
        if (!engine) return null_argument("cera_engine_encode_image", "engine");
        if (!out) return null_argument("cera_engine_encode_image", "out");
        if (!data && size > 0) return null_argument("cera_engine_encode_image", "data");
        auto h = std::make_unique<cera_image>();
        h->engine = engine->engine;
        h->image = engine->engine->encode_image(std::span<const uint8_t>(data, size));
        *out = h.release();
        return CERA_OK;
    });
}

void cera_image_free(cera_image* image) { delete image; }

cera_status cera_image_tokens(const cera_image* image, cera_token* tokens, size_t capacity, size_t* n_out) {
    return guard([&] {
        if (!image) return null_argument("cera_image_tokens", "image");
        const std::span<const int32_t> ids = image->engine->image_tokens(*image->image);
        return cera::capi::copy_array(std::vector<int32_t>(ids.begin(), ids.end()), tokens, capacity, n_out);
    });
}

cera_token cera_engine_image_marker(const cera_engine* engine) {
    if (!engine) return CERA_TOKEN_NULL;
    const int32_t id = engine->engine->image_marker();
    return id < 0 ? CERA_TOKEN_NULL : id;
}

cera_status cera_session_append_image(cera_session* session, const uint8_t* data, size_t size) {
    return guard([&] {
        if (!session) return null_argument("cera_session_append_image", "session");
        if (!data && size > 0) return null_argument("cera_session_append_image", "data");
        session->session->append_image(std::span<const uint8_t>(data, size));
        return CERA_OK;
    });
}

cera_status cera_session_append_image_file(cera_session* session, const char* path) {
    return guard([&] {
        if (!session) return null_argument("cera_session_append_image_file", "session");
        if (!path) return null_argument("cera_session_append_image_file", "path");
        session->session->append_image_file(path);
        return CERA_OK;
    });
}

}  // extern "C"
