// The client state file: safetensors with one F32 tensor per codec and the rest in metadata.
#include "edge_client/client_state.h"

#include <string_view>

#include "core/fetch/sha256.h"
#include "core/io/safetensors.h"

namespace starling::edge_client {
namespace {

constexpr std::string_view kFormat = "starling-client-state-1";

// The digest covers every field, so an edited or half-restored file is refused.
std::string digest(const ClientState& s) {
  fetch::Sha256 h;
  h.update(s.node_id);
  h.update("\n" + std::to_string(s.rounds_trained) + "\n" + std::to_string(s.last_round) + "\n");
  for (const auto& [spec, values] : s.codec_state) {
    h.update(spec);
    h.update("\n" + std::to_string(values.size()) + "\n");
    h.update(std::string_view(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(float)));
  }
  return h.final_hex();
}

}  // namespace

Status save_client_state(const std::filesystem::path& path, const ClientState& state) {
  io::StateDict tensors;
  std::map<std::string, std::string> meta = {
      {"format", std::string(kFormat)},
      {"node_id", state.node_id},
      {"rounds_trained", std::to_string(state.rounds_trained)},
      {"last_round", std::to_string(state.last_round)},
      {"sha256", digest(state)}};
  int k = 0;
  for (const auto& [spec, values] : state.codec_state) {
    const std::string name = "codec" + std::to_string(k++);
    meta[name] = spec;
    tensors.emplace_back(name, Tensor::from_vector(values, {static_cast<int64_t>(values.size())}));
  }
  RETURN_IF_ERROR(io::save_safetensors(path, tensors, meta),
                  "saving the client state " + path.string());
  return ok_status();
}

Result<ClientState> load_client_state(const std::filesystem::path& path,
                                      const std::string& node_id) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found("no client state at " + path.string());
  ASSIGN_OR_RETURN(auto file, io::load_safetensors(path), "client state");
  auto meta = [&](const std::string& key) -> Result<std::string> {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) {
      return data_loss(path.string() + ": client state without '" + key + "'");
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(const std::string format, meta("format"));
  if (format != kFormat) {
    return data_loss(path.string() + ": not a client state file (format '" + format + "')");
  }
  ClientState s;
  ASSIGN_OR_RETURN(s.node_id, meta("node_id"));
  if (s.node_id != node_id) {
    return failed_precondition(path.string() + ": the client state belongs to node '" + s.node_id +
                               "', not '" + node_id + "'");
  }
  try {
    ASSIGN_OR_RETURN(const std::string rounds, meta("rounds_trained"));
    ASSIGN_OR_RETURN(const std::string last, meta("last_round"));
    s.rounds_trained = std::stoull(rounds);
    s.last_round = std::stoull(last);
  } catch (const std::exception&) {
    return data_loss(path.string() + ": client state with a malformed round count");
  }
  for (const auto& [name, tensor] : file.tensors) {
    ASSIGN_OR_RETURN(const std::string spec, meta(name));
    if (tensor.dtype() != DType::kF32 || tensor.dim() != 1) {
      return data_loss(path.string() + ": client state tensor '" + name + "' is not a f32 vector");
    }
    const float* p = tensor.data<float>();
    s.codec_state[spec].assign(p, p + tensor.numel());
  }
  ASSIGN_OR_RETURN(const std::string sum, meta("sha256"));
  if (sum != digest(s)) {
    return data_loss(path.string() + ": client state checksum mismatch (the file was altered)");
  }
  return s;
}

}  // namespace starling::edge_client
