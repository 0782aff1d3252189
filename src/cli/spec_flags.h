// The speculative decoding flags of the commands that generate (run, chat, bench): prompt lookup, a draft
// model and the draft length, registered and checked in one place.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "cera/engine.h"
#include "cera/session.h"

namespace cera::cli {

struct SpecFlags {
    int32_t lookup_ngram = 0;  // --lookup-ngram
    std::string draft_model;   // --draft-model
    int32_t draft_max = 16;    // --draft-max
    int32_t draft_min = 0;     // --draft-min

    void add(CLI::App& app);
    // The options, loading the draft model (on the same device, threads and context as `engine`, which
    // it must share a vocabulary with). Throws Error(kInvalidArgument) naming a bad flag.
    SpeculativeOptions build(const EngineOptions& engine) const;
};

}  // namespace cera::cli
