// Updates of any size on the wire. protobuf caps a message at 2 GiB, and a 7B-parameter fp32
// update is 28 GB, so an update stream carries the EncodedUpdate's description (codecs, shapes,
// array lengths) as a small protobuf message and its arrays after it as raw bytes: a sender
// reads it out a range at a time without a serialized copy, and a receiver folds it a window at
// a time (aggregator/stream_fold.h).
//
// Layout, all little-endian:
//   "STRLUPD1"                 8 bytes
//   header length              u64
//   starling.v1.EncodedUpdate  every array field empty; each CodecSegment's array_bytes holds
//                              the byte lengths of f32, u16, i8, scales, indices, bits
//   the arrays                 segment by segment, each segment's in that order
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/compress/codec.h"
#include "core/util/status.h"

namespace starling::compress {

inline constexpr std::string_view kUpdateStreamMagic = "STRLUPD1";
// The description of a 7B model's few hundred tensors takes kilobytes; this bounds what an
// untrusted header can make a receiver allocate.
inline constexpr uint64_t kMaxUpdateStreamHeaderBytes = 64ull << 20;

// The six arrays of a Segment, in stream order.
enum StreamArray { kArrF32 = 0, kArrU16, kArrI8, kArrScales, kArrIndices, kArrBits, kNumArrays };
using ArrayBytes = std::array<uint64_t, kNumArrays>;

// Byte lengths of `s`'s arrays as held in memory.
ArrayBytes array_bytes_of(const Segment& s);
// The byte lengths a well-formed segment with `meta`'s codec fields must have (from numel,
// k, block, rank, values), so that a receiver can check a header before reading any array.
// DataLoss naming segment `index` when the fields describe no valid segment.
Result<ArrayBytes> expected_array_bytes(const Segment& meta, size_t index);

// The bytes before the arrays for an update whose segments carry `meta`'s fields (their arrays
// are ignored) and arrays of `bytes[i]` bytes. For senders that generate the arrays themselves.
// REQUIRES: bytes.size() == meta.segments.size().
std::string update_stream_header(const EncodedUpdate& meta, const std::vector<ArrayBytes>& bytes);

// An EncodedUpdate (which must outlive the writer and not change) seen as stream bytes.
class UpdateStreamWriter {
 public:
  explicit UpdateStreamWriter(const EncodedUpdate& update);
  uint64_t size() const { return size_; }
  // Copies bytes [offset, offset + out.size()). REQUIRES: offset + out.size() <= size().
  void read(uint64_t offset, std::span<char> out) const;
  // All of it in one string: for small updates and tests.
  std::string serialize() const;

 private:
  struct Piece {
    uint64_t begin;  // stream offset
    const char* data;
    uint64_t size;
  };
  std::string header_;
  std::vector<Piece> pieces_;  // the header, then every non-empty array in stream order
  uint64_t size_ = 0;
};

// Reads bytes [offset, offset + out.size()) of a received payload (memory, a spill file).
using ReadAt = std::function<Status(uint64_t offset, std::span<char> out)>;
ReadAt read_from_memory(std::string_view bytes);

// A segment of a received stream: its fields, arrays not loaded, and where they lie.
struct StreamSegment {
  Segment meta;        // arrays empty
  ArrayBytes at{};     // payload offset of each array
  ArrayBytes bytes{};  // and its length, as expected_array_bytes() requires
};
struct UpdateStreamLayout {
  int64_t numel = 0;
  uint64_t header_bytes = 0;
  std::vector<StreamSegment> segments;
};

// True when `prefix` (at least 8 bytes) starts an update stream.
bool is_update_stream(std::string_view prefix);
// Reads and checks the header of an untrusted stream of `total_bytes`: magic, header length,
// codec ids, segments tiling [0, numel) in order, every array of the length its codec needs,
// and the arrays filling the payload exactly. DataLoss saying what is wrong otherwise.
Result<UpdateStreamLayout> read_update_stream_header(const ReadAt& read, uint64_t total_bytes);
// Loads elements [begin, begin + n) of segment `seg` into `out` (its fields, and the parts of
// its arrays those elements need), so that checking and decoding `out` covers just them.
// Windows of identity, fp16, bf16, int8 and QSGD segments may start at any multiple of the
// block (1 for the first three); sign at multiples of 8; the other codecs load whole only
// (begin == 0, n == numel). InvalidArgument for another window.
Status load_stream_window(const ReadAt& read, const StreamSegment& seg, int64_t begin, int64_t n,
                          Segment& out);
// The window granularity of load_stream_window for this segment: elements per step (a multiple
// of the block) when it can be loaded in parts of about `target` elements, else 0.
int64_t stream_window_elements(const Segment& meta, int64_t target);

// Windows of a payload held whole in memory, read in place instead of copied (arrays at any
// alignment): for identity, int8 and QSGD segments, the checks of load_stream_window +
// check_segment + a finite test, and the arithmetic of decode_add_segment, so a fold gives the
// same bits either way. Windows start where load_stream_window allows.
bool reads_in_place(const Segment& meta);
// Checks elements [begin, begin + n) of segment `index`: DataLoss naming the segment for a bad
// scale or code, InvalidArgument "update holds non-finite values (segment i)" for a non-finite
// value; when sum_sq is not null, adds the squares of the decoded values to it, in element order
// in double (as a decode into zeros and a loop over it would).
Status check_window_in_place(std::string_view payload, const StreamSegment& seg, size_t index,
                             int64_t begin, int64_t n, double* sum_sq);
// dst[i] += weight * decoded element begin + i. REQUIRES: check_window_in_place passed.
void add_window_in_place(std::string_view payload, const StreamSegment& seg, int64_t begin,
                         int64_t n, float* dst, float weight);

}  // namespace starling::compress
