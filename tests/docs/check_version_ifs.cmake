cmake_minimum_required(VERSION 3.18)
# LibTorch-version conditionals (#if/#elif on TORCH_VERSION_*) live in the
# adapters docs/architecture.md names, nowhere else in runtime/:
#   cmake -DRUNTIME=<runtime dir> -P check_version_ifs.cmake
set(allowed distributed/c10d_compat.cpp distributed/c10d_compat.hpp optim/precision.cpp)
file(GLOB_RECURSE sources RELATIVE "${RUNTIME}" "${RUNTIME}/*.cpp" "${RUNTIME}/*.hpp" "${RUNTIME}/*.h")
set(offenders "")
foreach(source IN LISTS sources)
  file(STRINGS "${RUNTIME}/${source}" lines REGEX "^[ \t]*#[ \t]*(if|elif|ifdef|ifndef).*TORCH_VERSION")
  if(lines AND NOT source IN_LIST allowed)
    list(APPEND offenders "${source}: ${lines}")
  endif()
endforeach()
if(offenders)
  string(REPLACE ";" "\n  " offenders "${offenders}")
  message(FATAL_ERROR "LibTorch-version #ifs outside the adapters (${allowed}):\n  ${offenders}\n"
                      "Move the difference into an adapter, or name the new one in docs/architecture.md and here.")
endif()
message(STATUS "version #ifs only in: ${allowed}")
