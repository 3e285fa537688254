// The in-process simulation: selection, worker pool, wire round trip, emulated clock.
#include "sim/engine.h"

#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "aggregator/accumulator.h"
#include "aggregator/dp.h"
#include "aggregator/fed_task.h"
#include "aggregator/strategy.h"
#include "core/net/chunk_stream.h"
#include "core/secagg/noise.h"
#include "core/util/rng.h"
#include "core/wire/envelope.h"
#include "core/wire/frame.h"
#include "edge_client/transfer.h"
#include "sim/link.h"
#include "sim/ranks.h"
#include "sim/secagg_round.h"

namespace starling::sim {

std::string RoundRecord::metrics_json() const {
  nlohmann::json j = {{"round", round},
                      {"available", available},
                      {"selected", selected},
                      {"dropped", dropped},
                      {"stragglers", stragglers},
                      {"updates", updates},
                      {"rejected", rejected},
                      {"attempts", attempts},
                      {"examples", examples},
                      {"train_loss", train_loss},
                      {"bytes_up", bytes_up},
                      {"bytes_down", bytes_down},
                      {"bytes_total", bytes_total},
                      {"sim_round_seconds", sim_round_seconds},
                      {"sim_seconds", sim_seconds}};
  if (dp_epsilon > 0) j["dp_epsilon"] = dp_epsilon;
  if (secagg_degree > 0) {
    j["secagg_dropped"] = secagg_dropped;
    j["secagg_degree"] = secagg_degree;
    j["secagg_threshold"] = secagg_threshold;
  }
  if (evaluated) {
    j["test_loss"] = test_loss;
    j["test_accuracy"] = test_accuracy;
  }
  return j.dump();
}

namespace {

using Clock = std::chrono::steady_clock;

// FNV-1a of the node id, as the aggregator derives per-client plan seeds.
uint64_t fnv1a(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// The in-memory transport: messages are framed as on a TLS stream, counted, and parsed back by
// a FrameDecoder, as a Connection would.
class WireLoop {
 public:
  Status send(const v1::Envelope& e) {
    ASSIGN_OR_RETURN(std::string frame,
                     wire::encode_framed_envelope(e, wire::kDefaultMaxFrameBytes));
    bytes_ += frame.size();
    return decoder_.feed(frame);
  }
  Result<v1::Envelope> receive() {
    ASSIGN_OR_RETURN(auto view, decoder_.next());
    if (!view) return internal_error("wire loop: no complete frame");
    return wire::decode_envelope(*view);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  wire::FrameDecoder decoder_;
  uint64_t bytes_ = 0;
};

// Sends `payload` as a transfer after `head` (which carries its header) and returns what the
// receiver reassembled, checked against the header's SHA-256.
Result<std::string> transfer(WireLoop& wire, v1::Envelope head, std::string_view payload,
                             uint64_t id, uint32_t chunk_bytes, std::string_view content_type,
                             uint64_t limit) {
  net::ChunkSender sender(id, payload, chunk_bytes, std::string(content_type));
  *(head.has_update_upload() ? head.mutable_update_upload()->mutable_transfer()
                             : head.mutable_model_download()->mutable_transfer()) = sender.header();
  RETURN_IF_ERROR(wire.send(head));
  ASSIGN_OR_RETURN(v1::Envelope got, wire.receive());
  const v1::TransferHeader& header =
      got.has_update_upload() ? got.update_upload().transfer() : got.model_download().transfer();
  ASSIGN_OR_RETURN(auto rx, net::ChunkReceiver::create_buffered(header, limit));
  for (uint64_t c = 0; c < sender.num_chunks(); ++c) {
    v1::Envelope e;
    ASSIGN_OR_RETURN(*e.mutable_chunk(), sender.chunk(c));
    RETURN_IF_ERROR(wire.send(e));
    ASSIGN_OR_RETURN(v1::Envelope in, wire.receive());
    RETURN_IF_ERROR(rx.accept(in.chunk()));
  }
  RETURN_IF_ERROR(rx.finish());
  return rx.take_payload();
}

// What one selected client produced in a round.
struct Outcome {
  bool dropped = false;
  std::string payload;              // the update as the aggregator received it
  std::vector<uint32_t> quantized;  // [secagg]: the update quantized, masked later
  float weight = 0;
  float loss = 0;
  uint64_t bytes_up = 0;
  uint64_t chunks_up = 0;
  double seconds = 0;  // simulated: download + compute + upload
};

// What the other ranks need of an outcome trained here: where it stands in the round, not the
// update itself (that stays on its rank and reaches rank 0 inside the partial sum).
struct OutcomeMeta {
  uint64_t index = 0;
  uint64_t dropped = 0;
  double seconds = 0;
  double weight = 0;
  double loss = 0;
  uint64_t bytes_up = 0;
  uint64_t chunks_up = 0;
};

template <typename T>
void put_pod(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
bool get_pod(std::string_view& in, T& v) {
  if (in.size() < sizeof(T)) return false;
  std::memcpy(&v, in.data(), sizeof(T));
  in.remove_prefix(sizeof(T));
  return true;
}

// A rank's message: its first error ("" when none), then a count and that many PODs.
template <typename T>
std::string pack_rank(const Status& error, const std::vector<T>& items) {
  std::string out;
  const std::string text = error.ok() ? "" : error.message();
  put_pod(out, static_cast<uint32_t>(error.code()));
  put_pod(out, static_cast<uint64_t>(text.size()));
  out += text;
  put_pod(out, static_cast<uint64_t>(items.size()));
  for (const T& t : items) put_pod(out, t);
  return out;
}

// Every rank's items, in rank order; the first rank's error, named, when one failed.
template <typename T>
Result<std::vector<std::vector<T>>> exchange(const Ranks& ranks, const Status& error,
                                             const std::vector<T>& mine, std::string_view what) {
  ASSIGN_OR_RETURN(auto all, ranks.allgather(pack_rank(error, mine)), std::string(what));
  std::vector<std::vector<T>> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    std::string_view in = all[r];
    uint32_t code = 0;
    uint64_t n = 0;
    if (!get_pod(in, code) || !get_pod(in, n) || in.size() < n) {
      return internal_error(std::string(what) + ": garbled");
    }
    if (n > 0) {
      return Status(static_cast<StatusCode>(code),
                    "rank " + std::to_string(r) + ": " + std::string(in.substr(0, n)));
    }
    in.remove_prefix(n);
    if (!get_pod(in, n)) return internal_error(std::string(what) + ": garbled");
    out[r].resize(n);
    for (auto& t : out[r]) {
      if (!get_pod(in, t)) return internal_error(std::string(what) + ": garbled");
    }
  }
  return out;
}

// One rank's share of a round's fold.
struct FoldShare {
  double weight = 0;
  double loss_sum = 0;
  uint64_t count = 0;
  uint64_t rejected = 0;
};

int worker_count(const v1::FederationConfig& c) {
  if (c.simulate().workers() > 0) return static_cast<int>(c.simulate().workers());
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

Result<int> fleet_size(const v1::FederationConfig& c, const SimTask& task) {
  const int have = task.num_clients();
  if (c.simulate().num_clients() == 0) return have;
  if (static_cast<int>(c.simulate().num_clients()) > have) {
    return invalid_argument("simulate.num_clients " + std::to_string(c.simulate().num_clients()) +
                            " exceeds the " + std::to_string(have) +
                            " client partitions of [data]");
  }
  return static_cast<int>(c.simulate().num_clients());
}

}  // namespace

Result<SimResult> run_in_process(const v1::FederationConfig& cfg, SimTask& task,
                                 const std::filesystem::path& out_dir,
                                 const RoundCallback& on_round, const Ranks* ranks,
                                 const ModelCallback& on_model) {
  const auto opts = aggregator::aggregator_options(cfg);
  const bool multi = ranks != nullptr && ranks->size() > 1;
  if (multi) {
    // What composes across ranks: sums. The rules that need every update side by side, and
    // secure aggregation (its masks cancel only in one sum), run in one process.
    if (opts.rule.rule != aggregator::RobustRule::kMean) {
      return invalid_argument(
          "robust.rule (MEDIAN, TRIMMED_MEAN, KRUM, MULTI_KRUM) needs every update in one "
          "process; "
          "MPI ranks fold partial sums (run it without mpirun)");
    }
    if (cfg.secagg().enabled()) {
      return invalid_argument("[secagg] runs in one process for now (run it without mpirun)");
    }
  }
  if (opts.buffer_size > 0) {
    return invalid_argument(
        "rounds.buffer_size (FedBuff) runs only in simulate.mode = \"LOOPBACK\"");
  }
  if (opts.dp.enabled()) {
    // Central DP lives in the aggregator (Poisson sampling, clipping, noise, accountant); the
    // in-process engine would otherwise drop it without a word.
    return invalid_argument(
        "[dp] (central DP) runs only in simulate.mode = \"LOOPBACK\" or `starling aggregator "
        "--simulate`");
  }
  ASSIGN_OR_RETURN(const int n_clients, fleet_size(cfg, task));
  const bool secure = cfg.secagg().enabled();
  const secagg::Quantizer quantizer = secagg::quantizer_of(cfg.secagg());
  const bool distributed_dp = secure && cfg.secagg().noise_multiplier() > 0;
  double randk_ratio = 0;
  if (secure) {
    ASSIGN_OR_RETURN(randk_ratio, aggregator::secagg_randk_ratio(cfg));
  }
  aggregator::SkellamAccountant accountant;
  if (distributed_dp) {
    // The noisy sum of every client must not wrap around: 10 standard deviations of the total
    // noise of a round of all the clients, spread over them, on top of their largest values.
    const auto sens = secagg::rounded_sensitivity(cfg.secagg().dp_clip_norm(), quantizer.scale(),
                                                  task.initial_model().size());
    const double n = n_clients;
    const double margin = 10 * cfg.secagg().noise_multiplier() * sens.l2 * std::sqrt(n / 2) / n;
    RETURN_IF_ERROR(quantizer.validate(static_cast<uint32_t>(n_clients), margin),
                    "secagg.noise_multiplier " + std::to_string(cfg.secagg().noise_multiplier()));
  }
  const auto t0 = Clock::now();
  const compress::Layout& layout = task.layout();
  SimResult res;
  res.mode = "in-process";
  res.num_clients = n_clients;
  res.workers = worker_count(cfg);
  res.participation.assign(static_cast<size_t>(n_clients), 0);
  res.global = task.initial_model();
  const size_t numel = res.global.size();
  aggregator::ServerOptimizer optimizer(opts.strategy, static_cast<int64_t>(numel));
  aggregator::UpdateAccumulator acc(static_cast<int64_t>(numel), opts.rule);
  std::vector<float> mean(numel);
  ResidualStore store(multi ? out_dir / "residuals" / ("rank-" + std::to_string(ranks->rank()))
                            : out_dir / "residuals",
                      static_cast<uint64_t>(cfg.simulate().residual_memory_mb()) << 20);
  const LinkModel link(LinkOptions::from_proto(cfg.simulate()), opts.seed);
  const uint32_t chunk_bytes = std::max<uint32_t>(1024, cfg.simulate().chunk_bytes());
  const double deadline = std::chrono::duration<double>(opts.round_deadline).count();
  const uint64_t update_limit =
      opts.max_update_bytes ? opts.max_update_bytes : numel * 8 + (1u << 20);
  uint64_t version = 0, bytes_total = 0;
  double sim_seconds = 0;

  for (uint64_t round = 1; round <= opts.num_rounds; ++round) {
    RoundRecord rec;
    rec.round = round;
    for (uint64_t attempt = 0;; ++attempt) {
      if (attempt >= 100) {
        return failed_precondition("round " + std::to_string(round) +
                                   " failed 100 times: too few clients available or fast enough "
                                   "for rounds.min_updates before rounds.round_deadline_ms");
      }
      rec.attempts = static_cast<int>(attempt + 1);
      // Selection, as the aggregator does it: over the clients online now.
      std::vector<int> idle;
      for (int k = 0; k < n_clients; ++k) {
        if (link.available(k, round)) idle.push_back(k);
      }
      const size_t available = idle.size();
      rec.available = static_cast<int>(available);
      if (available == 0 || available < opts.min_available) {
        sim_seconds += deadline;
        continue;
      }
      auto ceil_count = [](double x) { return static_cast<size_t>(std::ceil(x - 1e-6)); };
      size_t want = std::max<size_t>(opts.clients_per_round,
                                     ceil_count(opts.fraction * static_cast<double>(available)));
      want = std::clamp<size_t>(want, 1, available);
      size_t pick =
          std::min(available, ceil_count(static_cast<double>(want) * (1.0 + opts.over_selection)));
      Rng rng = Rng(opts.seed).fork((round << 16) + attempt);
      std::vector<int> chosen;
      const double dp_rate = static_cast<double>(want) / static_cast<double>(available);
      if (distributed_dp) {
        // Poisson sampling, the accountant's model: each available client with probability
        // want / available, and every one drawn is waited for.
        for (int k : idle) {
          if (rng.uniform() < dp_rate) chosen.push_back(k);
        }
        pick = chosen.size();
        want = pick;
        if (pick < 2) {
          sim_seconds += deadline;
          continue;
        }
      } else {
        for (size_t i = 0; i < pick; ++i) {
          const size_t j = i + static_cast<size_t>(rng.below(available - i));
          std::swap(idle[i], idle[j]);
        }
        chosen.assign(idle.begin(), idle.begin() + static_cast<std::ptrdiff_t>(pick));
      }
      // Secure aggregation: the round's graph and threshold are set before training, and with
      // them each client's share of the noise.
      secagg::Params sa_params;
      secagg::Coordinates coords;
      double client_variance = 0;
      v1::SecAggEncoding encoding;
      if (secure) {
        const uint64_t coordinates_seed = Rng(opts.seed).fork(7).fork(round).next_u64();
        coords = secagg::choose_coordinates(randk_ratio, numel, coordinates_seed);
        ASSIGN_OR_RETURN(
            sa_params, plan_secagg(cfg.secagg(), static_cast<uint32_t>(pick), coords.length(numel)),
            "round " + std::to_string(round));
        client_variance = secagg::client_noise_variance(cfg.secagg(), sa_params);
        encoding =
            secagg::encoding_of(cfg.secagg(), randk_ratio, coordinates_seed, client_variance);
      }

      // The model download: one framed, chunked transfer, decoded back; every client gets it.
      WireLoop down;
      v1::Envelope dl;
      dl.mutable_model_download()->set_round(round);
      dl.mutable_model_download()->set_model_version(version);
      const std::string model_bytes = edge_client::to_f32_bytes(res.global);
      ASSIGN_OR_RETURN(std::string got,
                       transfer(down, dl, model_bytes, round, chunk_bytes,
                                edge_client::kModelContentType, numel * 4),
                       "model download");
      std::vector<float> round_global(numel);
      RETURN_IF_ERROR(edge_client::from_f32_bytes(got, round_global), "model download");
      const uint64_t down_chunks = (model_bytes.size() + chunk_bytes - 1) / chunk_bytes;

      // Local training on the worker pool.
      std::vector<Outcome> out(pick);
      std::atomic<size_t> next{0};
      std::mutex err_mu;
      Status first_error;
      auto work = [&] {
        omp_set_num_threads(1);  // one core per client: deterministic and not oversubscribed
        compress::EncodedUpdate encoded;
        std::vector<float> delta(numel);
        for (size_t i = next++; i < pick; i = next++) {
          const int k = chosen[i];
          if (multi && ranks->owner(k) != ranks->rank()) continue;  // another rank trains it
          Outcome& o = out[i];
          const ClientProfile prof = link.profile(k);
          const std::string node = "client-" + std::to_string(k);
          v1::RoundPlan plan;
          plan.set_round(round);
          plan.set_model_version(version);
          plan.set_local_steps(opts.local_steps);
          plan.set_batch_size(opts.batch_size);
          plan.set_learning_rate(opts.learning_rate);
          plan.set_codec(opts.codec);
          plan.set_seed(Rng(opts.seed).fork(round).fork(fnv1a(node)).next_u64());
          WireLoop wire;
          v1::Envelope pe;
          *pe.mutable_round_plan() = plan;
          Status st = wire.send(pe);
          const double down_s =
              link.transfer_seconds(k, round, 0, down.bytes() + wire.bytes(), down_chunks,
                                    prof.down_bytes_per_s, prof.latency_s);
          if (link.drops(k, round, attempt)) {
            o.dropped = true;
            continue;
          }
          auto r = [&]() -> Result<Outcome> {
            RETURN_IF_ERROR(st);
            ASSIGN_OR_RETURN(v1::Envelope plan_in, wire.receive());
            auto trainer = task.make_trainer(k);
            ASSIGN_OR_RETURN(auto report, trainer->train(round_global, plan_in.round_plan(), delta),
                             node + ": local training");
            trainer.reset();
            ASSIGN_OR_RETURN(std::vector<float> residual, store.take(k), node);
            if (secure) {
              // The client's side of secure aggregation: clip, quantize (unbiased), keep what
              // was left out; the masking happens once the round knows who survived.
              Outcome oc;
              Rng qrng = Rng(opts.seed).fork(5).fork(static_cast<uint64_t>(k)).fork(round);
              RETURN_IF_ERROR(
                  secagg::encode_update(encoding, sa_params, delta, residual, qrng, oc.quantized),
                  node);
              RETURN_IF_ERROR(store.put(k, std::move(residual)), node);
              oc.weight = static_cast<float>(report.num_samples);
              oc.loss = report.loss;
              const uint64_t masked =
                  secagg::packed_size(coords.length(numel), quantizer.bits) + 64;
              oc.chunks_up = (masked + chunk_bytes - 1) / chunk_bytes;
              const double compute_s =
                  static_cast<double>(task.local_steps(k, plan)) * prof.seconds_per_step;
              oc.seconds = down_s + compute_s +
                           link.transfer_seconds(k, round, 1, masked, oc.chunks_up,
                                                 prof.up_bytes_per_s, prof.latency_s);
              return oc;
            }
            ASSIGN_OR_RETURN(
                ClientCodec codec,
                ClientCodec::create(
                    plan.codec(), layout,
                    Rng(opts.seed).fork(3).fork(static_cast<uint64_t>(k)).fork(round).next_u64()),
                node);
            RETURN_IF_ERROR(codec.encode(delta, residual, encoded), node + ": encoding the update");
            RETURN_IF_ERROR(store.put(k, std::move(residual)), node);
            const std::string bytes = compress::UpdateStreamWriter(encoded).serialize();
            WireLoop up;
            v1::Envelope ue;
            auto* u = ue.mutable_update_upload();
            u->set_round(round);
            u->set_base_version(version);
            u->set_num_samples(report.num_samples);
            u->set_codec(plan.codec());
            u->set_train_loss(report.loss);
            Outcome oc;
            ASSIGN_OR_RETURN(oc.payload,
                             transfer(up, ue, bytes, round, chunk_bytes,
                                      edge_client::kUpdateStreamContentType, update_limit),
                             node + ": upload");
            oc.weight = static_cast<float>(report.num_samples);
            oc.loss = report.loss;
            oc.bytes_up = up.bytes();
            oc.chunks_up = (bytes.size() + chunk_bytes - 1) / chunk_bytes;
            const double compute_s =
                static_cast<double>(task.local_steps(k, plan)) * prof.seconds_per_step;
            oc.seconds = down_s + compute_s +
                         link.transfer_seconds(k, round, 1, oc.bytes_up, oc.chunks_up,
                                               prof.up_bytes_per_s, prof.latency_s);
            return oc;
          }();
          if (!r.ok()) {
            std::lock_guard lock(err_mu);
            if (first_error.ok()) first_error = r.status();
            next = pick;
            continue;
          }
          o = std::move(*r);
        }
      };
      std::vector<std::thread> pool;
      const int nw = std::min<int>(res.workers, static_cast<int>(pick));
      for (int w = 1; w < nw; ++w) pool.emplace_back(work);
      {
        // The calling thread works too; its OpenMP setting is restored for evaluation.
        const int threads = omp_get_max_threads();
        work();
        omp_set_num_threads(threads);
      }
      for (auto& t : pool) t.join();
      if (multi) {
        // Every rank learns where every outcome stands (an error on any rank ends them all,
        // named), so all of them take the same updates below.
        std::vector<OutcomeMeta> mine;
        for (size_t i = 0; i < pick; ++i) {
          if (ranks->owner(chosen[i]) != ranks->rank()) continue;
          const Outcome& o = out[i];
          mine.push_back(
              {i, o.dropped ? 1u : 0u, o.seconds, o.weight, o.loss, o.bytes_up, o.chunks_up});
        }
        auto all = exchange(*ranks, first_error, mine, "round " + std::to_string(round));
        if (!all.ok()) return all.status().with_context("round " + std::to_string(round));
        for (const auto& rank_items : *all) {
          for (const OutcomeMeta& m : rank_items) {
            if (m.index >= pick) return internal_error("outcome index out of range");
            Outcome& o = out[m.index];
            o.dropped = m.dropped != 0;
            o.seconds = m.seconds;
            o.weight = static_cast<float>(m.weight);
            o.loss = static_cast<float>(m.loss);
            o.bytes_up = m.bytes_up;
            o.chunks_up = m.chunks_up;
          }
        }
      }
      if (!first_error.ok()) return first_error.with_context("round " + std::to_string(round));

      // Which updates the round takes: the first `want` to arrive before the deadline.
      std::vector<size_t> order;
      uint64_t bytes_up = 0;
      int dropped = 0;
      for (size_t i = 0; i < pick; ++i) {
        bytes_up += out[i].bytes_up;
        if (out[i].dropped) {
          ++dropped;
        } else if (out[i].seconds <= deadline) {
          order.push_back(i);
        }
      }
      std::stable_sort(order.begin(), order.end(),
                       [&](size_t a, size_t b) { return out[a].seconds < out[b].seconds; });
      const uint64_t bytes_down = pick * down.bytes();
      const size_t taken = std::min(order.size(), want);
      rec.selected = static_cast<int>(pick);
      rec.dropped = dropped;
      rec.stragglers = static_cast<int>(pick) - dropped - static_cast<int>(taken);
      rec.bytes_up += bytes_up;
      rec.bytes_down += bytes_down;
      bytes_total += bytes_up + bytes_down;
      if (taken < std::max<uint32_t>(opts.min_updates, 1)) {
        sim_seconds += deadline;
        rec.sim_round_seconds += deadline;
        continue;  // the aggregator retries the round
      }
      // Closes at the want-th arrival; with fewer, at the deadline if someone is still out.
      double close = out[order[taken - 1]].seconds;
      if (taken < want && (dropped > 0 || order.size() < pick - static_cast<size_t>(dropped))) {
        close = deadline;
      }
      sim_seconds += close;
      rec.sim_round_seconds += close;
      std::vector<size_t> folded(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(taken));
      std::sort(folded.begin(), folded.end());  // fold in selection order: reproducible sums
      if (secure) {
        // Every selected client advertised and shared its keys at the start of the round; the
        // ones taken send masked vectors, the others (dropped, late) are unmasked around.
        std::vector<std::string> names(pick);
        std::vector<const std::vector<uint32_t>*> inputs(pick, nullptr);
        for (size_t i = 0; i < pick; ++i) names[i] = "client-" + std::to_string(chosen[i]);
        for (size_t i : folded) inputs[i] = &out[i].quantized;
        auto sa = run_secagg_round(cfg.secagg(), round, sa_params, names,
                                   [&](uint32_t i) { return inputs[i]; });
        if (!sa.ok() && sa.status().code() == StatusCode::kFailedPrecondition) {
          spdlog::warn("round {}: {}; retrying the round", round, sa.status().message());
          sim_seconds += deadline - close;
          rec.sim_round_seconds += deadline - close;
          continue;
        }
        if (!sa.ok()) return sa.status().with_context("round " + std::to_string(round));
        double weight = 0, loss_sum = 0;
        for (size_t i : folded) {
          weight += out[i].weight;
          loss_sum += static_cast<double>(out[i].loss) * out[i].weight;
          ++res.participation[static_cast<size_t>(chosen[i])];
          out[i].quantized = {};
        }
        rec.updates = sa->survivors;
        rec.rejected = 0;
        rec.examples = weight;
        rec.train_loss = loss_sum / weight;
        rec.bytes_up += sa->bytes_up;
        rec.bytes_down += sa->bytes_down;
        bytes_total += sa->bytes_up + sa->bytes_down;
        rec.secagg_dropped = sa->dropped;
        rec.secagg_degree = static_cast<int>(sa->degree);
        rec.secagg_threshold = static_cast<int>(sa->threshold);
        if (distributed_dp) {
          // The noise the round's survivors actually added (fewer survivors, less noise).
          const auto sens = secagg::rounded_sensitivity(cfg.secagg().dp_clip_norm(),
                                                        quantizer.scale(), coords.length(numel));
          accountant.compose(dp_rate, sens.l1, sens.l2, client_variance * sa->survivors);
          rec.dp_epsilon = accountant.spent(cfg.secagg().dp_delta()).epsilon;
        }
        // The mean over the updates summed; under distributed DP over the expected number,
        // q * available, as DP-FedAvg's fixed denominator (a round that drew few clients does
        // not divide the noise by few).
        const double denominator = distributed_dp ? dp_rate * static_cast<double>(available)
                                                  : static_cast<double>(sa->survivors);
        const auto inv = static_cast<float>(1.0 / denominator);
        secagg::scatter(coords, sa->sum, mean);
        for (size_t j = 0; j < numel; ++j) mean[j] *= inv;
        optimizer.apply(res.global, mean);
        ++version;
        break;
      }
      acc.reset();
      double loss_sum = 0;
      int rejected = 0;
      if (multi) {
        // Each rank folds the updates it trained, in selection order; rank 0 adds the partial
        // sums in rank order, takes the mean and steps; the new model goes to every rank.
        FoldShare share;
        std::vector<uint64_t> accepted;
        for (size_t i : folded) {
          if (ranks->owner(chosen[i]) != ranks->rank()) continue;
          const Status st = acc.fold_payload(out[i].payload, out[i].weight);
          out[i].payload.clear();
          if (!st.ok()) {
            ++share.rejected;
            continue;
          }
          share.loss_sum += static_cast<double>(out[i].loss) * out[i].weight;
          accepted.push_back(i);
        }
        share.weight = acc.total_weight();
        share.count = static_cast<uint64_t>(acc.count());
        const std::string where = "round " + std::to_string(round);
        ASSIGN_OR_RETURN(auto shares,
                         exchange(*ranks, Status(), std::vector<FoldShare>{share}, where));
        ASSIGN_OR_RETURN(auto kept, exchange(*ranks, Status(), accepted, where));
        FoldShare total;
        for (const auto& one : shares) {
          total.weight += one[0].weight;
          total.loss_sum += one[0].loss_sum;
          total.count += one[0].count;
          total.rejected += one[0].rejected;
        }
        for (const auto& one : kept) {
          for (uint64_t i : one) ++res.participation[static_cast<size_t>(chosen[i])];
        }
        if (total.count == 0) return data_loss(where + ": every update was rejected");
        RETURN_IF_ERROR(ranks->sum_to_root(acc.mutable_sum()), where);
        if (ranks->root()) {
          const auto w = static_cast<float>(total.weight);
          const auto sum = acc.sum();
          for (size_t j = 0; j < numel; ++j) mean[j] = sum[j] / w;
          optimizer.apply(res.global, mean);
        }
        RETURN_IF_ERROR(ranks->broadcast(res.global), where);
        rec.updates = static_cast<int>(total.count);
        rec.rejected = static_cast<int>(total.rejected);
        rec.examples = total.weight;
        rec.train_loss = total.loss_sum / total.weight;
        ++version;
        break;
      }
      for (size_t i : folded) {
        const Status st = acc.fold_payload(out[i].payload, out[i].weight);
        out[i].payload.clear();
        if (!st.ok()) {
          ++rejected;
          continue;
        }
        loss_sum += static_cast<double>(out[i].loss) * out[i].weight;
        ++res.participation[static_cast<size_t>(chosen[i])];
      }
      if (acc.count() == 0) {
        return data_loss("round " + std::to_string(round) + ": every update was rejected");
      }
      rec.updates = acc.count();
      rec.rejected = rejected;
      rec.examples = acc.total_weight();
      rec.train_loss = loss_sum / acc.total_weight();
      acc.mean_into(mean);
      optimizer.apply(res.global, mean);
      ++version;
      break;
    }
    rec.bytes_total = bytes_total;
    rec.sim_seconds = sim_seconds;
    const uint32_t every = cfg.eval().every_rounds();
    if (every > 0 && (round % every == 0 || round == opts.num_rounds)) {
      // Rank 0 evaluates; every rank hears the result (an accuracy target stops them all).
      std::vector<float> e(2);
      if (!multi || ranks->root()) {
        const TaskEval te = task.evaluate(res.global);
        e = {static_cast<float>(te.loss), static_cast<float>(te.accuracy)};
        rec.test_loss = te.loss;
        rec.test_accuracy = te.accuracy;
      }
      if (multi) {
        RETURN_IF_ERROR(ranks->broadcast(e), "round " + std::to_string(round) + ": evaluation");
        if (!ranks->root()) {
          rec.test_loss = e[0];
          rec.test_accuracy = e[1];
        }
      }
      rec.evaluated = true;
    }
    rec.real_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    res.rounds.push_back(rec);
    if (on_model) RETURN_IF_ERROR(on_model(round, res.global), "round " + std::to_string(round));
    if (on_round) on_round(rec);
    const float target = cfg.eval().target_accuracy();
    if (rec.evaluated && target > 0 && rec.test_accuracy >= target) break;
  }
  res.residuals = store.stats();
  res.real_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return res;
}

}  // namespace starling::sim
