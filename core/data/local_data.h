// A client's own data on its disk (`[data] path`), validated as untrusted input: every error
// names the file, and the line where there is one. Nothing here is ever uploaded.
#pragma once

#include <filesystem>
#include <string>

#include "core/data/char_tokenizer.h"
#include "core/data/mnist.h"
#include "core/util/status.h"

namespace starling::data {

// The text of `path`: a .txt file as it is, or a .jsonl file of one JSON object per line with
// a string field "text" (blank lines skipped), the texts joined with '\n'. DataLoss naming the
// file and line for a line that is not such an object; NotFound for a missing file;
// InvalidArgument for another extension or no text at all.
Result<std::string> read_local_text(const std::filesystem::path& path);

// read_local_text encoded with `tok` (the federation's vocabulary). InvalidArgument naming the
// file, line and character for the first character a char vocabulary lacks (the file and
// byte offset for BPE's invalid UTF-8), and for fewer than `min_tokens` tokens.
Result<std::vector<int32_t>> read_local_tokens(const std::filesystem::path& path,
                                               const Tokenizer& tok, int64_t min_tokens);

// The labelled images of a folder, in one of two layouts:
//   IDX:  train-images-idx3-ubyte and train-labels-idx1-ubyte, each gzip-compressed (.gz) or raw;
//   PNG:  one subfolder per label, 0 to 9, of .png files (any PNG colour type, read as 8-bit
//         gray; files in name order, labels in order).
// Images must be rows x cols (the model's input). Errors name the folder and the file.
Result<MnistSet> read_local_images(const std::filesystem::path& dir, int64_t rows, int64_t cols);

}  // namespace starling::data
