// The DDPM U-Net (Ho et al. 2020, in the layout of Nichol & Dhariwal's improved-diffusion):
// residual blocks with group norm, SiLU and a projected sinusoidal time embedding, strided
// convolutions down, nearest upsampling + convolution up, skip connections joined by channel
// concatenation, and self-attention at the lowest resolution and in the middle.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/nn/conv.h"
#include "core/nn/layers.h"
#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::models {

struct UNetConfig {
  int64_t image_size = 28;  // H = W
  int64_t in_channels = 1;
  int64_t base_channels = 32;
  std::vector<int64_t> channel_mult = {1, 2, 2};
  int64_t num_res_blocks = 1;
  int64_t groups = 8;
  bool attention = true;
  int64_t attention_heads = 1;
  double dropout = 0.0;

  // Every size positive, groups dividing every level's channels, heads dividing the lowest
  // level's channels, and image_size divisible by 2^(levels - 1). Errors name the [ddpm] key.
  Status validate() const;
  int64_t time_dim() const { return 4 * base_channels; }
};

// x: (B, C_in, H, W), temb: (B, time_dim) -> (B, C_out, H, W).
class ResBlock : public nn::Module {
 public:
  ResBlock(int64_t in, int64_t out, int64_t time_dim, int64_t groups, double dropout, Rng& init,
           Rng& dropout_rng);
  Tensor forward(const Tensor& x, const Tensor& temb) const;

  std::shared_ptr<nn::GroupNorm> norm1;
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::Linear> temb_proj;
  std::shared_ptr<nn::GroupNorm> norm2;
  std::shared_ptr<nn::Conv2d> conv2;  // zero-initialized: a new block starts as the identity
  std::shared_ptr<nn::Conv2d> skip;   // 1x1, only when in != out

 private:
  double dropout_;
  Rng* rng_;
};

// x + proj(attention(norm(x))) over the H W positions. x: (B, C, H, W) -> same.
class AttnBlock : public nn::Module {
 public:
  AttnBlock(int64_t channels, int64_t groups, int64_t heads, Rng& init);
  Tensor forward(const Tensor& x) const;

  std::shared_ptr<nn::GroupNorm> norm;
  std::shared_ptr<nn::Linear> qkv;   // C -> 3C, per position
  std::shared_ptr<nn::Linear> proj;  // C -> C, zero-initialized

 private:
  int64_t heads_;
};

class UNet : public nn::Module {
 public:
  // Weights from Rng(seed); dropout masks from a separate stream. REQUIRES: c.validate().ok().
  UNet(const UNetConfig& c, uint64_t seed);
  const UNetConfig& config() const { return config_; }

  // x: (B, C_in, H, W) f32, t: (B) f32 diffusion step indices -> predicted noise, same shape
  // as x. Differentiable.
  Tensor forward(const Tensor& x, const Tensor& t) const;

 private:
  // One stage of the down or up path: a residual block, optionally followed by attention.
  struct Stage {
    std::shared_ptr<ResBlock> res;
    std::shared_ptr<AttnBlock> attn;  // may be null
  };

  UNetConfig config_;
  Rng dropout_rng_;
  std::shared_ptr<nn::Linear> temb1_, temb2_;
  std::shared_ptr<nn::Conv2d> conv_in_;
  std::vector<std::vector<Stage>> down_;                 // per level
  std::vector<std::shared_ptr<nn::Conv2d>> downsample_;  // per level but the last
  std::shared_ptr<ResBlock> mid1_, mid2_;
  std::shared_ptr<AttnBlock> mid_attn_;                     // may be null
  std::vector<std::vector<Stage>> up_;                      // per level, lowest first
  std::vector<std::shared_ptr<nn::Conv2d>> upsample_conv_;  // per up level but the last
  std::shared_ptr<nn::GroupNorm> norm_out_;
  std::shared_ptr<nn::Conv2d> conv_out_;  // zero-initialized
};

}  // namespace starling::models
