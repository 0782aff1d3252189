# cera_add_library(NAME DIR DEPS...): one static library per layer, built from
# every .cpp under DIR (a layer's files are picked up without editing CMake).
# Files named *_avx2.cpp / *_avx512.cpp / *_amx.cpp get the ISA flags for run-time dispatch.
function(cera_add_library name dir)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${dir}/*.cpp)
  list(FILTER srcs EXCLUDE REGEX ".*/cuda/.*")
  if(NOT srcs)
    # A layer with no sources yet still gets a (empty) library to link against.
    set(empty ${CMAKE_CURRENT_BINARY_DIR}/${name}_empty.cpp)
    file(WRITE ${empty} "// empty\n")
    set(srcs ${empty})
  endif()
  add_library(${name} STATIC ${srcs})
  foreach(src IN LISTS srcs)
    if(src MATCHES "_amx\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${CERA_AMX_FLAGS}")
    elseif(src MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${CERA_AVX512_FLAGS}")
    elseif(src MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${CERA_AVX2_FLAGS}")
    endif()
  endforeach()
  target_link_libraries(${name} PUBLIC ${ARGN})
endfunction()
