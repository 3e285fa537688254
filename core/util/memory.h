// Process-wide allocator settings for training processes.
#pragma once

namespace starling::util {

// A training step frees and allocates the same activation and gradient buffers every step.
// glibc gives large freed blocks back to the kernel (mmap above its threshold, heap trimming),
// so every step page-faults them in again: 12% of the DDPM U-Net's CPU step. After this call,
// blocks below 32 MiB (glibc's limit) come from the heap and freed memory up to 1 GiB stays
// mapped for reuse;
// the peak RSS is unchanged (the step reaches it every time), but memory is not returned
// between steps. For `starling train` and the training benchmarks; not for long-lived
// aggregators and clients, whose memory should go back after a round. Returns false where the
// allocator has no such settings (not glibc, or a sanitizer's allocator).
bool keep_freed_memory();

}  // namespace starling::util
