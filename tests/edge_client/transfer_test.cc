// Raw f32 payloads and flat parameter vectors.
#include "edge_client/transfer.h"

#include <catch2/catch.hpp>

#include "edge_client/model_params.h"
#include "models/mlp/mlp.h"

namespace starling::edge_client {
namespace {

TEST_CASE("f32 payloads round-trip and refuse a wrong size", "[edge_client]") {
  const std::vector<float> v = {1.5f, -0.0f, 3e38f};
  const std::string bytes = to_f32_bytes(v);
  CHECK(bytes.size() == 12);
  std::vector<float> back(3);
  REQUIRE(from_f32_bytes(bytes, back).ok());
  CHECK(back == v);
  std::vector<float> wrong(2);
  CHECK(from_f32_bytes(bytes, wrong).code() == StatusCode::kDataLoss);
}

TEST_CASE("a module flattens to its layout and loads back", "[edge_client]") {
  models::Mlp a(models::MlpConfig{6, 4, 3}, 1);
  models::Mlp b(models::MlpConfig{6, 4, 3}, 2);
  const auto layout = layout_of(a);
  REQUIRE(layout.size() == 6);
  CHECK(layout[0].name == "fc1.weight");
  CHECK(layout[5].name == "fc3.bias");
  CHECK(compress::validate_layout(layout).value() == a.num_parameters());
  const auto flat = flatten(a);
  REQUIRE(load_flat(b, flat).ok());
  CHECK(flatten(b) == flat);
  CHECK_FALSE(load_flat(b, std::vector<float>(3)).ok());
}

}  // namespace
}  // namespace starling::edge_client
