// The Python module `cera`: an Engine with generate, stream, chat, embed, tokenize and detokenize
// over the C++ API (docs/python.md).
//
// Generation runs with the GIL released. generate() takes it back at each token to run Python's
// signal handlers (PyErr_CheckSignals), so Ctrl-C cancels the session and the KeyboardInterrupt
// reaches the caller. stream() generates on a thread of its own and hands pieces over through a
// queue; the iterator waits for them without the GIL and checks for signals while it waits.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "capi/chat.h"
#include "cera/engine.h"
#include "cera/error.h"
#include "cera/grammar.h"
#include "cera/session.h"

namespace py = pybind11;
using namespace py::literals;

namespace {

// Text as a Python str; bytes that are not UTF-8 (a token cut inside a character) become U+FFFD.
py::str to_str(std::string_view s) {
    PyObject* o = PyUnicode_DecodeUTF8(s.data(), Py_ssize_t(s.size()), "replace");
    if (!o) throw py::error_already_set();
    return py::reinterpret_steal<py::str>(o);
}

// The keyword arguments of generate(), stream() and chat().
struct GenArgs {
    int32_t max_tokens = 256;
    float temperature = 0.8f;
    float top_p = 0.95f;
    int32_t top_k = 40;
    float min_p = 0.05f;
    std::optional<uint64_t> seed;  // none: a random one
    std::vector<std::string> stop;
    float repeat_penalty = 1.0f;
    bool ignore_eos = false;
    std::string adapter;  // "": the engine's default adapters
    std::shared_ptr<const cera::Grammar> grammar;  // structured output; null: none
    int32_t lookup_ngram = 0;                      // prompt lookup (speculative decoding); 0: off

    cera::GenerateOptions options() const {
        cera::GenerateOptions g;
        g.max_tokens = max_tokens;
        g.sampling.temperature = temperature;
        g.sampling.top_p = top_p;
        g.sampling.top_k = top_k;
        g.sampling.min_p = min_p;
        g.sampling.repeat_penalty = repeat_penalty;
        g.sampling.seed = seed ? *seed : (uint64_t(std::random_device{}()) << 32 | std::random_device{}());
        g.stop = stop;
        g.ignore_eos = ignore_eos;
        g.adapter = adapter;
        g.grammar = grammar;
        g.speculative.lookup_ngram = lookup_ngram;
        return g;
    }
};

// A file system path from a str or an os.PathLike.
std::string fs_path(const py::handle& p) { return py::module_::import("os").attr("fspath")(p).cast<std::string>(); }

// The bytes of a bytes-like object (bytes, bytearray, memoryview, ...).
std::vector<uint8_t> buffer_bytes(const py::handle& o) {
    const py::buffer_info info = py::reinterpret_borrow<py::buffer>(o).request();
    const auto* p = static_cast<const uint8_t*>(info.ptr);
    return std::vector<uint8_t>(p, p + info.size * info.itemsize);
}

// Engine(lora=[...]): each item a path, or a (path, scale) pair.
std::vector<cera::LoraOptions> lora_list(const py::object& lora) {
    std::vector<cera::LoraOptions> out;
    if (lora.is_none()) return out;
    if (py::isinstance<py::str>(lora) || py::hasattr(lora, "__fspath__"))
        throw cera::Error(cera::ErrorCode::kInvalidArgument,
                          "lora: a list of paths or (path, scale) pairs is expected");
    for (const py::handle item : lora) {
        if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
            const py::sequence pair = py::reinterpret_borrow<py::sequence>(item);
            if (pair.size() != 2)
                throw cera::Error(cera::ErrorCode::kInvalidArgument, "lora: an item is not a (path, scale) pair");
            out.push_back({fs_path(pair[0]), pair[1].cast<float>()});
        } else {
            out.push_back({fs_path(item), 1.0f});
        }
    }
    return out;
}

std::vector<std::string> stop_list(const py::object& stop) {
    if (stop.is_none()) return {};
    if (py::isinstance<py::str>(stop)) return {stop.cast<std::string>()};
    return stop.cast<std::vector<std::string>>();
}

// An image given to the module: the bytes of its file, or the path of one.
struct ImageSource {
    std::vector<uint8_t> bytes;
    std::string path;  // used when bytes is empty
};

ImageSource image_source(const py::handle& o) {
    ImageSource src;
    if (py::isinstance<py::str>(o) || py::hasattr(o, "__fspath__"))
        src.path = fs_path(o);
    else if (PyObject_CheckBuffer(o.ptr()))
        src.bytes = buffer_bytes(o);
    else
        throw cera::Error(cera::ErrorCode::kInvalidArgument, "an image is given as bytes or a path");
    return src;
}

void queue_image(cera::Session& s, const ImageSource& src) {
    if (src.path.empty())
        s.append_image(src.bytes);
    else
        s.append_image_file(src.path);
}

// A prompt: token ids with an "<image>" marker (Engine::image_marker) where each image goes.
struct Prompt {
    std::vector<int32_t> tokens;
    std::vector<ImageSource> images;
};

// Queues a prompt: the tokens between markers, and each image at its marker.
void queue_prompt(cera::Session& s, const Prompt& p) {
    if (p.images.empty()) return s.append_tokens(p.tokens);
    const int32_t marker = s.engine()->image_marker();
    const size_t n_markers = size_t(std::count(p.tokens.begin(), p.tokens.end(), marker));
    if (marker < 0 || n_markers != p.images.size())
        throw cera::Error(cera::ErrorCode::kInvalidArgument,
                          "chat: the prompt has " + std::to_string(marker < 0 ? 0 : n_markers) +
                              " <image> markers for " + std::to_string(p.images.size()) + " images");
    const std::span<const int32_t> tokens(p.tokens);
    size_t from = 0, image = 0;
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] != marker) continue;
        if (i > from) s.append_tokens(tokens.subspan(from, i - from));
        queue_image(s, p.images[image++]);
        from = i + 1;
    }
    if (from < tokens.size()) s.append_tokens(tokens.subspan(from));
}

// An OpenAI-style message's content: a string, None, or a list of parts: text ones, and image ones
// ({"type": "image", "image": bytes or a path}) which become "<image>" markers, their images going to
// *images in order.
std::string content_text(const py::handle& content, std::vector<ImageSource>* images) {
    if (content.is_none()) return "";
    if (py::isinstance<py::str>(content)) return content.cast<std::string>();
    std::string out;
    for (const py::handle part : content) {
        const py::dict d = py::reinterpret_borrow<py::dict>(part);
        const std::string type = d.contains("type") ? d["type"].cast<std::string>() : "text";
        if (type == "image" && d.contains("image")) {
            images->push_back(image_source(d["image"]));
            out += "<image>";
        } else if (type == "text") {
            out += d["text"].cast<std::string>();
        } else {
            throw cera::Error(
                cera::ErrorCode::kUnsupported,
                "chat: content parts are {'type': 'text', 'text': ...} or {'type': 'image', 'image': ...}");
        }
    }
    return out;
}

std::vector<cera::ChatMessage> chat_messages(const py::iterable& messages, std::vector<ImageSource>* images) {
    std::vector<cera::ChatMessage> out;
    for (const py::handle m : messages) {
        const py::dict d = py::reinterpret_borrow<py::dict>(m);
        if (!d.contains("role")) throw cera::Error(cera::ErrorCode::kInvalidArgument, "chat: a message has no 'role'");
        cera::ChatMessage c;
        c.role = d["role"].cast<std::string>();
        if (d.contains("content")) c.content = content_text(d["content"], images);
        if (d.contains("name") && !d["name"].is_none()) c.name = d["name"].cast<std::string>();
        if (d.contains("tool_call_id") && !d["tool_call_id"].is_none())
            c.tool_call_id = d["tool_call_id"].cast<std::string>();
        out.push_back(std::move(c));
    }
    return out;
}

// generate(): runs on the caller's thread without the GIL; each token takes the GIL briefly to run
// the signal handlers, and a raised exception (KeyboardInterrupt) cancels the session.
class InterruptibleSink : public cera::Sink {
 public:
    // Constructed with the GIL held. Python runs signal handlers on its main thread only, so a
    // generation on another thread never takes the GIL back.
    explicit InterruptibleSink(cera::Session& session) : session_(session), main_thread_(on_main_thread()) {}
    void on_text(std::string_view) override {}
    void on_token(int32_t) override {
        if (!main_thread_ || error_) return;
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
            error_.emplace();  // takes the pending Python exception
            session_.cancel();
        }
    }
    // Raises the exception a signal handler raised, if one did (with the GIL held).
    void rethrow() {
        if (error_) {
            py::error_already_set e = std::move(*error_);
            error_.reset();
            throw e;
        }
    }

 private:
    static bool on_main_thread() {
        const py::module_ threading = py::module_::import("threading");
        return threading.attr("current_thread")().is(threading.attr("main_thread")());
    }

    cera::Session& session_;
    const bool main_thread_;
    std::optional<py::error_already_set> error_;
};

// The iterator stream() returns: a thread generates into a queue of pieces.
class Stream {
 public:
    Stream(std::shared_ptr<cera::Engine> engine, const Prompt& prompt, cera::GenerateOptions options)
        : session_(std::make_unique<cera::Session>(std::move(engine))) {
        queue_prompt(*session_, prompt);
        thread_ = std::thread([this, options = std::move(options)] {
            QueueSink sink(*this);
            try {
                session_->generate(options, sink);
            } catch (...) {
                std::lock_guard<std::mutex> lk(mu_);
                error_ = std::current_exception();
            }
            std::lock_guard<std::mutex> lk(mu_);
            done_ = true;
            cv_.notify_all();
        });
    }
    ~Stream() { stop(); }

    // The next piece; py::stop_iteration at the end.
    py::str next() {
        for (;;) {
            std::string piece;
            bool have = false, finished = false;
            {
                py::gil_scoped_release release;
                std::unique_lock<std::mutex> lk(mu_);
                cv_.wait_for(lk, std::chrono::milliseconds(50), [&] { return !pieces_.empty() || done_; });
                if (!pieces_.empty()) {
                    piece = std::move(pieces_.front());
                    pieces_.pop_front();
                    have = true;
                } else if (done_) {
                    finished = true;
                }
            }
            if (have) return to_str(piece);
            if (finished) {
                join();
                if (error_) {
                    std::exception_ptr e = error_;
                    error_ = nullptr;
                    std::rethrow_exception(e);
                }
                throw py::stop_iteration();
            }
            if (PyErr_CheckSignals() != 0) {
                py::error_already_set e;
                stop();
                throw e;
            }
        }
    }

    // Cancels the generation and waits for its thread.
    void stop() {
        if (!thread_.joinable()) return;
        session_->cancel();
        py::gil_scoped_release release;
        join();
    }

 private:
    class QueueSink : public cera::Sink {
     public:
        explicit QueueSink(Stream& s) : s_(s) {}
        void on_text(std::string_view text) override {
            std::lock_guard<std::mutex> lk(s_.mu_);
            s_.pieces_.emplace_back(text);
            s_.cv_.notify_all();
        }

     private:
        Stream& s_;
    };
    void join() {
        if (thread_.joinable()) thread_.join();
    }

    std::unique_ptr<cera::Session> session_;
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::string> pieces_;
    bool done_ = false;
    std::exception_ptr error_;
};

class Engine {
 public:
    Engine(const py::object& path, const std::string& device, int threads, int32_t n_ctx, const py::object& mmproj,
           const py::object& lora) {
        cera::EngineOptions o;
        o.device = device;
        o.threads = threads;
        o.n_ctx = n_ctx;
        if (!mmproj.is_none()) o.mmproj = fs_path(mmproj);
        o.lora = lora_list(lora);
        const std::string file = fs_path(path);
        py::gil_scoped_release release;
        engine_ = cera::Engine::load(file, o);
    }

    // The prompt as `cera run` tokenizes it: BOS where the model wants it, then the text with
    // special-token text parsed.
    std::vector<int32_t> prompt_tokens(const std::string& prompt) const {
        std::vector<int32_t> ids;
        if (engine_->add_bos() && engine_->bos_token() >= 0) ids.push_back(engine_->bos_token());
        const std::vector<int32_t> body = engine_->tokenize(prompt, false, true);
        ids.insert(ids.end(), body.begin(), body.end());
        if (ids.empty()) throw cera::Error(cera::ErrorCode::kInvalidArgument, "the prompt is empty");
        return ids;
    }

    py::str generate_tokens(const Prompt& prompt, const GenArgs& a) const {
        const cera::GenerateOptions g = a.options();
        cera::Session session(engine_);
        {
            py::gil_scoped_release release;  // images are encoded here
            queue_prompt(session, prompt);
        }
        InterruptibleSink sink(session);
        cera::GenerationResult r;
        {
            py::gil_scoped_release release;
            r = session.generate(g, sink);
        }
        sink.rethrow();
        return to_str(r.text);
    }

    std::shared_ptr<Stream> stream_tokens(const Prompt& prompt, const GenArgs& a) const {
        return std::make_shared<Stream>(engine_, prompt, a.options());
    }

    py::str generate(const std::string& prompt, const GenArgs& a) const {
        return generate_tokens({prompt_tokens(prompt), {}}, a);
    }
    std::shared_ptr<Stream> stream(const std::string& prompt, const GenArgs& a) const {
        return stream_tokens({prompt_tokens(prompt), {}}, a);
    }
    Prompt chat_prompt(const py::iterable& messages) const {
        Prompt p;
        const std::vector<cera::ChatMessage> msgs = chat_messages(messages, &p.images);
        p.tokens = cera::capi::chat_tokens(*engine_, msgs);
        return p;
    }
    py::str apply_chat_template(const py::iterable& messages, bool add_generation_prompt) const {
        std::vector<ImageSource> images;  // their markers stay in the text
        return to_str(
            cera::capi::render_chat(*engine_, nullptr, chat_messages(messages, &images), add_generation_prompt));
    }

    py::object embed(const std::string& text, const std::string& pooling) const {
        cera::Pooling p;
        const cera::EngineInfo& info = engine_->info();
        if (pooling == "model") {
            if (!info.pooling_unsupported.empty())
                throw cera::Error(cera::ErrorCode::kUnsupported, "embed: the model pools its embeddings by " +
                                                                     info.pooling_unsupported +
                                                                     ", which is not supported");
            p = info.pooling;
        } else if (pooling == "mean")
            p = cera::Pooling::kMean;
        else if (pooling == "last")
            p = cera::Pooling::kLast;
        else if (pooling == "none")
            p = cera::Pooling::kNone;
        else
            throw cera::Error(cera::ErrorCode::kInvalidArgument,
                              "embed: pooling must be 'model', 'mean', 'last' or 'none'");
        const std::vector<int32_t> tokens = engine_->tokenize(text, true);
        std::vector<float> v;
        {
            cera::Session session(engine_);
            py::gil_scoped_release release;
            v = session.embed(tokens, p);
        }
        const size_t n_embd = size_t(engine_->info().n_embd);
        py::object np;
        try {
            np = py::module_::import("numpy");
        } catch (const py::error_already_set&) {
            // No NumPy: plain lists (of rows when not pooled).
            if (p != cera::Pooling::kNone) return py::cast(v);
            py::list rows;
            for (size_t i = 0; i < v.size(); i += n_embd)
                rows.append(py::cast(std::vector<float>(v.begin() + i, v.begin() + i + n_embd)));
            return rows;
        }
        py::array_t<float> a(v.size());
        std::copy(v.begin(), v.end(), a.mutable_data());
        if (p == cera::Pooling::kNone) a.resize({v.size() / n_embd, n_embd});
        return a;
    }

    std::vector<int32_t> tokenize(const std::string& text, bool add_bos, bool special) const {
        return engine_->tokenize(text, add_bos, special);
    }
    py::str detokenize(const std::vector<int32_t>& tokens, bool special) const {
        const int32_t n_vocab = engine_->info().n_vocab;
        for (int32_t t : tokens)
            if (t < 0 || t >= n_vocab)
                throw cera::Error(cera::ErrorCode::kOutOfRange,
                                  "detokenize: token id " + std::to_string(t) + " is outside the vocabulary");
        return to_str(engine_->detokenize(tokens, special));
    }

    void load_adapter(const std::string& name, const py::object& path, float scale) {
        const std::string file = fs_path(path);
        py::gil_scoped_release release;
        engine_->load_adapter(name, file, scale);
    }
    py::list adapters() const {
        py::list out;
        for (const cera::AdapterInfo& a : engine_->adapters())
            out.append(py::dict("name"_a = a.name, "path"_a = a.path, "scale"_a = a.scale, "n_tensors"_a = a.n_tensors,
                                "rank"_a = a.rank));
        return out;
    }

    py::dict info() const {
        const cera::EngineInfo& i = engine_->info();
        return py::dict("path"_a = i.path, "architecture"_a = i.architecture, "name"_a = i.name,
                        "weight_type"_a = i.weight_type, "device"_a = i.device, "on_gpu"_a = i.on_gpu,
                        "n_params"_a = i.n_params, "n_vocab"_a = i.n_vocab, "n_embd"_a = i.n_embd,
                        "n_layer"_a = i.n_layer, "n_ctx_train"_a = i.n_ctx_train, "n_ctx"_a = i.n_ctx,
                        "has_chat_template"_a = i.has_chat_template);
    }
    const cera::Engine& engine() const { return *engine_; }
    const std::shared_ptr<cera::Engine>& shared() const { return engine_; }

 private:
    std::shared_ptr<cera::Engine> engine_;
};

// The keyword arguments generate(), stream() and chat() share, after their first argument.
GenArgs gen_args(int32_t max_tokens, float temperature, float top_p, int32_t top_k, float min_p,
                 std::optional<uint64_t> seed, const py::object& stop, float repeat_penalty, bool ignore_eos,
                 const std::optional<std::string>& adapter, const py::object& grammar, const py::object& json_schema,
                 int32_t lookup_ngram) {
    GenArgs a;
    a.max_tokens = max_tokens;
    a.temperature = temperature;
    a.top_p = top_p;
    a.top_k = top_k;
    a.min_p = min_p;
    a.seed = seed;
    a.stop = stop_list(stop);
    a.repeat_penalty = repeat_penalty;
    a.ignore_eos = ignore_eos;
    a.adapter = adapter.value_or("");
    if (!grammar.is_none() && !json_schema.is_none())
        throw cera::Error(cera::ErrorCode::kInvalidArgument, "grammar and json_schema: give one of them");
    if (!grammar.is_none()) {
        a.grammar = cera::Grammar::parse(grammar.cast<std::string>());
    } else if (!json_schema.is_none()) {  // a schema's text, or the schema as Python objects
        const std::string text = py::isinstance<py::str>(json_schema)
                                     ? json_schema.cast<std::string>()
                                     : py::module_::import("json").attr("dumps")(json_schema).cast<std::string>();
        a.grammar = cera::Grammar::from_json_schema(text);
    }
    a.lookup_ngram = lookup_ngram;
    return a;
}

// A stateful sequence: text and tokens accumulate, generate() continues from where it is, and the
// state saves to bytes and loads back.
class PySession {
 public:
    PySession(const Engine& engine, int32_t n_ctx) : session_(engine.shared(), n_ctx) {}

    void append(const std::string& text, bool special) { session_.append_text(text, special); }
    void append_tokens(const std::vector<int32_t>& tokens) { session_.append_tokens(tokens); }
    void append_image(const py::object& image) {
        const ImageSource src = image_source(image);
        py::gil_scoped_release release;
        queue_image(session_, src);
    }
    py::str generate(const GenArgs& a) {
        const cera::GenerateOptions g = a.options();
        InterruptibleSink sink(session_);
        cera::GenerationResult r;
        {
            py::gil_scoped_release release;
            r = session_.generate(g, sink);
        }
        sink.rethrow();
        return to_str(r.text);
    }
    py::object logits() {
        std::span<const float> row;
        {
            py::gil_scoped_release release;
            row = session_.logits();
        }
        try {
            py::module_::import("numpy");
        } catch (const py::error_already_set&) {
            return py::cast(std::vector<float>(row.begin(), row.end()));
        }
        py::array_t<float> a(row.size());
        std::copy(row.begin(), row.end(), a.mutable_data());
        return a;
    }
    py::bytes save_state() const {
        const std::vector<uint8_t> b = session_.save_state();
        return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
    }
    void load_state(const py::bytes& data) {
        const std::string_view v = data;
        session_.load_state(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size()));
    }
    cera::Session& session() { return session_; }

 private:
    cera::Session session_;
};

#define CERA_GEN_ARGS                                                                                                  \
    py::kw_only(), "max_tokens"_a = 256, "temperature"_a = 0.8f, "top_p"_a = 0.95f, "top_k"_a = 40, "min_p"_a = 0.05f, \
                   "seed"_a = py::none(), "stop"_a = py::none(), "repeat_penalty"_a = 1.0f, "ignore_eos"_a = false,    \
                   "adapter"_a = py::none(), "grammar"_a = py::none(), "json_schema"_a = py::none(),                   \
                   "lookup_ngram"_a = 0

}  // namespace

PYBIND11_MODULE(cera, m) {
    m.doc() = "cera: LLM inference on GGUF models (CPU and CUDA)";
    m.attr("__version__") = CERA_VERSION_STRING;
    static py::exception<cera::Error> error(m, "Error", PyExc_RuntimeError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const cera::Error& e) {
            // An instance with the code as an attribute, e.g. err.code == "invalid file".
            py::object exc = py::handle(error.ptr())(e.what());
            exc.attr("code") = cera::error_code_name(e.code());
            PyErr_SetObject(error.ptr(), exc.ptr());
        }
    });

    py::class_<Stream, std::shared_ptr<Stream>>(m, "Stream", "An iterator of generated text pieces")
        .def("__iter__", [](std::shared_ptr<Stream> s) { return s; })
        .def("__next__", &Stream::next)
        .def("close", &Stream::stop, "Cancels the generation");

    py::class_<PySession>(m, "Session", "One sequence on an Engine: its tokens, KV cache and state")
        .def(py::init<const Engine&, int32_t>(), "engine"_a, "n_ctx"_a = 0, py::keep_alive<1, 2>())
        .def("append", &PySession::append, "text"_a, "special"_a = true,
             "Queues text (BOS first when the session is empty and the model wants it)")
        .def("append_tokens", &PySession::append_tokens, "tokens"_a, "Queues token ids")
        .def("append_image", &PySession::append_image, "image"_a,
             "Queues an image, given as the bytes of its file or its path (an Engine with mmproj): its tokens "
             "join the sequence, its embeddings standing in for the image tokens")
        .def(
            "generate",
            [](PySession& s, int32_t max_tokens, float temperature, float top_p, int32_t top_k, float min_p,
               std::optional<uint64_t> seed, const py::object& stop, float repeat_penalty, bool ignore_eos,
               const std::optional<std::string>& adapter, const py::object& grammar, const py::object& json_schema,
               int32_t lookup_ngram) {
                return s.generate(gen_args(max_tokens, temperature, top_p, top_k, min_p, seed, stop, repeat_penalty,
                                           ignore_eos, adapter, grammar, json_schema, lookup_ngram));
            },
            CERA_GEN_ARGS, "Evaluates what is queued and continues the sequence; the generated text")
        .def("logits", &PySession::logits, "The next-token logits after the last token (queued ones evaluated)")
        .def("save_state", &PySession::save_state, "The whole state as bytes")
        .def("load_state", &PySession::load_state, "data"_a, "Replaces the state with saved bytes")
        .def("reset", [](PySession& s) { s.session().reset(); })
        .def(
            "truncate", [](PySession& s, int32_t n) { s.session().truncate(n); }, "n"_a)
        .def(
            "cancel", [](PySession& s) { s.session().cancel(); }, "Stops a generate() running on another thread")
        .def_property_readonly("tokens", [](PySession& s) { return s.session().tokens(); })
        .def_property_readonly("position", [](PySession& s) { return s.session().position(); })
        .def_property_readonly("n_ctx", [](PySession& s) { return s.session().n_ctx(); });

    py::class_<Engine>(m, "Engine", "A loaded GGUF model")
        .def(py::init<const py::object&, const std::string&, int, int32_t, const py::object&, const py::object&>(),
             "path"_a, "device"_a = "auto", "threads"_a = 0, "n_ctx"_a = 0, py::kw_only(), "mmproj"_a = py::none(),
             "lora"_a = py::none(),
             "Loads a model. device: 'auto', 'cpu', 'cuda' or 'cuda:N'; threads 0: the physical cores; "
             "n_ctx 0: the model's context (at most 4096); mmproj: a vision projector GGUF (sessions and chat then "
             "take images); lora: default adapters, each a path or a (path, scale) pair")
        .def(
            "generate",
            [](const Engine& e, const std::string& prompt, int32_t max_tokens, float temperature, float top_p,
               int32_t top_k, float min_p, std::optional<uint64_t> seed, const py::object& stop, float repeat_penalty,
               bool ignore_eos, const std::optional<std::string>& adapter, const py::object& grammar,
               const py::object& json_schema, int32_t lookup_ngram) {
                return e.generate(prompt,
                                  gen_args(max_tokens, temperature, top_p, top_k, min_p, seed, stop, repeat_penalty,
                                           ignore_eos, adapter, grammar, json_schema, lookup_ngram));
            },
            "prompt"_a, CERA_GEN_ARGS,
            "The continuation of a prompt (greedy at temperature 0: the text `cera run` prints)")
        .def(
            "stream",
            [](const Engine& e, const std::string& prompt, int32_t max_tokens, float temperature, float top_p,
               int32_t top_k, float min_p, std::optional<uint64_t> seed, const py::object& stop, float repeat_penalty,
               bool ignore_eos, const std::optional<std::string>& adapter, const py::object& grammar,
               const py::object& json_schema, int32_t lookup_ngram) {
                return e.stream(prompt,
                                gen_args(max_tokens, temperature, top_p, top_k, min_p, seed, stop, repeat_penalty,
                                         ignore_eos, adapter, grammar, json_schema, lookup_ngram));
            },
            "prompt"_a, CERA_GEN_ARGS, "As generate(), yielding the text in pieces as it decodes")
        .def(
            "chat",
            [](const Engine& e, const py::iterable& messages, int32_t max_tokens, float temperature, float top_p,
               int32_t top_k, float min_p, std::optional<uint64_t> seed, const py::object& stop, float repeat_penalty,
               bool ignore_eos, const std::optional<std::string>& adapter, const py::object& grammar,
               const py::object& json_schema, int32_t lookup_ngram, bool stream) -> py::object {
                const GenArgs a = gen_args(max_tokens, temperature, top_p, top_k, min_p, seed, stop, repeat_penalty,
                                           ignore_eos, adapter, grammar, json_schema, lookup_ngram);
                const Prompt prompt = e.chat_prompt(messages);
                if (stream) return py::cast(e.stream_tokens(prompt, a));
                return e.generate_tokens(prompt, a);
            },
            "messages"_a, CERA_GEN_ARGS, "stream"_a = false,
            "The assistant's reply to OpenAI-style messages ([{'role': 'user', 'content': '...'}]), rendered with "
            "the model's chat template (ChatML when it has none); stream=True: an iterator of pieces")
        .def("load_adapter", &Engine::load_adapter, "name"_a, "path"_a, "scale"_a = 1.0f,
             "Adds a named LoRA adapter (a GGUF LoRA file or a PEFT folder) that generate(adapter=name) uses")
        .def(
            "unload_adapter", [](Engine& e, const std::string& name) { return e.shared()->unload_adapter(name); },
            "name"_a, "Removes a named adapter; False when there is none by that name")
        .def("adapters", &Engine::adapters, "The named adapters: dicts of name, path, scale, n_tensors and rank")
        .def("apply_chat_template", &Engine::apply_chat_template, "messages"_a, "add_generation_prompt"_a = true,
             "The messages rendered with the model's chat template, as text")
        .def("embed", &Engine::embed, "text"_a, "pooling"_a = "model",
             "The last hidden states after the final norm, pooled ('model': as the model asks, the mean unless "
             "its file names the last token's; 'mean', 'last' or 'none': one row per token); "
             "a NumPy array when NumPy is importable, else a list")
        .def("tokenize", &Engine::tokenize, "text"_a, "add_bos"_a = true, "special"_a = true,
             "Text to token ids (add_bos: BOS where the model wants it; special: special-token text as its id)")
        .def("detokenize", &Engine::detokenize, "tokens"_a, "special"_a = false, "Token ids to text")
        .def_property_readonly("info", &Engine::info, "Facts about the model and device")
        .def_property_readonly(
            "has_vision", [](const Engine& e) { return e.engine().has_vision(); },
            "Whether a vision projector is loaded (mmproj)")
        .def_property_readonly("n_vocab", [](const Engine& e) { return e.engine().info().n_vocab; })
        .def_property_readonly("n_embd", [](const Engine& e) { return e.engine().info().n_embd; })
        .def_property_readonly("n_ctx", [](const Engine& e) { return e.engine().info().n_ctx; })
        .def_property_readonly("bos_token", [](const Engine& e) { return e.engine().bos_token(); })
        .def_property_readonly("eos_token", [](const Engine& e) { return e.engine().eos_token(); });
}
