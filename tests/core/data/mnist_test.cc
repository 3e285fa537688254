// IDX reading: synthetic files (raw and gzip), every malformed header an error, and the real
// MNIST test split when the data folder is present.
#include "core/data/mnist.h"

#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/data/data_dir.h"
#include "tests/testing/test_data.h"

namespace starling::data {
namespace {

namespace fs = std::filesystem;

void put32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

std::vector<uint8_t> idx_images(uint32_t n, uint32_t rows, uint32_t cols) {
  std::vector<uint8_t> b;
  put32(b, 0x803);
  put32(b, n);
  put32(b, rows);
  put32(b, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(static_cast<uint8_t>(i * 51));
  return b;
}

std::vector<uint8_t> idx_labels(uint32_t n) {
  std::vector<uint8_t> b;
  put32(b, 0x801);
  put32(b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i % 10));
  return b;
}

TEST_CASE("IDX images and labels parse", "[data]") {
  auto set = parse_mnist(idx_images(3, 2, 2), idx_labels(3), "test");
  REQUIRE(set.ok());
  CHECK(set->size() == 3);
  CHECK(set->pixels() == 4);
  CHECK(set->images[1] == 51.0f / 255.0f);
  CHECK(set->labels == std::vector<int32_t>{0, 1, 2});
}

TEST_CASE("malformed IDX input is DataLoss, never a crash", "[data]") {
  auto img = idx_images(3, 2, 2);
  auto lab = idx_labels(3);
  CHECK(parse_mnist({}, lab, "t").status().code() == StatusCode::kDataLoss);
  CHECK(parse_mnist(img, {}, "t").status().code() == StatusCode::kDataLoss);
  auto bad_magic = img;
  bad_magic[3] = 0x01;
  CHECK_FALSE(parse_mnist(bad_magic, lab, "t").ok());
  auto truncated = img;
  truncated.pop_back();
  CHECK_FALSE(parse_mnist(truncated, lab, "t").ok());
  CHECK_FALSE(parse_mnist(img, idx_labels(2), "t").ok());
  auto bad_label = lab;
  bad_label.back() = 200;
  CHECK_FALSE(parse_mnist(img, bad_label, "t").ok());
  auto huge = idx_images(0, 2, 2);
  huge[7] = 0xff;  // claims 255 images
  CHECK_FALSE(parse_mnist(huge, idx_labels(0), "t").ok());
}

TEST_CASE("gzip and raw files both load", "[data]") {
  const fs::path dir = fs::temp_directory_path() / ("starling_mnist_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const auto img = idx_images(5, 3, 3);
  const auto lab = idx_labels(5);
  {
    gzFile f = gzopen((dir / "img.gz").c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(gzwrite(f, img.data(), static_cast<unsigned>(img.size())) ==
            static_cast<int>(img.size()));
    gzclose(f);
    std::ofstream(dir / "lab", std::ios::binary)
        .write(reinterpret_cast<const char*>(lab.data()), static_cast<std::streamsize>(lab.size()));
  }
  auto set = load_mnist(dir / "img.gz", dir / "lab");
  REQUIRE(set.ok());
  CHECK(set->size() == 5);
  CHECK(load_mnist(dir / "missing.gz", dir / "lab").status().code() == StatusCode::kNotFound);
  fs::remove_all(dir);
}

TEST_CASE("the real MNIST test split, when present", "[data]") {
  auto dir = resolve_data_dir("");
  if (!dir.ok()) return;
  std::error_code ec;
  if (!fs::exists(*dir / "mnist" / "t10k-images-idx3-ubyte.gz", ec)) return;
  auto set = load_mnist_split(*dir, "mnist", false);
  REQUIRE(set.ok());
  CHECK(set->size() == (testing::using_fixture_data() ? 500 : 10000));  // the cut: the first 500
  CHECK(set->pixels() == 784);
  CHECK(set->labels[0] == 7);  // the first test digit is a 7
}

TEST_CASE("a subset of a split loads as the same examples, converted alone", "[data]") {
  auto dir = resolve_data_dir("");
  if (!dir.ok()) return;
  std::error_code ec;
  if (!fs::exists(*dir / "mnist" / "t10k-images-idx3-ubyte.gz", ec)) return;
  auto all = load_mnist_split(*dir, "mnist", false);
  REQUIRE(all.ok());
  const int64_t size = all->size();  // 10000, or 500 in the fixture cut
  const std::vector<int64_t> pick = {size - 1, 0, 17, 17, size * 42 / 100};
  int64_t seen = 0;
  auto part = load_mnist_split_subset(*dir, "mnist", false,
                                      [&](const MnistSet& labels) -> Result<std::vector<int64_t>> {
                                        seen = labels.size();
                                        CHECK(labels.images.empty());
                                        return pick;
                                      });
  REQUIRE(part.ok());
  CHECK(seen == size);
  auto expected = subset(*all, pick);
  REQUIRE(expected.ok());
  CHECK(part->images == expected->images);
  CHECK(part->labels == expected->labels);
  CHECK(subset(*all, std::vector<int64_t>{size}).status().code() == StatusCode::kOutOfRange);
  auto bad = load_mnist_split_subset(*dir, "mnist", false, [](const MnistSet&) {
    return Result<std::vector<int64_t>>(std::vector<int64_t>{-1});
  });
  CHECK(bad.status().code() == StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace starling::data
