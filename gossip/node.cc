// Gossip node state: message encoding and the mixing steps of D-PSGD, push-pull and CHOCO-SGD.
#include "gossip/node.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace starling::gossip {

std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::kDpsgd:
      return "dpsgd";
    case Algorithm::kPushPull:
      return "push_pull";
    case Algorithm::kChoco:
      return "choco";
    case Algorithm::kFedAvg:
      return "fedavg";
  }
  return "unknown";
}

Result<Algorithm> parse_algorithm(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (Algorithm a :
       {Algorithm::kDpsgd, Algorithm::kPushPull, Algorithm::kChoco, Algorithm::kFedAvg}) {
    if (lower == algorithm_name(a)) return a;
  }
  return invalid_argument("unknown gossip algorithm '" + std::string(name) +
                          "' (dpsgd, push_pull, choco, fedavg)");
}

GossipNode::GossipNode(NodeOptions options, compress::Layout layout, std::vector<float> x,
                       std::unique_ptr<compress::Codec> codec)
    : options_(std::move(options)),
      layout_(std::move(layout)),
      x_(std::move(x)),
      codec_(std::move(codec)) {
  if (options_.algorithm == Algorithm::kChoco) {
    xhat0_ = options_.shared_init ? x_ : std::vector<float>(x_.size(), 0.0f);
    xhat_ = xhat0_;
  }
}

Result<std::unique_ptr<GossipNode>> GossipNode::create(const NodeOptions& options,
                                                       compress::Layout layout,
                                                       std::vector<float> initial) {
  ASSIGN_OR_RETURN(const int64_t numel, compress::validate_layout(layout), "gossip node");
  if (static_cast<int64_t>(initial.size()) != numel) {
    return invalid_argument("gossip node: initial model has " + std::to_string(initial.size()) +
                            " parameters, layout " + std::to_string(numel));
  }
  ASSIGN_OR_RETURN(auto spec, compress::parse_compression_spec(options.codec), "gossip codec");
  if (options.algorithm == Algorithm::kChoco) {
    if (!(options.consensus_step > 0.0 && options.consensus_step <= 1.0)) {
      return invalid_argument("gossip: CHOCO consensus_step must be in (0, 1], got " +
                              std::to_string(options.consensus_step));
    }
    bool ef = spec.default_spec.error_feedback;
    for (const auto& o : spec.overrides) ef = ef || o.spec.error_feedback;
    if (ef) {
      return invalid_argument("gossip codec '" + options.codec +
                              "': CHOCO keeps its own error memory (x - x^); drop ef=1");
    }
  }
  ASSIGN_OR_RETURN(auto codec, compress::make_codec(spec, layout, options.seed), "gossip codec");
  return std::unique_ptr<GossipNode>(
      new GossipNode(options, std::move(layout), std::move(initial), std::move(codec)));
}

Result<std::string> GossipNode::make_message() {
  if (options_.algorithm != Algorithm::kChoco) {
    RETURN_IF_ERROR(codec_->encode_into(x_, encoded_), "gossip: encoding the model");
    return compress::serialize_update(encoded_);
  }
  scratch_.resize(x_.size());
  for (size_t i = 0; i < x_.size(); ++i) scratch_[i] = x_[i] - xhat_[i];
  RETURN_IF_ERROR(codec_->encode_into(scratch_, encoded_), "gossip: encoding x - x^");
  RETURN_IF_ERROR(compress::decode_add(encoded_, xhat_, 1.0f), "gossip: updating x^");
  return compress::serialize_update(encoded_);
}

Status GossipNode::restore(std::span<const float> x, std::span<const float> public_copy,
                           std::span<const float> codec_state) {
  if (x.size() != x_.size()) {
    return invalid_argument("gossip node: restored model has " + std::to_string(x.size()) +
                            " parameters, expected " + std::to_string(x_.size()));
  }
  if (public_copy.size() != xhat_.size()) {
    return invalid_argument("gossip node: restored public copy has " +
                            std::to_string(public_copy.size()) + " values, expected " +
                            std::to_string(xhat_.size()));
  }
  RETURN_IF_ERROR(codec_->restore_state(codec_state), "gossip node: restoring the codec state");
  x_.assign(x.begin(), x.end());
  xhat_.assign(public_copy.begin(), public_copy.end());
  return ok_status();
}

std::string GossipNode::snapshot() const {
  compress::EncodedUpdate u;
  u.numel = static_cast<int64_t>(xhat_.size());
  for (const compress::TensorInfo& t : layout_) {
    compress::Segment s;
    s.codec = compress::CodecKind::kIdentity;
    s.offset = t.offset;
    s.numel = shape_numel(t.shape);
    s.shape = t.shape;
    s.f32.assign(xhat_.begin() + t.offset, xhat_.begin() + t.offset + s.numel);
    u.segments.push_back(std::move(s));
  }
  return compress::serialize_update(u);
}

Status GossipNode::absorb(const Incoming& in) {
  if (options_.algorithm != Algorithm::kChoco || in.update == nullptr) return ok_status();
  if (in.snapshot) {
    std::vector<float> copy(x_.size(), 0.0f);
    RETURN_IF_ERROR(compress::decode(*in.update, copy), "gossip: snapshot from " + in.from);
    copies_[in.from] = std::move(copy);
    return ok_status();
  }
  auto it = copies_.find(in.from);
  if (it == copies_.end()) {
    return failed_precondition("gossip: increment from '" + in.from +
                               "' before its snapshot (no public copy held)");
  }
  return compress::decode_add(*in.update, it->second, 1.0f)
      .with_context("gossip: message from " + in.from);
}

Status GossipNode::mix(double self_weight, std::span<const Incoming> incoming) {
  if (options_.algorithm == Algorithm::kChoco) {
    for (const Incoming& in : incoming) {
      if (in.update == nullptr && !copies_.count(in.from)) {
        return failed_precondition("gossip: no public copy of '" + in.from + "' to mix");
      }
    }
    for (const Incoming& in : incoming) RETURN_IF_ERROR(absorb(in));
    const auto gamma = static_cast<float>(options_.consensus_step);
    for (const Incoming& in : incoming) {
      const auto w = static_cast<float>(in.weight) * gamma;
      const std::vector<float>& copy = copies_[in.from];
      for (size_t i = 0; i < x_.size(); ++i) x_[i] += w * (copy[i] - xhat_[i]);
    }
    return ok_status();
  }
  scratch_.resize(x_.size());
  const auto ws = static_cast<float>(self_weight);
  for (size_t i = 0; i < x_.size(); ++i) scratch_[i] = ws * x_[i];
  for (const Incoming& in : incoming) {
    RETURN_IF_ERROR(compress::decode_add(*in.update, scratch_, static_cast<float>(in.weight)),
                    "gossip: message from " + in.from);
  }
  x_.swap(scratch_);
  return ok_status();
}

Status GossipNode::mix_late(const compress::EncodedUpdate& update, std::span<const float> own,
                            double weight) {
  if (own.size() != x_.size()) {
    return invalid_argument("gossip: late mix against a model of " + std::to_string(own.size()) +
                            " parameters, ours " + std::to_string(x_.size()));
  }
  scratch_.assign(x_.size(), 0.0f);
  RETURN_IF_ERROR(compress::decode_add(update, scratch_, 1.0f), "gossip: late message");
  const auto w = static_cast<float>(weight);
  for (size_t i = 0; i < x_.size(); ++i) x_[i] += w * (scratch_[i] - own[i]);
  return ok_status();
}

Status GossipNode::pair_average(const compress::EncodedUpdate& other) {
  scratch_.resize(x_.size());
  for (size_t i = 0; i < x_.size(); ++i) scratch_[i] = 0.5f * x_[i];
  RETURN_IF_ERROR(compress::decode_add(other, scratch_, 0.5f), "gossip: push-pull average");
  x_.swap(scratch_);
  return ok_status();
}

Status GossipNode::set_params(std::span<const float> x) {
  if (x.size() != x_.size()) {
    return invalid_argument("gossip: model of " + std::to_string(x.size()) + " parameters, ours " +
                            std::to_string(x_.size()));
  }
  std::copy(x.begin(), x.end(), x_.begin());
  return ok_status();
}

Result<compress::EncodedUpdate> parse_message(std::string_view bytes, int64_t numel,
                                              std::string_view from) {
  const std::string who = "gossip message from " + std::string(from);
  ASSIGN_OR_RETURN(auto update, compress::parse_update(bytes), who);
  if (update.numel != numel) {
    return invalid_argument(who + ": " + std::to_string(update.numel) + " parameters, ours " +
                            std::to_string(numel));
  }
  // Validate every segment now (a dry decode), so that mixing never meets a bad update.
  std::vector<float> probe(static_cast<size_t>(numel), 0.0f);
  RETURN_IF_ERROR(compress::decode_add(update, probe, 1.0f), who);
  for (float v : probe) {
    if (!std::isfinite(v)) return invalid_argument(who + ": non-finite value");
  }
  return update;
}

}  // namespace starling::gossip
