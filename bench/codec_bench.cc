// codec_bench: per codec, the compression ratio on a GPT-2-124M-shaped delta and CPU encode and
// decode_add throughput (GB/s of fp32 input, one thread), beside numpy and PyTorch doing the same
// transform in the same run (bench/codec_peer.py, run through --python; see codec_bench.sh).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/rng.h"

namespace {

using starling::Rng;
using starling::Shape;
using starling::compress::Layout;
using starling::compress::TensorInfo;

// GPT-2 small (124,439,808 parameters) in Hugging Face naming; --scale shrinks the vocabulary,
// the positions and the number of layers together.
Layout gpt2_layout(double scale) {
  auto scaled = [&](int64_t v) { return std::max<int64_t>(1, std::llround(v * scale)); };
  const int64_t c = 768, vocab = scaled(50257), ctx = scaled(1024), layers = scaled(12);
  std::vector<std::pair<std::string, Shape>> tensors = {{"wte.weight", {vocab, c}},
                                                        {"wpe.weight", {ctx, c}}};
  for (int64_t l = 0; l < layers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    tensors.push_back({h + "ln_1.weight", {c}});
    tensors.push_back({h + "ln_1.bias", {c}});
    tensors.push_back({h + "attn.c_attn.weight", {c, 3 * c}});
    tensors.push_back({h + "attn.c_attn.bias", {3 * c}});
    tensors.push_back({h + "attn.c_proj.weight", {c, c}});
    tensors.push_back({h + "attn.c_proj.bias", {c}});
    tensors.push_back({h + "ln_2.weight", {c}});
    tensors.push_back({h + "ln_2.bias", {c}});
    tensors.push_back({h + "mlp.c_fc.weight", {c, 4 * c}});
    tensors.push_back({h + "mlp.c_fc.bias", {4 * c}});
    tensors.push_back({h + "mlp.c_proj.weight", {4 * c, c}});
    tensors.push_back({h + "mlp.c_proj.bias", {c}});
  }
  tensors.push_back({"ln_f.weight", {c}});
  tensors.push_back({"ln_f.bias", {c}});
  Layout layout;
  int64_t offset = 0;
  for (auto& [name, shape] : tensors) {
    layout.push_back(TensorInfo{name, shape, offset});
    offset += starling::shape_numel(shape);
  }
  return layout;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct PeerRow {
  double enc = 0, dec = 0;
};

// Runs the peer script; its lines are "<spec> <lib> <encode GB/s> <decode_add GB/s>".
std::map<std::pair<std::string, std::string>, PeerRow> run_peer(
    const std::string& python, const std::string& script, const Layout& layout,
    const std::vector<std::string>& specs, int reps) {
  std::map<std::pair<std::string, std::string>, PeerRow> rows;
  const std::string layout_path = "/tmp/codec_bench_layout." + std::to_string(::getpid()) + ".txt";
  {
    std::ofstream f(layout_path);
    for (const auto& t : layout) {
      f << t.name;
      for (int64_t d : t.shape) f << ' ' << d;
      f << '\n';
    }
  }
  std::string joined;
  for (const auto& s : specs) joined += (joined.empty() ? "" : ";") + s;
  const std::string cmd = python + " " + script + " --layout " + layout_path + " --reps " +
                          std::to_string(reps) + " --codecs '" + joined + "'";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) {
    std::fprintf(stderr, "codec_bench: could not run %s\n", cmd.c_str());
    return rows;
  }
  char line[512];
  while (std::fgets(line, sizeof line, pipe.get()) != nullptr) {
    std::istringstream in(line);
    std::string spec, lib;
    PeerRow r;
    if (in >> spec >> lib >> r.enc >> r.dec) rows[{spec, lib}] = r;
  }
  std::remove(layout_path.c_str());
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Codec throughput on a GPT-2-124M-shaped delta, beside numpy and PyTorch"};
  double scale = 1.0;
  int reps = 3;
  std::string python, peer = "bench/codec_peer.py";
  std::vector<std::string> specs = {"identity",
                                    "fp16",
                                    "bf16",
                                    "int8:block=256",
                                    "qsgd:levels=8,bucket=512",
                                    "topk:ratio=0.01",
                                    "topk:ratio=0.01,approx=1",
                                    "topk:ratio=0.01,values=int8",
                                    "randk:ratio=0.01",
                                    "powersgd:rank=4",
                                    "sign"};
  app.add_option("--scale", scale, "fraction of GPT-2 124M (vocabulary, positions, layers)")
      ->check(CLI::Range(1e-4, 1.0));
  app.add_option("--reps", reps, "repetitions; the best time is reported")
      ->check(CLI::Range(1, 100));
  app.add_option("--python", python, "python with numpy and torch; empty: no peer columns");
  app.add_option("--peer", peer, "the peer script");
  app.add_option("--codecs", specs, "codec specs")->delimiter(';');
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    const Layout layout = gpt2_layout(scale);
    const int64_t n = layout.back().offset + starling::shape_numel(layout.back().shape);
    const double gb = 4.0 * static_cast<double>(n) / 1e9;
    std::printf("delta: %lld floats (%.1f MB), %zu tensors, best of %d, one thread\n",
                static_cast<long long>(n), gb * 1e3, layout.size(), reps);
    std::vector<float> delta(static_cast<size_t>(n)), dst(static_cast<size_t>(n), 0.0f);
    Rng rng(1234);
    for (auto& v : delta) v = static_cast<float>(rng.normal() * 1e-3);

    struct Row {
      std::string spec;
      double ratio = 0, enc = 0, dec = 0;
    };
    std::vector<Row> rows;
    for (const auto& spec : specs) {
      auto codec = starling::compress::make_codec(spec, layout, 7);
      if (!codec.ok()) {
        std::fprintf(stderr, "codec_bench: %s\n", codec.status().to_string().c_str());
        return 1;
      }
      Row row{spec};
      double best_enc = 1e30, best_dec = 1e30;
      // A sender keeps its EncodedUpdate between rounds (encode_into reuses its arrays); the
      // peers allocate per call, as numpy and torch code does.
      starling::compress::EncodedUpdate enc;
      for (int r = 0; r < reps; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        const starling::Status es = (*codec)->encode_into(delta, enc);
        best_enc = std::min(best_enc, seconds_since(t0));
        if (!es.ok()) {
          std::fprintf(stderr, "codec_bench: %s\n", es.to_string().c_str());
          return 1;
        }
        t0 = std::chrono::steady_clock::now();
        const starling::Status s = starling::compress::decode_add(enc, dst, 0.5f);
        best_dec = std::min(best_dec, seconds_since(t0));
        if (!s.ok()) {
          std::fprintf(stderr, "codec_bench: %s\n", s.to_string().c_str());
          return 1;
        }
        if (r == 0) {
          row.ratio = 4.0 * static_cast<double>(n) /
                      static_cast<double>(starling::compress::serialize_update(enc).size());
        }
      }
      row.enc = gb / best_enc;
      row.dec = gb / best_dec;
      rows.push_back(row);
      std::fprintf(stderr, "  %-30s done\n", spec.c_str());
    }

    std::map<std::pair<std::string, std::string>, PeerRow> peer_rows;
    if (!python.empty()) peer_rows = run_peer(python, peer, layout, specs, reps);

    std::printf("\n%-30s %8s | %8s %8s | %8s %8s %6s %6s | %8s %8s %6s %6s\n", "codec", "ratio",
                "enc", "dec_add", "np enc", "np dec", "x enc", "x dec", "pt enc", "pt dec", "x enc",
                "x dec");
    auto peer_cols = [&](const Row& row, const char* lib) {
      const auto it = peer_rows.find({row.spec, lib});
      if (it == peer_rows.end()) {
        std::printf(" | %8s %8s %6s %6s", "-", "-", "-", "-");
        return;
      }
      const PeerRow& p = it->second;
      std::printf(" | %8.2f %8.2f %6.2f %6.2f", p.enc, p.dec, row.enc / p.enc, row.dec / p.dec);
    };
    for (const auto& row : rows) {
      std::printf("%-30s %8.1f | %8.2f %8.2f", row.spec.c_str(), row.ratio, row.enc, row.dec);
      peer_cols(row, "numpy");
      peer_cols(row, "torch");
      std::printf("\n");
    }
    std::printf(
        "\nGB/s of fp32 input (4 bytes x numel / best time); ratio = fp32 bytes / serialized "
        "bytes; x = starling / peer.\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "codec_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
