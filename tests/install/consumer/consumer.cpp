// Greedy continuation of argv[2] by the model argv[1] through the C++ API, printed to stdout; a
// cera::Error thrown by the library is caught here (its type information crosses the boundary).
#include <cera/engine.h>
#include <cera/error.h>
#include <cera/session.h>

#include <cstdio>

int main(int argc, char** argv) {
    if (argc < 3) return 2;
    try {
        (void)cera::Engine::load("/nonexistent/model.gguf", {.device = "cpu"});
        return 3;
    } catch (const cera::Error& e) {
        if (e.code() != cera::ErrorCode::kIo) return 4;
    }
    auto engine = cera::Engine::load(argv[1], {.device = "cpu", .threads = 1});
    cera::Session s(engine);
    s.append_text(argv[2]);
    cera::GenerateOptions g;
    g.max_tokens = 24;
    g.sampling.temperature = 0.0f;
    cera::NullSink sink;
    const std::string text = s.generate(g, sink).text;
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
}
