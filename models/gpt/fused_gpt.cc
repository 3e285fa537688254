// FusedGpt: buffer layout, forward / backward call order (llm.c's), clipping and AdamW over the
// flat buffers, and the StateDict bridge to models::Gpt.
#include "models/gpt/fused_gpt.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <unordered_map>

namespace starling::models {

namespace {

// Runs `op`, one profiled operation of `label` when the backend is profiling (ProfileScope).
template <class Op>
void timed(FusedBackend& k, const char* label, Op&& op) {
  ProfileScope scope(k, label);
  op();
}

}  // namespace

namespace {

constexpr size_t kNormOffset = 0;  // double
constexpr size_t kLossOffset = 8;  // float
constexpr size_t kScalarBytes = 16;

}  // namespace

std::vector<FusedParam> fused_gpt_layout(const GptConfig& c) {
  std::vector<FusedParam> out;
  size_t offset = 0;
  auto add = [&](std::string name, Shape shape) {
    FusedParam p;
    p.name = std::move(name);
    p.numel = static_cast<size_t>(shape_numel(shape));
    p.decay = shape.size() >= 2;
    p.shape = std::move(shape);
    p.offset = offset;
    offset += p.numel;
    out.push_back(std::move(p));
  };
  const int64_t C = c.n_embd;
  add("transformer.wte.weight", {c.vocab_size, C});
  if (!c.rope) add("transformer.wpe.weight", {c.block_size, C});
  auto linear = [&](const std::string& name, int64_t in, int64_t outf) {
    add(name + ".weight", {outf, in});
    if (c.bias) add(name + ".bias", {outf});
  };
  auto norm = [&](const std::string& name) {
    add(name + ".weight", {C});
    if (c.bias) add(name + ".bias", {C});
  };
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    norm(h + "ln_1");
    linear(h + "attn.c_attn", C, 3 * C);
    linear(h + "attn.c_proj", C, C);
    norm(h + "ln_2");
    linear(h + "mlp.c_fc", C, 4 * C);
    linear(h + "mlp.c_proj", 4 * C, C);
  }
  norm("transformer.ln_f");
  return out;
}

ops::AttnMask default_attn_mask(const GptConfig& c) {
  return c.causal ? ops::AttnMask::causal() : ops::AttnMask::full();
}

Status check_fused_gpt_config(const GptConfig& c, int64_t batch, int64_t time) {
  return check_fused_gpt_config(c, batch, time, default_attn_mask(c));
}

Status check_fused_gpt_config(const GptConfig& c, int64_t batch, int64_t time,
                              const ops::AttnMask& mask) {
  RETURN_IF_ERROR(c.validate(), "fused GPT");
  if (c.dropout > 0.0) {
    return unimplemented("fused GPT: model.dropout = " + std::to_string(c.dropout) +
                         " is not supported (the fused trainer has no dropout); set "
                         "model.dropout = 0 or use train.engine = \"autograd\"");
  }
  if (c.gelu_tanh) {
    return unimplemented(
        "fused GPT: model.activation = \"gelu_tanh\" (GPT-2's) is not supported (the fused "
        "engine computes the exact GELU); use train.engine = \"autograd\"");
  }
  if (batch <= 0) return invalid_argument("fused GPT: batch size must be positive");
  if (time <= 0) {
    return invalid_argument("fused GPT: sequence length " + std::to_string(time) +
                            " must be positive");
  }
  if (const std::string why = mask.check(time); !why.empty()) {
    return invalid_argument("fused GPT: sequence length " + std::to_string(time) + ": " + why);
  }
  const int64_t positions = mask.position_period(time) > 0 ? mask.position_period(time) : time;
  if (positions > c.block_size) {
    return invalid_argument("fused GPT: sequence length " + std::to_string(positions) +
                            " must be in [1, model.block_size = " + std::to_string(c.block_size) +
                            "]");
  }
  // Kernels index with int: every (B*T, ...) and (B*H, T, T) extent must fit.
  const double big = static_cast<double>(batch) * static_cast<double>(time) *
                     static_cast<double>(std::max({c.vocab_size, 4 * c.n_embd, c.n_head * time}));
  if (big >= 2147483647.0) {
    return invalid_argument("fused GPT: B*T*max(V, 4C, H*T) = " + std::to_string(big) +
                            " exceeds the kernels' 32-bit indexing; lower train.batch_size");
  }
  return ok_status();
}

FusedGpt::FusedGpt(const GptConfig& config, int64_t b, int64_t t, const ops::AttnMask& mask,
                   std::unique_ptr<FusedBackend> backend)
    : config_(config),
      b_(b),
      t_(t),
      mask_(mask),
      positions_(mask.position_period(t) > 0 ? mask.position_period(t) : t),
      backend_(std::move(backend)) {}

FusedGpt::~FusedGpt() {
  if (!backend_) return;
  backend_->synchronize();
  for (void* p : owned_) backend_->free(p);
}

Status FusedGpt::set_bf16_matmuls(bool on) {
  const int64_t n = b_ * t_, c = config_.n_embd, v = config_.vocab_size;
  // The largest linear call: the tied head (C -> V) or the MLP (C -> 4C, 4C -> C).
  const auto elems = [n](int64_t in, int64_t out) {
    return static_cast<size_t>(n * in + out * in + n * out);
  };
  const size_t most = std::max({elems(c, v), elems(c, 4 * c), elems(4 * c, c), elems(c, 3 * c)});
  return backend_->set_bf16_matmuls(on, most);
}

Result<std::unique_ptr<FusedGpt>> FusedGpt::make(const GptConfig& config, int64_t batch,
                                                 int64_t time, uint64_t seed,
                                                 std::unique_ptr<FusedBackend> backend) {
  return make(config, batch, time, seed, std::move(backend), default_attn_mask(config));
}

Result<std::unique_ptr<FusedGpt>> FusedGpt::make(const GptConfig& config, int64_t batch,
                                                 int64_t time, uint64_t seed,
                                                 std::unique_ptr<FusedBackend> backend,
                                                 const ops::AttnMask& mask) {
  RETURN_IF_ERROR(check_fused_gpt_config(config, batch, time, mask));
  if (!backend) return invalid_argument("fused GPT: no backend");
  std::unique_ptr<FusedGpt> m(new FusedGpt(config, batch, time, mask, std::move(backend)));
  m->loss_vocab_ = config.vocab_size;
  m->layout_ = fused_gpt_layout(config);
  for (const auto& p : m->layout_) m->num_params_ += p.numel;
  std::unordered_map<std::string, int> index;
  for (size_t i = 0; i < m->layout_.size(); ++i) index[m->layout_[i].name] = static_cast<int>(i);
  auto at = [&](const std::string& n) {
    auto it = index.find(n);
    return it == index.end() ? -1 : it->second;
  };
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const std::string h = "transformer.h." + std::to_string(l) + ".";
    m->blocks_.push_back({at(h + "ln_1.weight"), at(h + "ln_1.bias"), at(h + "attn.c_attn.weight"),
                          at(h + "attn.c_attn.bias"), at(h + "attn.c_proj.weight"),
                          at(h + "attn.c_proj.bias"), at(h + "ln_2.weight"), at(h + "ln_2.bias"),
                          at(h + "mlp.c_fc.weight"), at(h + "mlp.c_fc.bias"),
                          at(h + "mlp.c_proj.weight"), at(h + "mlp.c_proj.bias")});
  }
  m->wte_ = at("transformer.wte.weight");
  m->wpe_ = at("transformer.wpe.weight");
  m->lnfw_ = at("transformer.ln_f.weight");
  m->lnfb_ = at("transformer.ln_f.bias");
  RETURN_IF_ERROR(m->allocate(), "fused GPT on " + m->backend_->name());
  // STARLING_CUDA_GRAPHS=0: eager steps (for comparison; set_graphs).
  if (const char* g = std::getenv("STARLING_CUDA_GRAPHS"); g != nullptr && std::string(g) == "0") {
    m->set_graphs(false);
  }

  // The autograd model's initialization, so both engines start from the same weights.
  const Gpt init(config, seed);
  const io::StateDict sd = init.state_dict();
  if (sd.size() != m->layout_.size()) {
    return internal_error("fused GPT: layout has " + std::to_string(m->layout_.size()) +
                          " tensors, models::Gpt " + std::to_string(sd.size()));
  }
  for (size_t i = 0; i < sd.size(); ++i) {
    if (sd[i].first != m->layout_[i].name) {
      return internal_error("fused GPT: layout tensor " + std::to_string(i) + " is '" +
                            m->layout_[i].name + "', models::Gpt's is '" + sd[i].first + "'");
    }
  }
  RETURN_IF_ERROR(m->load(sd));
  return m;
}

Status FusedGpt::set_loss_vocab(int64_t v) {
  if (v < 1 || v > config_.vocab_size) {
    return invalid_argument("fused GPT: loss vocabulary " + std::to_string(v) +
                            " must be in [1, V = " + std::to_string(config_.vocab_size) + "]");
  }
  loss_vocab_ = v;
  return ok_status();
}

Status FusedGpt::allocate() {
  auto get = [&](size_t nbytes) -> Result<void*> {
    ASSIGN_OR_RETURN(void* p, backend_->alloc(nbytes));
    if (p != nullptr) owned_.push_back(p);
    return p;
  };
  auto floats = [&](size_t n) -> Result<float*> {
    ASSIGN_OR_RETURN(void* p, get(n * sizeof(float)));
    return static_cast<float*>(p);
  };
  auto ints = [&](size_t n) -> Result<int*> {
    ASSIGN_OR_RETURN(void* p, get(n * sizeof(int)));
    return static_cast<int*>(p);
  };
  const size_t B = static_cast<size_t>(b_), T = static_cast<size_t>(t_);
  const size_t C = static_cast<size_t>(config_.n_embd), V = static_cast<size_t>(config_.vocab_size);
  const size_t H = static_cast<size_t>(config_.n_head), L = static_cast<size_t>(config_.n_layer);
  const size_t N = B * T;
  const int bi = static_cast<int>(B), ti = static_cast<int>(T), ci = static_cast<int>(C),
            hi = static_cast<int>(H);
  const size_t att_floats = backend_->attention_state_floats(bi, ti, ci, hi);
  ASSIGN_OR_RETURN(params_, floats(num_params_), "parameters");
  ASSIGN_OR_RETURN(grads_, floats(num_params_), "gradients");
  ASSIGN_OR_RETURN(m_, floats(num_params_), "AdamW state");
  ASSIGN_OR_RETURN(v_, floats(num_params_), "AdamW state");
  ASSIGN_OR_RETURN(a_.idx, ints(N));
  ASSIGN_OR_RETURN(a_.targets, ints(N));
  ASSIGN_OR_RETURN(a_.weights, floats(N));
  ASSIGN_OR_RETURN(a_.bucket_order, ints(N));
  ASSIGN_OR_RETURN(a_.bucket_starts, ints(N + 1));
  ASSIGN_OR_RETURN(a_.bucket_tokens, ints(N));
  for (size_t l = 0; l <= L; ++l) {
    ASSIGN_OR_RETURN(float* r, floats(N * C), "activations");
    a_.residual.push_back(r);
  }
  struct PerLayer {
    std::vector<float*>* dst;
    size_t n;
  };
  const PerLayer per_layer[] = {
      {&a_.ln1, N * C},  {&a_.ln1_mean, N},     {&a_.ln1_rstd, N},      {&a_.qkv, 3 * N * C},
      {&a_.atty, N * C}, {&a_.att, att_floats}, {&a_.resid_mid, N * C}, {&a_.ln2, N * C},
      {&a_.ln2_mean, N}, {&a_.ln2_rstd, N},     {&a_.fch, 4 * N * C},   {&a_.fch_gelu, 4 * N * C},
  };
  for (const auto& pl : per_layer) {
    for (size_t l = 0; l < L; ++l) {
      ASSIGN_OR_RETURN(float* p, floats(pl.n), "activations");
      pl.dst->push_back(p);
    }
  }
  ASSIGN_OR_RETURN(a_.tmp, floats(N * C), "activations");
  ASSIGN_OR_RETURN(a_.lnf, floats(N * C), "activations");
  ASSIGN_OR_RETURN(a_.lnf_mean, floats(N), "activations");
  ASSIGN_OR_RETURN(a_.lnf_rstd, floats(N), "activations");
  ASSIGN_OR_RETURN(a_.logits, floats(N * V), "logits");
  ASSIGN_OR_RETURN(a_.losses, floats(N), "activations");
  ASSIGN_OR_RETURN(a_.dlogits, floats(N * V), "logit gradients");
  ASSIGN_OR_RETURN(a_.dres, floats(N * C), "backward scratch");
  ASSIGN_OR_RETURN(a_.dbtc, floats(N * C), "backward scratch");
  ASSIGN_OR_RETURN(a_.dbtc2, floats(N * C), "backward scratch");
  ASSIGN_OR_RETURN(a_.dqkv, floats(3 * N * C), "backward scratch");
  ASSIGN_OR_RETURN(a_.dfch, floats(4 * N * C), "backward scratch");
  ASSIGN_OR_RETURN(a_.datt, floats(backend_->attention_scratch_floats(bi, ti, ci, hi)),
                   "backward scratch");
  ASSIGN_OR_RETURN(a_.scalars, get(kScalarBytes));
  if (config_.rope) {
    // ops::rope's table: angles p * base^(-2i/D) in double, their cos and sin rounded to fp32.
    const int64_t D = config_.n_embd / config_.n_head, half = D / 2, P = positions_;
    std::vector<float> cs(static_cast<size_t>(P * half)), sn(cs.size());
    for (int64_t i = 0; i < half; ++i) {
      const double inv_freq =
          std::pow(config_.rope_base, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      for (int64_t p = 0; p < P; ++p) {
        const double a = static_cast<double>(p) * inv_freq;
        cs[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(a));
        sn[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(a));
      }
    }
    ASSIGN_OR_RETURN(a_.rope_cos, floats(cs.size()), "RoPE tables");
    ASSIGN_OR_RETURN(a_.rope_sin, floats(sn.size()), "RoPE tables");
    backend_->copy_to_backend(a_.rope_cos, cs.data(), cs.size() * sizeof(float));
    backend_->copy_to_backend(a_.rope_sin, sn.data(), sn.size() * sizeof(float));
    backend_->synchronize();  // the host tables go out of scope
  }
  return ok_status();
}

Status FusedGpt::load(const io::StateDict& sd) {
  std::unordered_map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : sd) {
    if (name == "lm_head.weight") continue;  // nanoGPT's tied head: the same tensor as wte
    if (!by_name.emplace(name, &t).second) {
      return invalid_argument("fused GPT load: tensor '" + name + "' appears twice");
    }
  }
  for (const auto& p : layout_) {
    auto it = by_name.find(p.name);
    if (it == by_name.end())
      return invalid_argument("fused GPT load: missing tensor '" + p.name + "'");
    const Tensor& t = *it->second;
    if (t.shape() != p.shape) {
      return invalid_argument("fused GPT load: tensor '" + p.name + "' has shape " +
                              shape_str(t.shape()) + ", expected " + shape_str(p.shape));
    }
    if (t.dtype() != DType::kF32) {
      return invalid_argument("fused GPT load: tensor '" + p.name + "' is not f32");
    }
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    return invalid_argument("fused GPT load: unexpected tensor '" + by_name.begin()->first +
                            "' for a GPT with L=" + std::to_string(config_.n_layer) +
                            ", bias=" + (config_.bias ? "true" : "false") +
                            (config_.rope ? ", rotary positions (no wpe)" : ""));
  }
  std::vector<float> host(num_params_);
  for (const auto& [name, t] : sd) {
    if (name == "lm_head.weight") continue;
    const auto pos = std::find_if(layout_.begin(), layout_.end(),
                                  [&](const FusedParam& p) { return p.name == name; });
    const Tensor c = t.contiguous();
    std::memcpy(host.data() + pos->offset, c.data<float>(), pos->numel * sizeof(float));
  }
  backend_->copy_to_backend(params_, host.data(), num_params_ * sizeof(float));
  backend_->synchronize();
  return ok_status();
}

io::StateDict FusedGpt::state_dict() {
  const std::vector<float> host = parameters_host();
  io::StateDict sd;
  for (const auto& p : layout_) {
    std::vector<float> v(host.begin() + static_cast<std::ptrdiff_t>(p.offset),
                         host.begin() + static_cast<std::ptrdiff_t>(p.offset + p.numel));
    sd.emplace_back(p.name, Tensor::from_vector(v, p.shape));
  }
  return sd;
}

Status FusedGpt::set_batch(const FusedBatch& batch, bool fewer_rows) {
  const int32_t* idx = batch.idx;
  const int32_t* targets = batch.targets;
  if (idx == nullptr || targets == nullptr) {
    return invalid_argument("fused GPT: a batch needs inputs and targets");
  }
  const size_t T = static_cast<size_t>(t_), full = static_cast<size_t>(b_) * T;
  const bool fits = fewer_rows ? batch.count > 0 && batch.count % T == 0 && batch.count <= full
                               : batch.count == full;
  const size_t N = fits ? batch.count : full;
  if (!fits) {
    return invalid_argument("fused GPT: batch has " + std::to_string(batch.count) +
                            " tokens, expected " +
                            (fewer_rows ? "r*T, 1 <= r <= B, with B*T = " : "B*T = ") +
                            std::to_string(b_) + "*" + std::to_string(t_));
  }
  const int32_t V = static_cast<int32_t>(config_.vocab_size);
  const int32_t VL = static_cast<int32_t>(loss_vocab_);
  const bool weighted = batch.weights != nullptr;
  for (size_t i = 0; i < N; ++i) {
    if (idx[i] < 0 || idx[i] >= V) {
      return invalid_argument("fused GPT: token at position " + std::to_string(i) + " (" +
                              std::to_string(idx[i]) + ") is outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    }
    // Negative targets mark ignored positions, which only a weighted loss has.
    if (targets[i] >= VL || (targets[i] < 0 && !weighted)) {
      return invalid_argument("fused GPT: target at position " + std::to_string(i) + " (" +
                              std::to_string(targets[i]) + ") is outside the vocabulary [0, " +
                              std::to_string(VL) + ")");
    }
    if (weighted && targets[i] >= 0 && !std::isfinite(batch.weights[i])) {
      return invalid_argument("fused GPT: loss weight at position " + std::to_string(i) +
                              " is not finite");
    }
  }
  // Counting sort of positions by token: buckets for the deterministic embedding backward.
  h_count_.assign(static_cast<size_t>(V) + 1, 0);
  for (size_t i = 0; i < N; ++i) ++h_count_[static_cast<size_t>(idx[i]) + 1];
  h_tokens_.clear();
  h_starts_.clear();
  for (int32_t v = 0; v < V; ++v) {
    if (h_count_[static_cast<size_t>(v) + 1] > 0) {
      h_tokens_.push_back(v);
      h_starts_.push_back(h_count_[static_cast<size_t>(v)]);
    }
    h_count_[static_cast<size_t>(v) + 1] += h_count_[static_cast<size_t>(v)];
  }
  h_starts_.push_back(static_cast<int32_t>(N));
  h_order_.assign(N, 0);
  for (size_t i = 0; i < N; ++i) {
    h_order_[static_cast<size_t>(h_count_[static_cast<size_t>(idx[i])]++)] =
        static_cast<int32_t>(i);
  }
  a_.num_unique = static_cast<int>(h_tokens_.size());
  backend_->copy_to_backend(a_.idx, idx, N * sizeof(int));
  backend_->copy_to_backend(a_.targets, targets, N * sizeof(int));
  weighted_ = weighted;
  if (weighted) backend_->copy_to_backend(a_.weights, batch.weights, N * sizeof(float));
  backend_->copy_to_backend(a_.bucket_order, h_order_.data(), N * sizeof(int));
  backend_->copy_to_backend(a_.bucket_starts, h_starts_.data(), h_starts_.size() * sizeof(int));
  backend_->copy_to_backend(a_.bucket_tokens, h_tokens_.data(), h_tokens_.size() * sizeof(int));
  rows_ = static_cast<int64_t>(N / T);
  return ok_status();
}

void FusedGpt::forward() {
  FusedBackend& k = *backend_;
  const int B = static_cast<int>(rows_), T = static_cast<int>(t_);
  const int C = static_cast<int>(config_.n_embd), V = static_cast<int>(config_.vocab_size);
  const int H = static_cast<int>(config_.n_head);
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  const int P = static_cast<int>(positions_);  // row r is at position r % P
  timed(k, "embedding fwd",
        [&] { k.encoder_forward(a_.residual[0], a_.idx, param(wte_), param(wpe_), N / P, P, C); });
  for (size_t l = 0; l < blocks_.size(); ++l) {
    const BlockIndex& p = blocks_[l];
    const float* x = a_.residual[l];
    timed(k, "layer_norm fwd", [&] {
      k.layer_norm_forward(a_.ln1[l], a_.ln1_mean[l], a_.ln1_rstd[l], x, param(p.ln1w),
                           param(p.ln1b), N, C);
    });
    timed(k, "linear qkv fwd", [&] {
      k.linear_forward(a_.qkv[l], a_.ln1[l], param(p.qkvw), param(p.qkvb), N, C, 3 * C);
    });
    if (config_.rope) {
      timed(k, "rope", [&] { k.rope(a_.qkv[l], a_.rope_cos, a_.rope_sin, N, C, H, P, false); });
    }
    timed(k, "attention fwd",
          [&] { k.attention_forward(a_.atty[l], a_.att[l], a_.qkv[l], B, T, C, H, mask_); });
    timed(k, "linear attn_proj fwd", [&] {
      k.linear_forward(a_.tmp, a_.atty[l], param(p.attprojw), param(p.attprojb), N, C, C);
    });
    timed(k, "residual add", [&] { k.residual_add(a_.resid_mid[l], x, a_.tmp, NC); });
    timed(k, "layer_norm fwd", [&] {
      k.layer_norm_forward(a_.ln2[l], a_.ln2_mean[l], a_.ln2_rstd[l], a_.resid_mid[l],
                           param(p.ln2w), param(p.ln2b), N, C);
    });
    timed(k, "linear fc fwd",
          [&] { k.linear_forward(a_.fch[l], a_.ln2[l], param(p.fcw), param(p.fcb), N, C, 4 * C); });
    timed(k, "gelu fwd", [&] { k.gelu_forward(a_.fch_gelu[l], a_.fch[l], 4 * NC); });
    timed(k, "linear fc_proj fwd", [&] {
      k.linear_forward(a_.tmp, a_.fch_gelu[l], param(p.fcprojw), param(p.fcprojb), N, 4 * C, C);
    });
    timed(k, "residual add",
          [&] { k.residual_add(a_.residual[l + 1], a_.resid_mid[l], a_.tmp, NC); });
  }
  timed(k, "layer_norm fwd", [&] {
    k.layer_norm_forward(a_.lnf, a_.lnf_mean, a_.lnf_rstd, a_.residual.back(), param(lnfw_),
                         param(lnfb_), N, C);
  });
  timed(k, "head fwd", [&] {
    k.linear_forward(a_.logits, a_.lnf, param(wte_), nullptr, N, C, V);  // tied head
  });
  timed(k, "cross_entropy fwd", [&] {
    k.cross_entropy_forward(a_.losses,
                            reinterpret_cast<float*>(static_cast<char*>(a_.scalars) + kLossOffset),
                            a_.logits, a_.targets, weighted_ ? a_.weights : nullptr, N,
                            static_cast<int>(loss_vocab_), V);
  });
}

void FusedGpt::backward() {
  backward_layers();
  embedding_backward();
}

void FusedGpt::embedding_backward() {
  const int N = static_cast<int>(rows_ * t_), C = static_cast<int>(config_.n_embd);
  const int P = static_cast<int>(positions_);
  const EncoderBuckets bk{a_.bucket_order, a_.bucket_starts, a_.bucket_tokens, a_.num_unique};
  timed(*backend_, "embedding bwd",
        [&] { backend_->encoder_backward(grad(wte_), grad(wpe_), a_.dres, bk, N / P, P, C); });
}

void FusedGpt::set_graphs(bool on) {
  graphs_ = on;
  graph_.reset();
  graph_rows_ = warm_rows_ = -1;
  graph_note_ = on ? "on (not captured yet)" : "off";
}

bool FusedGpt::run_graph() {
  if (!graphs_ || reducer_ || backend_->profiling()) return false;
  if (graph_ && graph_rows_ == rows_ && graph_weighted_ == weighted_) {
    backend_->replay(graph_);
    return true;
  }
  // The first step of a shape runs eagerly: libraries finish their lazy setup (cuBLAS
  // heuristics, kernel attributes) outside the capture.
  if (warm_rows_ != rows_) {
    warm_rows_ = rows_;
    return false;
  }
  graph_.reset();
  auto fail = [&](const Status& why) {
    graphs_ = false;
    graph_note_ = "off: " + why.message();
    // A backend without graphs (the CPU) is the expected case; a failed capture is worth a word.
    if (why.code() == StatusCode::kUnimplemented) {
      spdlog::debug("fused engine on {}: training steps run eagerly ({})", backend_->name(),
                    why.message());
    } else {
      spdlog::warn("fused engine on {}: training steps run eagerly ({})", backend_->name(),
                   why.message());
    }
    return false;
  };
  if (Status st = backend_->begin_capture(); !st.ok()) return fail(st);
  forward();
  backward_layers();
  auto g = backend_->end_capture();
  if (!g.ok()) return fail(g.status());  // nothing ran: the caller runs the step eagerly
  graph_ = *g;
  graph_rows_ = rows_;
  graph_weighted_ = weighted_;
  graph_note_ =
      "on: captured a graph of the " + std::to_string(rows_) + " x " + std::to_string(t_) + " step";
  spdlog::info("fused engine on {}: {}", backend_->name(), graph_note_);
  backend_->replay(graph_);
  return true;
}

void FusedGpt::backward_layers() {
  FusedBackend& k = *backend_;
  const int B = static_cast<int>(rows_), T = static_cast<int>(t_);
  const int C = static_cast<int>(config_.n_embd), V = static_cast<int>(config_.vocab_size);
  const int H = static_cast<int>(config_.n_head);
  const int N = B * T;
  const size_t NC = static_cast<size_t>(N) * C;
  const int P = static_cast<int>(positions_);
  timed(k, "zero gradients", [&] { k.zero(grads_, num_params_ * sizeof(float)); });
  timed(k, "cross_entropy bwd", [&] {
    k.cross_entropy_backward(a_.dlogits, a_.logits, a_.targets, weighted_ ? a_.weights : nullptr, N,
                             static_cast<int>(loss_vocab_), V);
  });
  // The head writes dwte; the embedding backward adds to it at the end (tied weights).
  timed(k, "head bwd", [&] {
    k.linear_backward(a_.dbtc, grad(wte_), nullptr, a_.dlogits, a_.lnf, param(wte_), N, C, V);
  });
  timed(k, "layer_norm bwd", [&] {
    k.layer_norm_backward(a_.dres, grad(lnfw_), grad(lnfb_), a_.dbtc, a_.residual.back(),
                          param(lnfw_), a_.lnf_mean, a_.lnf_rstd, N, C);
  });
  for (size_t li = blocks_.size(); li-- > 0;) {
    const BlockIndex& p = blocks_[li];
    // a_.dres holds the gradient of residual[li + 1].
    timed(k, "linear fc_proj bwd", [&] {
      k.linear_backward(a_.dfch, grad(p.fcprojw), grad(p.fcprojb), a_.dres, a_.fch_gelu[li],
                        param(p.fcprojw), N, 4 * C, C);
    });
    timed(k, "gelu bwd", [&] { k.gelu_backward(a_.dfch, a_.dfch, a_.fch[li], 4 * NC); });
    timed(k, "linear fc bwd", [&] {
      k.linear_backward(a_.dbtc, grad(p.fcw), grad(p.fcb), a_.dfch, a_.ln2[li], param(p.fcw), N, C,
                        4 * C);
    });
    timed(k, "layer_norm bwd", [&] {
      k.layer_norm_backward(a_.dbtc2, grad(p.ln2w), grad(p.ln2b), a_.dbtc, a_.resid_mid[li],
                            param(p.ln2w), a_.ln2_mean[li], a_.ln2_rstd[li], N, C);
    });
    // The gradient of resid_mid.
    timed(k, "residual add", [&] { k.residual_add(a_.dres, a_.dres, a_.dbtc2, NC); });
    timed(k, "linear attn_proj bwd", [&] {
      k.linear_backward(a_.dbtc, grad(p.attprojw), grad(p.attprojb), a_.dres, a_.atty[li],
                        param(p.attprojw), N, C, C);
    });
    timed(k, "attention bwd", [&] {
      k.attention_backward(a_.dqkv, a_.datt, a_.dbtc, a_.qkv[li], a_.atty[li], a_.att[li], B, T, C,
                           H, mask_);
    });
    // qkv[li] holds the rotated q, k; rotating dq, dk back gives c_attn's output gradient.
    if (config_.rope) {
      timed(k, "rope", [&] { k.rope(a_.dqkv, a_.rope_cos, a_.rope_sin, N, C, H, P, true); });
    }
    timed(k, "linear qkv bwd", [&] {
      k.linear_backward(a_.dbtc, grad(p.qkvw), grad(p.qkvb), a_.dqkv, a_.ln1[li], param(p.qkvw), N,
                        C, 3 * C);
    });
    timed(k, "layer_norm bwd", [&] {
      k.layer_norm_backward(a_.dbtc2, grad(p.ln1w), grad(p.ln1b), a_.dbtc, a_.residual[li],
                            param(p.ln1w), a_.ln1_mean[li], a_.ln1_rstd[li], N, C);
    });
    // The gradient of residual[li].
    timed(k, "residual add", [&] { k.residual_add(a_.dres, a_.dres, a_.dbtc2, NC); });
    if (reducing_) reducer_->ready(grads_ + block_ranges_[li].first, block_ranges_[li].second);
  }
}

Result<double> FusedGpt::loss(const int32_t* idx, const int32_t* targets, size_t count) {
  if (targets == nullptr) return invalid_argument("fused GPT: loss needs targets");
  return loss(FusedBatch{idx, targets, nullptr, count});
}

Result<double> FusedGpt::loss(const FusedBatch& batch) {
  RETURN_IF_ERROR(set_batch(batch, true));
  forward();
  float loss = 0.0f;
  backend_->copy_to_host(&loss, static_cast<char*>(a_.scalars) + kLossOffset, sizeof loss);
  return static_cast<double>(loss);
}

Result<double> FusedGpt::forward_backward(const int32_t* idx, const int32_t* targets,
                                          size_t count) {
  if (targets == nullptr) return invalid_argument("fused GPT: training needs targets");
  return forward_backward(FusedBatch{idx, targets, nullptr, count});
}

Result<double> FusedGpt::forward_backward(const FusedBatch& batch) {
  RETURN_IF_ERROR(set_batch(batch));
  forward();
  backward();
  float loss = 0.0f;
  backend_->copy_to_host(&loss, static_cast<char*>(a_.scalars) + kLossOffset, sizeof loss);
  return static_cast<double>(loss);
}

Status FusedGpt::set_data_parallel(comm::Communicator* comm, bool overlap) {
  reducer_.reset();
  block_ranges_.clear();
  other_ranges_.clear();
  if (comm == nullptr) return ok_status();
  // Each block's tensors are contiguous in the layout (fused_gpt_layout): its range is from its
  // first tensor to the end of its last.
  for (size_t li = 0; li < blocks_.size(); ++li) {
    const std::string prefix = "transformer.h." + std::to_string(li) + ".";
    size_t lo = num_params_, hi = 0, sum = 0;
    for (const auto& p : layout_) {
      if (p.name.rfind(prefix, 0) != 0) continue;
      lo = std::min(lo, p.offset);
      hi = std::max(hi, p.offset + p.numel);
      sum += p.numel;
    }
    if (sum == 0 || hi - lo != sum) {
      return internal_error("fused GPT: block " + std::to_string(li) +
                            "'s parameters are not contiguous in the flat layout");
    }
    block_ranges_.emplace_back(lo, sum);
  }
  const size_t first = block_ranges_.empty() ? num_params_ : block_ranges_.front().first;
  const size_t last = block_ranges_.empty()
                          ? num_params_
                          : block_ranges_.back().first + block_ranges_.back().second;
  if (first > 0) other_ranges_.emplace_back(0, first);
  if (last < num_params_) other_ranges_.emplace_back(last, num_params_ - last);
  // Rank 0's parameters everywhere: replicas start equal and, averaging the same gradients with
  // the same arithmetic, stay equal.
  backend_->synchronize();
  RETURN_IF_ERROR(comm->broadcast(std::span<float>(params_, num_params_), 0),
                  "fused GPT: broadcasting rank 0's parameters");
  reducer_ = std::make_unique<GradientReducer>(*comm, *backend_, overlap);
  return ok_status();
}

void FusedGpt::reset_optimizer() {
  backend_->zero(m_, num_params_ * sizeof(float));
  backend_->zero(v_, num_params_ * sizeof(float));
  steps_ = 0;
}

Result<FusedStepResult> FusedGpt::train_step(const int32_t* idx, const int32_t* targets,
                                             size_t count, double lr, const FusedOptimizer& opt,
                                             double grad_clip) {
  if (targets == nullptr) return invalid_argument("fused GPT: training needs targets");
  return train_step(FusedBatch{idx, targets, nullptr, count}, lr, opt, grad_clip);
}

void FusedGpt::adamw_step(double lr, const FusedOptimizer& opt) {
  size_t i = 0;
  while (i < layout_.size()) {
    size_t j = i;
    while (j + 1 < layout_.size() && layout_[j + 1].decay == layout_[i].decay) ++j;
    const size_t off = layout_[i].offset;
    const size_t n = layout_[j].offset + layout_[j].numel - off;
    FusedAdamW s{lr,
                 opt.beta1,
                 opt.beta2,
                 opt.eps,
                 layout_[i].decay ? opt.weight_decay : 0.0,
                 static_cast<long>(steps_)};
    backend_->adamw(params_ + off, grads_ + off, m_ + off, v_ + off, n, s);
    i = j + 1;
  }
}

Result<FusedStepResult> FusedGpt::train_step(const FusedBatch& batch, double lr,
                                             const FusedOptimizer& opt, double grad_clip) {
  {
    ProfileScope upload(*backend_, "batch upload");
    RETURN_IF_ERROR(set_batch(batch));
  }
  if (!run_graph()) {
    forward();
    reducing_ = reducer_ != nullptr;  // only a training step averages (not forward_backward)
    backward_layers();
    reducing_ = false;
  }
  embedding_backward();
  if (reducer_) {
    for (const auto& [off, n] : other_ranges_) reducer_->ready(grads_ + off, n);
    float* loss = reinterpret_cast<float*>(static_cast<char*>(a_.scalars) + kLossOffset);
    reducer_->ready(loss, 1);
    ProfileScope wait(*backend_, "gradient all-reduce wait");
    RETURN_IF_ERROR(reducer_->finish(), "fused GPT, data-parallel step " +
                                            std::to_string(steps_ + 1) + " on rank " +
                                            std::to_string(reducer_->comm().rank()));
  }
  double* norm_sq = reinterpret_cast<double*>(static_cast<char*>(a_.scalars) + kNormOffset);
  timed(*backend_, "gradient norm + clip", [&] {
    backend_->sum_squares(norm_sq, grads_, num_params_);
    backend_->clip_scale(grads_, num_params_, norm_sq, grad_clip);
  });
  ++steps_;
  timed(*backend_, "adamw", [&] { adamw_step(lr, opt); });
  unsigned char host[kScalarBytes];
  backend_->copy_to_host(host, a_.scalars, kScalarBytes);
  double nsq = 0.0;
  float loss = 0.0f;
  std::memcpy(&nsq, host + kNormOffset, sizeof nsq);
  std::memcpy(&loss, host + kLossOffset, sizeof loss);
  return FusedStepResult{static_cast<double>(loss), std::sqrt(nsq)};
}

std::vector<float> FusedGpt::parameters_host() {
  std::vector<float> out(num_params_);
  backend_->copy_to_host(out.data(), params_, num_params_ * sizeof(float));
  return out;
}

std::vector<float> FusedGpt::gradients_host() {
  std::vector<float> out(num_params_);
  backend_->copy_to_host(out.data(), grads_, num_params_ * sizeof(float));
  return out;
}

std::vector<float> FusedGpt::logits_host() {
  std::vector<float> out(static_cast<size_t>(rows_ * t_ * config_.vocab_size));
  backend_->copy_to_host(out.data(), a_.logits, out.size() * sizeof(float));
  return out;
}

}  // namespace starling::models
