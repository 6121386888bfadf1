# kiln_add_plugin(<name> SOURCES <files...> [NO_TORCH] [OUTPUT_DIRECTORY <dir>])
#
# Builds a kiln plugin: a shared object named lib<name>.so that compiles
# against the kiln SDK. A plugin links LibTorch (the same one as the host)
# unless NO_TORCH is given, in which case it sees only the C ABI (kiln/abi.h).
# Symbols are hidden by default; KILN_EXPORT_PLUGINS exports the one entry.
function(kiln_add_plugin name)
  cmake_parse_arguments(ARG "NO_TORCH" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "kiln_add_plugin(${name}): SOURCES is required")
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  set_target_properties(${name} PROPERTIES
    PREFIX "lib"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  endif()
  if(ARG_NO_TORCH)
    target_link_libraries(${name} PRIVATE Kiln::abi)
  else()
    # Kiln::sdk carries LibTorch (the imported target `torch`, found once by
    # find_package(Kiln) or the caller, in the caller's scope): linking it
    # here works for every plugin of a project, not only the first.
    if(NOT TARGET torch)
      message(FATAL_ERROR "kiln_add_plugin(${name}): LibTorch not found; call find_package(Torch) or find_package(Kiln) first")
    endif()
    target_link_libraries(${name} PRIVATE Kiln::sdk)
    target_compile_features(${name} PRIVATE cxx_std_17)
    # Inside kiln's own build (KILN_PCH), one precompiled <torch/torch.h>.
    if(TARGET kiln_plugin_pch)
      target_precompile_headers(${name} REUSE_FROM kiln_plugin_pch)
    endif()
  endif()
  # Fail at link time, not at load time, on an unresolved symbol.
  target_link_options(${name} PRIVATE -Wl,--no-undefined)
  # kiln's own build lists its plugins (kiln_every_plugin).
  set_property(GLOBAL APPEND PROPERTY KILN_PLUGIN_TARGETS ${name})
endfunction()
