// Train/val split and random next-token windows.
#include "core/data/text_dataset.h"

#include <cmath>
#include <cstring>
#include <string>
#include <utility>

namespace starling::data {

std::string_view split_name(Split split) { return split == Split::kTrain ? "train" : "val"; }

Result<TextDataset> TextDataset::from_tokens(std::vector<int32_t> ids, double val_fraction) {
  if (ids.empty()) return invalid_argument("text dataset: no tokens");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return invalid_argument("text dataset: val_fraction " + std::to_string(val_fraction) +
                            " is not in [0, 1)");
  }
  const auto n = static_cast<double>(ids.size());
  const auto train = static_cast<int64_t>(std::floor(n * (1.0 - val_fraction)));
  return TextDataset(std::move(ids), train);
}

std::span<const int32_t> TextDataset::tokens(Split split) const {
  const std::span<const int32_t> all(ids_);
  const auto train = static_cast<size_t>(train_size_);
  return split == Split::kTrain ? all.first(train) : all.subspan(train);
}

Result<Batch> TextDataset::get_batch(Split split, int64_t B, int64_t T, Rng& rng) const {
  if (B <= 0 || T <= 0) {
    return invalid_argument("text dataset: batch shape B=" + std::to_string(B) +
                            ", T=" + std::to_string(T) + " must be positive");
  }
  const std::span<const int32_t> data = tokens(split);
  const auto len = static_cast<int64_t>(data.size());
  if (len < T + 1) {
    return failed_precondition("text dataset: the " + std::string(split_name(split)) +
                               " split has " + std::to_string(len) + " tokens; a batch with T=" +
                               std::to_string(T) + " needs at least " + std::to_string(T + 1));
  }
  Batch batch{Tensor::empty({B, T}, DType::kI32), Tensor::empty({B, T}, DType::kI32)};
  int32_t* x = batch.x.data<int32_t>();
  int32_t* y = batch.y.data<int32_t>();
  const auto row_bytes = static_cast<size_t>(T) * sizeof(int32_t);
  for (int64_t b = 0; b < B; ++b) {
    const auto start = static_cast<size_t>(rng.below(static_cast<uint64_t>(len - T)));
    std::memcpy(x + b * T, data.data() + start, row_bytes);
    std::memcpy(y + b * T, data.data() + start + 1, row_bytes);
  }
  return batch;
}

}  // namespace starling::data
