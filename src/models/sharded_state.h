// The states of a model split over several ranks (models/shard.h): one sequence state a rank, run in
// step by a thread a rank.
#pragma once
#include <memory>

#include "models/model.h"

namespace cera {

// The state of one sequence on one rank's backend (model_state.cpp).
std::unique_ptr<ModelState> make_sequence_state(const Model& model, int n_ctx);
// One sequence over every rank of `model` (model.world() > 1): each call runs on all ranks at once,
// rank 0's outputs are the caller's.
std::unique_ptr<ModelState> make_sharded_state(const Model& model, int n_ctx);

}  // namespace cera
