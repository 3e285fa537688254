// Training steps as graphs (FusedGpt::set_graphs) checked on the CPU: a backend that records
// the calls made between begin_capture and end_capture instead of running them, each with its
// arguments as they were (pointers and scalars, as a CUDA graph keeps its kernels' arguments),
// and replays them on replay. Steps replayed from such a recording must equal eager steps bit
// for bit: anything that changes from step to step outside the engine's fixed buffers (a batch's
// token buckets, the learning rate, the step count) would be replayed stale and show here.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <vector>

#include "core/util/rng.h"
#include "models/gpt/fused_backend.h"
#include "models/gpt/fused_gpt.h"

namespace starling::models {
namespace {

// The CPU backend behind a recorder: every enqueued operation is run, or recorded while
// capturing. Queries and memory management pass straight through.
class RecordingBackend final : public FusedBackend {
 public:
  RecordingBackend() : inner_(make_fused_cpu_backend()) {}
  std::string name() const override { return "recording cpu"; }

  Status begin_capture() override {
    if (recording_) return failed_precondition("capture already on");
    recording_ = std::make_shared<std::vector<std::function<void()>>>();
    return ok_status();
  }
  Result<std::shared_ptr<void>> end_capture() override {
    if (!recording_) return failed_precondition("no capture on");
    ++captures;
    auto graph = std::move(recording_);
    recording_.reset();
    return std::shared_ptr<void>(graph);
  }
  void replay(const std::shared_ptr<void>& graph) override {
    ++replays;
    for (const auto& op : *static_cast<std::vector<std::function<void()>>*>(graph.get())) op();
  }

  Result<void*> alloc(size_t nbytes) override {
    CHECK_FALSE(recording_);  // a capture allocates nothing
    return inner_->alloc(nbytes);
  }
  void free(void* p) override { inner_->free(p); }
  void copy_to_backend(void* dst, const void* src, size_t n) override {
    CHECK_FALSE(recording_);  // host data would be read at capture time only
    inner_->copy_to_backend(dst, src, n);
  }
  void copy_to_host(void* dst, const void* src, size_t n) override {
    CHECK_FALSE(recording_);  // a wait inside a capture
    inner_->copy_to_host(dst, src, n);
  }
  void synchronize() override {
    CHECK_FALSE(recording_);
    inner_->synchronize();
  }
  Status set_bf16_matmuls(bool on, size_t scratch) override {
    bf16_matmuls_ = on;
    return inner_->set_bf16_matmuls(on, scratch);
  }
  size_t attention_state_floats(int b, int t, int c, int h) const override {
    return inner_->attention_state_floats(b, t, c, h);
  }
  size_t attention_scratch_floats(int b, int t, int c, int h) const override {
    return inner_->attention_scratch_floats(b, t, c, h);
  }
  size_t bytes_in_use() const override { return inner_->bytes_in_use(); }
  size_t peak_bytes() const override { return inner_->peak_bytes(); }

  // Enqueued operations: arguments captured by value, as a graph's kernel nodes keep them.
  void zero(void* p, size_t n) override {
    run([=, this] { inner_->zero(p, n); });
  }
  void encoder_forward(float* out, const int* idx, const float* wte, const float* wpe, int b, int t,
                       int c) override {
    run([=, this] { inner_->encoder_forward(out, idx, wte, wpe, b, t, c); });
  }
  void encoder_backward(float* dwte, float* dwpe, const float* dout, const EncoderBuckets& bk,
                        int b, int t, int c) override {
    run([=, this] { inner_->encoder_backward(dwte, dwpe, dout, bk, b, t, c); });
  }
  void layer_norm_forward(float* out, float* mean, float* rstd, const float* x, const float* w,
                          const float* bias, int n, int c) override {
    run([=, this] { inner_->layer_norm_forward(out, mean, rstd, x, w, bias, n, c); });
  }
  void layer_norm_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                           const float* w, const float* mean, const float* rstd, int n,
                           int c) override {
    run([=, this] { inner_->layer_norm_backward(dx, dw, db, dout, x, w, mean, rstd, n, c); });
  }
  void linear_forward(float* out, const float* x, const float* w, const float* bias, int n, int in,
                      int o) override {
    run([=, this] { inner_->linear_forward(out, x, w, bias, n, in, o); });
  }
  void linear_backward(float* dx, float* dw, float* db, const float* dout, const float* x,
                       const float* w, int n, int in, int o) override {
    run([=, this] { inner_->linear_backward(dx, dw, db, dout, x, w, n, in, o); });
  }
  void attention_forward(float* out, float* att, const float* qkv, int b, int t, int c, int h,
                         const ops::AttnMask& mask) override {
    run([=, this] { inner_->attention_forward(out, att, qkv, b, t, c, h, mask); });
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                          const float* out, const float* att, int b, int t, int c, int h,
                          const ops::AttnMask& mask) override {
    run([=, this] {
      inner_->attention_backward(dqkv, scratch, dout, qkv, out, att, b, t, c, h, mask);
    });
  }
  void rope(float* qkv, const float* cos, const float* sin, int n, int c, int h, int period,
            bool inverse) override {
    run([=, this] { inner_->rope(qkv, cos, sin, n, c, h, period, inverse); });
  }
  void gelu_forward(float* out, const float* x, size_t n) override {
    run([=, this] { inner_->gelu_forward(out, x, n); });
  }
  void gelu_backward(float* dx, const float* dout, const float* x, size_t n) override {
    run([=, this] { inner_->gelu_backward(dx, dout, x, n); });
  }
  void residual_add(float* out, const float* a, const float* b, size_t n) override {
    run([=, this] { inner_->residual_add(out, a, b, n); });
  }
  void cross_entropy_forward(float* losses, float* loss, const float* logits, const int* targets,
                             const float* weights, int n, int v, int vp) override {
    run([=, this] {
      inner_->cross_entropy_forward(losses, loss, logits, targets, weights, n, v, vp);
    });
  }
  void cross_entropy_backward(float* dlogits, const float* logits, const int* targets,
                              const float* weights, int n, int v, int vp) override {
    run([=, this] { inner_->cross_entropy_backward(dlogits, logits, targets, weights, n, v, vp); });
  }
  void adamw(float* p, const float* g, float* m, float* v, size_t n, const FusedAdamW& s) override {
    run([=, this] { inner_->adamw(p, g, m, v, n, s); });
  }
  void sum_squares(double* out, const float* x, size_t n) override {
    run([=, this] { inner_->sum_squares(out, x, n); });
  }
  void clip_scale(float* x, size_t n, const double* norm_sq, double max_norm) override {
    run([=, this] { inner_->clip_scale(x, n, norm_sq, max_norm); });
  }
  void subtract(float* out, const float* a, const float* b, size_t n) override {
    run([=, this] { inner_->subtract(out, a, b, n); });
  }

  int captures = 0, replays = 0;

 private:
  void run(std::function<void()> op) {
    if (recording_) {
      recording_->push_back(std::move(op));
    } else {
      op();
    }
  }

  std::unique_ptr<FusedBackend> inner_;
  std::shared_ptr<std::vector<std::function<void()>>> recording_;
};

GptConfig tiny(bool rope) {
  GptConfig c;
  c.vocab_size = 11;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.rope = rope;
  return c;
}

std::vector<int32_t> tokens(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> out(n);
  for (auto& x : out) x = static_cast<int32_t>(rng.below(11));
  return out;
}

TEST_CASE("training steps replayed as a graph equal eager steps bit for bit", "[models][fused]") {
  const bool rope = GENERATE(false, true);
  INFO("rope " << rope);
  const GptConfig c = tiny(rope);
  const int64_t b = 3, t = 8;
  auto rec = std::make_unique<RecordingBackend>();
  RecordingBackend* recorder = rec.get();
  auto graphed = FusedGpt::make(c, b, t, 5, std::move(rec));
  auto eager = FusedGpt::make(c, b, t, 5, make_fused_cpu_backend());
  REQUIRE(graphed.ok());
  REQUIRE(eager.ok());
  (*eager)->set_graphs(false);
  CHECK((*eager)->graph_note() == "off");
  const FusedOptimizer opt{0.9, 0.95, 1e-8, 0.1};
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    // A new batch (new tokens: other token buckets for the embedding gradient) and a new
    // learning rate every step, clipping that scales.
    const auto x = tokens(static_cast<size_t>(b * t), 100 + step);
    const auto y = tokens(static_cast<size_t>(b * t), 200 + step);
    const double lr = 1e-2 / (1 + step);
    auto rg = (*graphed)->train_step(x.data(), y.data(), x.size(), lr, opt, 0.5);
    auto re = (*eager)->train_step(x.data(), y.data(), x.size(), lr, opt, 0.5);
    REQUIRE(rg.ok());
    REQUIRE(re.ok());
    CHECK(rg->loss == re->loss);
    CHECK(rg->grad_norm == re->grad_norm);
    CHECK((*graphed)->parameters_host() == (*eager)->parameters_host());
  }
  // Step 0 eager (warm-up), step 1 captured and replayed, steps 2..5 replayed.
  CHECK(recorder->captures == 1);
  CHECK(recorder->replays == 5);
  CHECK_THAT((*graphed)->graph_note(), Catch::Contains("captured"));
  // forward_backward and loss stay eager and agree with the graphed engine's state.
  const auto x = tokens(static_cast<size_t>(b * t), 7);
  auto lg = (*graphed)->loss(x.data(), x.data(), x.size());
  auto le = (*eager)->loss(x.data(), x.data(), x.size());
  REQUIRE(lg.ok());
  REQUIRE(le.ok());
  CHECK(*lg == *le);
  CHECK(recorder->replays == 5);
}

TEST_CASE("a backend that cannot capture leaves the steps eager and says why", "[models][fused]") {
  auto m = FusedGpt::make(tiny(false), 2, 8, 5, make_fused_cpu_backend());
  REQUIRE(m.ok());
  CHECK((*m)->graphs());
  const FusedOptimizer opt{0.9, 0.95, 1e-8, 0.0};
  for (int step = 0; step < 3; ++step) {
    const auto x = tokens(16, 50 + step);
    REQUIRE((*m)->train_step(x.data(), x.data(), x.size(), 1e-3, opt, 0.0).ok());
  }
  CHECK_FALSE((*m)->graphs());
  CHECK_THAT((*m)->graph_note(), Catch::Contains("cannot capture"));
}

}  // namespace
}  // namespace starling::models
