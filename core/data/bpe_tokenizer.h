// BpeTokenizer: OpenAI GPT-2's byte-level BPE (encoder.json + vocab.bpe), matching the reference
// encoder.py id for id: the same pre-tokenizer regex, byte-to-unicode map and rank-ordered merges.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "core/data/tokenizer.h"

namespace starling::data {

class BpeTokenizer final : public Tokenizer {
 public:
  // Loads the vocabulary (a JSON object token -> id, ids dense from 0) and the merge list
  // ("#version" header, then one "left right" pair per line, best rank first).
  // Errors: NotFound for a missing file; DataLoss for malformed content, naming the file (and the
  // line for vocab.bpe).
  static Result<BpeTokenizer> load(const std::filesystem::path& encoder_json,
                                   const std::filesystem::path& vocab_bpe);
  // load() on <data_dir>/gpt2/encoder.json and <data_dir>/gpt2/vocab.bpe.
  static Result<BpeTokenizer> load_gpt2(const std::filesystem::path& data_dir);
  // load() on the files' text (Hugging Face names them vocab.json and merges.txt); the names
  // stand for the files in errors.
  static Result<BpeTokenizer> from_text(std::string encoder_json, std::string merges,
                                        std::string_view encoder_name,
                                        std::string_view merges_name);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer() override;

  // Any valid UTF-8 text; decode(encode(s)) == s. Special tokens in the text are encoded as plain
  // text. Thread-safe (a mutex guards the per-word cache).
  // Errors: InvalidArgument for invalid UTF-8, naming the byte offset.
  Result<std::vector<int32_t>> encode(std::string_view text) const override;
  Result<std::string> decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override;
  std::string name() const override { return "gpt2-bpe"; }

  // Id of "<|endoftext|>" (50256 for GPT-2), or -1 when the vocabulary has none.
  int32_t eot_id() const;
  // The two files' text as loaded (what a checkpoint embeds to carry a tokenizer of its own).
  const std::string& encoder_json() const;
  const std::string& merges() const;

 private:
  struct State;
  explicit BpeTokenizer(std::unique_ptr<State> state);

  std::unique_ptr<State> state_;
};

}  // namespace starling::data
