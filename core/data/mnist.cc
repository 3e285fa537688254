// IDX parsing and gzip reading (zlib's gzread also passes raw files through).
#include "core/data/mnist.h"

#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>

#include "core/data/data_dir.h"

namespace starling::data {
namespace {

struct GzClose {
  void operator()(gzFile f) const { gzclose(f); }
};

Result<std::vector<uint8_t>> read_gz(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found("no such file: " + path.string());
  std::unique_ptr<gzFile_s, GzClose> f(gzopen(path.c_str(), "rb"));
  if (!f) return internal_error("cannot open " + path.string());
  std::vector<uint8_t> out;
  // A gzip member ends with its uncompressed size mod 2^32: reserve it, so the 47 MB of MNIST
  // images are not copied through a doubling vector (which would double peak memory).
  {
    std::ifstream raw(path, std::ios::binary | std::ios::ate);
    const auto size = static_cast<int64_t>(raw.tellg());
    unsigned char head[2] = {0, 0};
    unsigned char tail[4] = {0, 0, 0, 0};
    raw.seekg(0);
    raw.read(reinterpret_cast<char*>(head), 2);
    if (raw && size > 18 && head[0] == 0x1f && head[1] == 0x8b) {
      raw.seekg(size - 4);
      raw.read(reinterpret_cast<char*>(tail), 4);
      const uint32_t isize = uint32_t{tail[0]} | (uint32_t{tail[1]} << 8) |
                             (uint32_t{tail[2]} << 16) | (uint32_t{tail[3]} << 24);
      if (raw && isize < (1u << 30)) out.reserve(isize);
    } else if (size > 0 && size < (int64_t{1} << 30)) {
      out.reserve(static_cast<size_t>(size));
    }
  }
  std::vector<uint8_t> buf(1 << 20);
  for (;;) {
    const int n = gzread(f.get(), buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) {
      int err = 0;
      return data_loss(path.string() + ": " + gzerror(f.get(), &err));
    }
    if (n == 0) break;
    out.insert(out.end(), buf.begin(), buf.begin() + n);
  }
  return out;
}

uint32_t be32(std::span<const uint8_t> b, size_t at) {
  return (uint32_t{b[at]} << 24) | (uint32_t{b[at + 1]} << 16) | (uint32_t{b[at + 2]} << 8) |
         uint32_t{b[at + 3]};
}

}  // namespace

namespace {

// Validates both files; converts the images unless labels_only.
Result<MnistSet> parse_idx(std::span<const uint8_t> images, std::span<const uint8_t> labels,
                           std::string_view source, bool labels_only) {
  const std::string src(source);
  if (images.size() < 16 || be32(images, 0) != 0x803) {
    return data_loss(src + ": images are not an IDX3 ubyte file (magic 0x00000803)");
  }
  if (labels.size() < 8 || be32(labels, 0) != 0x801) {
    return data_loss(src + ": labels are not an IDX1 ubyte file (magic 0x00000801)");
  }
  const uint64_t n = be32(images, 4);
  const uint64_t rows = be32(images, 8);
  const uint64_t cols = be32(images, 12);
  if (rows == 0 || cols == 0 || rows > 4096 || cols > 4096 ||
      images.size() - 16 != n * rows * cols) {
    return data_loss(src + ": images header says " + std::to_string(n) + " x " +
                     std::to_string(rows) + " x " + std::to_string(cols) + " but holds " +
                     std::to_string(images.size() - 16) + " bytes");
  }
  if (be32(labels, 4) != n || labels.size() - 8 != n) {
    return data_loss(src + ": " + std::to_string(n) + " images but " +
                     std::to_string(labels.size() - 8) + " labels");
  }
  MnistSet set;
  set.rows = static_cast<int64_t>(rows);
  set.cols = static_cast<int64_t>(cols);
  if (!labels_only) {
    set.images.resize(n * rows * cols);
    for (size_t i = 0; i < set.images.size(); ++i) {
      set.images[i] = static_cast<float>(images[16 + i]) / 255.0f;
    }
  }
  set.labels.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (labels[8 + i] > 9) {
      return data_loss(src + ": label " + std::to_string(labels[8 + i]) + " at " +
                       std::to_string(i) + " is not a digit class");
    }
    set.labels[i] = labels[8 + i];
  }
  return set;
}

}  // namespace

Result<MnistSet> parse_mnist(std::span<const uint8_t> images, std::span<const uint8_t> labels,
                             std::string_view source) {
  return parse_idx(images, labels, source, false);
}

Result<MnistSet> load_mnist(const std::filesystem::path& images,
                            const std::filesystem::path& labels) {
  ASSIGN_OR_RETURN(auto img, read_gz(images));
  ASSIGN_OR_RETURN(auto lab, read_gz(labels));
  return parse_mnist(img, lab, images.string());
}

Result<MnistSet> load_mnist_split(const std::filesystem::path& data_dir, std::string_view dataset,
                                  bool train) {
  const std::string prefix = std::string(dataset) + (train ? "-train-" : "-test-");
  ASSIGN_OR_RETURN(auto images, resolve_dataset_file(data_dir, prefix + "images"));
  ASSIGN_OR_RETURN(auto labels, resolve_dataset_file(data_dir, prefix + "labels"));
  return load_mnist(images, labels);
}

Result<MnistSet> subset(const MnistSet& set, std::span<const int64_t> indices) {
  MnistSet out;
  out.rows = set.rows;
  out.cols = set.cols;
  const auto px = static_cast<size_t>(set.pixels());
  out.images.resize(indices.size() * px);
  out.labels.resize(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    const int64_t i = indices[k];
    if (i < 0 || i >= set.size()) {
      return out_of_range("example index " + std::to_string(i) + " (position " + std::to_string(k) +
                          ") outside a set of " + std::to_string(set.size()));
    }
    std::copy_n(set.images.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(i) * px), px,
                out.images.begin() + static_cast<ptrdiff_t>(k * px));
    out.labels[k] = set.labels[static_cast<size_t>(i)];
  }
  return out;
}

Result<MnistSet> load_mnist_split_subset(const std::filesystem::path& data_dir,
                                         std::string_view dataset, bool train,
                                         const ExampleChooser& choose) {
  const std::string prefix = std::string(dataset) + (train ? "-train-" : "-test-");
  ASSIGN_OR_RETURN(auto images_path, resolve_dataset_file(data_dir, prefix + "images"));
  ASSIGN_OR_RETURN(auto labels_path, resolve_dataset_file(data_dir, prefix + "labels"));
  ASSIGN_OR_RETURN(auto img, read_gz(images_path));
  ASSIGN_OR_RETURN(auto lab, read_gz(labels_path));
  ASSIGN_OR_RETURN(MnistSet all, parse_idx(img, lab, images_path.string(), true));
  ASSIGN_OR_RETURN(const std::vector<int64_t> picked, choose(all));
  MnistSet out;
  out.rows = all.rows;
  out.cols = all.cols;
  const auto px = static_cast<size_t>(all.pixels());
  out.images.resize(picked.size() * px);
  out.labels.resize(picked.size());
  for (size_t k = 0; k < picked.size(); ++k) {
    const int64_t i = picked[k];
    if (i < 0 || i >= all.size()) {
      return out_of_range("example index " + std::to_string(i) + " outside a split of " +
                          std::to_string(all.size()));
    }
    const uint8_t* src = img.data() + 16 + static_cast<size_t>(i) * px;
    for (size_t p = 0; p < px; ++p) out.images[k * px + p] = static_cast<float>(src[p]) / 255.0f;
    out.labels[k] = all.labels[static_cast<size_t>(i)];
  }
  return out;
}

}  // namespace starling::data
