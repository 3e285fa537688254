# Installation and the client package: `cmake --install` puts the starling binary, an example
# client config, the systemd unit and the docs in place; CPack turns the same into a .deb and a
# tarball (`cmake --build --preset package --target package`, docs/edge.md).
include(GNUInstallDirs)

install(TARGETS starling RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT client)
install(FILES packaging/client.example.toml README.md docs/edge.md
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT client)
install(FILES packaging/starling-client.service
  DESTINATION lib/systemd/system COMPONENT client)

set(CPACK_PACKAGE_NAME starling)
set(CPACK_PACKAGE_VENDOR "starling")
set(CPACK_PACKAGE_CONTACT "starling maintainers <starling@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Federated and decentralized learning: edge client, aggregator and simulator")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR "DEB;TGZ")
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${PROJECT_SOURCE_DIR}/packaging/postinst")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
if(CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR STREQUAL "aarch64")
  set(CPACK_DEBIAN_PACKAGE_ARCHITECTURE arm64)
  set(CPACK_SYSTEM_NAME linux-aarch64)
  # dpkg-shlibdeps reads the arm64 libraries' symbols files from the multiarch packages.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS /usr/lib/aarch64-linux-gnu)
endif()
# The .deb and tarball carry the client (binary, config, unit, docs), not the C++ package.
set(CPACK_COMPONENTS_ALL client)
include(CPack)
