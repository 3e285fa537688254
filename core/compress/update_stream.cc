// Update streams: header, writer, and the checked reading of untrusted streams.
#include "core/compress/update_stream.h"

#include <algorithm>
#include <cstring>

#include "core/compress/internal/kernels.h"
#include "core/wire/codec.pb.h"

namespace starling::compress {
namespace {

constexpr uint64_t kPrefixBytes = 16;  // magic + header length
// Beyond any real tensor, and small enough that 8 bytes per element cannot overflow.
constexpr int64_t kMaxSegmentElements = int64_t{1} << 56;

uint64_t blocks_of(int64_t n, int32_t block) {
  return static_cast<uint64_t>((n + block - 1) / block);
}

Status bad(size_t index, const Segment& s, const std::string& what) {
  return data_loss("update stream: segment " + std::to_string(index) + " (" +
                   std::string(codec_kind_name(s.codec)) + "): " + what);
}

Status values_bytes(const Segment& s, size_t index, int64_t k, ArrayBytes& out) {
  const auto uk = static_cast<uint64_t>(k);
  switch (s.values) {
    case ValueCoding::kF32:
      out[kArrF32] = 4 * uk;
      return ok_status();
    case ValueCoding::kF16:
    case ValueCoding::kBf16:
      out[kArrU16] = 2 * uk;
      return ok_status();
    case ValueCoding::kInt8:
      if (s.block < 1) return bad(index, s, "int8 values need block >= 1");
      out[kArrI8] = uk;
      out[kArrScales] = 4 * blocks_of(k, s.block);
      return ok_status();
  }
  return bad(index, s, "unknown value coding");
}

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

template <typename T>
Status read_array(const ReadAt& read, uint64_t at, uint64_t count, std::vector<T>& out) {
  out.resize(static_cast<size_t>(count));
  if (count == 0) return ok_status();
  return read(at, std::span<char>(reinterpret_cast<char*>(out.data()), count * sizeof(T)));
}

}  // namespace

ArrayBytes array_bytes_of(const Segment& s) {
  return {s.f32.size() * 4,    s.u16.size() * 2,     s.i8.size(),
          s.scales.size() * 4, s.indices.size() * 4, s.bits.size()};
}

Result<ArrayBytes> expected_array_bytes(const Segment& s, size_t index) {
  ArrayBytes out{};
  const int64_t n = s.numel;
  if (n < 0 || n > kMaxSegmentElements) return bad(index, s, "numel out of range");
  const auto un = static_cast<uint64_t>(n);
  switch (s.codec) {
    case CodecKind::kIdentity:
      out[kArrF32] = 4 * un;
      return out;
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      out[kArrU16] = 2 * un;
      return out;
    case CodecKind::kQsgd:
      if (s.levels < 1 || s.levels > 127) return bad(index, s, "levels must be in [1, 127]");
      [[fallthrough]];
    case CodecKind::kInt8:
      if (s.block < 1) return bad(index, s, "block must be >= 1");
      out[kArrI8] = un;
      out[kArrScales] = 4 * blocks_of(n, s.block);
      return out;
    case CodecKind::kTopk:
      if (s.k < 0 || s.k > n) return bad(index, s, "k outside [0, numel]");
      out[kArrIndices] = 4 * static_cast<uint64_t>(s.k);
      RETURN_IF_ERROR(values_bytes(s, index, s.k, out));
      return out;
    case CodecKind::kRandk:
      if (s.k < 0 || s.k > n || (s.k == 0 && n > 0)) return bad(index, s, "k outside [1, numel]");
      RETURN_IF_ERROR(values_bytes(s, index, s.k, out));
      return out;
    case CodecKind::kPowerSgd: {
      int64_t prod = 1;
      for (int64_t d : s.shape) {
        if (d < 0 || __builtin_mul_overflow(prod, d, &prod)) return bad(index, s, "bad shape");
      }
      if (prod != n) return bad(index, s, "shape does not match numel");
      if (s.rank < 1 || s.rank > 1024) return bad(index, s, "rank must be in [1, 1024]");
      int64_t rows = 0, cols = 0;
      if (!internal::powersgd_applies(s.shape, s.rank, &rows, &cols)) {
        return bad(index, s, "shape and rank do not describe a low-rank matrix");
      }
      out[kArrF32] = 4 * static_cast<uint64_t>(s.rank) * static_cast<uint64_t>(rows + cols);
      return out;
    }
    case CodecKind::kSign:
      out[kArrBits] = (un + 7) / 8;
      out[kArrScales] = 4;
      return out;
  }
  return bad(index, s, "unknown codec");
}

std::string update_stream_header(const EncodedUpdate& meta, const std::vector<ArrayBytes>& bytes) {
  v1::EncodedUpdate msg;
  msg.set_numel(meta.numel);
  for (size_t i = 0; i < meta.segments.size(); ++i) {
    const Segment& s = meta.segments[i];
    v1::CodecSegment* p = msg.add_segments();
    segment_fields_to_message(s, p);
    for (uint64_t b : bytes[i]) p->add_array_bytes(b);
  }
  std::string out(kUpdateStreamMagic);
  const std::string body = msg.SerializeAsString();
  put_u64(out, body.size());
  out += body;
  return out;
}

UpdateStreamWriter::UpdateStreamWriter(const EncodedUpdate& update) {
  std::vector<ArrayBytes> bytes;
  bytes.reserve(update.segments.size());
  for (const Segment& s : update.segments) bytes.push_back(array_bytes_of(s));
  header_ = update_stream_header(update, bytes);
  pieces_.push_back({0, header_.data(), header_.size()});
  size_ = header_.size();
  auto add = [&](const void* data, uint64_t n) {
    if (n == 0) return;
    pieces_.push_back({size_, static_cast<const char*>(data), n});
    size_ += n;
  };
  for (const Segment& s : update.segments) {
    add(s.f32.data(), s.f32.size() * 4);
    add(s.u16.data(), s.u16.size() * 2);
    add(s.i8.data(), s.i8.size());
    add(s.scales.data(), s.scales.size() * 4);
    add(s.indices.data(), s.indices.size() * 4);
    add(s.bits.data(), s.bits.size());
  }
}

void UpdateStreamWriter::read(uint64_t offset, std::span<char> out) const {
  // The last piece starting at or before offset.
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), offset,
                             [](uint64_t off, const Piece& p) { return off < p.begin; });
  --it;
  size_t done = 0;
  while (done < out.size()) {
    const uint64_t within = offset + done - it->begin;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(it->size - within, out.size() - done));
    std::memcpy(out.data() + done, it->data + within, n);
    done += n;
    ++it;
  }
}

std::string UpdateStreamWriter::serialize() const {
  std::string out(size_, '\0');
  read(0, out);
  return out;
}

ReadAt read_from_memory(std::string_view bytes) {
  return [bytes](uint64_t offset, std::span<char> out) -> Status {
    if (offset > bytes.size() || out.size() > bytes.size() - offset) {
      return out_of_range("update stream: read past the end of " + std::to_string(bytes.size()) +
                          " bytes");
    }
    if (!out.empty()) std::memcpy(out.data(), bytes.data() + offset, out.size());
    return ok_status();
  };
}

bool is_update_stream(std::string_view prefix) { return prefix.starts_with(kUpdateStreamMagic); }

Result<UpdateStreamLayout> read_update_stream_header(const ReadAt& read, uint64_t total_bytes) {
  if (total_bytes < kPrefixBytes) {
    return data_loss("update stream: " + std::to_string(total_bytes) +
                     " bytes, shorter than its 16-byte prefix");
  }
  char prefix[kPrefixBytes];
  RETURN_IF_ERROR(read(0, prefix), "update stream");
  if (!is_update_stream(std::string_view(prefix, kPrefixBytes))) {
    return data_loss("update stream: bad magic (expected STRLUPD1)");
  }
  const uint64_t header_bytes = get_u64(prefix + 8);
  if (header_bytes > kMaxUpdateStreamHeaderBytes || header_bytes > total_bytes - kPrefixBytes) {
    return data_loss("update stream: header of " + std::to_string(header_bytes) +
                     " bytes does not fit (payload " + std::to_string(total_bytes) +
                     " bytes, limit " + std::to_string(kMaxUpdateStreamHeaderBytes) + ")");
  }
  std::string body(static_cast<size_t>(header_bytes), '\0');
  RETURN_IF_ERROR(read(kPrefixBytes, body), "update stream");
  v1::EncodedUpdate msg;
  if (!msg.ParseFromArray(body.data(), static_cast<int>(body.size()))) {
    return data_loss("update stream: header is not a starling.v1.EncodedUpdate message");
  }
  for (int i = 0; i < msg.segments_size(); ++i) {
    const v1::CodecSegment& p = msg.segments(i);
    if (!p.f32().empty() || !p.u16().empty() || !p.i8().empty() || !p.scales().empty() ||
        !p.indices().empty() || !p.bits().empty()) {
      return data_loss("update stream: segment " + std::to_string(i) +
                       " carries arrays inside the header");
    }
    if (p.array_bytes_size() != kNumArrays) {
      return data_loss("update stream: segment " + std::to_string(i) + " lists " +
                       std::to_string(p.array_bytes_size()) + " array lengths, not 6");
    }
  }
  EncodedUpdate meta;
  RETURN_IF_ERROR(update_from_message(msg, meta), "update stream");
  UpdateStreamLayout layout;
  layout.numel = meta.numel;
  layout.header_bytes = kPrefixBytes + header_bytes;
  if (meta.numel < 0) return data_loss("update stream: negative numel");
  uint64_t at = layout.header_bytes;
  int64_t next = 0;
  layout.segments.reserve(meta.segments.size());
  for (size_t i = 0; i < meta.segments.size(); ++i) {
    StreamSegment seg;
    seg.meta = std::move(meta.segments[i]);
    const Segment& s = seg.meta;
    if (s.offset != next || s.numel < 0 || s.numel > meta.numel - next) {
      return bad(i, s, "segments must tile [0, numel) in order");
    }
    next += s.numel;
    ASSIGN_OR_RETURN(seg.bytes, expected_array_bytes(s, i));
    for (int a = 0; a < kNumArrays; ++a) {
      const uint64_t sent = msg.segments(static_cast<int>(i)).array_bytes(a);
      if (sent != seg.bytes[a]) {
        return bad(i, s,
                   "array " + std::to_string(a) + " of " + std::to_string(sent) +
                       " bytes, its codec needs " + std::to_string(seg.bytes[a]));
      }
      if (seg.bytes[a] > total_bytes - at) {
        return data_loss("update stream: segment " + std::to_string(i) +
                         "'s arrays run past the end of the payload");
      }
      seg.at[a] = at;
      at += seg.bytes[a];
    }
    layout.segments.push_back(std::move(seg));
  }
  if (next != meta.numel) {
    return data_loss("update stream: segments cover " + std::to_string(next) + " of " +
                     std::to_string(meta.numel) + " elements");
  }
  if (at != total_bytes) {
    return data_loss("update stream: arrays end at byte " + std::to_string(at) + ", payload has " +
                     std::to_string(total_bytes));
  }
  return layout;
}

int64_t stream_window_elements(const Segment& s, int64_t target) {
  target = std::max<int64_t>(target, 1);
  switch (s.codec) {
    case CodecKind::kIdentity:
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return target;
    case CodecKind::kInt8:
    case CodecKind::kQsgd: {
      const int64_t b = std::max<int32_t>(s.block, 1);
      return std::max<int64_t>(b, target / b * b);
    }
    case CodecKind::kSign:
      return std::max<int64_t>(8, target / 8 * 8);
    default:
      return 0;
  }
}

Status load_stream_window(const ReadAt& read, const StreamSegment& seg, int64_t begin, int64_t n,
                          Segment& out) {
  const Segment& m = seg.meta;
  const int64_t step = stream_window_elements(m, 1);
  const bool whole = begin == 0 && n == m.numel;
  if (begin < 0 || n < 0 || n > m.numel - begin || (!whole && (step == 0 || begin % step != 0))) {
    return invalid_argument("load_stream_window: elements [" + std::to_string(begin) + ", +" +
                            std::to_string(n) + ") of a " + std::string(codec_kind_name(m.codec)) +
                            " segment of " + std::to_string(m.numel));
  }
  out.codec = m.codec;
  out.offset = m.offset + begin;
  out.numel = n;
  out.block = m.block;
  out.levels = m.levels;
  out.k = m.k;
  out.rank = m.rank;
  out.seed = m.seed;
  out.values = m.values;
  out.f32.clear();
  out.u16.clear();
  out.i8.clear();
  out.scales.clear();
  out.indices.clear();
  out.bits.clear();
  if (whole) {
    out.shape = m.shape;
    RETURN_IF_ERROR(read_array(read, seg.at[kArrF32], seg.bytes[kArrF32] / 4, out.f32));
    RETURN_IF_ERROR(read_array(read, seg.at[kArrU16], seg.bytes[kArrU16] / 2, out.u16));
    RETURN_IF_ERROR(read_array(read, seg.at[kArrI8], seg.bytes[kArrI8], out.i8));
    RETURN_IF_ERROR(read_array(read, seg.at[kArrScales], seg.bytes[kArrScales] / 4, out.scales));
    RETURN_IF_ERROR(read_array(read, seg.at[kArrIndices], seg.bytes[kArrIndices] / 4, out.indices));
    return read_array(read, seg.at[kArrBits], seg.bytes[kArrBits], out.bits);
  }
  out.shape = {n};
  const auto ub = static_cast<uint64_t>(begin);
  const auto un = static_cast<uint64_t>(n);
  switch (m.codec) {
    case CodecKind::kIdentity:
      return read_array(read, seg.at[kArrF32] + 4 * ub, un, out.f32);
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return read_array(read, seg.at[kArrU16] + 2 * ub, un, out.u16);
    case CodecKind::kInt8:
    case CodecKind::kQsgd: {
      const auto b = static_cast<uint64_t>(m.block);
      RETURN_IF_ERROR(read_array(read, seg.at[kArrI8] + ub, un, out.i8));
      return read_array(read, seg.at[kArrScales] + 4 * (ub / b), blocks_of(n, m.block), out.scales);
    }
    case CodecKind::kSign:
      RETURN_IF_ERROR(read_array(read, seg.at[kArrBits] + ub / 8, (un + 7) / 8, out.bits));
      return read_array(read, seg.at[kArrScales], 1, out.scales);
    default:
      return internal_error("load_stream_window: unreachable");
  }
}

bool reads_in_place(const Segment& meta) {
  return meta.codec == CodecKind::kIdentity || meta.codec == CodecKind::kInt8 ||
         meta.codec == CodecKind::kQsgd;
}

namespace {

std::vector<float> scales_of_window(std::string_view payload, const StreamSegment& seg,
                                    int64_t begin, int64_t n) {
  const auto b = static_cast<uint64_t>(seg.meta.block);
  std::vector<float> scales(blocks_of(n, seg.meta.block));
  std::memcpy(scales.data(),
              payload.data() + seg.at[kArrScales] + 4 * (static_cast<uint64_t>(begin) / b),
              scales.size() * 4);
  return scales;
}

}  // namespace

Status check_window_in_place(std::string_view payload, const StreamSegment& seg, size_t index,
                             int64_t begin, int64_t n, double* sum_sq) {
  const Segment& m = seg.meta;
  const auto ub = static_cast<uint64_t>(begin);
  const auto un = static_cast<uint64_t>(n);
  const auto bad_segment = [&](const std::string& what) {
    return data_loss("segment " + std::to_string(index) + " (" +
                     std::string(codec_kind_name(m.codec)) + "): " + what);
  };
  if (!reads_in_place(m) || begin < 0 || n < 0 || n > m.numel - begin) {
    return invalid_argument("check_window_in_place: elements [" + std::to_string(begin) + ", +" +
                            std::to_string(n) + ") of a " + std::string(codec_kind_name(m.codec)) +
                            " segment of " + std::to_string(m.numel));
  }
  if (m.codec == CodecKind::kIdentity) {
    if (seg.at[kArrF32] + 4 * (ub + un) > payload.size())
      return bad_segment("values past the payload");
    const char* p = payload.data() + seg.at[kArrF32] + 4 * ub;
    if (internal::has_nonfinite_bytes(p, un)) {
      return invalid_argument("update holds non-finite values (segment " + std::to_string(index) +
                              ")");
    }
    if (sum_sq != nullptr) {
      for (uint64_t i = 0; i < un; ++i) {
        const float x = internal::load_f32(p + 4 * i);
        *sum_sq += static_cast<double>(x) * x;
      }
    }
    return ok_status();
  }
  // int8 and QSGD: codes in place, the window's scales copied (one float per block).
  if (m.block < 1 || ub % static_cast<uint64_t>(m.block) != 0) {
    return bad_segment("block must be >= 1 and divide the window start");
  }
  if (m.codec == CodecKind::kQsgd && (m.levels < 1 || m.levels > 127)) {
    return bad_segment("levels must be in [1, 127]");
  }
  const uint64_t nblocks = blocks_of(n, m.block);
  if (seg.at[kArrI8] + ub + un > payload.size() ||
      seg.at[kArrScales] + 4 * (ub / static_cast<uint64_t>(m.block) + nblocks) > payload.size()) {
    return bad_segment("arrays past the payload");
  }
  const std::vector<float> scales = scales_of_window(payload, seg, begin, n);
  for (float f : scales) {
    if (!(f >= 0.0f && f <= 3.4028235e38f)) return bad_segment("non-finite or negative scale");
  }
  const auto* q = reinterpret_cast<const int8_t*>(payload.data() + seg.at[kArrI8] + ub);
  if (m.codec == CodecKind::kQsgd) {
    const int lim = m.levels;
    int bad_codes = 0;
    for (uint64_t i = 0; i < un; ++i) bad_codes |= (q[i] > lim) | (q[i] < -lim);
    if (bad_codes != 0) return bad_segment("code outside [-levels, levels]");
  }
  if (sum_sq != nullptr) {
    // The decoded values as add_segment makes them: q * (scale * 1/levels).
    const float inv_levels =
        m.codec == CodecKind::kQsgd ? 1.0f / static_cast<float>(m.levels) : 1.0f;
    const auto b = static_cast<uint64_t>(m.block);
    for (uint64_t i = 0; i < un; ++i) {
      const float v = static_cast<float>(q[i]) * (scales[i / b] * inv_levels);
      *sum_sq += static_cast<double>(v) * v;
    }
  }
  return ok_status();
}

void add_window_in_place(std::string_view payload, const StreamSegment& seg, int64_t begin,
                         int64_t n, float* dst, float weight) {
  const Segment& m = seg.meta;
  const auto ub = static_cast<uint64_t>(begin);
  const auto un = static_cast<uint64_t>(n);
  if (m.codec == CodecKind::kIdentity) {
    internal::add_f32_bytes(payload.data() + seg.at[kArrF32] + 4 * ub, un, dst, weight);
    return;
  }
  const std::vector<float> scales = scales_of_window(payload, seg, begin, n);
  const auto* q = reinterpret_cast<const int8_t*>(payload.data() + seg.at[kArrI8] + ub);
  const float inv_levels = m.codec == CodecKind::kQsgd ? 1.0f / static_cast<float>(m.levels) : 1.0f;
  const auto b = static_cast<uint64_t>(m.block);
  for (uint64_t start = 0, blk = 0; start < un; start += b, ++blk) {
    const uint64_t len = std::min(un - start, b);
    internal::add_i8(std::span<const int8_t>(q + start, len), scales[blk] * inv_levels, dst + start,
                     weight);
  }
}

}  // namespace starling::compress
