// A minimal PNG encoder (8-bit grayscale or RGB, one zlib-compressed IDAT) and the sample-grid
// writer of the image diffusion model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "core/tensor/tensor.h"
#include "core/util/status.h"

namespace starling::models {

// PNG bytes of a width x height image; pixels row-major, `channels` (1 gray, 3 RGB) bytes per
// pixel. InvalidArgument for other channel counts, empty sizes or a pixel count mismatch.
Result<std::vector<uint8_t>> encode_png(std::span<const uint8_t> pixels, int64_t width,
                                        int64_t height, int64_t channels);

// Tiles images (N, C, H, W) f32 with values in [-1, 1] (C = 1 or 3; clamped) into a grid of
// `cols` columns with `pad` black pixels between tiles, mapping [-1, 1] to [0, 255].
// REQUIRES: N >= 1, cols >= 1.
Result<std::vector<uint8_t>> image_grid_png(const Tensor& images, int64_t cols, int64_t pad = 2);

// image_grid_png written atomically to `path`; errors name the file.
Status write_image_grid(const std::filesystem::path& path, const Tensor& images, int64_t cols,
                        int64_t pad = 2);

}  // namespace starling::models
