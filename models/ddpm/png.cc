// PNG: signature, IHDR, IDAT (filter byte 0 before each row, zlib-compressed), IEND; each chunk
// with its big-endian length and CRC-32 (zlib's crc32 is the PNG CRC).
#include "models/ddpm/png.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/io/file.h"

namespace starling::models {

namespace {

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

void put_chunk(std::vector<uint8_t>& out, const char type[4], std::span<const uint8_t> data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc = crc32(0L, out.data() + start, static_cast<uInt>(out.size() - start));
  put_u32(out, static_cast<uint32_t>(crc));
}

}  // namespace

Result<std::vector<uint8_t>> encode_png(std::span<const uint8_t> pixels, int64_t width,
                                        int64_t height, int64_t channels) {
  if (channels != 1 && channels != 3) {
    return invalid_argument("png: " + std::to_string(channels) +
                            " channels (1 gray or 3 RGB supported)");
  }
  if (width <= 0 || height <= 0 || width > (1 << 24) || height > (1 << 24)) {
    return invalid_argument("png: bad size " + std::to_string(width) + "x" +
                            std::to_string(height));
  }
  const auto row = static_cast<size_t>(width * channels);
  if (pixels.size() != row * static_cast<size_t>(height)) {
    return invalid_argument("png: " + std::to_string(pixels.size()) + " bytes for a " +
                            std::to_string(width) + "x" + std::to_string(height) + "x" +
                            std::to_string(channels) + " image");
  }
  std::vector<uint8_t> raw;
  raw.reserve((row + 1) * static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) {
    raw.push_back(0);  // filter: none
    const auto* r = pixels.data() + static_cast<size_t>(y) * row;
    raw.insert(raw.end(), r, r + row);
  }
  uLongf zlen = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> z(zlen);
  if (compress2(z.data(), &zlen, raw.data(), static_cast<uLong>(raw.size()), 9) != Z_OK) {
    return internal_error("png: zlib compression failed");
  }
  z.resize(zlen);
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, static_cast<uint32_t>(width));
  put_u32(ihdr, static_cast<uint32_t>(height));
  ihdr.push_back(8);                      // bit depth
  ihdr.push_back(channels == 1 ? 0 : 2);  // color type: gray / RGB
  ihdr.insert(ihdr.end(), {0, 0, 0});     // compression, filter, interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", z);
  put_chunk(out, "IEND", {});
  return out;
}

Result<std::vector<uint8_t>> image_grid_png(const Tensor& images, int64_t cols, int64_t pad) {
  if (images.dim() != 4 || images.size(0) < 1) {
    return invalid_argument("image grid: images must be (N, C, H, W) with N >= 1, got " +
                            shape_str(images.shape()));
  }
  if (cols < 1 || pad < 0) return invalid_argument("image grid: cols must be >= 1, pad >= 0");
  const int64_t n = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  cols = std::min(cols, n);
  const int64_t rows = (n + cols - 1) / cols;
  const int64_t gw = cols * w + (cols + 1) * pad, gh = rows * h + (rows + 1) * pad;
  std::vector<uint8_t> px(static_cast<size_t>(gw * gh * c), 0);
  const std::vector<float> v = images.to_float_vector();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t oy = pad + (i / cols) * (h + pad), ox = pad + (i % cols) * (w + pad);
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t y = 0; y < h; ++y) {
        for (int64_t x = 0; x < w; ++x) {
          const float f =
              std::clamp(v[static_cast<size_t>(((i * c + ch) * h + y) * w + x)], -1.0f, 1.0f);
          px[static_cast<size_t>(((oy + y) * gw + ox + x) * c + ch)] =
              static_cast<uint8_t>(std::lround((f + 1.0f) * 127.5f));
        }
      }
    }
  }
  return encode_png(px, gw, gh, c);
}

Status write_image_grid(const std::filesystem::path& path, const Tensor& images, int64_t cols,
                        int64_t pad) {
  auto png = image_grid_png(images, cols, pad);
  if (!png.ok()) return png.status().with_context(path.string());
  ASSIGN_OR_RETURN(io::AtomicFile f, io::AtomicFile::create(path), path.string());
  RETURN_IF_ERROR(f.append(png->data(), png->size()), path.string());
  return f.commit();
}

}  // namespace starling::models
