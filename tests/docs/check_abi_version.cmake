cmake_minimum_required(VERSION 3.18)
# abi.h's opening line names the version its KILN_ABI_VERSION_MAJOR/MINOR
# define (it said 1.3 while MINOR was 4):
#   cmake -DABI=<sdk/include/kiln/abi.h> -P check_abi_version.cmake
file(READ "${ABI}" text)
string(REGEX MATCH "the kiln plugin ABI, version ([0-9]+)\\.([0-9]+)" named "${text}")
set(named_major "${CMAKE_MATCH_1}")
set(named_minor "${CMAKE_MATCH_2}")
string(REGEX MATCH "#define KILN_ABI_VERSION_MAJOR ([0-9]+)" _ "${text}")
set(major "${CMAKE_MATCH_1}")
string(REGEX MATCH "#define KILN_ABI_VERSION_MINOR ([0-9]+)" _ "${text}")
set(minor "${CMAKE_MATCH_1}")
if(NOT named OR NOT major STREQUAL named_major OR NOT minor STREQUAL named_minor)
  message(FATAL_ERROR "${ABI}: its first lines name version ${named_major}.${named_minor}, "
                      "its KILN_ABI_VERSION_MAJOR/MINOR are ${major}.${minor}: make them agree")
endif()
message(STATUS "abi.h: version ${major}.${minor}")
