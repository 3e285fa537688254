// StateDict: the ordered (name, tensor) list that checkpoints save and load. Kept in its own
// header so that nn code can name the type without pulling in file I/O.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor/tensor.h"

namespace starling::io {

// Names are unique within one StateDict; order is significant (it is the file order).
using StateDict = std::vector<std::pair<std::string, Tensor>>;

}  // namespace starling::io
