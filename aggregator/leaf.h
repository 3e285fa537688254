// The upstream face of a leaf aggregator (a tier of aggregators, docs/federation.md "Aggregator
// tiers"): an EdgeClient to the tier above, on a thread and io_context of its own, whose
// "training" is one round of the leaf's own Aggregator (AggregatorOptions::leaf). The model
// the tier above sends is relayed to the leaf's clients; what goes up is the rule's mean of
// their updates, weighted by the examples behind it, with the list of contributors that the
// tier above checks the weight against. The tier above applies its strategy once, over leaves
// and direct clients alike, so two tiers of FedAvg give the flat federation's model.
#pragma once

#include <asio/io_context.hpp>
#include <asio/ssl/context.hpp>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

#include "aggregator/aggregator.h"
#include "core/util/status.h"
#include "edge_client/edge_client.h"

namespace starling::aggregator {

struct LeafOptions {
  // The link to the tier above: address, identity (node_id = the leaf's certificate CN), backoff,
  // chunk size, state_path (error-feedback residuals of the leaf's uploads, crash-safe). Its
  // role is set to LEAF.
  edge_client::EdgeClientOptions upstream;
  // The leaf's round ends at this fraction of the time left before the upper round's deadline.
  double deadline_fraction = 0.8;
};

class Leaf {
 public:
  // Starts the link on its own thread. `agg` (a leaf, running on `io`) must outlive the Leaf;
  // the Leaf only calls it through `io`.
  static Result<std::unique_ptr<Leaf>> start(asio::io_context& io, Aggregator& agg,
                                             compress::Layout layout,
                                             std::shared_ptr<asio::ssl::context> upstream_ctx,
                                             LeafOptions options);
  // Stops the link and joins its thread.
  ~Leaf();
  Leaf(const Leaf&) = delete;
  Leaf& operator=(const Leaf&) = delete;

  // The tier above ended the federation, or the link failed for good (see error()). Any thread.
  bool stopped() const { return stopped_.load(); }
  bool finished() const { return finished_.load(); }
  Status error() const;
  int rounds() const { return rounds_.load(); }  // partial sums acknowledged by the tier above

  class Trainer;

 private:
  Leaf() = default;
  void run();

  asio::io_context up_io_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<edge_client::EdgeClient> client_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> finished_{false};
  std::atomic<int> rounds_{0};
  mutable std::mutex mu_;
  Status error_;
};

}  // namespace starling::aggregator
