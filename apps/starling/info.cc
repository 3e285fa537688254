// `starling info`: what this build can do (backends, devices, threads).
#include <omp.h>

#include <cstdio>

#include "apps/starling/commands.h"
#include "core/cuda/device.h"
#include "core/ops/blas_core.h"
#include "sim/ranks.h"

namespace starling::apps {

void register_info(CLI::App& app, CommandContext& /*ctx*/) {
  auto* cmd = app.add_subcommand("info", "Show the build's backends and visible devices");
  cmd->callback([]() {
    std::printf("starling 0.1.0\n");
    std::printf("cpu threads: %d (OpenMP)\n", omp_get_max_threads());
    std::printf("blas kernels: OpenBLAS %s\n", ops::blas_core().c_str());
    std::printf("cuda backend: %s\n", cuda::built_with_cuda() ? "built" : "not built");
    std::printf("mpi: %s\n", sim::Ranks::built_with_mpi()
                                 ? "built (mpirun -n R starling simulate -c CONFIG)"
                                 : "not built (install libopenmpi-dev and rebuild)");
    const auto devs = cuda::devices();
    if (devs.empty()) std::printf("cuda devices: none\n");
    for (const auto& d : devs) {
      std::printf("cuda device %d: %s, %.1f GiB, sm_%d%d\n", d.index, d.name.c_str(),
                  static_cast<double>(d.total_memory) / (1 << 30), d.compute_major,
                  d.compute_minor);
    }
  });
}

}  // namespace starling::apps
