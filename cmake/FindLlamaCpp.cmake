# Finds the prebuilt llama.cpp that scripts/install-llama-cpp.sh unpacks (node-llama-cpp's CPU
# build from the npm registry: Debian 12 has no llama.cpp package).
#
#   KVTIER_LLAMA_CPP_DIR   where it lies (default: .deps/llama.cpp of the source tree), with
#                          include/llama.h, include/ggml.h and lib/libllama.v*.so
#
# Defines LlamaCpp_FOUND, LlamaCpp_LIBRARY_DIR (also where the CPU back-end variants are, which
# ggml_backend_load_all_from_path() loads at run time) and the imported target LlamaCpp::llama
# (libllama, libggml and libggml-base, with an rpath to LlamaCpp_LIBRARY_DIR).
set(KVTIER_LLAMA_CPP_DIR "${PROJECT_SOURCE_DIR}/.deps/llama.cpp" CACHE PATH
    "The prebuilt llama.cpp (scripts/install-llama-cpp.sh)")

find_path(LlamaCpp_INCLUDE_DIR llama.h PATHS "${KVTIER_LLAMA_CPP_DIR}/include" NO_DEFAULT_PATH)
# The libraries carry their release in the file name (libllama.v0.5.0.so) and have no plain
# libllama.so link, so the linker is handed the exact files.
file(GLOB _kvtier_llama_libs "${KVTIER_LLAMA_CPP_DIR}/lib/libllama.v*.so")
file(GLOB _kvtier_ggml_libs "${KVTIER_LLAMA_CPP_DIR}/lib/libggml.v*.so")
set(_kvtier_ggml_base "${KVTIER_LLAMA_CPP_DIR}/lib/libggml-base.so")

include(FindPackageHandleStandardArgs)
if(_kvtier_llama_libs AND _kvtier_ggml_libs AND EXISTS "${_kvtier_ggml_base}")
  list(GET _kvtier_llama_libs 0 LlamaCpp_LIBRARY)
  list(GET _kvtier_ggml_libs 0 LlamaCpp_GGML_LIBRARY)
endif()
find_package_handle_standard_args(LlamaCpp REQUIRED_VARS LlamaCpp_INCLUDE_DIR LlamaCpp_LIBRARY
                                  LlamaCpp_GGML_LIBRARY)

if(LlamaCpp_FOUND AND NOT TARGET LlamaCpp::llama)
  set(LlamaCpp_LIBRARY_DIR "${KVTIER_LLAMA_CPP_DIR}/lib")
  add_library(LlamaCpp::llama INTERFACE IMPORTED)
  set_target_properties(LlamaCpp::llama PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${LlamaCpp_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES
      "${LlamaCpp_LIBRARY};${LlamaCpp_GGML_LIBRARY};${_kvtier_ggml_base}"
    INTERFACE_LINK_OPTIONS "-Wl,-rpath,${LlamaCpp_LIBRARY_DIR}")
endif()
