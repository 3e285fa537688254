// MNIST-style IDX files (MNIST, Fashion-MNIST): images (magic 0x803) and labels (magic 0x801),
// gzip-compressed or raw, validated as untrusted input.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::data {

struct MnistSet {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> images;    // N * rows * cols, row-major, pixel / 255 in [0, 1]
  std::vector<int32_t> labels;  // N, in [0, 9]
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
  int64_t pixels() const { return rows * cols; }
};

// Parses the two IDX files' bytes. DataLoss (naming `source`) for a wrong magic, dimensions
// that do not match the byte count, differing counts, or a label above 9.
Result<MnistSet> parse_mnist(std::span<const uint8_t> images, std::span<const uint8_t> labels,
                             std::string_view source);
// Reads the files (gzip or raw, detected by content). NotFound names a missing file.
Result<MnistSet> load_mnist(const std::filesystem::path& images,
                            const std::filesystem::path& labels);
// The train or test split of a named dataset ("mnist", "fashion-mnist") under data_dir.
Result<MnistSet> load_mnist_split(const std::filesystem::path& data_dir, std::string_view dataset,
                                  bool train);
// Picks examples of a split given its labels (images empty): an index list, in order.
using ExampleChooser = std::function<Result<std::vector<int64_t>>(const MnistSet& labels_only)>;
// As load_mnist_split, but only the examples `choose` picks are converted to floats: an edge
// client never holds the whole split in memory as floats (60,000 MNIST images are 188 MB).
Result<MnistSet> load_mnist_split_subset(const std::filesystem::path& data_dir,
                                         std::string_view dataset, bool train,
                                         const ExampleChooser& choose);
// The examples at `indices`, in that order, as a set of their own (an edge client keeps only
// its partition in memory). OutOfRange names the first index outside [0, set.size()).
Result<MnistSet> subset(const MnistSet& set, std::span<const int64_t> indices);

}  // namespace starling::data
