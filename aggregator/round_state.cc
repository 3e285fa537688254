// Saving and restoring the aggregator's round state.
#include "aggregator/round_state.h"

#include <cstring>
#include <system_error>

#include "aggregator/dp.h"
#include "core/io/safetensors.h"
#include "core/net/chunk_stream.h"
#include "edge_client/model_params.h"

namespace starling::aggregator {
namespace {

namespace fs = std::filesystem;
constexpr const char* kSlotPrefix = "server_opt.";

std::string hex(const std::string& raw) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::string digest(const io::StateDict& sd) {
  net::Sha256 sha;
  for (const auto& [name, t] : sd) {
    sha.update(name);
    sha.update(std::string_view(static_cast<const char*>(t.raw_data()), t.nbytes()));
  }
  return hex(sha.finish());
}

Tensor flat_tensor(const std::vector<float>& v, int64_t offset, const Shape& shape) {
  Tensor t = Tensor::uninitialized(shape);
  std::memcpy(t.data<float>(), v.data() + offset, static_cast<size_t>(t.numel()) * 4);
  return t;
}

Result<uint64_t> parse_u64(const std::map<std::string, std::string>& md, const std::string& key) {
  auto it = md.find(key);
  if (it == md.end()) return data_loss("round state lacks metadata '" + key + "'");
  try {
    size_t pos = 0;
    const uint64_t v = std::stoull(it->second, &pos);
    if (pos != it->second.size()) throw std::invalid_argument(key);
    return v;
  } catch (const std::exception&) {
    return data_loss("round state metadata '" + key + "' is not a number: " + it->second);
  }
}

}  // namespace

Status save_round_state(const fs::path& dir, const compress::Layout& layout,
                        const RoundState& state, const std::function<void()>& between_files) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return internal_error("cannot create state directory " + dir.string() + ": " + ec.message());
  io::StateDict sd = edge_client::layout_tensors(layout, state.global);
  RETURN_IF_ERROR(io::save_safetensors(
                      dir / kModelFile, sd,
                      {{"round", std::to_string(state.round)}, {"format", "starling-federation"}}),
                  "saving the global model");
  if (between_files) between_files();
  const int64_t numel = static_cast<int64_t>(state.global.size());
  for (const auto& [name, values] : state.slots) {
    sd.emplace_back(kSlotPrefix + name, flat_tensor(values, 0, {numel}));
  }
  std::map<std::string, std::string> md = {
      {"round", std::to_string(state.round)},
      {"model_version", std::to_string(state.model_version)},
      {"strategy", state.strategy},
      {"sha256", digest(sd)},
  };
  if (!state.dp_rdp.empty()) md["dp_rdp"] = rdp_to_text(state.dp_rdp);
  return io::save_safetensors(dir / kStateFile, sd, md).with_context("saving the round state");
}

Result<RoundState> load_round_state(const fs::path& dir, const compress::Layout& layout) {
  const fs::path path = dir / kStateFile;
  std::error_code ec;
  if (!fs::exists(path, ec)) return not_found("no round state in " + dir.string());
  ASSIGN_OR_RETURN(auto file, io::load_safetensors(path));
  auto it = file.metadata.find("sha256");
  if (it == file.metadata.end() || it->second != digest(file.tensors)) {
    return data_loss(path.string() + ": checksum mismatch (the state file is corrupt)");
  }
  RoundState st;
  ASSIGN_OR_RETURN(st.round, parse_u64(file.metadata, "round"));
  ASSIGN_OR_RETURN(st.model_version, parse_u64(file.metadata, "model_version"));
  st.strategy = file.metadata["strategy"];
  if (auto dp = file.metadata.find("dp_rdp"); dp != file.metadata.end()) {
    ASSIGN_OR_RETURN(st.dp_rdp, rdp_from_text(dp->second), path.string());
  }
  ASSIGN_OR_RETURN(const int64_t numel, compress::validate_layout(layout));
  st.global.assign(static_cast<size_t>(numel), 0.0f);
  size_t next = 0;
  for (const auto& info : layout) {
    if (next >= file.tensors.size() || file.tensors[next].first != info.name ||
        file.tensors[next].second.shape() != info.shape ||
        file.tensors[next].second.dtype() != DType::kF32) {
      return invalid_argument(path.string() + ": does not hold the model's tensor '" + info.name +
                              "' " + shape_str(info.shape) + " f32 at position " +
                              std::to_string(next));
    }
    const Tensor t = file.tensors[next].second.contiguous();
    std::memcpy(st.global.data() + info.offset, t.data<float>(), t.nbytes());
    ++next;
  }
  for (; next < file.tensors.size(); ++next) {
    const auto& [name, t] = file.tensors[next];
    if (name.rfind(kSlotPrefix, 0) != 0 || t.numel() != numel || t.dtype() != DType::kF32) {
      return invalid_argument(path.string() + ": unexpected tensor '" + name + "'");
    }
    const Tensor c = t.contiguous();
    st.slots.emplace_back(name.substr(std::strlen(kSlotPrefix)),
                          std::vector<float>(c.data<float>(), c.data<float>() + numel));
  }
  return st;
}

}  // namespace starling::aggregator
