// GptTrainer's local steps over the fused engine, on the CPU backend or a GPU.
#include "edge_client/fused_gpt_trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>

#include "edge_client/local_steps.h"
#include "edge_client/model_params.h"
#include "models/gpt/fused_backend.h"

namespace starling::edge_client {
namespace {}  // namespace

compress::Layout layout_of_fused(const models::GptConfig& config) {
  compress::Layout layout;
  for (const auto& p : models::fused_gpt_layout(config)) {
    layout.push_back({p.name, p.shape, static_cast<int64_t>(p.offset)});
  }
  return layout;
}

Result<std::unique_ptr<models::FusedBackend>> make_fused_backend(const FusedDevice& device,
                                                                 int rank) {
  if (!device.cuda) return models::make_fused_cpu_backend();
  return models::make_fused_cuda_backend(device.gpu(rank));
}

std::string fused_device_name(const FusedDevice& device, const models::FusedBackend& backend) {
  const int ranks = device.ranks();
  if (!device.cuda) {
    return ranks == 1 ? "fused CPU engine"
                      : "fused CPU engine, data parallel over " + std::to_string(ranks) + " ranks";
  }
  std::string ids;
  for (int r = 0; r < ranks; ++r) ids += (r ? "," : "") + std::to_string(device.gpu(r));
  return "cuda:" + ids + " (" + backend.name() + ", fused engine" +
         (ranks > 1 ? ", data parallel over " + std::to_string(ranks) + " GPUs" : "") + ")";
}

Result<std::unique_ptr<FusedGptTrainer>> FusedGptTrainer::create(
    std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin, int64_t end,
    GptTrainerOptions options, FusedDevice device) {
  if (options.optimizer != LocalStepOptions::Optimizer::kAdamW) {
    return failed_precondition(
        "key 'model.local_optimizer' must be \"ADAMW\" for a GPT trained by the fused engine "
        "(client.device \"cuda\"): the engine's optimizer is AdamW");
  }
  if (options.prox_mu > 0) {
    return failed_precondition(
        "key 'local.prox_mu' must be 0 for a GPT trained by the fused engine (client.device "
        "\"cuda\"): FedProx's term is applied by the SGD trainer only");
  }
  if (options.lora.enabled()) {
    return unimplemented(
        "[lora] is not supported by the fused engine (client.device \"cuda\") yet: LoRA "
        "clients train with the autograd engine on the CPU (client.device \"cpu\")");
  }
  if (options.context > 0 && options.context != options.model.block_size) {
    return unimplemented(
        "the fused engine (client.device \"cuda\") trains on windows of the "
        "model's whole position table; set model.block_size to the base's");
  }
  RETURN_IF_ERROR(models::check_fused_gpt_config(options.model, 1, options.model.block_size),
                  "fused GPT trainer");
  // The fused layout is models::Gpt's state-dict order and names: the federation's layout.
  compress::Layout layout = layout_of_fused(options.model);
  auto trainer = std::unique_ptr<FusedGptTrainer>(new FusedGptTrainer(
      std::move(tokens), begin, end, std::move(options), device, std::move(layout)));
  // Fail here, not in the first round, when a GPU is not there or several cannot be joined.
  const int ranks = device.ranks();
  if (device.cuda && ranks > 1) {
    RETURN_IF_ERROR(models::FusedReplicas::check_gpus(device.gpus), "key 'client.gpus'");
  }
  for (int r = 0; r < ranks; ++r) {
    ASSIGN_OR_RETURN(auto backend, make_fused_backend(device, r));
    trainer->backends_.push_back(std::move(backend));
  }
  trainer->where_ = fused_device_name(device, *trainer->backends_[0]);
  return trainer;
}

FusedGptTrainer::FusedGptTrainer(std::shared_ptr<const std::vector<int32_t>> tokens, int64_t begin,
                                 int64_t end, GptTrainerOptions options, FusedDevice device,
                                 compress::Layout layout)
    : tokens_(std::move(tokens)),
      begin_(begin),
      end_(end),
      options_(std::move(options)),
      device_(device),
      layout_(std::move(layout)) {}

Status FusedGptTrainer::ensure_engine(int64_t batch) {
  const int ranks = device_.ranks();
  if (ranks == 1 && engine_ && engine_->batch() == batch) return ok_status();
  if (ranks > 1 && replicas_ && replicas_->rows_per_rank() * ranks == batch) return ok_status();
  if (batch % ranks != 0) {
    return invalid_argument("a round's batch of " + std::to_string(batch) +
                            " rows does not split over the " + std::to_string(ranks) +
                            (device_.cuda ? " GPUs of key 'client.gpus'" : " data-parallel ranks") +
                            ": local.batch_size must be a multiple of " + std::to_string(ranks));
  }
  // The old buffers go before the new ones are allocated.
  engine_.reset();
  replicas_.reset();
  // Seed 0: the weights are overwritten by every round's global model.
  const auto replica = [this, batch, ranks](int r) -> Result<std::unique_ptr<models::FusedGpt>> {
    std::unique_ptr<models::FusedBackend> backend;
    if (static_cast<size_t>(r) < backends_.size() && backends_[static_cast<size_t>(r)]) {
      backend = std::move(backends_[static_cast<size_t>(r)]);
    } else {
      ASSIGN_OR_RETURN(backend, make_fused_backend(device_, r));
    }
    return models::FusedGpt::make(options_.model, batch / ranks, options_.model.block_size, 0,
                                  std::move(backend));
  };
  if (ranks == 1) {
    ASSIGN_OR_RETURN(engine_, replica(0));
    return ok_status();
  }
  // Each rank's OpenMP threads: the CPU's share (a GPU rank's thread only enqueues work).
  const int threads = device_.cuda ? 1 : std::max(1, omp_get_max_threads() / ranks);
  ASSIGN_OR_RETURN(replicas_, models::FusedReplicas::make(
                                  ranks, replica, device_.cuda ? device_.gpus : std::vector<int>{},
                                  /*overlap=*/true, threads, std::chrono::minutes(5)));
  return ok_status();
}

Status FusedGptTrainer::run_steps(std::span<const float> global, const v1::RoundPlan& plan,
                                  int64_t steps, double* loss_sum) {
  const int64_t T = options_.model.block_size, B = plan.batch_size();
  const io::StateDict sd = layout_tensors(layout_, global);
  // Fresh moments every round, as GptTrainer's AdamW.
  if (replicas_) {
    const auto load = [&](int r) -> Status {
      RETURN_IF_ERROR(replicas_->replica(r).load(sd));
      replicas_->replica(r).reset_optimizer();
      return ok_status();
    };
    RETURN_IF_ERROR(replicas_->on_ranks(load));
  } else {
    RETURN_IF_ERROR(engine_->load(sd));
    engine_->reset_optimizer();
  }
  const models::FusedOptimizer opt{options_.beta1, options_.beta2, 1e-8, options_.weight_decay};
  const int64_t n = end_ - begin_;
  const int32_t* tok = tokens_->data() + begin_;
  std::vector<int32_t> x, y;
  Rng rng(plan.seed());  // the same stream, so the same windows, as GptTrainer
  for (int64_t step = 0; step < steps; ++step) {
    draw_windows(rng, tok, n, B, T, x, &y);
    ASSIGN_OR_RETURN(const auto r,
                     replicas_
                         ? replicas_->train_step(x.data(), y.data(), x.size(), plan.learning_rate(),
                                                 opt, options_.grad_clip)
                         : engine_->train_step(x.data(), y.data(), x.size(), plan.learning_rate(),
                                               opt, options_.grad_clip));
    RETURN_IF_ERROR(check_step_loss(step, r.loss));
    *loss_sum += r.loss;
  }
  return ok_status();
}

Result<TrainReport> FusedGptTrainer::train(std::span<const float> global, const v1::RoundPlan& plan,
                                           std::span<float> delta) {
  const int64_t T = options_.model.block_size;
  const int64_t n = end_ - begin_;
  RETURN_IF_ERROR(check_text_round(begin_, end_, tokens_->size(), T, plan));
  // An empty delta: the update stays on the device for make_encoder's encoder.
  const bool on_device = delta.empty();
  if (on_device && !codec_backend_) {
    return failed_precondition("fused GPT trainer: an empty delta needs make_encoder() first");
  }
  if (!on_device && delta.size() != global.size()) {
    return invalid_argument("delta and global sizes differ");
  }
  const auto numel = static_cast<size_t>(layout_numel());
  if (global.size() != numel) {
    return invalid_argument("fused GPT trainer: a global model of " +
                            std::to_string(global.size()) + " values for a layout of " +
                            std::to_string(numel));
  }
  const int64_t steps = gpt_local_steps(n, T, options_.epochs, plan);
  if (steps <= 0) return invalid_argument("a round of " + std::to_string(steps) + " local steps");
  RETURN_IF_ERROR(ensure_engine(plan.batch_size()));
  device_delta_ready_ = false;
  double loss_sum = 0.0;
  Status st = run_steps(global, plan, steps, &loss_sum);
  if (!st.ok()) {
    // A failed collective leaves the replicas' group broken: the next round makes new ones.
    replicas_.reset();
    return st.with_context("fused GPT trainer");
  }
  models::FusedGpt& rank0 = replicas_ ? replicas_->replica(0) : *engine_;
  if (on_device) {
    // delta = trained - global where the weights are (rank 0's device), for the encoder.
    rank0.backend().synchronize();
    codec_backend_->copy_to_backend(global_dev_, global.data(), numel * sizeof(float));
    codec_backend_->subtract(delta_dev_, rank0.parameter_buffer(), global_dev_, numel);
    codec_backend_->synchronize();
    device_delta_ready_ = true;
  } else {
    const std::vector<float> local = rank0.parameters_host();
    for (size_t i = 0; i < numel; ++i) delta[i] = local[i] - global[i];
  }
  return TrainReport{static_cast<uint64_t>(n), static_cast<float>(loss_sum / steps)};
}

int64_t FusedGptTrainer::layout_numel() const {
  // The layout is fused_gpt_layout's, which tiles the buffer by construction.
  const auto n = compress::validate_layout(layout_);
  return n.ok() ? *n : 0;
}

namespace {

// The encoder of FusedGptTrainer::make_encoder: the backend's codec over the trainer's device
// delta.
class FusedEncoder final : public UpdateEncoder {
 public:
  FusedEncoder(std::unique_ptr<models::FusedUpdateCodec> codec, const float* delta,
               const bool* ready)
      : codec_(std::move(codec)), delta_(delta), ready_(ready) {}
  Status encode_into(compress::EncodedUpdate& out) override {
    if (!*ready_) {
      return failed_precondition(
          "fused GPT trainer: no update to encode (train() with an empty delta first)");
    }
    return codec_->encode_into(delta_, out);
  }
  std::vector<float> persistent_state() override { return codec_->persistent_state(); }
  Status restore_state(std::span<const float> state) override {
    return codec_->restore_state(state);
  }

 private:
  std::unique_ptr<models::FusedUpdateCodec> codec_;
  const float* delta_;
  const bool* ready_;
};

}  // namespace

Result<std::unique_ptr<UpdateEncoder>> FusedGptTrainer::make_encoder(const std::string& spec,
                                                                     uint64_t seed) {
  if (!codec_backend_) {
    // On rank 0's device, beside its engine (another stream on a GPU): the delta, the global
    // model it is taken from and the codecs' state live there across rounds.
    ASSIGN_OR_RETURN(codec_backend_, make_fused_backend(device_, 0), "fused GPT trainer");
    const size_t bytes = static_cast<size_t>(layout_numel()) * sizeof(float);
    ASSIGN_OR_RETURN(void* g, codec_backend_->alloc(bytes), "fused GPT trainer: the global model");
    global_dev_ = static_cast<float*>(g);
    ASSIGN_OR_RETURN(void* d, codec_backend_->alloc(bytes), "fused GPT trainer: the update");
    delta_dev_ = static_cast<float*>(d);
  }
  ASSIGN_OR_RETURN(auto codec, codec_backend_->make_update_codec(spec, layout_, seed),
                   "codec '" + spec + "'");
  return std::unique_ptr<UpdateEncoder>(
      std::make_unique<FusedEncoder>(std::move(codec), delta_dev_, &device_delta_ready_));
}

FusedGptTrainer::~FusedGptTrainer() {
  if (codec_backend_) {
    codec_backend_->free(global_dev_);
    codec_backend_->free(delta_dev_);
  }
}

}  // namespace starling::edge_client
