// A leaf aggregator's link to the tier above.
#include "aggregator/leaf.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <asio/post.hpp>
#include <chrono>
#include <cmath>
#include <future>
#include <utility>

#include "core/net/hello.h"

namespace starling::aggregator {

using std::chrono::milliseconds;

// The LocalTrainer of the link: one round of the leaf's aggregator, run on its io_context
// while this (the link's) thread waits.
class Leaf::Trainer : public edge_client::LocalTrainer {
 public:
  Trainer(asio::io_context& io, Aggregator& agg, compress::Layout layout, double fraction)
      : io_(io), agg_(agg), layout_(std::move(layout)), fraction_(fraction) {}

  const compress::Layout& layout() const override { return layout_; }
  // A round the leaf could not run (too few clients, its window closed) costs the tier above
  // this leaf's clients for that round, not the leaf's service.
  bool round_failures_recoverable() const override { return true; }

  Result<edge_client::TrainReport> train(std::span<const float> global, const v1::RoundPlan& plan,
                                         std::span<float> delta) override {
    const auto left_ms =
        static_cast<int64_t>(plan.deadline_unix_ms()) - static_cast<int64_t>(net::unix_now_ms());
    if (left_ms <= 0) {
      return deadline_exceeded("round " + std::to_string(plan.round()) +
                               " of the tier above is past its deadline");
    }
    const milliseconds window(
        std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(left_ms) * fraction_)));
    auto promise = std::make_shared<std::promise<Result<LeafResult>>>();
    auto result = promise->get_future();
    std::vector<float> model(global.begin(), global.end());
    asio::post(io_, [this, plan, model = std::move(model), window, promise]() mutable {
      agg_.lead_round(plan, std::move(model), window,
                      [promise](Result<LeafResult> r) { promise->set_value(std::move(r)); });
    });
    // The leaf's round closes within its window; a margin for the io thread to get there.
    if (result.wait_for(window + std::chrono::seconds(5)) != std::future_status::ready) {
      asio::post(io_, [this, round = plan.round()] {
        agg_.abandon_round(deadline_exceeded(
            "the link to the tier above stopped waiting for round " + std::to_string(round)));
      });
      return deadline_exceeded("the leaf's round " + std::to_string(plan.round()) +
                               " did not close within its window");
    }
    auto r = result.get();
    if (!r.ok()) return r.status();
    if (r->mean.size() != delta.size()) {
      return internal_error("the leaf's mean has " + std::to_string(r->mean.size()) +
                            " values, the model " + std::to_string(delta.size()));
    }
    std::copy(r->mean.begin(), r->mean.end(), delta.begin());
    edge_client::TrainReport report;
    report.num_samples = static_cast<uint64_t>(std::llround(r->total_weight));
    report.loss = static_cast<float>(r->report.mean_train_loss);
    contributions_ = std::move(r->contributions);
    spdlog::info("leaf: round {}: {} update(s) of {} client(s), weight {}, going up", plan.round(),
                 r->report.updates, contributions_.size(), report.num_samples);
    return report;
  }

  std::vector<v1::Contribution> take_contributions() override {
    return std::exchange(contributions_, {});
  }

 private:
  asio::io_context& io_;
  Aggregator& agg_;
  compress::Layout layout_;
  double fraction_;
  std::vector<v1::Contribution> contributions_;  // of the last round, until its upload
};

Result<std::unique_ptr<Leaf>> Leaf::start(asio::io_context& io, Aggregator& agg,
                                          compress::Layout layout,
                                          std::shared_ptr<asio::ssl::context> upstream_ctx,
                                          LeafOptions options) {
  if (!(options.deadline_fraction > 0 && options.deadline_fraction < 1)) {
    return invalid_argument("leaf: deadline_fraction must be in (0, 1)");
  }
  std::unique_ptr<Leaf> leaf(new Leaf());
  leaf->trainer_ = std::make_unique<Trainer>(io, agg, std::move(layout), options.deadline_fraction);
  options.upstream.role = v1::ROLE_LEAF;
  // The leaf's checks are its clients'; its own link has no device conditions.
  options.upstream.memory_limit_bytes = 0;
  options.upstream.condition = {};
  leaf->client_ = std::make_unique<edge_client::EdgeClient>(
      leaf->up_io_, std::move(upstream_ctx), std::move(options.upstream), *leaf->trainer_);
  leaf->client_->start();
  leaf->thread_ = std::thread([l = leaf.get()] { l->run(); });
  return leaf;
}

void Leaf::run() {
  while (!stop_.load() && !client_->stopped()) {
    up_io_.run_for(milliseconds(50));
    if (up_io_.stopped()) up_io_.restart();
    rounds_.store(client_->rounds_trained());
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = client_->error();
  }
  finished_.store(client_->finished());
  rounds_.store(client_->rounds_trained());
  stopped_.store(true);
}

Leaf::~Leaf() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  client_.reset();  // aborts the link on a stopped io_context: nothing runs after this
  trainer_.reset();
}

Status Leaf::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

}  // namespace starling::aggregator
