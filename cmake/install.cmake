# `cmake --install BUILD --prefix P`: the daemon and the tool, the SDK's public headers and its
# libraries (client/CMakeLists.txt: libkvtier.a, libkvtier.so), with llama.cpp the integration's
# header and library (kvtier/llama.h, libkvtier-llama.a), a CMake package (find_package(kvtier)
# gives kvtier::client; COMPONENTS llama, kvtier::llama) and a pkg-config file (kvtier.pc). The
# prefix is relocatable: nothing installed names the prefix it was configured with, or the build
# and source trees. docs/sdk.md and docs/llama.md show the use.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

# Installed binaries find shared libraries outside the system's directories (a CUDA toolkit under
# /usr/local/cuda) where they were found at build time.
set_target_properties(kvtierd kvtier kvtier_sdk_shared PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
install(TARGETS kvtierd kvtier RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/client/include/ ${PROJECT_SOURCE_DIR}/store/include/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")

# Two export sets: the shared library's interface needs only OpenSSL's headers, the static one's
# every package it was linked from; kvtierConfig.cmake loads the second only when those are there.
install(TARGETS kvtier_sdk_shared EXPORT kvtierSharedTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS kvtier_sdk_static EXPORT kvtierStaticTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
set(KVTIER_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kvtier)
install(EXPORT kvtierSharedTargets NAMESPACE kvtier:: DESTINATION ${KVTIER_CMAKE_DIR})
install(EXPORT kvtierStaticTargets NAMESPACE kvtier:: DESTINATION ${KVTIER_CMAKE_DIR})
# The llama.cpp integration: its header, its library, a third export set, and the module that
# finds llama.cpp (kvtierConfig.cmake loads them for COMPONENTS llama, given the llama.cpp kvtier
# was built against: KVTIER_LLAMA_CPP_DIR).
if(KVTIER_HAVE_LLAMA)
  install(FILES ${PROJECT_SOURCE_DIR}/integrations/llama/include/kvtier/llama.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kvtier)
  install(TARGETS kvtier_llama_installed EXPORT kvtierLlamaTargets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT kvtierLlamaTargets NAMESPACE kvtier:: DESTINATION ${KVTIER_CMAKE_DIR})
  install(FILES ${PROJECT_SOURCE_DIR}/cmake/FindLlamaCpp.cmake DESTINATION ${KVTIER_CMAKE_DIR})
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kvtierConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/kvtierConfig.cmake
                              INSTALL_DESTINATION ${KVTIER_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/kvtierConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/kvtierConfig.cmake ${PROJECT_BINARY_DIR}/kvtierConfigVersion.cmake
        DESTINATION ${KVTIER_CMAKE_DIR})

# kvtier.pc finds its prefix from its own place (${pcfiledir}), so `--prefix` at install time
# works; the static libraries' dependencies are private (pkg-config --static).
file(RELATIVE_PATH KVTIER_PC_TO_PREFIX /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
string(REGEX REPLACE "/$" "" KVTIER_PC_TO_PREFIX "${KVTIER_PC_TO_PREFIX}")
set(KVTIER_PC_LIBS_PRIVATE "-lrt -pthread -lstdc++ -lm")
if(KVTIER_HAVE_CUDA)
  string(APPEND KVTIER_PC_LIBS_PRIVATE " -L${CUDAToolkit_LIBRARY_DIR} -lcudart")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/kvtier.pc.in ${PROJECT_BINARY_DIR}/kvtier.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/kvtier.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
