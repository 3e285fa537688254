// The fused GPT engine under train_gpt's loop. Evaluation runs the fused forward on batches of
// the training shape; checkpoints go through a host models::Gpt loaded from the fused weights,
// so their format is train_gpt's.
#include "models/gpt/fused_trainer.h"

#include <omp.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "core/comm/run_ranks.h"
#include "core/comm/thread_group.h"
#include "models/gpt/fused_gpt.h"
#if defined(STARLING_HAVE_NCCL)
#include "core/comm/nccl/nccl_communicator.h"
#endif

namespace starling::models {

namespace {

// One FusedGpt of `rows` rows on the CPU backend or GPU `gpu`, with train.attention and
// train.precision applied.
Result<std::unique_ptr<FusedGpt>> make_engine(const GptConfig& gc, const v1::TrainConfig& tc,
                                              int64_t rows, bool cuda, int gpu) {
  std::unique_ptr<FusedBackend> backend;
  if (cuda) {
    ASSIGN_OR_RETURN(backend, make_fused_cuda_backend(gpu));
  } else {
    backend = make_fused_cpu_backend();
  }
  backend->set_attention(fused_attention(tc));
  ASSIGN_OR_RETURN(auto model,
                   FusedGpt::make(gc, rows, gc.block_size, tc.seed(), std::move(backend)));
  RETURN_IF_ERROR(model->set_bf16_matmuls(tc.precision() == v1::TrainConfig::BF16));
  return model;
}

class FusedEngine final : public GptEngine {
 public:
  FusedEngine(std::unique_ptr<FusedGpt> model, const GptConfig& gc, const v1::TrainConfig& tc)
      : model_(std::move(model)),
        where_(model_->backend().name()),
        opt_{tc.beta1(), tc.beta2(), 1e-8, tc.weight_decay()},
        host_(gc, tc.seed()) {}

  std::string describe() const override {
    return std::string("fused engine (") + (model_->backend().bf16_matmuls() ? "bf16" : "fp32") +
           " linear layers) on " + where_ + " (" +
           std::to_string((model_->backend().bytes_in_use() + 500'000) / 1'000'000) +
           " MB of buffers)";
  }
  int64_t num_parameters() const override { return static_cast<int64_t>(model_->num_parameters()); }
  Result<Step> step(const data::Batch& batch, double lr, double grad_clip) override {
    ASSIGN_OR_RETURN(FusedStepResult r,
                     model_->train_step(batch.x.data<int32_t>(), batch.y.data<int32_t>(),
                                        static_cast<size_t>(batch.x.numel()), lr, opt_, grad_clip));
    return Step{r.loss, r.grad_norm};
  }
  Result<double> eval_loss(const data::Batch& batch) override {
    return model_->loss(batch.x.data<int32_t>(), batch.y.data<int32_t>(),
                        static_cast<size_t>(batch.x.numel()));
  }
  Result<const Gpt*> host_model() override {
    RETURN_IF_ERROR(host_.load(model_->state_dict()), "fused GPT weights");
    return &host_;
  }
  std::string metrics_fields() const override {
    return ",\"engine\":\"fused\",\"device\":\"" + where_ + "\",\"precision\":\"" +
           (model_->backend().bf16_matmuls() ? "bf16" : "fp32") + "\"";
  }

 private:
  std::unique_ptr<FusedGpt> model_;
  std::string where_;
  FusedOptimizer opt_;
  Gpt host_;  // checkpoints are written from it
};

// N replicas of the fused engine, one per rank (FusedTrainOptions: CPU threads or GPUs), under
// train_gpt's loop: a step splits the loop's batch into N slices of B/N rows and runs the
// replicas' train_step on N threads at once (one thread per rank: a GPU needs no more, and the
// ranks share the host's data sampler, logs and checkpoints without another process);
// set_data_parallel averages their gradients, so the step is the step on the whole batch.
// Evaluation splits the batch the same way (no collectives); rank 0's weights are checkpointed.
class FusedRanksEngine final : public GptEngine {
 public:
  static Result<std::unique_ptr<GptEngine>> make(const GptConfig& gc, const v1::TrainConfig& tc,
                                                 const FusedTrainOptions& o) {
    const bool cuda = o.cuda;
    const int n = cuda ? static_cast<int>(o.gpus.size()) : o.ranks;
    if (tc.batch_size() % n != 0) {
      return invalid_argument("train.batch_size " + std::to_string(tc.batch_size()) +
                              " is not a multiple of the " + std::to_string(n) +
                              " data-parallel ranks (each takes batch_size / ranks rows)");
    }
    auto e = std::unique_ptr<FusedRanksEngine>(new FusedRanksEngine(gc, tc, n, o.gpus));
    // A generous collective timeout: rank 0 evaluates and checkpoints between steps.
    e->group_ = std::make_unique<comm::ThreadGroup>(n, std::chrono::minutes(10));
    for (int r = 0; r < n; ++r) {
      e->boot_.push_back(e->group_->communicator(r));
      ASSIGN_OR_RETURN(
          auto model,
          make_engine(gc, tc, tc.batch_size() / n, cuda, cuda ? o.gpus[static_cast<size_t>(r)] : 0),
          "rank " + std::to_string(r));
      e->replicas_.push_back(std::move(model));
    }
    e->comms_.resize(static_cast<size_t>(n));
    // Collective: the NCCL join (one rank per GPU, the unique id through the ThreadGroup) and
    // the broadcast of rank 0's weights.
    const auto join = [&e, cuda, overlap = o.overlap](int r) -> Status {
      comm::Communicator* c = e->boot_[static_cast<size_t>(r)].get();
      if (cuda) {
#if defined(STARLING_HAVE_NCCL)
        ASSIGN_OR_RETURN(e->comms_[static_cast<size_t>(r)],
                         comm::NcclCommunicator::create(*c, e->gpus_[static_cast<size_t>(r)]));
        c = e->comms_[static_cast<size_t>(r)].get();
#else
        return unimplemented("several GPUs need NCCL, which this build was made without");
#endif
      }
      return e->replicas_[static_cast<size_t>(r)]->set_data_parallel(c, overlap);
    };
    RETURN_IF_ERROR(e->on_ranks(join));
    return std::unique_ptr<GptEngine>(std::move(e));
  }

  std::string describe() const override {
    FusedGpt& m = *replicas_[0];
    std::string where = gpus_.empty() ? "CPU threads" : "GPUs";
    for (size_t i = 0; i < gpus_.size(); ++i) where += (i ? "," : " ") + std::to_string(gpus_[i]);
    return "fused engine (" + std::string(m.backend().bf16_matmuls() ? "bf16" : "fp32") +
           " linear layers), data parallel: " + std::to_string(n_) + " ranks on " + where + " x " +
           std::to_string(rows_) + " rows, gradients averaged during backward";
  }
  int64_t num_parameters() const override {
    return static_cast<int64_t>(replicas_[0]->num_parameters());
  }
  Result<Step> step(const data::Batch& batch, double lr, double grad_clip) override {
    std::vector<FusedStepResult> out(static_cast<size_t>(n_));
    const size_t slice = static_cast<size_t>(rows_) * static_cast<size_t>(t_);
    RETURN_IF_ERROR(on_ranks([&](int r) -> Status {
      const size_t at = static_cast<size_t>(r) * slice;
      ASSIGN_OR_RETURN(out[static_cast<size_t>(r)],
                       replicas_[static_cast<size_t>(r)]->train_step(batch.x.data<int32_t>() + at,
                                                                     batch.y.data<int32_t>() + at,
                                                                     slice, lr, opt_, grad_clip));
      return ok_status();
    }));
    // Every rank reports the ranks' mean loss and the norm of the averaged gradient.
    return Step{out[0].loss, out[0].grad_norm};
  }
  Result<double> eval_loss(const data::Batch& batch) override {
    const int64_t rows = batch.x.numel() / t_;
    if (rows % n_ != 0) {
      return invalid_argument("an evaluation batch of " + std::to_string(rows) +
                              " rows does not split over " + std::to_string(n_) + " ranks");
    }
    const size_t slice = static_cast<size_t>(rows / n_) * static_cast<size_t>(t_);
    std::vector<double> losses(static_cast<size_t>(n_));
    RETURN_IF_ERROR(on_ranks([&](int r) -> Status {
      const size_t at = static_cast<size_t>(r) * slice;
      ASSIGN_OR_RETURN(losses[static_cast<size_t>(r)],
                       replicas_[static_cast<size_t>(r)]->loss(
                           batch.x.data<int32_t>() + at, batch.y.data<int32_t>() + at, slice));
      return ok_status();
    }));
    double sum = 0.0;
    for (double l : losses) sum += l;  // equal slices: the mean of the means
    return sum / static_cast<double>(n_);
  }
  Result<const Gpt*> host_model() override {
    RETURN_IF_ERROR(host_.load(replicas_[0]->state_dict()), "fused GPT weights (rank 0)");
    return &host_;
  }
  std::string metrics_fields() const override {
    return ",\"engine\":\"fused\",\"ranks\":" + std::to_string(n_) + ",\"device\":\"" +
           (gpus_.empty() ? std::string("cpu") : std::string("cuda")) + "\"";
  }

 private:
  FusedRanksEngine(const GptConfig& gc, const v1::TrainConfig& tc, int n, std::vector<int> gpus)
      : n_(n),
        rows_(tc.batch_size() / n),
        t_(gc.block_size),
        gpus_(std::move(gpus)),
        opt_{tc.beta1(), tc.beta2(), 1e-8, tc.weight_decay()},
        host_(gc, tc.seed()),
        threads_per_rank_(
            std::max(1, (tc.threads() > 0 ? tc.threads() : omp_get_max_threads()) / n)) {}

  // fn(r) on one thread per rank; the first error aborts the group (a rank waiting in a
  // collective fails at once instead of at its timeout) and is returned.
  Status on_ranks(const std::function<Status(int)>& fn) {
    std::vector<Status> st(static_cast<size_t>(n_));
    std::vector<std::thread> threads;
    for (int r = 0; r < n_; ++r) {
      threads.emplace_back([&, r] {
        omp_set_num_threads(threads_per_rank_);
        if (r < static_cast<int>(replicas_.size()))
          replicas_[static_cast<size_t>(r)]->backend().bind_thread();
        st[static_cast<size_t>(r)] = fn(r);
        if (!st[static_cast<size_t>(r)].ok()) {
          group_->abort(
              Status(st[static_cast<size_t>(r)].code(),
                     "rank " + std::to_string(r) + ": " + st[static_cast<size_t>(r)].message()));
        }
      });
    }
    for (auto& t : threads) t.join();
    return comm::first_error(st);
  }

  int n_;
  int64_t rows_, t_;
  std::vector<int> gpus_;
  FusedOptimizer opt_;
  Gpt host_;
  int threads_per_rank_;
  std::unique_ptr<comm::ThreadGroup> group_;
  std::vector<std::unique_ptr<comm::Communicator>> boot_;   // ThreadGroup handles
  std::vector<std::unique_ptr<comm::Communicator>> comms_;  // NCCL (GPUs), else empty
  // Last: destroyed first, while the communicators they hold still exist.
  std::vector<std::unique_ptr<FusedGpt>> replicas_;
};

}  // namespace

FusedBackend::Attention fused_attention(const v1::TrainConfig& tc) {
  switch (tc.attention()) {
    case v1::TrainConfig::MATERIALIZED:
      return FusedBackend::Attention::kMaterialized;
    case v1::TrainConfig::FLASH_BF16:
      return FusedBackend::Attention::kFlashBf16;
    case v1::TrainConfig::FLASH:
      break;
  }
  return FusedBackend::Attention::kFlash;
}

GptEngineFactory fused_engine_factory(const FusedTrainOptions& options) {
  return [options](const GptConfig& gc,
                   const v1::RunConfig& cfg) -> Result<std::unique_ptr<GptEngine>> {
    const auto& tc = cfg.train();
    if (tc.optimizer() != v1::TrainConfig::ADAMW) {
      return unimplemented("the fused engine supports train.optimizer = \"adamw\" only");
    }
    RETURN_IF_ERROR(check_fused_gpt_config(gc, tc.batch_size(), gc.block_size));
    if (options.ranks < 1) return invalid_argument("data-parallel ranks must be at least 1");
    if ((options.cuda && options.gpus.size() > 1) || (!options.cuda && options.ranks > 1)) {
      return FusedRanksEngine::make(gc, tc, options);
    }
    ASSIGN_OR_RETURN(auto model, make_engine(gc, tc, tc.batch_size(), options.cuda,
                                             options.gpus.empty() ? options.gpu : options.gpus[0]));
    return std::unique_ptr<GptEngine>(std::make_unique<FusedEngine>(std::move(model), gc, tc));
  };
}

Result<TrainSummary> train_gpt_fused(const v1::RunConfig& cfg, const std::string& config_source,
                                     const FusedTrainOptions& options) {
  if (cfg.model().arch() != v1::ModelConfig::GPT) {
    return unimplemented(config_source +
                         ": the fused engine (train.engine = \"fused\", --device cuda) trains "
                         "model.arch = \"gpt\" only");
  }
  return train_gpt(cfg, config_source, fused_engine_factory(options));
}

}  // namespace starling::models
