// Checks that a file is an ELF shared object this process could map, before
// dlopen maps it. dlopen maps each loadable segment with mmap; a segment
// that reaches past the end of the file (a plugin cut short by an
// interrupted copy) maps pages with no file behind them, and the dynamic
// loader's first touch of one kills the process with SIGBUS. So the file is
// read here with pread, never mapped, and refused when its header, program
// headers, segments or section headers do not lie inside it, when it is not
// a shared object, or when it was built for another machine, word size or
// byte order.
//
// Part of kiln_core (no LibTorch): tests/fuzz/elf_fuzz.cpp fuzzes it.
#pragma once

#include <filesystem>
#include <string>

namespace kiln {

// What is wrong with `path` as a shared object for this process, as the end
// of one line ("the file is truncated (...); copy the plugin again"); empty
// when nothing is. Never maps the file; reads at most its headers.
std::string elf_problem(const std::filesystem::path& path);

// Throws InputError("<who>: <what is wrong>; <what to do>") when
// elf_problem(path) finds something. `who` names the file (and where it was
// named, e.g. "/x/libfoo.so (run.toml [model])").
void check_elf_shared_object(const std::filesystem::path& path, const std::string& who);

}  // namespace kiln
