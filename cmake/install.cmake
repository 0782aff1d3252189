# `cmake --install`: the public headers, libcera (shared and static), the cera binary, the Python
# module, a CMake package (find_package(cera) -> cera::cera, cera::cera_static) and cera.pc for
# pkg-config. `cpack -G DEB` packs the same tree into a .deb.
include(CMakePackageConfigHelpers)

set(CERA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/cera)
file(GLOB public_headers ${CMAKE_SOURCE_DIR}/include/cera/*.h)
install(FILES ${public_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/cera COMPONENT dev)
install(TARGETS cera_shared cera_static EXPORT cera-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT lib NAMELINK_COMPONENT dev
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
install(TARGETS cera RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT bin)
install(EXPORT cera-targets NAMESPACE cera:: DESTINATION ${CERA_CMAKE_DIR} COMPONENT dev)
configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/cera-config.cmake.in
    ${CMAKE_BINARY_DIR}/cera-config.cmake INSTALL_DESTINATION ${CERA_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cera-config-version.cmake
    VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cera-config.cmake ${CMAKE_BINARY_DIR}/cera-config-version.cmake
        DESTINATION ${CERA_CMAKE_DIR} COMPONENT dev)

# cera.pc finds its prefix from where it lies, so that a tree installed under any --prefix works.
set(pc_dir ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH CERA_PC_TO_PREFIX /root/${pc_dir} /root)
set(CERA_PC_LIBS_PRIVATE "-pthread")
if(CERA_HAVE_CUDA)
  # As cera_static's link option (src/lib): the CUDA backend's weakly referenced entry point.
  string(APPEND CERA_PC_LIBS_PRIVATE " -Wl,--undefined=_ZN4cera17make_cuda_backendEiRKNS_11CudaOptionsE"
         " -L${CUDAToolkit_LIBRARY_DIR} -lcublasLt -lcublas -lcudart")
endif()
configure_file(${CMAKE_SOURCE_DIR}/cmake/cera.pc.in ${CMAKE_BINARY_DIR}/cera.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cera.pc DESTINATION ${pc_dir} COMPONENT dev)

if(TARGET cera_python)
  install(TARGETS cera_python LIBRARY DESTINATION ${CERA_PYTHON_INSTALL_DIR} COMPONENT python)
endif()

set(CPACK_PACKAGE_NAME cera)
set(CPACK_PACKAGE_VENDOR "cera")
set(CPACK_PACKAGE_CONTACT "cera maintainers <cera@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "LLM inference engine for GGUF models: library, headers, CLI and Python module")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
# The dependencies come from the shared libraries the binaries link (dpkg-shlibdeps); the CUDA
# toolkit's libraries are not Debian packages, so a CUDA build lists none and expects them installed.
if(NOT CERA_HAVE_CUDA)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
endif()
# The Python module is built for one Python version (its file name says which).
if(TARGET cera_python)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "${CERA_PYTHON_DEB_DEPENDS}")
  set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "python3-numpy")
endif()
set(CPACK_STRIP_FILES ON)
include(CPack)
