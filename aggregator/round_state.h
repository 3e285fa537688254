// Crash-safe aggregator state: after every round the global model and the round state (round
// number, model version, server optimizer slots) are written as one safetensors file, atomically
// (temp file, fsync, rename), with a SHA-256 of the tensor bytes in its metadata.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"

namespace starling::aggregator {

struct RoundState {
  uint64_t round = 0;          // rounds completed
  uint64_t model_version = 0;  // bumped once per completed round
  std::string strategy;        // strategy_name() of the run that wrote it
  std::vector<float> global;   // flat model, in layout order
  // Server optimizer slots ("m", "v"), each of the model's size.
  std::vector<std::pair<std::string, std::vector<float>>> slots;
  // The DP accountant's accumulated RDP, one value per order (empty without DP); kept in the
  // metadata as exact hex floats.
  std::vector<double> dp_rdp;
};

// File names inside the state directory.
inline constexpr const char* kStateFile = "state.safetensors";         // the commit point
inline constexpr const char* kModelFile = "global_model.safetensors";  // model only, for users

// Writes <dir>/global_model.safetensors (the model with its tensor names) and then
// <dir>/state.safetensors (model, "server_opt.<slot>" tensors, metadata round, model_version,
// strategy, sha256). Creates `dir` if needed. `between_files` runs after the global model is
// written and before the state (crash tests kill the process there).
Status save_round_state(const std::filesystem::path& dir, const compress::Layout& layout,
                        const RoundState& state, const std::function<void()>& between_files = {});

// Reads <dir>/state.safetensors. NotFound when there is none (a fresh run); DataLoss when the
// checksum or the metadata is wrong; InvalidArgument when the tensors do not match `layout`.
Result<RoundState> load_round_state(const std::filesystem::path& dir,
                                    const compress::Layout& layout);

}  // namespace starling::aggregator
