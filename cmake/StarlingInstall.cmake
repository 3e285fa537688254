# The C++ package: `cmake --install` puts headers (include/starling), the static libraries and a
# CMake package (lib/cmake/starling) in the prefix, so a project of one's own can say
#   find_package(starling REQUIRED)
#   target_link_libraries(app PRIVATE starling::client)   # or starling::core, ...
# (examples/cpp_client, docs/own_model.md). The libraries' include directories point into the
# source and build trees while building and at include/starling once installed.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(STARLING_PACKAGE_TARGETS
  starling_warnings starling_blas starling_asio
  starling_core_util starling_core_tensor starling_core_autograd starling_core_ops
  starling_core_nn starling_core_optim starling_core_io starling_core_data starling_core_config
  starling_core_compress starling_core_comm starling_core_fetch starling_core_wire
  starling_core_cuda starling_core_net starling_core_secagg
  starling_models starling_edge_client starling_aggregator starling_gossip starling_sim)
if(TARGET starling_core_comm_nccl)
  list(APPEND STARLING_PACKAGE_TARGETS starling_core_comm_nccl)
endif()

set(STARLING_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR}/starling)
foreach(t IN LISTS STARLING_PACKAGE_TARGETS)
  string(REGEX REPLACE "^starling_" "" short ${t})
  set_target_properties(${t} PROPERTIES EXPORT_NAME ${short})
  get_target_property(dirs ${t} INTERFACE_INCLUDE_DIRECTORIES)
  if(dirs)
    set(mapped "")
    foreach(d IN LISTS dirs)
      string(FIND "${d}" "${PROJECT_SOURCE_DIR}" in_source)
      string(FIND "${d}" "${PROJECT_BINARY_DIR}" in_build)
      if(in_source EQUAL 0 OR in_build EQUAL 0)
        list(APPEND mapped "$<BUILD_INTERFACE:${d}>")
      else()
        list(APPEND mapped "${d}")  # a system folder (OpenBLAS, NCCL): the same once installed
      endif()
    endforeach()
    list(APPEND mapped "$<INSTALL_INTERFACE:${STARLING_INSTALL_INCLUDEDIR}>"
      "$<INSTALL_INTERFACE:${STARLING_INSTALL_INCLUDEDIR}/core/wire>")
    list(REMOVE_DUPLICATES mapped)
    set_target_properties(${t} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${mapped}")
  endif()
endforeach()

# The umbrella targets users link: starling::core (engine, codecs, transport, config) and
# starling::client (a client of one's own, simulations: sim/federate.h, and everything below).
add_library(starling_package_core INTERFACE)
target_link_libraries(starling_package_core INTERFACE starling_core_util starling_core_tensor
  starling_core_autograd starling_core_ops starling_core_nn starling_core_optim starling_core_io
  starling_core_data starling_core_config starling_core_compress starling_core_comm
  starling_core_net starling_core_wire starling_core_secagg)
set_target_properties(starling_package_core PROPERTIES EXPORT_NAME core)
add_library(starling_package_client INTERFACE)
target_link_libraries(starling_package_client INTERFACE starling_sim starling_edge_client
  starling_aggregator starling_gossip starling_models starling_package_core)
set_target_properties(starling_package_client PROPERTIES EXPORT_NAME client)
add_library(starling::core ALIAS starling_package_core)
add_library(starling::client ALIAS starling_package_client)

install(TARGETS ${STARLING_PACKAGE_TARGETS} starling_package_core starling_package_client
  EXPORT starlingTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  INCLUDES DESTINATION ${STARLING_INSTALL_INCLUDEDIR})
install(DIRECTORY core edge_client aggregator gossip sim models
  DESTINATION ${STARLING_INSTALL_INCLUDEDIR} COMPONENT dev
  FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
install(DIRECTORY ${PROJECT_BINARY_DIR}/core/wire/
  DESTINATION ${STARLING_INSTALL_INCLUDEDIR}/core/wire COMPONENT dev
  FILES_MATCHING PATTERN "*.pb.h" PATTERN "CMakeFiles" EXCLUDE)
install(EXPORT starlingTargets NAMESPACE starling::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/starling COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/starlingConfig.cmake.in
  ${PROJECT_BINARY_DIR}/starlingConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/starling)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/starlingConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/starlingConfig.cmake
  ${PROJECT_BINARY_DIR}/starlingConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/starling COMPONENT dev)
