// `cera quantize`: requantizes a GGUF model to another weight type, tensor for tensor
// as llama-quantize does (see tools/quantize).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cera/error.h"
#include "cli/command.h"
#include "cli/parse_args.h"
#include "cli/progress.h"
#include "quantize/quantize.h"

namespace cera::cli {
namespace {

std::string type_list() {
    std::string s;
    for (const auto& n : quantize::file_type_names()) s += std::string(s.empty() ? "" : " | ") + n.name;
    return s;
}

int run_quantize(const std::vector<std::string>& args) {
    CLI::App app{"Requantizes a GGUF model to another weight type, with llama-quantize's choice of tensor types.",
                 "cera quantize"};
    std::string in, out, type;
    std::vector<std::string> keep;
    int threads = 0;
    app.add_option("IN", in, "input GGUF (F32, F16, BF16 or quantized)")->required();
    app.add_option("OUT", out, "output GGUF")->required();
    app.add_option("TYPE", type,
                   type_list() + " (Q3_K / Q4_K / Q5_K: the _M mixtures)")
        ->required();
    app.add_option("--keep", keep, "tensors left in their input type (comma-separated, repeatable)")->delimiter(',');
    std::string imatrix;
    app.add_option("--imatrix", imatrix, "importance matrix (from cera imatrix or llama-imatrix) to weight the quantizers");
    app.add_option("--threads", threads, "threads (default: all cores); the output does not depend on it");

    quantize::QuantizeOptions o;
    const int rc = parse_args(app, args, "quantize", [&] {
        if (threads < 0) throw CLI::ValidationError("--threads must be >= 0");
        try {
            o.file_type = quantize::parse_file_type(type);
        } catch (const Error& e) {
            throw CLI::ValidationError(e.what());
        }
    });
    if (rc >= 0) return rc;
    o.input = in;
    o.output = out;
    o.keep = keep;
    o.imatrix = imatrix;
    o.n_threads = threads;

    Progress bar("quantize");
    o.on_progress = [&bar](uint64_t done, uint64_t total) { bar.update(done, total); };
    const auto t0 = std::chrono::steady_clock::now();
    const quantize::QuantizeSummary s = quantize::quantize_model(o);
    bar.finish();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::ostringstream types;
    for (const auto& [t, n] : s.types) types << (types.tellp() > 0 ? ", " : "") << type_name(t) << " x" << n;
    std::printf("wrote %s: %s, %zu tensors (%zu converted: %s), %.1f MiB -> %.1f MiB, in %.1f s\n", out.c_str(),
                quantize::file_type_name(o.file_type), s.n_tensors, s.n_converted, types.str().c_str(),
                double(s.bytes_in) / (1 << 20), double(s.bytes_out) / (1 << 20), secs);
    if (!imatrix.empty()) {
        std::printf("importance matrix: %zu tensors quantized under it", s.n_imatrix);
        if (!s.no_imatrix.empty())
            std::printf("; %zu without (no entry, e.g. %s)", s.no_imatrix.size(), s.no_imatrix.front().c_str());
        std::printf("\n");
    }
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(quantize, "quantize", "requantize a GGUF model to another weight type (like llama-quantize)",
                 run_quantize);

}  // namespace cera::cli
