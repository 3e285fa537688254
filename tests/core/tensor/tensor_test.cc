// Tensor storage, views without copies, and dtype conversions.
#include "core/tensor/tensor.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "core/util/rng.h"

using starling::DType;
using starling::Tensor;

TEST_CASE("tensor factories and storage alignment", "[tensor]") {
  Tensor t = Tensor::zeros({2, 3});
  REQUIRE(t.numel() == 6);
  REQUIRE(t.dim() == 2);
  REQUIRE(t.is_contiguous());
  REQUIRE(reinterpret_cast<uintptr_t>(t.raw_data()) % 64 == 0);
  for (float v : t.to_float_vector()) REQUIRE(v == 0.0f);
  Tensor o = Tensor::full({4}, 2.5, DType::kBF16);
  REQUIRE(o.to_float_vector() == std::vector<float>{2.5f, 2.5f, 2.5f, 2.5f});
}

TEST_CASE("views share storage: reshape, transpose, slice, select", "[tensor]") {
  Tensor t = Tensor::arange(24).view({2, 3, 4});
  Tensor tr = t.transpose(0, 2);
  REQUIRE(tr.shape() == starling::Shape{4, 3, 2});
  REQUIRE(tr.shares_storage(t));
  REQUIRE_FALSE(tr.is_contiguous());
  // tr[i][j][k] == t[k][j][i]
  auto v = tr.contiguous().to_float_vector();
  REQUIRE(v[(1 * 3 + 2) * 2 + 1] == static_cast<float>((1 * 3 + 2) * 4 + 1));

  Tensor s = t.slice(2, 1, 4, 2);  // columns 1 and 3
  REQUIRE(s.shape() == starling::Shape{2, 3, 2});
  REQUIRE(s.shares_storage(t));
  REQUIRE(s.contiguous().to_float_vector()[0] == 1.0f);
  REQUIRE(s.contiguous().to_float_vector()[1] == 3.0f);

  Tensor row = t.select(1, 2);  // (2, 4)
  REQUIRE(row.shape() == starling::Shape{2, 4});
  REQUIRE(row.to_float_vector()[4] == 20.0f);

  // Writing through a view changes the base.
  s.fill(-1.0);
  REQUIRE(t.to_float_vector()[1] == -1.0f);
  REQUIRE(t.to_float_vector()[2] == 2.0f);

  Tensor r = t.reshape({6, 4});
  REQUIRE(r.shares_storage(t));
  Tensor r2 = tr.reshape({24});
  REQUIRE_FALSE(r2.shares_storage(t));
}

TEST_CASE("contiguous copies of strided views hold every element in row-major order", "[tensor]") {
  // Views whose inner dims are contiguous rows (copied a row at a time) and views that are not
  // (copied element by element), each against an index-by-index reference.
  const Tensor t = Tensor::arange(2 * 5 * 3 * 4).view({2, 5, 3, 4});
  const std::vector<Tensor> views = {
      t.slice(1, 1, 4),                                   // a channel range: rows of 3 x 4 merged
      t.slice(1, 0, 5, 2),                                // every other channel
      t.slice(3, 1, 3),                                   // part of each innermost row
      t.slice(2, 2, 3),                                   // a dim of one: skipped when merging
      t.select(1, 3),                                     // (2, 3, 4) from (2, 5, 3, 4)
      t.transpose(1, 3),                                  // innermost stride 60: element by element
      t.slice(0, 1, 2).slice(1, 2, 5).slice(3, 0, 4, 3),  // steps inside the row
  };
  for (size_t v = 0; v < views.size(); ++v) {
    CAPTURE(v);
    const Tensor& view = views[v];
    const Tensor c = view.contiguous();
    REQUIRE(c.is_contiguous());
    REQUIRE(c.shape() == view.shape());
    const std::vector<float> got = c.to_float_vector();
    // The reference: walk the view's indices with its own strides.
    const auto& sh = view.shape();
    const auto& st = view.strides();
    std::vector<int64_t> idx(sh.size(), 0);
    const std::vector<float> base = t.to_float_vector();
    for (int64_t i = 0; i < view.numel(); ++i) {
      int64_t off = view.offset();
      for (size_t d = 0; d < sh.size(); ++d) off += idx[d] * st[d];
      REQUIRE(got[static_cast<size_t>(i)] == base[static_cast<size_t>(off)]);
      for (int64_t d = static_cast<int64_t>(sh.size()) - 1; d >= 0; --d) {
        const auto du = static_cast<size_t>(d);
        if (++idx[du] < sh[du]) break;
        idx[du] = 0;
      }
    }
  }
}

TEST_CASE("dtype conversions round trip", "[tensor]") {
  starling::Rng rng(7);
  Tensor x = Tensor::randn({257}, rng);
  for (DType d : {DType::kBF16, DType::kF16, DType::kF64}) {
    Tensor back = x.to(d).to(DType::kF32);
    const double tol = d == DType::kBF16 ? 1.0 / 128 : d == DType::kF16 ? 1.0 / 1024 : 0.0;
    auto a = x.to_float_vector(), b = back.to_float_vector();
    for (size_t i = 0; i < a.size(); ++i)
      REQUIRE(std::fabs(a[i] - b[i]) <= tol * std::fabs(a[i]) + 1e-7);
  }
  Tensor ints = Tensor::from_vector(std::vector<int32_t>{-3, 0, 7}, {3});
  REQUIRE(ints.to(DType::kI8).to_float_vector() == std::vector<float>{-3, 0, 7});
  REQUIRE(ints.to(DType::kF32).to_float_vector() == std::vector<float>{-3, 0, 7});
}

TEST_CASE("half precision special values", "[tensor]") {
  using starling::f16_to_float;
  using starling::float_to_f16;
  REQUIRE(f16_to_float(float_to_f16(65504.0f)) == 65504.0f);
  REQUIRE(std::isinf(f16_to_float(float_to_f16(70000.0f))));
  REQUIRE(std::isnan(f16_to_float(float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  REQUIRE(f16_to_float(float_to_f16(5.960464477539063e-08f)) == 5.960464477539063e-08f);
  REQUIRE(f16_to_float(float_to_f16(-0.0f)) == 0.0f);
  REQUIRE(starling::bf16_to_float(starling::float_to_bf16(1.0f + 1.0f / 256)) ==
          1.0f);  // ties to even
}
