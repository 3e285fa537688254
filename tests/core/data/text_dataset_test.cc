// TextDataset: nanoGPT's split and get_batch, determinism and errors.
#include "core/data/text_dataset.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <numeric>
#include <set>
#include <vector>

#include "core/data/char_tokenizer.h"
#include "core/data/data_dir.h"

using starling::Rng;
using starling::StatusCode;
using starling::data::Split;
using starling::data::TextDataset;

namespace {

std::vector<int32_t> iota_ids(int32_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

std::vector<int32_t> values(const starling::Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

}  // namespace

TEST_CASE("text dataset: Tiny Shakespeare split as nanoGPT", "[data]") {
  auto dir = starling::data::resolve_data_dir("");
  REQUIRE(dir.ok());
  auto path = starling::data::resolve_dataset_file(*dir, "tinyshakespeare");
  REQUIRE(path.ok());
  auto text = starling::data::read_text_file(*path);
  REQUIRE(text.ok());
  auto tok = starling::data::CharTokenizer::from_corpus(*text);
  REQUIRE(tok.ok());
  auto ds = TextDataset::from_tokens(tok->encode(*text).value(), 0.1);
  REQUIRE(ds.ok());
  // nanoGPT prepare.py: "train has 1,003,854 tokens", "val has 111,540 tokens".
  REQUIRE(ds->train_size() == 1003854);
  REQUIRE(ds->val_size() == 111540);
  Rng rng(1337);
  auto batch = ds->get_batch(Split::kTrain, 4, 8, rng);
  REQUIRE(batch.ok());
  REQUIRE(batch->x.shape() == starling::Shape{4, 8});
  REQUIRE(batch->y.shape() == starling::Shape{4, 8});
  REQUIRE(batch->x.dtype() == starling::DType::kI32);
  REQUIRE(batch->y.dtype() == starling::DType::kI32);
}

TEST_CASE("text dataset: split sizes and shifted targets", "[data]") {
  auto ds = TextDataset::from_tokens(iota_ids(1000), 0.1);
  REQUIRE(ds.ok());
  REQUIRE(ds->train_size() == 900);
  REQUIRE(ds->val_size() == 100);
  REQUIRE(ds->tokens(Split::kVal).front() == 900);

  const Split split = GENERATE(Split::kTrain, Split::kVal);
  const int64_t T = GENERATE(1, 7, 64);
  Rng rng(7);
  auto batch = ds->get_batch(split, 16, T, rng);
  REQUIRE(batch.ok());
  const auto x = values(batch->x);
  const auto y = values(batch->y);
  const int32_t lo = split == Split::kTrain ? 0 : 900;
  const int32_t hi = split == Split::kTrain ? 900 : 1000;
  for (int64_t b = 0; b < 16; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      REQUIRE(y[i] == x[i] + 1);  // consecutive ids: the window is contiguous
      if (t + 1 < T) REQUIRE(x[i + 1] == y[i]);
      REQUIRE(x[i] >= lo);
      REQUIRE(y[i] < hi);  // never reads past the split
    }
  }
}

TEST_CASE("text dataset: window starts cover [0, len - T - 1] exactly", "[data]") {
  auto ds = TextDataset::from_tokens(iota_ids(11), 0.0);
  REQUIRE(ds.ok());
  REQUIRE(ds->val_size() == 0);
  Rng rng(3);
  std::set<int32_t> starts;
  for (int i = 0; i < 200; ++i)
    starts.insert(values(ds->get_batch(Split::kTrain, 1, 8, rng)->x)[0]);
  REQUIRE(starts == std::set<int32_t>{0, 1, 2});
}

TEST_CASE("text dataset: batches are deterministic for a seed", "[data]") {
  auto ds = TextDataset::from_tokens(iota_ids(5000), 0.1);
  REQUIRE(ds.ok());
  Rng a(42), b(42), c(43);
  const auto xa = values(ds->get_batch(Split::kTrain, 8, 32, a)->x);
  const auto xb = values(ds->get_batch(Split::kTrain, 8, 32, b)->x);
  const auto xc = values(ds->get_batch(Split::kTrain, 8, 32, c)->x);
  REQUIRE(xa == xb);
  REQUIRE(xa != xc);
  // The next batch from the same generator differs from the first.
  REQUIRE(values(ds->get_batch(Split::kTrain, 8, 32, a)->x) != xa);
}

TEST_CASE("text dataset: errors", "[data]") {
  SECTION("a split too short for T names the split and the sizes") {
    auto ds = TextDataset::from_tokens(iota_ids(50), 0.1);
    REQUIRE(ds.ok());
    REQUIRE(ds->val_size() == 5);
    Rng rng(0);
    auto batch = ds->get_batch(Split::kVal, 2, 8, rng);
    REQUIRE(batch.status().code() == StatusCode::kFailedPrecondition);
    REQUIRE_THAT(batch.status().message(), Catch::Contains("val split has 5 tokens"));
    REQUIRE_THAT(batch.status().message(), Catch::Contains("T=8 needs at least 9"));
    REQUIRE(ds->get_batch(Split::kVal, 2, 4, rng).ok());
    REQUIRE_FALSE(ds->get_batch(Split::kVal, 2, 5, rng).ok());
  }
  SECTION("bad shapes and fractions") {
    auto ds = TextDataset::from_tokens(iota_ids(50), 0.1);
    Rng rng(0);
    REQUIRE(ds->get_batch(Split::kTrain, 0, 8, rng).status().code() ==
            StatusCode::kInvalidArgument);
    REQUIRE(ds->get_batch(Split::kTrain, 2, -1, rng).status().code() ==
            StatusCode::kInvalidArgument);
    REQUIRE_FALSE(TextDataset::from_tokens({}, 0.1).ok());
    REQUIRE_FALSE(TextDataset::from_tokens(iota_ids(10), 1.0).ok());
    REQUIRE_FALSE(TextDataset::from_tokens(iota_ids(10), -0.1).ok());
  }
  SECTION("read_text_file names the path") {
    const auto missing = std::filesystem::temp_directory_path() / "starling_no_such_file.txt";
    auto text = starling::data::read_text_file(missing);
    REQUIRE(text.status().code() == StatusCode::kNotFound);
    REQUIRE_THAT(text.status().message(), Catch::Contains(missing.string()));
    auto dir = starling::data::read_text_file(std::filesystem::temp_directory_path());
    REQUIRE(dir.status().code() == StatusCode::kInvalidArgument);
  }
}
