// The event loop of the commands that run an io_context on the main thread.
#pragma once

#include <asio/io_context.hpp>
#include <chrono>
#include <functional>

namespace starling::apps {

// Runs handlers until done() or, when no handler is left, returns.
inline void run_while(asio::io_context& io, const std::function<bool()>& done) {
  while (!done()) {
    if (io.stopped()) io.restart();
    if (io.run_one_for(std::chrono::milliseconds(100)) == 0 && io.stopped()) return;
  }
}

}  // namespace starling::apps
