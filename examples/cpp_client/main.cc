// A model of one's own, federated from C++: linear regression y = w.x + b (the model of
// examples/exec_protocol/linreg.py), trained by SGD on data each client draws for itself. It
// builds against the installed package (find_package(starling), starling::client) and uses
// only the documented interface: edge_client::LocalTrainer and sim/federate.h.
//   cpp_client init WEIGHTS                write the initial model (zeros) for model.weights
//   cpp_client run CONFIG [PARTITION]      join the federation of CONFIG over mutual TLS
//   cpp_client peer GOSSIP_CONFIG [PARTITION]   a peer of a serverless gossip federation
//   cpp_client simulate CONFIG OUT_DIR     the whole federation of CONFIG on this machine
//   cpp_client eval MODEL                  mean squared error of a model file on held-out data
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/io/safetensors.h"
#include "edge_client/edge_client.h"
#include "edge_client/model_params.h"
#include "sim/federate.h"

namespace {

using starling::Result;
using starling::Status;
namespace ec = starling::edge_client;

constexpr float kTrueW[4] = {1.0f, -2.0f, 3.0f, 0.5f};
constexpr float kTrueB = -1.0f;

struct Example {
  float x[4];
  float y;
};

std::vector<Example> examples(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<Example> out(static_cast<size_t>(n));
  for (auto& e : out) {
    e.y = kTrueB + noise(rng);
    for (int i = 0; i < 4; ++i) {
      e.x[i] = u(rng);
      e.y += kTrueW[i] * e.x[i];
    }
  }
  return out;
}

double mse(std::span<const float> m, const std::vector<Example>& data) {
  double s = 0;
  for (const auto& e : data) {
    double p = m[4];
    for (int i = 0; i < 4; ++i) p += m[static_cast<size_t>(i)] * e.x[i];
    s += (p - e.y) * (p - e.y);
  }
  return s / static_cast<double>(data.size());
}

const starling::compress::Layout& layout() {
  static const starling::compress::Layout l = {{"linear.weight", {4}, 0}, {"linear.bias", {1}, 4}};
  return l;
}

// The trainer starling calls each round: global model in, local - global out.
class LinRegTrainer final : public ec::LocalTrainer {
 public:
  explicit LinRegTrainer(int partition)
      : data_(examples(static_cast<uint64_t>(partition) + 1, 64)) {}
  const starling::compress::Layout& layout() const override { return ::layout(); }
  Result<ec::TrainReport> train(std::span<const float> global, const starling::v1::RoundPlan& plan,
                                std::span<float> delta) override {
    std::vector<float> m(global.begin(), global.end());
    std::mt19937_64 rng(plan.seed());
    const int batch = std::max<int>(1, std::min<int>(static_cast<int>(plan.batch_size()), 64));
    const int steps = std::max<int>(1, static_cast<int>(plan.local_steps()));
    double loss = 0;
    for (int s = 0; s < steps; ++s) {
      float g[5] = {0, 0, 0, 0, 0};
      loss = 0;
      for (int k = 0; k < batch; ++k) {
        const Example& e = data_[rng() % data_.size()];
        float err = m[4] - e.y;
        for (int i = 0; i < 4; ++i) err += m[static_cast<size_t>(i)] * e.x[i];
        loss += err * err / batch;
        for (int i = 0; i < 4; ++i) g[i] += 2 * err * e.x[i] / batch;
        g[4] += 2 * err / batch;
      }
      for (int i = 0; i < 5; ++i) m[static_cast<size_t>(i)] -= plan.learning_rate() * g[i];
    }
    for (size_t i = 0; i < m.size(); ++i) delta[i] = m[i] - global[i];
    return ec::TrainReport{data_.size(), static_cast<float>(loss)};
  }

 private:
  std::vector<Example> data_;
};

int fail(const Status& st) {
  std::fprintf(stderr, "cpp_client: %s\n", st.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "init" && argc == 3) {
    const std::vector<float> zeros(5, 0.0f);
    const Status st = starling::io::save_safetensors(argv[2], ec::layout_tensors(layout(), zeros));
    return st.ok() ? 0 : fail(st);
  }
  if (cmd == "run" && (argc == 3 || argc == 4)) {
    const int partition = argc == 4 ? std::atoi(argv[3]) : 0;
    LinRegTrainer trainer(partition);
    starling::sim::ClientRunOptions options;
    options.partition = partition;
    auto r = starling::sim::run_client(argv[2], trainer, options);
    if (!r.ok()) return fail(r.status());
    std::printf("cpp_client: %d rounds trained\n", r->rounds_trained);
    return 0;
  }
  if (cmd == "peer" && (argc == 3 || argc == 4)) {
    const int partition = argc == 4 ? std::atoi(argv[3]) : 0;
    LinRegTrainer trainer(partition);
    starling::sim::ClientRunOptions options;
    options.partition = partition;
    auto r = starling::sim::run_peer(argv[2], trainer, std::vector<float>(5, 0.0f), options);
    if (!r.ok()) return fail(r.status());
    std::printf("cpp_client: peer %llu rounds, mse %.5f\n",
                static_cast<unsigned long long>(r->rounds_completed),
                mse(r->params, examples(10'000, 200)));
    return 0;
  }
  if (cmd == "simulate" && argc == 4) {
    const auto test = examples(10'000, 200);
    auto r = starling::sim::simulate_federation(
        argv[2], std::vector<float>(5, 0.0f),
        [](int k) { return std::make_unique<LinRegTrainer>(k); },
        [&](std::span<const float> g) {
          return starling::sim::TaskEval{mse(g, test), std::nan("")};
        },
        argv[3]);
    if (!r.ok()) return fail(r.status());
    std::printf("cpp_client: %zu rounds, mse %.5f\n", r->rounds.size(), mse(r->global, test));
    return 0;
  }
  if (cmd == "eval" && argc == 3) {
    auto file = starling::io::load_safetensors(argv[2]);
    if (!file.ok()) return fail(file.status());
    std::vector<float> m(5);
    const Status st = ec::read_layout_tensors(*file, layout(), m, argv[2]);
    if (!st.ok()) return fail(st);
    std::printf("mse %.5f\n", mse(m, examples(10'000, 200)));
    return 0;
  }
  std::fprintf(stderr,
               "usage: cpp_client init WEIGHTS | run CONFIG [PARTITION] | peer GOSSIP_CONFIG "
               "[PARTITION] | simulate CONFIG OUT_DIR | eval MODEL\n");
  return 2;
}
