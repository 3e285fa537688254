// [cuda] The federated client trainers on the GPU ([client] device = "cuda"): the GPT and MDLM
// trainers on cuda:0 give the fused CPU backend's round (the same windows, corruption and AdamW),
// and a GPT client over every visible GPU (data parallel, NCCL; one rank on a one-GPU machine)
// gives one GPU's round.
#include <catch2/catch.hpp>

#include "core/cuda/device.h"
#include "edge_client/fused_gpt_trainer.h"
#include "edge_client/fused_mdlm_trainer.h"
#include "edge_client/model_params.h"
#include "models/gpt/gpt.h"
#include "models/mdlm/mdlm.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/testing/client_rounds.h"

namespace starling::edge_client {
namespace {

// Two rounds of 5 steps from the same globals: losses within 1e-4, updates within `tol`.
void check_rounds(LocalTrainer& a, LocalTrainer& b, const std::vector<float>& g, uint32_t batch,
                  double tol) {
  testing::check_same_rounds(
      a, b, g,
      {testing::round_plan(41, 5, batch, 0.003f), testing::round_plan(42, 5, batch, 0.003f)}, 1e-4,
      tol);
}

GptTrainerOptions gpt_options() {
  GptTrainerOptions o;
  o.model.vocab_size = 65;
  o.model.block_size = 32;
  o.model.n_layer = 2;
  o.model.n_head = 4;
  o.model.n_embd = 64;
  o.grad_clip = 1.0f;
  o.optimizer = LocalStepOptions::Optimizer::kAdamW;
  o.weight_decay = 0.1f;
  return o;
}

}  // namespace

TEST_CASE("GPU clients: the GPT and MDLM trainers on cuda:0 give the CPU backend's rounds",
          "[cuda]") {
  STARLING_REQUIRE_GPU();
  {
    const auto tokens = testing::random_tokens(5000, 65, 7);
    auto cpu = FusedGptTrainer::create(tokens, 0, 5000, gpt_options(), FusedDevice{});
    auto gpu = FusedGptTrainer::create(tokens, 0, 5000, gpt_options(), FusedDevice{true, {0}});
    REQUIRE(cpu.ok());
    INFO(gpu.status().to_string());
    REQUIRE(gpu.ok());
    check_rounds(**cpu, **gpu, flatten(models::Gpt(gpt_options().model, 3)), 8, 1e-3);
  }
  MdlmTrainerOptions mo;
  mo.model.vocab_size = 65;
  mo.model.block_size = 32;
  mo.model.n_layer = 2;
  mo.model.n_head = 4;
  mo.model.n_embd = 64;
  mo.steps.optimizer = LocalStepOptions::Optimizer::kAdamW;
  mo.steps.weight_decay = 0.1f;
  const auto tokens = testing::random_tokens(5000, 65, 7);
  auto cpu = FusedMdlmTrainer::create(tokens, 0, 5000, mo, FusedDevice{});
  auto gpu = FusedMdlmTrainer::create(tokens, 0, 5000, mo, FusedDevice{true, {0}});
  REQUIRE(cpu.ok());
  INFO(gpu.status().to_string());
  REQUIRE(gpu.ok());
  check_rounds(**cpu, **gpu, flatten(models::Mdlm(mo.model, 3)), 8, 1e-3);
}

TEST_CASE("GPU clients: a GPT client over every visible GPU trains as one GPU", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const int n = static_cast<int>(cuda::devices().size());
  FusedDevice all{true, {}, 1};
  for (int g = 0; g < n; ++g) all.gpus.push_back(g);
  const auto tokens = testing::random_tokens(5000, 65, 7);
  auto one = FusedGptTrainer::create(tokens, 0, 5000, gpt_options(), FusedDevice{true, {0}});
  auto many = FusedGptTrainer::create(tokens, 0, 5000, gpt_options(), all);
  REQUIRE(one.ok());
  INFO(many.status().to_string());
  REQUIRE(many.ok());
  // 8 rows per GPU.
  check_rounds(**one, **many, flatten(models::Gpt(gpt_options().model, 3)),
               static_cast<uint32_t>(8 * n), n == 1 ? 0.0 : 1e-3);
}

}  // namespace starling::edge_client

namespace starling::edge_client {

// The GPU client's encoder (make_encoder: the GPU codecs on the trainer's device) gives what the
// host codec gives for the same round's delta, error feedback included. Two trainers train the
// round (one hands its delta to the host): their updates are compared decoded, within 1e-5
// (int8 and exact top-k are bit-identical by GpuCodec's contract; the training itself is
// deterministic on one GPU, but this test does not depend on it).
TEST_CASE("GPU clients: the encoder on the device gives the host codec's bytes", "[cuda]") {
  STARLING_REQUIRE_GPU();
  const auto tokens = testing::random_tokens(5000, 65, 9);
  std::vector<float> g = flatten(models::Gpt(gpt_options().model, 4));
  for (const std::string spec : {"int8:block=256,ef=1", "topk:ratio=0.01,ef=1"}) {
    INFO(spec);
    auto host = FusedGptTrainer::create(tokens, 0, 5000, gpt_options(), FusedDevice{true, {0}});
    auto dev = FusedGptTrainer::create(tokens, 0, 5000, gpt_options(), FusedDevice{true, {0}});
    REQUIRE(host.ok());
    REQUIRE(dev.ok());
    auto codec = compress::make_codec(spec, (*host)->layout(), 5);
    REQUIRE(codec.ok());
    auto enc = (*dev)->make_encoder(spec, 5);
    INFO(enc.status().to_string());
    REQUIRE(enc.ok());
    for (uint64_t seed : {61u, 62u}) {
      std::vector<float> d(g.size());
      REQUIRE((*host)->train(g, testing::round_plan(seed, 3, 8, 0.003f), d).ok());
      REQUIRE((*dev)->train(g, testing::round_plan(seed, 3, 8, 0.003f), std::span<float>()).ok());
      compress::EncodedUpdate a, b;
      REQUIRE((*codec)->encode_into(d, a).ok());
      REQUIRE((*enc)->encode_into(b).ok());
      std::vector<float> da(g.size(), 0.0f), db(g.size(), 0.0f);
      REQUIRE(compress::decode_add(a, da, 1.0f).ok());
      REQUIRE(compress::decode_add(b, db, 1.0f).ok());
      const double e = testing::normalized_error(db.data(), da.data(), da.size());
      INFO("normalized error " << e);
      CHECK(e <= 1e-5);
      if (compress::serialize_update(a) != compress::serialize_update(b)) {
        WARN("the two updates decode alike but are not the same bytes");
      }
    }
  }
}

}  // namespace starling::edge_client
