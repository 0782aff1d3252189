// `cera synth`: writes a random-weight model (seeded, deterministic) of a given
// architecture and shape, with the tokenizer copied from another GGUF.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "cera/error.h"
#include "cli/command.h"
#include "core/check.h"
#include "gguf/gguf.h"
#include "synth/synth.h"

namespace cera::cli {
namespace {

std::vector<int64_t> parse_layer_list(const std::string& s) {
    std::vector<int64_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        size_t used = 0;
        long long v = -1;
        try {
            v = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used == 0 || used != item.size() || v < 0)
            throw_error(ErrorCode::kInvalidArgument, "--attn-layers: '%s' is not a layer index", item.c_str());
        out.push_back(v);
    }
    return out;
}

GgmlType parse_type(const std::string& name, const char* flag) {
    auto t = type_from_name(name);
    if (!t)
        throw_error(ErrorCode::kInvalidArgument,
                    "%s: unknown tensor type '%s' (F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                    "Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)",
                    flag, name.c_str());
    return *t;
}

int run_synth(const std::vector<std::string>& args) {
    CLI::App app{"Writes a random-weight model of a given architecture and shape, with the tokenizer of another GGUF.",
                 "cera synth"};
    std::string arch, preset = "tiny", vocab_from, out, type_name_ = "F32", embd_type_name, attn_layers, name;
    uint64_t seed = 42;
    int threads = 0;
    int64_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = -1, n_ff = 0, n_ctx = 0, n_expert = 0,
            n_expert_used = 0, n_ff_exp = 0, n_dense_lead = -1, l_cache = 0;
    float rope_base = 0, norm_eps = 0;
    bool untied = false;
    app.add_option("--arch", arch, "lfm2 | lfm2moe | llama | qwen2 | qwen3 | granite (required for a model)");
    app.add_option("--preset", preset, "tiny | lfm2-350m | lfm2-1.2b | llama-1b (default tiny)");
    app.add_option("--vocab-from", vocab_from, "GGUF file whose tokenizer.* keys are copied (required for a model)");
    int64_t lora_rank = 0;
    std::string lora_of;
    app.add_option("--lora-rank", lora_rank,
                   "write a random LoRA adapter of this rank instead of a model: a GGUF LoRA with a pair on every "
                   "projection of --lora-of");
    app.add_option("--lora-of", lora_of, "--lora-rank: the base model GGUF the adapter is for");
    std::string mmproj;
    app.add_option("--mmproj", mmproj,
                   "write a random LFM2-VL vision projector (mmproj) instead of a model, in a preset's shape: "
                   "tiny | lfm2-vl-450m | lfm2-vl-1.6b (--type F32 or F16)");
    app.add_option("--type", type_name_,
                   "type of the 2-D and 3-D weights (default F32), or a llama-quantize file type (Q4_K_M, Q3_K_L, "
                   "...): its mixture of types");
    app.add_option("--embd-type", embd_type_name, "type of token_embd / output (default: --type)");
    app.add_option("-o,--output", out, "output GGUF path")->required();
    app.add_option("--seed", seed, "random seed (default 42)");
    app.add_option("--name", name, "general.name");
    app.add_option("--threads", threads, "threads (default: all cores)");
    app.add_option("--n-embd", n_embd);
    app.add_option("--n-layer", n_layer);
    app.add_option("--n-head", n_head);
    app.add_option("--n-head-kv", n_head_kv);
    app.add_option("--head-dim", head_dim, "default n_embd / n_head");
    app.add_option("--n-ff", n_ff);
    app.add_option("--n-ctx", n_ctx);
    app.add_option("--n-expert", n_expert, "lfm2moe");
    app.add_option("--n-expert-used", n_expert_used, "lfm2moe");
    app.add_option("--n-ff-exp", n_ff_exp, "lfm2moe expert width");
    app.add_option("--n-dense-lead", n_dense_lead, "lfm2moe leading dense layers");
    app.add_option("--attn-layers", attn_layers, "lfm2: comma-separated attention layer indices");
    app.add_option("--l-cache", l_cache, "lfm2: short-conv kernel length");
    app.add_option("--rope-base", rope_base);
    app.add_option("--norm-eps", norm_eps);
    app.add_flag("--untied", untied, "write a separate output.weight");

    std::vector<std::string> rev(args.rbegin(), args.rend());
    gguf::SynthConfig c;
    try {
        app.parse(rev);
        if (lora_rank != 0 || !lora_of.empty()) {
            if (lora_of.empty()) throw_error(ErrorCode::kInvalidArgument, "--lora-rank needs --lora-of BASE.gguf");
            auto base = gguf::File::open(lora_of);
            gguf::synthesize_lora(*base, lora_rank, seed, out);
            auto f = gguf::File::open(out);
            std::printf("wrote %s: a rank-%lld LoRA adapter for %s, %zu tensors, %.1f MiB\n", out.c_str(),
                        (long long)lora_rank, lora_of.c_str(), f->tensors().size(), double(f->file_size()) / (1 << 20));
            return 0;
        }
        if (!mmproj.empty()) {
            gguf::synthesize_mmproj(gguf::mmproj_preset(mmproj), parse_type(type_name_, "--type"), seed, out);
            auto f = gguf::File::open(out);
            int64_t params = 0;
            for (const auto& t : f->tensors()) params += t.n_elements();
            std::printf("wrote %s: a %s-shaped mmproj, %zu tensors, %.1fM parameters, %.1f MiB\n", out.c_str(),
                        mmproj.c_str(), f->tensors().size(), double(params) / 1e6, double(f->file_size()) / (1 << 20));
            return 0;
        }
        if (arch.empty() || vocab_from.empty())
            throw_error(ErrorCode::kInvalidArgument, "--arch and --vocab-from are required for a model");
        c = gguf::synth_preset(arch, preset);
        const int64_t preset_layers = c.n_layer;
        if (n_embd) c.n_embd = n_embd;
        if (n_layer) c.n_layer = n_layer;
        if (n_head) c.n_head = n_head;
        if (n_head_kv) c.n_head_kv = n_head_kv;
        if (head_dim >= 0) c.head_dim = head_dim;
        if (n_ff) c.n_ff = n_ff;
        if (n_ctx) c.n_ctx = n_ctx;
        if (n_expert) c.n_expert = n_expert;
        if (n_expert_used) c.n_expert_used = n_expert_used;
        if (n_ff_exp) c.n_ff_exp = n_ff_exp;
        if (n_dense_lead >= 0) c.n_dense_lead = n_dense_lead;
        if (l_cache) c.l_cache = l_cache;
        if (rope_base > 0) c.rope_freq_base = rope_base;
        if (norm_eps > 0) c.norm_eps = norm_eps;
        if (!attn_layers.empty())
            c.attn_layers = parse_layer_list(attn_layers);
        else if (c.n_layer != preset_layers)
            c.attn_layers.clear();  // the default pattern, for the new depth
        c.tied = !untied;
        if (type_from_name(type_name_)) {
            c.type = parse_type(type_name_, "--type");
        } else {  // a llama-quantize file type: its mixture
            c.mixture = quantize::parse_file_type(type_name_);
            c.type = quantize::default_type(*c.mixture);
        }
        if (!embd_type_name.empty()) c.embd_type = parse_type(embd_type_name, "--embd-type");
        c.seed = seed;
        c.name = name;
        if (threads < 0) throw_error(ErrorCode::kInvalidArgument, "--threads must be >= 0");
    } catch (const CLI::CallForHelp&) {
        std::printf("%s", app.help().c_str());
        return 0;
    } catch (const CLI::ParseError& e) {
        std::string msg = e.what();
        for (char& ch : msg)
            if (ch == '\n') ch = ' ';
        std::fprintf(stderr, "cera synth: error: %s (see `cera synth --help`)\n", msg.c_str());
        return 2;
    } catch (const Error& e) {
        if (e.code() != ErrorCode::kInvalidArgument) throw;
        std::fprintf(stderr, "cera synth: error: %s\n", e.what());
        return 2;
    }

    auto vocab = gguf::File::open(vocab_from);
    const auto t0 = std::chrono::steady_clock::now();
    gguf::synthesize(c, vocab.get(), out, threads);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto f = gguf::File::open(out);
    int64_t params = 0;
    for (const auto& t : f->tensors()) params += t.n_elements();
    std::printf("wrote %s: %s, %zu tensors, %.1fM parameters, %.1f MiB, %s, in %.1f s\n", out.c_str(), c.arch.c_str(),
                f->tensors().size(), double(params) / 1e6, double(f->file_size()) / (1 << 20), type_name(c.type), secs);
    return 0;
}

}  // namespace

CERA_CLI_COMMAND(synth, "synth", "write a random-weight model of a given architecture and shape", run_synth);

}  // namespace cera::cli
