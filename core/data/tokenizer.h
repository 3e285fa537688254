// Tokenizer: the interface shared by the character-level and GPT-2 BPE tokenizers.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/status.h"

namespace starling::data {

// Maps text to token ids in [0, vocab_size()) and back. Implementations are immutable after
// construction (internal caches are synchronized), so one instance may be shared by threads.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Errors: InvalidArgument when the text cannot be represented (a character outside a char
  // vocabulary, invalid UTF-8 for BPE), naming the byte offset.
  virtual Result<std::vector<int32_t>> encode(std::string_view text) const = 0;
  // Errors: OutOfRange for an id outside [0, vocab_size()), naming its position.
  virtual Result<std::string> decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // A short stable name recorded in checkpoints: "char", "gpt2-bpe".
  virtual std::string name() const = 0;
};

}  // namespace starling::data
