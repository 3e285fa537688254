// The compiled catalog: hashes equal shared/data/SHA256SUMS, every data_dir name is downloadable,
// URL overrides, the SHA256SUMS parser and SHA-256 itself.
#include "core/fetch/catalog.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "core/data/data_dir.h"
#include "core/fetch/download.h"
#include "core/fetch/sha256.h"

namespace fs = std::filesystem;
using starling::StatusCode;
using starling::fetch::CatalogFile;

TEST_CASE("fetch: the compiled hash table equals shared/data/SHA256SUMS", "[fetch]") {
  const fs::path sums = fs::path(STARLING_SOURCE_DIR) / ".." / "shared" / "data" / "SHA256SUMS";
  if (!fs::exists(sums)) {
    WARN("skipped: " << sums.string() << " is absent");
    return;
  }
  std::ifstream f(sums, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  auto parsed = starling::fetch::parse_sha256sums(text);
  REQUIRE(parsed.ok());
  // shared/data holds the datasets; the pretrained models are fetched on request only.
  starling::fetch::HashTable datasets_only;
  for (const auto& d : starling::fetch::datasets()) {
    if (d.pretrained_model) continue;
    for (const auto& file : d.files) {
      datasets_only.emplace(std::string(file.relative_path),
                            starling::fetch::compiled_sha256().at(std::string(file.relative_path)));
    }
  }
  CHECK(*parsed == datasets_only);
}

TEST_CASE("fetch: GPT-2 124M is pinned to a Hugging Face revision, and its tokenizer is GPT-2's",
          "[fetch]") {
  const auto* model = starling::fetch::find_pretrained_model("gpt2-124m");
  REQUIRE(model != nullptr);
  CHECK(starling::fetch::find_pretrained_model("gpt2") == nullptr);  // the tokenizer, not a model
  CHECK(starling::fetch::find_pretrained_model("mnist") == nullptr);
  std::set<std::string> files;
  for (const auto& f : model->files) {
    files.insert(std::string(f.relative_path));
    // A commit-pinned URL: a moved branch cannot change what the hash was taken of.
    CHECK_THAT(std::string(f.url),
               Catch::Contains("/resolve/607a30d783dfa663caf39e06633721c8d4cfcd7e/"));
  }
  CHECK(files == std::set<std::string>{"gpt2-124m/config.json", "gpt2-124m/model.safetensors",
                                       "gpt2-124m/vocab.json", "gpt2-124m/merges.txt"});
  const auto& sums = starling::fetch::compiled_sha256();
  CHECK(sums.at("gpt2-124m/vocab.json") == sums.at("gpt2/encoder.json"));
  CHECK(sums.at("gpt2-124m/merges.txt") == sums.at("gpt2/vocab.bpe"));
}

TEST_CASE("fetch: every catalog file has a hash and every hash a catalog file", "[fetch]") {
  std::set<std::string> paths, names;
  for (const auto& d : starling::fetch::datasets()) {
    CHECK(names.insert(std::string(d.name)).second);
    REQUIRE_FALSE(d.files.empty());
    for (const auto& file : d.files) {
      CHECK(paths.insert(std::string(file.relative_path)).second);
      CHECK(starling::fetch::compiled_sha256().count(file.relative_path) == 1);
      CHECK(std::string_view(file.url).starts_with("https://"));
    }
  }
  CHECK(paths.size() == starling::fetch::compiled_sha256().size());
  CHECK(names == std::set<std::string>{"tinyshakespeare", "mnist", "fashion-mnist", "wikitext-2",
                                       "ptb", "gpt2", "gpt2-124m"});
}

TEST_CASE("fetch: every data_dir dataset name selects the file data_dir resolves", "[fetch]") {
  const fs::path dir =
      fs::temp_directory_path() / ("starling_fetch_catalog_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  for (const auto& [path, hash] : starling::fetch::compiled_sha256()) {
    fs::create_directories((dir / path).parent_path());
    std::ofstream(dir / path) << "x";
  }
  for (const auto name : starling::data::known_dataset_names()) {
    INFO(name);
    auto files = starling::fetch::select_files(name);
    REQUIRE(files.ok());
    REQUIRE(files->size() >= 1);
    auto resolved = starling::data::resolve_dataset_file(dir, name);
    REQUIRE(resolved.ok());
    // A group name (tinyshakespeare) and a file name may coincide; the file is in the selection.
    bool found = false;
    for (const auto& f : *files) found = found || dir / f.relative_path == *resolved;
    CHECK(found);
  }
  fs::remove_all(dir);

  auto bad = starling::fetch::select_files("cifar-10");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("fashion-mnist"));
  CHECK(starling::fetch::select_files("mnist")->size() == 4);
  CHECK(starling::fetch::select_files("mnist-test-labels")->size() == 1);
}

TEST_CASE("fetch: URL overrides: catalog, one file, or a mirror base", "[fetch]") {
  auto mnist = starling::fetch::select_files("mnist");
  REQUIRE(mnist.ok());

  auto upstream = starling::fetch::resolve_urls(*mnist, "");
  REQUIRE(upstream.ok());
  CHECK((*upstream)[0] == (*mnist)[0].url);

  auto mirror = starling::fetch::resolve_urls(*mnist, "http://127.0.0.1:9/d/");
  REQUIRE(mirror.ok());
  CHECK((*mirror)[2] == "http://127.0.0.1:9/d/mnist/t10k-images-idx3-ubyte.gz");

  auto one = starling::fetch::resolve_urls(*starling::fetch::select_files("tinyshakespeare"),
                                           "http://127.0.0.1:9/x.txt");
  REQUIRE(one.ok());
  CHECK(*one == std::vector<std::string>{"http://127.0.0.1:9/x.txt"});

  auto ambiguous = starling::fetch::resolve_urls(*mnist, "http://127.0.0.1:9/x.gz");
  REQUIRE_FALSE(ambiguous.ok());
  CHECK(ambiguous.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("fetch: parse_sha256sums accepts sha256sum output and rejects anything else", "[fetch]") {
  const std::string h(64, 'a');
  auto ok = starling::fetch::parse_sha256sums(h + "  a/b.txt\r\n\n" + h + " *c\n");
  REQUIRE(ok.ok());
  CHECK(ok->size() == 2);
  CHECK(ok->at("a/b.txt") == h);
  CHECK(ok->at("c") == h);

  const std::string bad = GENERATE(std::string("zz  a\n"), std::string(64, 'A') + "  a\n",
                                   std::string(64, 'a') + "\ta\n", std::string(64, 'a') + "  \n",
                                   std::string(64, 'a') + "  a\n" + std::string(64, 'b') + "  a\n");
  auto r = starling::fetch::parse_sha256sums(bad);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
}

TEST_CASE("fetch: SHA-256 known answers", "[fetch]") {
  CHECK(starling::fetch::sha256_hex("") ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(starling::fetch::sha256_hex("abc") ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  starling::fetch::Sha256 h;
  h.update("a");
  h.update("bc");
  CHECK(h.final_hex() == starling::fetch::sha256_hex("abc"));
}
