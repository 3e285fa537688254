// U-Net construction and forward pass; parameter names follow the module tree
// ("down.1.0.res.conv1.weight", "mid.attn.qkv.weight", ...).
#include "models/ddpm/unet.h"

#include <string>

#include "core/ops/concat.h"
#include "core/ops/ops.h"
#include "core/ops/pool.h"
#include "core/ops/time_embedding.h"

namespace starling::models {

Status UNetConfig::validate() const {
  auto bad = [](const std::string& key, int64_t v, const std::string& rule) {
    return invalid_argument("key 'ddpm." + key + "' = " + std::to_string(v) + " " + rule);
  };
  if (image_size <= 0) return bad("image_size", image_size, "must be > 0");
  if (in_channels <= 0) return bad("image_channels", in_channels, "must be > 0");
  if (base_channels <= 0) return bad("base_channels", base_channels, "must be > 0");
  if (channel_mult.empty()) return invalid_argument("key 'ddpm.channel_mult' is empty");
  if (num_res_blocks <= 0) return bad("num_res_blocks", num_res_blocks, "must be > 0");
  if (groups <= 0) return bad("groups", groups, "must be > 0");
  if (attention_heads <= 0) return bad("attention_heads", attention_heads, "must be > 0");
  if (!(dropout >= 0.0 && dropout < 1.0)) {
    return invalid_argument("key 'ddpm.dropout' = " + std::to_string(dropout) +
                            " must be in [0, 1)");
  }
  for (int64_t m : channel_mult) {
    if (m <= 0) return bad("channel_mult", m, "entries must be > 0");
    if ((base_channels * m) % groups != 0) {
      return bad("groups", groups,
                 "must divide every level's channels (base_channels * channel_mult = " +
                     std::to_string(base_channels * m) + ")");
    }
  }
  if (base_channels % groups != 0) {
    return bad("groups", groups, "must divide base_channels = " + std::to_string(base_channels));
  }
  const int64_t lowest = base_channels * channel_mult.back();
  if (attention && lowest % attention_heads != 0) {
    return bad("attention_heads", attention_heads,
               "must divide the lowest level's channels = " + std::to_string(lowest));
  }
  const int64_t factor = int64_t{1} << (channel_mult.size() - 1);
  if (image_size % factor != 0) {
    return bad("image_size", image_size,
               "must be divisible by 2^(levels - 1) = " + std::to_string(factor) +
                   " (one halving per level of ddpm.channel_mult but the last)");
  }
  return ok_status();
}

ResBlock::ResBlock(int64_t in, int64_t out, int64_t time_dim, int64_t groups, double dropout,
                   Rng& init, Rng& dropout_rng)
    : dropout_(dropout), rng_(&dropout_rng) {
  norm1 = register_module("norm1", std::make_shared<nn::GroupNorm>(groups, in));
  conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(in, out, 3, 1, 1, true, init));
  temb_proj = register_module("temb_proj", std::make_shared<nn::Linear>(time_dim, out, true, init));
  norm2 = register_module("norm2", std::make_shared<nn::GroupNorm>(groups, out));
  conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(out, out, 3, 1, 1, true, init));
  conv2->weight.zero();
  conv2->bias.zero();
  if (in != out) {
    skip = register_module("skip", std::make_shared<nn::Conv2d>(in, out, 1, 1, 0, true, init));
  }
}

Tensor ResBlock::forward(const Tensor& x, const Tensor& temb) const {
  Tensor h = conv1->forward(norm1->forward_silu(x));
  // The time embedding (B, out) is added per image and channel inside norm2, never as a tensor.
  const Tensor tp = temb_proj->forward(ops::silu(temb));
  h = norm2->forward_silu(h, tp);
  h = ops::dropout(h, dropout_, training(), *rng_);
  // The skip is added as conv2 writes its output.
  return conv2->forward(h, skip ? skip->forward(x) : x);
}

AttnBlock::AttnBlock(int64_t channels, int64_t groups, int64_t heads, Rng& init) : heads_(heads) {
  norm = register_module("norm", std::make_shared<nn::GroupNorm>(groups, channels));
  qkv = register_module("qkv", std::make_shared<nn::Linear>(channels, 3 * channels, true, init));
  proj = register_module("proj", std::make_shared<nn::Linear>(channels, channels, true, init));
  proj->weight.zero();
}

Tensor AttnBlock::forward(const Tensor& x) const {
  const int64_t b = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  Tensor seq = ops::reshape(norm->forward(x), {b, c, h * w});
  seq = ops::contiguous(ops::transpose(seq, 1, 2));  // (B, HW, C)
  Tensor y = ops::attention_packed(qkv->forward(seq), heads_, false);
  y = proj->forward(y);                          // (B, HW, C)
  y = ops::contiguous(ops::transpose(y, 1, 2));  // (B, C, HW)
  return ops::add(x, ops::reshape(y, {b, c, h, w}));
}

UNet::UNet(const UNetConfig& c, uint64_t seed) : config_(c), dropout_rng_(Rng(seed).fork(0x0d0d)) {
  Rng init(seed);
  const int64_t base = c.base_channels, td = c.time_dim();
  const auto levels = static_cast<int64_t>(c.channel_mult.size());
  temb1_ = register_module("temb.0", std::make_shared<nn::Linear>(base, td, true, init));
  temb2_ = register_module("temb.1", std::make_shared<nn::Linear>(td, td, true, init));
  conv_in_ = register_module(
      "conv_in", std::make_shared<nn::Conv2d>(c.in_channels, base, 3, 1, 1, true, init));
  std::vector<int64_t> skip_ch = {base};
  int64_t ch = base;
  for (int64_t l = 0; l < levels; ++l) {
    const int64_t out = base * c.channel_mult[l];
    const bool attn = c.attention && l == levels - 1;
    std::vector<Stage> stages;
    for (int64_t r = 0; r < c.num_res_blocks; ++r) {
      const std::string p = "down." + std::to_string(l) + "." + std::to_string(r);
      Stage s;
      s.res = register_module(
          p + ".res",
          std::make_shared<ResBlock>(ch, out, td, c.groups, c.dropout, init, dropout_rng_));
      if (attn) {
        s.attn = register_module(
            p + ".attn", std::make_shared<AttnBlock>(out, c.groups, c.attention_heads, init));
      }
      stages.push_back(std::move(s));
      ch = out;
      skip_ch.push_back(ch);
    }
    down_.push_back(std::move(stages));
    if (l + 1 < levels) {
      downsample_.push_back(
          register_module("down." + std::to_string(l) + ".downsample",
                          std::make_shared<nn::Conv2d>(ch, ch, 3, 2, 1, true, init)));
      skip_ch.push_back(ch);
    }
  }
  mid1_ = register_module(
      "mid.res1", std::make_shared<ResBlock>(ch, ch, td, c.groups, c.dropout, init, dropout_rng_));
  if (c.attention) {
    mid_attn_ = register_module("mid.attn",
                                std::make_shared<AttnBlock>(ch, c.groups, c.attention_heads, init));
  }
  mid2_ = register_module(
      "mid.res2", std::make_shared<ResBlock>(ch, ch, td, c.groups, c.dropout, init, dropout_rng_));
  for (int64_t l = levels - 1; l >= 0; --l) {
    const int64_t out = base * c.channel_mult[l];
    const bool attn = c.attention && l == levels - 1;
    std::vector<Stage> stages;
    for (int64_t r = 0; r <= c.num_res_blocks; ++r) {
      const std::string p = "up." + std::to_string(l) + "." + std::to_string(r);
      const int64_t in = ch + skip_ch.back();
      skip_ch.pop_back();
      Stage s;
      s.res = register_module(
          p + ".res",
          std::make_shared<ResBlock>(in, out, td, c.groups, c.dropout, init, dropout_rng_));
      if (attn) {
        s.attn = register_module(
            p + ".attn", std::make_shared<AttnBlock>(out, c.groups, c.attention_heads, init));
      }
      stages.push_back(std::move(s));
      ch = out;
    }
    up_.push_back(std::move(stages));
    if (l > 0) {
      upsample_conv_.push_back(
          register_module("up." + std::to_string(l) + ".upsample",
                          std::make_shared<nn::Conv2d>(ch, ch, 3, 1, 1, true, init)));
    }
  }
  norm_out_ = register_module("norm_out", std::make_shared<nn::GroupNorm>(c.groups, ch));
  conv_out_ = register_module("conv_out",
                              std::make_shared<nn::Conv2d>(ch, c.in_channels, 3, 1, 1, true, init));
  conv_out_->weight.zero();
  conv_out_->bias.zero();
}

Tensor UNet::forward(const Tensor& x, const Tensor& t) const {
  Tensor temb = ops::timestep_embedding(t, config_.base_channels);
  temb = temb2_->forward(ops::silu(temb1_->forward(temb)));
  Tensor h = conv_in_->forward(x);
  std::vector<Tensor> skips = {h};
  for (size_t l = 0; l < down_.size(); ++l) {
    for (const Stage& s : down_[l]) {
      h = s.res->forward(h, temb);
      if (s.attn) h = s.attn->forward(h);
      skips.push_back(h);
    }
    if (l < downsample_.size()) {
      h = downsample_[l]->forward(h);
      skips.push_back(h);
    }
  }
  h = mid1_->forward(h, temb);
  if (mid_attn_) h = mid_attn_->forward(h);
  h = mid2_->forward(h, temb);
  for (size_t u = 0; u < up_.size(); ++u) {
    for (const Stage& s : up_[u]) {
      h = s.res->forward(ops::cat({h, skips.back()}, 1), temb);
      skips.pop_back();
      if (s.attn) h = s.attn->forward(h);
    }
    if (u < upsample_conv_.size()) {
      h = upsample_conv_[u]->forward(ops::upsample_nearest2d(h, 2));
    }
  }
  return conv_out_->forward(norm_out_->forward_silu(h));
}

}  // namespace starling::models
