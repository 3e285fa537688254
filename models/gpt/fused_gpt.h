// FusedGpt: the GPT of models/gpt/gpt.h trained llm.c-style over flat buffers: one fp32
// parameter buffer in nanoGPT order, one gradient buffer of the same layout, AdamW moments,
// activations sized once for (B, T). Its arithmetic goes through a FusedBackend (CPU or CUDA);
// a step enqueues forward, backward, clipping and AdamW and reads back only the loss and the
// gradient norm. Weights load from and export to models::Gpt's StateDict. Learned (wpe) or
// rotary positions (RoPE on q and k, no wpe). The same trunk serves the MDLM
// (models/mdlm/fused_engine.h): bidirectional or block-diffusion attention, positions that
// repeat with a period, a loss over the first V of V + 1 logits, and per-position weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/communicator.h"
#include "core/io/state_dict.h"
#include "core/ops/attention.h"
#include "core/tensor/tensor.h"
#include "models/gpt/fused_backend.h"
#include "models/gpt/fused_reducer.h"
#include "models/gpt/gpt.h"

namespace starling::models {

// One tensor of the flat buffers: its StateDict name and shape, where it starts (in floats) and
// whether AdamW decays it (matrices and embeddings, as optim::decay_matrices_only).
struct FusedParam {
  std::string name;
  Shape shape;
  size_t offset = 0;
  size_t numel = 0;
  bool decay = false;
};

// The flat layout of a GPT's parameters, in models::Gpt's state-dict order: wte, wpe (absent
// with config.rope), per layer ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, then
// ln_f (biases when config.bias). REQUIRES: config.validate() is ok.
std::vector<FusedParam> fused_gpt_layout(const GptConfig& config);

// Why the fused trainer cannot run `config` (dropout > 0, an invalid shape), or ok. Causal and
// bidirectional (config.causal = false) attention, learned and rotary positions are supported.
// `batch` and `time` are B and T of the activations (1 <= T <= block_size).
Status check_fused_gpt_config(const GptConfig& config, int64_t batch, int64_t time);
// The same for a trunk whose attention follows `mask` instead of config.causal: mask.check(T)
// must pass, and the positions (T, or mask.position_period(T) when it repeats them, as the
// block-diffusion layout [x_t | x_0] does) must fit in block_size.
Status check_fused_gpt_config(const GptConfig& config, int64_t batch, int64_t time,
                              const ops::AttnMask& mask);
// config.causal's mask: causal or full.
ops::AttnMask default_attn_mask(const GptConfig& config);

struct FusedOptimizer {
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double weight_decay = 0.1;  // applied to FusedParam::decay tensors only
};

struct FusedStepResult {
  double loss = 0.0;       // the batch's loss (FusedBatch), before the update
  double grad_norm = 0.0;  // global L2 norm before clipping
};

// One batch in host memory, B*T positions row-major. Without weights the loss is the mean
// cross-entropy over every position (the GPT) and every target must be in [0, loss_vocab). With
// weights it is sum_i weights[i] * CE_i over the positions whose target is >= 0; a negative
// target is ignored (no loss, no gradient): the MDLM's weighted NELBO.
struct FusedBatch {
  const int32_t* idx = nullptr;      // (B, T) inputs in [0, V)
  const int32_t* targets = nullptr;  // (B, T)
  const float* weights = nullptr;    // (B, T) or null
  size_t count = 0;                  // B*T
};

class FusedGpt {
 public:
  // Allocates parameters, gradients, AdamW moments and activations for batches of (B, T) on
  // `backend` and initializes the weights as models::Gpt(config, seed) does (same values).
  static Result<std::unique_ptr<FusedGpt>> make(const GptConfig& config, int64_t batch,
                                                int64_t time, uint64_t seed,
                                                std::unique_ptr<FusedBackend> backend);
  // The same with the attention under `mask` (checks: check_fused_gpt_config with the mask). Row
  // t of a sequence is at position t % mask.position_period(T) (t when the period is 0) for wpe
  // and RoPE alike, as models::Mdlm's trunk_forward.
  static Result<std::unique_ptr<FusedGpt>> make(const GptConfig& config, int64_t batch,
                                                int64_t time, uint64_t seed,
                                                std::unique_ptr<FusedBackend> backend,
                                                const ops::AttnMask& mask);
  ~FusedGpt();
  FusedGpt(const FusedGpt&) = delete;
  FusedGpt& operator=(const FusedGpt&) = delete;

  const GptConfig& config() const { return config_; }
  int64_t batch() const { return b_; }
  int64_t time() const { return t_; }
  const ops::AttnMask& attn_mask() const { return mask_; }
  // Positions per sequence: T, or the period when positions repeat.
  int64_t positions() const { return positions_; }
  const std::vector<FusedParam>& layout() const { return layout_; }
  size_t num_parameters() const { return num_params_; }
  FusedBackend& backend() { return *backend_; }
  // AdamW steps taken so far.
  int64_t steps() const { return steps_; }
  // The loss reads the first `v` of the tied head's V logits per position (1 <= v <= V; V by
  // default): llm.c's padded vocabulary, and the MDLM's SUBS, whose [MASK] logit (wte's last
  // row) is -inf. The gradient of the other columns is 0. Bad v: InvalidArgument.
  Status set_loss_vocab(int64_t v);
  int64_t loss_vocab() const { return loss_vocab_; }
  // bf16 mixed precision of the linear layers (FusedBackend::set_bf16_matmuls): their GEMMs
  // read bf16-rounded inputs and accumulate in fp32; master weights, AdamW, layer norms,
  // attention and the loss stay fp32. Reserves the backend's conversion buffer.
  Status set_bf16_matmuls(bool on);

  // Copies weights in (names and shapes must match models::Gpt's; nanoGPT's tied
  // "lm_head.weight" is ignored). A missing, unknown or misshapen tensor is InvalidArgument
  // naming it; then nothing is changed.
  Status load(const io::StateDict& sd);
  // The weights as a StateDict of host tensors in models::Gpt's order and names.
  io::StateDict state_dict();

  // idx, targets: (B, T) row-major token ids in [0, V) (host memory). Bad sizes or ids:
  // InvalidArgument naming the first bad position. Returns the mean loss (waits for it).
  Result<double> loss(const int32_t* idx, const int32_t* targets, size_t count);
  // The loss of a batch (FusedBatch: mean or weighted), forward only. The batch may hold fewer
  // rows than the engine was sized for (count = r * T, 1 <= r <= B): only those r rows run.
  Result<double> loss(const FusedBatch& batch);
  // One training step: forward, backward, global-norm clipping at grad_clip (0: none), AdamW
  // with learning rate lr. Only the loss and the norm come back to the host, at the end.
  Result<FusedStepResult> train_step(const int32_t* idx, const int32_t* targets, size_t count,
                                     double lr, const FusedOptimizer& opt, double grad_clip);
  Result<FusedStepResult> train_step(const FusedBatch& batch, double lr, const FusedOptimizer& opt,
                                     double grad_clip);
  // Forward and backward only (gradients stay in the gradient buffer); returns the loss.
  Result<double> forward_backward(const int32_t* idx, const int32_t* targets, size_t count);
  Result<double> forward_backward(const FusedBatch& batch);

  // Zeroes the AdamW moments and the step count: the next train_step starts a fresh optimizer
  // (a federated client's round).
  void reset_optimizer();

  // A training step's forward and backward as a graph (FusedBackend::begin_capture: CUDA
  // graphs), on by default where the backend can capture (STARLING_CUDA_GRAPHS=0 turns it off):
  // the second step of a batch shape is captured and every later step of that shape replays it,
  // so hundreds of launches become one. The embedding gradient (its grid follows the batch's
  // tokens), clipping and AdamW (their arguments change per step) stay outside. Off while
  // profiling or data parallel (the reducer's hooks run inside backward). A backend that cannot
  // capture, or a capture that fails, leaves the step eager; the reason is in graph_note() and
  // logged once.
  void set_graphs(bool on);
  bool graphs() const { return graphs_; }
  // "off", "on (not captured yet)", "on: captured a graph of the B x T step", or why not.
  const std::string& graph_note() const { return graph_note_; }

  // Data-parallel training over `comm` (collective: every rank's engine calls it, with the same
  // config and batch shape). Rank 0's parameters are broadcast to every rank; from then on
  // train_step averages the gradients over the ranks before clipping and AdamW (each transformer
  // block's range as soon as backward has finished it: on a worker thread while backward goes on
  // with `overlap`, else after backward; the embeddings and ln_f last) and reports the mean of the
  // ranks' losses. Each rank trains on its own rows: with the same number of (unweighted) tokens
  // per rank the step is the step on all ranks' rows together. `comm` reduces this engine's
  // backend memory (a comm::ThreadGroup for the CPU backend, NCCL for CUDA) and must outlive the
  // engine or the next set_data_parallel(nullptr). forward_backward and loss stay local.
  Status set_data_parallel(comm::Communicator* comm, bool overlap = true);

  // The flat parameter buffer in the backend's memory (num_parameters() floats).
  const float* parameter_buffer() const { return params_; }
  // Host copies for tests and tools.
  std::vector<float> parameters_host();
  std::vector<float> gradients_host();
  std::vector<float> logits_host();  // (r, T, V) of the last forward's r rows, all V columns

 private:
  FusedGpt(const GptConfig& config, int64_t b, int64_t t, const ops::AttnMask& mask,
           std::unique_ptr<FusedBackend> backend);
  Status allocate();
  // Copies a batch in; `fewer_rows` accepts r * T tokens for 1 <= r <= B (forward only), else
  // exactly B * T. Sets rows_ to the batch's rows.
  Status set_batch(const FusedBatch& batch, bool fewer_rows = false);
  void forward();
  // backward_layers: every gradient but the embeddings'; backward = it + embedding_backward.
  void backward();
  void backward_layers();
  void embedding_backward();
  // The forward and backward_layers of a training step as a graph: true when it ran that way
  // (replayed, or captured and replayed), false to run them eagerly.
  bool run_graph();
  // AdamW on every parameter: one backend call per run of tensors with the same decay flag.
  void adamw_step(double lr, const FusedOptimizer& opt);

  // nullptr for index -1 (an absent bias).
  float* param(int i) const { return i < 0 ? nullptr : params_ + layout_[i].offset; }
  float* grad(int i) const { return i < 0 ? nullptr : grads_ + layout_[i].offset; }

  GptConfig config_;
  int64_t b_, t_;
  int64_t rows_ = 0;  // rows of the batch set last (b_ for training; 1..b_ for loss)
  ops::AttnMask mask_;
  int64_t positions_;  // t_, or mask_'s position period
  std::unique_ptr<FusedBackend> backend_;
  std::vector<FusedParam> layout_;
  size_t num_params_ = 0;
  // Indices into layout_ of each block's tensors (-1: no bias), and of wte, wpe, ln_f.
  struct BlockIndex {
    int ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
  };
  std::vector<BlockIndex> blocks_;
  int wte_ = 0, wpe_ = 1, lnfw_ = -1, lnfb_ = -1;  // wpe_ = -1 with RoPE
  int64_t steps_ = 0;
  int64_t loss_vocab_ = 0;  // set to V by make()
  // Data parallel (set_data_parallel): the reducer, each block's [offset, offset + n) in the flat
  // buffer, and the ranges outside the blocks (wte, wpe; ln_f).
  std::unique_ptr<GradientReducer> reducer_;
  bool reducing_ = false;  // inside train_step's backward: hand finished blocks to reducer_
  std::vector<std::pair<size_t, size_t>> block_ranges_, other_ranges_;
  bool weighted_ = false;  // the current batch has weights (a_.weights)
  // Graphs (set_graphs): the captured step, the batch shape it was captured for, the shape the
  // last eager (warm-up) step ran.
  bool graphs_ = true;
  std::string graph_note_ = "on (not captured yet)";
  std::shared_ptr<void> graph_;
  int64_t graph_rows_ = -1, warm_rows_ = -1;
  bool graph_weighted_ = false;

  std::vector<void*> owned_;  // every backend allocation, freed in ~FusedGpt
  float* params_ = nullptr;
  float* grads_ = nullptr;
  float* m_ = nullptr;
  float* v_ = nullptr;

  struct Activations {
    int* idx = nullptr;        // (B, T)
    int* targets = nullptr;    // (B, T)
    float* weights = nullptr;  // (B, T), read when weighted_
    int* bucket_order = nullptr;
    int* bucket_starts = nullptr;
    int* bucket_tokens = nullptr;
    int num_unique = 0;
    std::vector<float*> residual;  // L + 1 of (B, T, C): x_0 (embeddings) .. x_L
    // att: the attention state the backward reads (FusedBackend::attention_state_floats).
    std::vector<float*> ln1, ln1_mean, ln1_rstd, qkv, atty, att, resid_mid, ln2, ln2_mean, ln2_rstd,
        fch, fch_gelu;
    float* tmp = nullptr;  // (B, T, C): attention / MLP projections before the residual add
    float* lnf = nullptr;
    float* lnf_mean = nullptr;
    float* lnf_rstd = nullptr;
    float* logits = nullptr;  // (B, T, V)
    float* losses = nullptr;  // (B, T)
    // Backward scratch.
    float* dlogits = nullptr;  // (B, T, V)
    float* dres = nullptr;     // (B, T, C): gradient of the residual stream
    float* dbtc = nullptr;     // (B, T, C)
    float* dbtc2 = nullptr;    // (B, T, C)
    float* dqkv = nullptr;     // (B, T, 3C)
    float* dfch = nullptr;     // (B, T, 4C)
    float* datt = nullptr;     // attention backward scratch (attention_scratch_floats)
    // RoPE: cos and sin of each position's angles, (positions, D/2) each (null without RoPE).
    float* rope_cos = nullptr;
    float* rope_sin = nullptr;
    // [norm_sq: double][loss: float], read back together.
    void* scalars = nullptr;
  } a_;
  // Host staging of the batch (kept until the next batch: copies may still read them).
  std::vector<int32_t> h_order_, h_starts_, h_tokens_, h_count_;
};

}  // namespace starling::models
