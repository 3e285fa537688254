// `starling import hf DIR` and `starling export hf CHECKPOINT`: Hugging Face GPT-2 checkpoints
// to and from starling's.
#include "models/gpt/hf.h"

#include <spdlog/spdlog.h>

#include <cstdio>
#include <memory>

#include "apps/starling/commands.h"
#include "core/data/data_dir.h"
#include "models/gpt/checkpoint.h"

namespace starling::apps {

void register_hf(CLI::App& app, CommandContext& ctx) {
  auto* import_cmd = app.add_subcommand("import", "Read a pretrained model into starling");
  import_cmd->require_subcommand(1);
  auto* ihf = import_cmd->add_subcommand(
      "hf",
      "A Hugging Face GPT-2 directory (config.json, model.safetensors, vocab.json + "
      "merges.txt) -> a starling GPT checkpoint (for sample, eval, train and federations)");
  struct ImportOpts {
    std::string dir;
    std::string out;
    std::string data_dir;
  };
  auto io = std::make_shared<ImportOpts>();
  ihf->add_option("dir", io->dir, "The Hugging Face model directory")->required();
  ihf->add_option("-o,--out", io->out, "The checkpoint to write (.safetensors)")->required();
  ihf->add_option("--data-dir", io->data_dir,
                  "Data directory, for GPT-2's tokenizer when DIR has none (default: found as "
                  "for training)");
  ihf->callback([&ctx, io]() {
    auto data_dir = data::resolve_data_dir(io->data_dir);
    auto pre = models::load_pretrained_gpt("hf:" + io->dir,
                                           data_dir.ok() ? *data_dir : std::filesystem::path());
    if (!pre.ok()) return fail(ctx, pre.status().message());
    v1::RunConfig rc;
    *rc.mutable_model() = pre->model;
    rc.mutable_data()->set_tokenizer(v1::DataConfig::GPT2);
    rc.mutable_data()->set_data_dir(io->data_dir);
    rc.mutable_sample()->set_prompt("\n");
    const Status st =
        models::save_gpt_checkpoint(io->out, *pre->gpt, rc, *pre->tokenizer, {0, 0.0, 0.0});
    if (!st.ok()) return fail(ctx, st.message());
    std::printf("imported %s -> %s\n", pre->describe.c_str(), io->out.c_str());
  });

  auto* export_cmd = app.add_subcommand("export", "Write a starling model in another format");
  export_cmd->require_subcommand(1);
  auto* ehf = export_cmd->add_subcommand(
      "hf",
      "A starling GPT checkpoint -> a Hugging Face GPT-2 directory that transformers loads "
      "with GPT2LMHeadModel.from_pretrained (LoRA adapters are already merged in "
      "checkpoints)");
  struct ExportOpts {
    std::string checkpoint;
    std::string out;
    std::string data_dir;
  };
  auto eo = std::make_shared<ExportOpts>();
  ehf->add_option("checkpoint", eo->checkpoint, "The starling GPT checkpoint")->required();
  ehf->add_option("-o,--out", eo->out, "The directory to write")->required();
  ehf->add_option("--data-dir", eo->data_dir,
                  "Data directory, for a checkpoint whose tokenizer lives there");
  ehf->callback([&ctx, eo]() {
    auto loaded = models::load_gpt_checkpoint(eo->checkpoint, eo->data_dir);
    if (!loaded.ok()) return fail(ctx, loaded.status().message());
    const Status st = models::save_hf_gpt2(eo->out, *loaded->model, loaded->tokenizer.get());
    if (!st.ok()) return fail(ctx, st.message());
    const auto& g = loaded->model->config();
    std::printf("exported %s -> %s (GPT-2 L=%lld H=%lld C=%lld T=%lld V=%lld%s)\n",
                eo->checkpoint.c_str(), eo->out.c_str(), static_cast<long long>(g.n_layer),
                static_cast<long long>(g.n_head), static_cast<long long>(g.n_embd),
                static_cast<long long>(g.block_size), static_cast<long long>(g.vocab_size),
                loaded->tokenizer->name() == "gpt2-bpe" ? ", with its tokenizer"
                                                        : ", no tokenizer (char vocabulary)");
  });
}

}  // namespace starling::apps
