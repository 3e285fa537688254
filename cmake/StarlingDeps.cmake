# Third-party dependencies, all from Debian packages: nothing is downloaded or vendored.
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(PkgConfig REQUIRED)
# OpenBLAS: prefer Debian's OpenMP build (libopenblas-openmp-dev) so that BLAS and our own
# OpenMP loops share one thread pool instead of two pools spinning against each other.
find_library(STARLING_OPENBLAS_OPENMP_LIB openblas
  PATHS /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
find_path(STARLING_OPENBLAS_OPENMP_INC cblas.h
  PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp NO_DEFAULT_PATH)
add_library(starling_blas INTERFACE)
if(STARLING_OPENBLAS_OPENMP_LIB AND STARLING_OPENBLAS_OPENMP_INC)
  message(STATUS "starling: OpenBLAS (OpenMP) ${STARLING_OPENBLAS_OPENMP_LIB}")
  target_include_directories(starling_blas INTERFACE ${STARLING_OPENBLAS_OPENMP_INC})
  target_link_libraries(starling_blas INTERFACE ${STARLING_OPENBLAS_OPENMP_LIB} OpenMP::OpenMP_CXX)
else()
  pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
  message(STATUS "starling: OpenBLAS (pkg-config) ${OPENBLAS_LINK_LIBRARIES}")
  target_link_libraries(starling_blas INTERFACE PkgConfig::OPENBLAS OpenMP::OpenMP_CXX)
endif()
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(tomlplusplus REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(Protobuf REQUIRED)
find_package(OpenSSL 3 REQUIRED)
find_package(ZLIB REQUIRED)
if(STARLING_BUILD_TESTS)
  find_package(Catch2 2 REQUIRED)
endif()
find_package(CURL REQUIRED)
# prometheus-cpp (prometheus-cpp-dev): the aggregator's metrics registry and text format.
find_package(prometheus-cpp CONFIG QUIET COMPONENTS core)
if(NOT TARGET prometheus-cpp::core)
  # On a multiarch host the -dev package of the other architecture may hold the headers and
  # CMake files (only one can be installed); this architecture's runtime library still is.
  find_path(STARLING_PROMETHEUS_INC prometheus/registry.h)
  find_library(STARLING_PROMETHEUS_CORE NAMES prometheus-cpp-core libprometheus-cpp-core.so.1.0)
  if(NOT STARLING_PROMETHEUS_INC OR NOT STARLING_PROMETHEUS_CORE)
    message(FATAL_ERROR "prometheus-cpp not found: install prometheus-cpp-dev (scripts/deps.sh)")
  endif()
  message(STATUS "starling: prometheus-cpp core ${STARLING_PROMETHEUS_CORE} (no CMake package)")
  add_library(prometheus-cpp::core UNKNOWN IMPORTED)
  set_target_properties(prometheus-cpp::core PROPERTIES
    IMPORTED_LOCATION ${STARLING_PROMETHEUS_CORE}
    INTERFACE_INCLUDE_DIRECTORIES ${STARLING_PROMETHEUS_INC})
endif()
# OpenMPI (libopenmpi-dev, openmpi-bin): `mpirun -n R starling simulate` spreads a simulation over
# processes and machines (sim/ranks.h). Optional: without it the binary builds and refuses an MPI
# launch with an error saying how to get it. AUTO: use it when found; ON: insist; OFF: never.
set(STARLING_MPI "AUTO" CACHE STRING "Build with MPI for cluster simulations: AUTO, ON or OFF")
if(STARLING_MPI STREQUAL "ON")
  find_package(MPI REQUIRED COMPONENTS C)
elseif(STARLING_MPI STREQUAL "AUTO" AND NOT CMAKE_CROSSCOMPILING)
  find_package(MPI QUIET COMPONENTS C)
endif()
if(TARGET MPI::MPI_C)
  set(STARLING_HAVE_MPI ON)
  message(STATUS "starling: MPI ${MPI_C_VERSION} (cluster simulations)")
else()
  set(STARLING_HAVE_MPI OFF)
  message(STATUS "starling: no MPI (simulations run in one process; apt install libopenmpi-dev)")
endif()
