// The peer state file: safetensors with the model, the public copy, the codec residual and the
// recent rounds' messages as tensors, and the rest as metadata (members and round descriptors
// as JSON).
#include "gossip/peer_state.h"

#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/fetch/sha256.h"
#include "core/io/safetensors.h"
#include "edge_client/model_params.h"

namespace starling::gossip {
namespace {

constexpr std::string_view kFormat = "starling-peer-state-1";

// Covers every metadata entry but the digest itself and every tensor, so an edited or
// half-restored file is refused.
std::string digest(const std::map<std::string, std::string>& meta, const io::StateDict& tensors) {
  fetch::Sha256 h;
  for (const auto& [k, v] : meta) {
    if (k == "sha256") continue;
    h.update(k + "\n" + std::to_string(v.size()) + "\n");
    h.update(v);
  }
  std::map<std::string, const Tensor*> sorted;
  for (const auto& [name, t] : tensors) sorted[name] = &t;
  for (const auto& [name, t] : sorted) {
    const size_t n = static_cast<size_t>(t->numel()) * dtype_size(t->dtype());
    h.update(name + "\n" + std::string(dtype_name(t->dtype())) + "\n" + std::to_string(n) + "\n");
    h.update(std::string_view(static_cast<const char*>(t->raw_data()), n));
  }
  return h.final_hex();
}

Tensor f32_vector(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

Tensor u8_vector(const std::string& bytes) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bytes.size())}, DType::kU8);
  if (!bytes.empty()) std::memcpy(t.raw_data(), bytes.data(), bytes.size());
  return t;
}

}  // namespace

Status save_peer_state(const std::filesystem::path& dir, const compress::Layout& layout,
                       const PeerState& state) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return internal_error("cannot create the peer state folder " + dir.string());
  const std::map<std::string, std::string> model_meta = {{"round", std::to_string(state.round)},
                                                         {"node_id", state.node_id}};
  RETURN_IF_ERROR(
      io::save_safetensors(dir / kPeerModelFile, edge_client::layout_tensors(layout, state.params),
                           model_meta),
      "saving the peer model");

  io::StateDict tensors;
  tensors.emplace_back("params", f32_vector(state.params));
  if (!state.public_copy.empty())
    tensors.emplace_back("public_copy", f32_vector(state.public_copy));
  if (!state.codec_state.empty())
    tensors.emplace_back("codec_state", f32_vector(state.codec_state));
  nlohmann::json members = nlohmann::json::array();
  for (const auto& [id, address] : state.members) members.push_back({id, address});
  nlohmann::json past = nlohmann::json::array();
  for (const SavedRound& p : state.past) {
    const std::string key = "past." + std::to_string(p.round);
    tensors.emplace_back(key + ".msg", u8_vector(p.msg));
    if (!p.own.empty()) tensors.emplace_back(key + ".own", f32_vector(p.own));
    nlohmann::json missed = nlohmann::json::object();
    // Weights as exact hex floats: a resumed late mix must use the very same value.
    for (const auto& [id, w] : p.missed) missed[id] = fmt::format("{:a}", w);
    past.push_back({{"round", p.round},
                    {"degree", p.degree},
                    {"sent_to", p.sent_to},
                    {"missed", missed},
                    {"own", !p.own.empty()}});
  }
  std::map<std::string, std::string> meta = {{"format", std::string(kFormat)},
                                             {"node_id", state.node_id},
                                             {"algorithm", state.algorithm},
                                             {"codec", state.codec},
                                             {"round", std::to_string(state.round)},
                                             {"messages_made", std::to_string(state.messages_made)},
                                             {"members", members.dump()},
                                             {"past", past.dump()}};
  meta["sha256"] = digest(meta, tensors);
  RETURN_IF_ERROR(io::save_safetensors(dir / kPeerStateFile, tensors, meta),
                  "saving the peer state");
  return ok_status();
}

Result<PeerState> load_peer_state(const std::filesystem::path& dir, const compress::Layout& layout,
                                  const std::string& node_id, const std::string& algorithm,
                                  const std::string& codec) {
  const std::filesystem::path path = dir / kPeerStateFile;
  const std::string name = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found("no peer state at " + name);
  ASSIGN_OR_RETURN(auto file, io::load_safetensors(path), "peer state");
  auto meta = [&](const std::string& key) -> Result<std::string> {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) return data_loss(name + ": peer state without '" + key + "'");
    return it->second;
  };
  ASSIGN_OR_RETURN(const std::string format, meta("format"));
  if (format != kFormat) {
    return data_loss(name + ": not a peer state file (format '" + format + "')");
  }
  ASSIGN_OR_RETURN(const std::string sum, meta("sha256"));
  if (sum != digest(file.metadata, file.tensors)) {
    return data_loss(name + ": peer state checksum mismatch (the file was altered or torn)");
  }
  PeerState s;
  ASSIGN_OR_RETURN(s.node_id, meta("node_id"));
  ASSIGN_OR_RETURN(s.algorithm, meta("algorithm"));
  ASSIGN_OR_RETURN(s.codec, meta("codec"));
  auto mismatch = [&](const std::string& what, const std::string& saved, const std::string& now) {
    return failed_precondition(name + ": the peer state is of " + what + " '" + saved +
                               "', this peer runs '" + now + "' (remove the file to start afresh)");
  };
  if (s.node_id != node_id) return mismatch("node", s.node_id, node_id);
  if (s.algorithm != algorithm) return mismatch("algorithm", s.algorithm, algorithm);
  if (s.codec != codec) return mismatch("codec", s.codec, codec);
  std::map<std::string, const Tensor*> tensors;
  for (const auto& [n, t] : file.tensors) tensors[n] = &t;
  int64_t numel = 0;
  for (const auto& t : layout) numel += shape_numel(t.shape);
  auto floats = [&](const std::string& key, bool required, std::vector<float>& out) -> Status {
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      return required ? data_loss(name + ": peer state without tensor '" + key + "'") : ok_status();
    }
    const Tensor& t = *it->second;
    if (t.dtype() != DType::kF32 || t.dim() != 1) {
      return data_loss(name + ": peer state tensor '" + key + "' is not a f32 vector");
    }
    const float* p = t.data<float>();
    out.assign(p, p + t.numel());
    return ok_status();
  };
  try {
    ASSIGN_OR_RETURN(const std::string round, meta("round"));
    ASSIGN_OR_RETURN(const std::string made, meta("messages_made"));
    s.round = std::stoull(round);
    s.messages_made = std::stoull(made);
    RETURN_IF_ERROR(floats("params", true, s.params));
    RETURN_IF_ERROR(floats("public_copy", false, s.public_copy));
    RETURN_IF_ERROR(floats("codec_state", false, s.codec_state));
    if (static_cast<int64_t>(s.params.size()) != numel) {
      return failed_precondition(name + ": the peer state's model has " +
                                 std::to_string(s.params.size()) + " parameters, this model " +
                                 std::to_string(numel) + " (remove the file to start afresh)");
    }
    ASSIGN_OR_RETURN(const std::string members, meta("members"));
    for (const auto& m : nlohmann::json::parse(members)) {
      s.members.emplace_back(m.at(0).get<std::string>(), m.at(1).get<std::string>());
    }
    ASSIGN_OR_RETURN(const std::string past, meta("past"));
    for (const auto& j : nlohmann::json::parse(past)) {
      SavedRound p;
      p.round = j.at("round").get<uint64_t>();
      p.degree = j.at("degree").get<uint32_t>();
      p.sent_to = j.at("sent_to").get<std::vector<std::string>>();
      for (const auto& [id, w] : j.at("missed").items()) {
        p.missed[id] = std::stod(w.get<std::string>());
      }
      const std::string key = "past." + std::to_string(p.round);
      auto msg = tensors.find(key + ".msg");
      if (msg == tensors.end() || msg->second->dtype() != DType::kU8) {
        return data_loss(name + ": peer state without the message of round " +
                         std::to_string(p.round));
      }
      p.msg.assign(static_cast<const char*>(msg->second->raw_data()),
                   static_cast<size_t>(msg->second->numel()));
      if (j.at("own").get<bool>()) RETURN_IF_ERROR(floats(key + ".own", true, p.own));
      s.past.push_back(std::move(p));
    }
  } catch (const std::exception& e) {
    return data_loss(name + ": malformed peer state: " + e.what());
  }
  return s;
}

}  // namespace starling::gossip
