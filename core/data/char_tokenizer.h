// CharTokenizer: one token per distinct byte of a corpus, ids in sorted byte order
// (nanoGPT's shakespeare_char: Tiny Shakespeare gives 65 symbols, '\n' = 0, ' ' = 1).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/data/tokenizer.h"

namespace starling::data {

class CharTokenizer final : public Tokenizer {
 public:
  // Vocabulary = the sorted distinct bytes of `corpus`. Errors: InvalidArgument if empty.
  static Result<CharTokenizer> from_corpus(std::string_view corpus);
  // Rebuilds from vocab() of another instance. Errors: InvalidArgument if `vocab` is empty or
  // not strictly increasing bytes.
  static Result<CharTokenizer> from_vocab(std::string_view vocab);

  // The sorted symbols, one byte each; id i is vocab()[i]. This is what checkpoints store.
  // NOTE: it is valid UTF-8 only when the corpus is ASCII.
  const std::string& vocab() const { return vocab_; }

  Result<std::vector<int32_t>> encode(std::string_view text) const override;
  // `text` without the bytes outside the vocabulary; adds their number to *dropped. For text fed
  // to a pretrained model whose vocabulary came from another corpus.
  std::string keep_known(std::string_view text, int64_t* dropped) const;
  Result<std::string> decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }
  std::string name() const override { return "char"; }

 private:
  explicit CharTokenizer(std::string vocab);

  std::string vocab_;
  std::array<int32_t, 256> id_of_byte_{};  // -1 for bytes not in the vocabulary
};

}  // namespace starling::data
