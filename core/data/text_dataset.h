// TextDataset: a token stream split into train and val, sampled as (B, T) next-token batches the
// way nanoGPT's get_batch does.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "core/data/text_file.h"
#include "core/tensor/tensor.h"
#include "core/util/rng.h"
#include "core/util/status.h"

namespace starling::data {

enum class Split : uint8_t { kTrain, kVal };
std::string_view split_name(Split split);  // "train", "val"

// x: (B, T) i32 inputs; y: (B, T) i32 targets, y[b][t] == x[b][t + 1] within the same window.
struct Batch {
  Tensor x;
  Tensor y;
};

// Immutable after construction; get_batch is const, so threads may share one dataset as long as
// each uses its own Rng.
class TextDataset {
 public:
  // The first floor(n * (1 - val_fraction)) tokens are train, the rest val (nanoGPT:
  // train = data[:int(n * 0.9)] for val_fraction 0.1).
  // Errors: InvalidArgument when ids is empty or val_fraction is not in [0, 1).
  static Result<TextDataset> from_tokens(std::vector<int32_t> ids, double val_fraction);

  // B windows of T + 1 consecutive tokens, each starting uniformly in [0, len - T - 1], drawn in
  // order b = 0..B-1 with rng.below(len - T); the same seed gives the same batch.
  // Errors: InvalidArgument when B or T is not positive; FailedPrecondition when the split has
  // fewer than T + 1 tokens (naming the split and both sizes).
  Result<Batch> get_batch(Split split, int64_t B, int64_t T, Rng& rng) const;

  int64_t train_size() const { return train_size_; }
  int64_t val_size() const { return static_cast<int64_t>(ids_.size()) - train_size_; }
  std::span<const int32_t> tokens(Split split) const;

 private:
  TextDataset(std::vector<int32_t> ids, int64_t train_size)
      : ids_(std::move(ids)), train_size_(train_size) {}

  std::vector<int32_t> ids_;
  int64_t train_size_ = 0;
};

}  // namespace starling::data
