// The loader's ELF check (plugin/elf_check.hpp), which reads a plugin file
// with pread before dlopen maps it. The contract: elf_problem gives "" or
// one line (no newline, never empty text after the file's name), and when it
// gives "", everything dlopen maps or reads lies inside the file: the ELF
// and program headers, each PT_LOAD segment's bytes, in address order
// without overlap, and the section header table. That is checked here
// independently of the check's own code; a file it accepts that breaks it
// would be a SIGBUS in dlopen. Nothing is ever mapped or loaded here.
#include <elf.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_file.hpp"
#include "plugin/elf_check.hpp"
#include "util/errors.hpp"

namespace {

template <typename T>
T at(const uint8_t* data, uint64_t offset) {
  T v;
  std::memcpy(&v, data + offset, sizeof v);
  return v;
}

bool inside(uint64_t offset, uint64_t length, uint64_t size) { return offset <= size && length <= size - offset; }

// What an accepted file must satisfy, from the bytes alone.
void check_accepted(const uint8_t* data, size_t size) {
  if (size < sizeof(Elf64_Ehdr) || std::memcmp(data, ELFMAG, SELFMAG) != 0) __builtin_trap();
  const auto h = at<Elf64_Ehdr>(data, 0);
  if (h.e_ident[EI_CLASS] != ELFCLASS64 || h.e_type != ET_DYN || h.e_phentsize != sizeof(Elf64_Phdr) ||
      h.e_phnum == 0)
    __builtin_trap();
  if (!inside(h.e_phoff, uint64_t{h.e_phnum} * sizeof(Elf64_Phdr), size)) __builtin_trap();
  bool any_load = false;
  uint64_t load_end = 0;
  for (uint64_t i = 0; i < h.e_phnum; ++i) {
    const auto p = at<Elf64_Phdr>(data, h.e_phoff + i * sizeof(Elf64_Phdr));
    if (p.p_type != PT_LOAD) continue;
    if (!inside(p.p_offset, p.p_filesz, size) || p.p_filesz > p.p_memsz) __builtin_trap();
    if (p.p_memsz > ~uint64_t{0} - p.p_vaddr) __builtin_trap();
    if (any_load && p.p_vaddr < load_end) __builtin_trap();
    any_load = true;
    load_end = p.p_vaddr + p.p_memsz;
  }
  if (!any_load) __builtin_trap();
  if (h.e_shnum != 0 && !inside(h.e_shoff, uint64_t{h.e_shnum} * h.e_shentsize, size)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = kiln_fuzz::input_file(".so", data, size);
  const std::string problem = kiln::elf_problem(file);
  if (problem.empty()) {
    check_accepted(data, size);
  } else if (problem.find('\n') != std::string::npos || problem.find('\r') != std::string::npos) {
    __builtin_trap();
  }
  // The throwing form names the file and carries the same line.
  try {
    kiln::check_elf_shared_object(file, "plugin");
    if (!problem.empty()) __builtin_trap();
  } catch (const kiln::InputError& e) {
    if (problem.empty() || std::string(e.what()) != "plugin: " + problem) __builtin_trap();
  }
  return 0;
}
