// train_gpt_fused: models::train_gpt's loop (same data, batches, schedule, clipping, evaluation,
// logs, metrics and checkpoints) over the FusedGpt engine on a CPU or CUDA backend. `starling
// train` runs it for train.engine = "fused" and for --device cuda.
#pragma once

#include <string>
#include <vector>

#include "core/util/status.h"
#include "core/wire/config.pb.h"
#include "models/gpt/fused_backend.h"
#include "models/gpt/trainer.h"

namespace starling::models {

struct FusedTrainOptions {
  bool cuda = false;  // false: the CPU backend
  int gpu = 0;        // the CUDA device when cuda (and gpus is empty)
  // Data parallel (FusedGpt::set_data_parallel): `ranks` replicas on the CPU backend (threads of
  // a comm::ThreadGroup), or with cuda one replica per GPU of `gpus` (NCCL) when it names more
  // than one. Each replica takes train.batch_size / ranks rows of every batch; one thread per
  // rank in this process. `overlap`: gradients averaged during backward.
  int ranks = 1;
  std::vector<int> gpus = {};
  bool overlap = true;
};

// Same outputs as train_gpt (<out_dir>/ckpt.safetensors, best.safetensors, metrics.jsonl,
// config.toml); `starling sample` and the federation read them as usual. Refuses (with the
// reason) what the fused engine does not support: non-GPT archs, dropout > 0, the SGD
// optimizer; and a CUDA request in a build or machine without it. Learned (wpe) and rotary
// (model.pos_encoding = "rope") positions both train.
// The engine for train_gpt (GptEngineFactory): the checks above, then a FusedGpt on the chosen
// backend.
GptEngineFactory fused_engine_factory(const FusedTrainOptions& options);

// train.attention for a fused backend (FusedBackend::set_attention).
FusedBackend::Attention fused_attention(const v1::TrainConfig& tc);

Result<TrainSummary> train_gpt_fused(const v1::RunConfig& config, const std::string& config_source,
                                     const FusedTrainOptions& options);

}  // namespace starling::models
