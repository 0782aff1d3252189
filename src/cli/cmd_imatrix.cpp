// `cera imatrix`: the importance matrix of a model over a text (llama-imatrix's file), for
// `cera quantize --imatrix`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "cera/error.h"
#include "cli/command.h"
#include "cli/model_path.h"
#include "cli/parse_args.h"
#include "cli/progress.h"
#include "quantize/imatrix.h"

namespace cera::cli {
namespace {

int run_imatrix(const std::vector<std::string>& args) {
    CLI::App app{
        "Measures the importance matrix of a model over a text: for every weight matrix of its blocks, the\n"
        "mean square of each column's input, for `cera quantize --imatrix`. The file is llama-imatrix's\n"
        "GGUF format. Runs on the CPU.",
        "cera imatrix"};
    std::string model, text_file, out = "imatrix.gguf";
    quantize::ImatrixOptions o;
    app.add_option("-m,--model", model, "GGUF model (default: the bundled model)");
    app.add_option("-f,--file", text_file, "the text to run (at least two chunks of it)")->required();
    app.add_option("-o,--output", out, "the importance matrix file to write")->capture_default_str();
    app.add_option("-c,--ctx", o.n_ctx, "chunk length in tokens (each chunk from an empty cache)")
        ->capture_default_str();
    app.add_option("--chunks", o.n_chunks, "chunks to run at most (-1: all that fit)")->capture_default_str();
    app.add_option("-t,--threads", o.n_threads, "CPU threads (0: the physical cores)")->capture_default_str();
    app.add_flag("--process-output", o.process_output, "also measure the input of output.weight");
    if (int rc = parse_args(app, args, "imatrix",
                            [&] {
                                if (o.n_ctx < 2) throw CLI::ValidationError("--ctx must be at least 2");
                                if (o.n_threads < 0) throw CLI::ValidationError("--threads must be >= 0");
                            });
        rc >= 0)
        return rc;
    if (model.empty()) model = find_default_model();
    std::ifstream f(text_file, std::ios::binary);
    if (!f) throw Error(ErrorCode::kIo, "-f " + text_file + ": cannot open the file");
    const std::string text(std::istreambuf_iterator<char>(f), {});
    o.model = model;
    o.dataset = text_file;
    Progress bar("imatrix", 0, stderr, "chunks");
    o.on_chunk = [&bar](int32_t done, int32_t total) { bar.update(uint64_t(done), uint64_t(total)); };
    const quantize::ImatrixRun r = quantize::compute_imatrix(o, text);
    bar.finish();
    quantize::write_imatrix(r.imatrix, out);
    std::printf("wrote %s: %zu matrices, %u chunks of %u tokens (%lld tokens, %.0f tok/s), in %.1f s\n", out.c_str(),
                r.imatrix.entries.size(), r.imatrix.chunk_count, r.imatrix.chunk_size, (long long)r.n_tokens,
                r.seconds > 0 ? double(r.n_tokens) / r.seconds : 0.0, r.seconds);
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(imatrix, "imatrix", "measure a model's importance matrix over a text (for quantize --imatrix)",
                 run_imatrix);

}  // namespace cera::cli
