// plugin/elf_check: a plugin file is read, never mapped, and refused with one
// line unless dlopen could map all of it. A real plugin cut short (an
// interrupted copy) was a SIGBUS inside dlopen; each cut here must be an
// InputError instead, from the check and from the loader itself.
#include <gtest/gtest.h>

#include <elf.h>

#include <cstring>
#include <functional>
#include <set>

#include "plugin/elf_check.hpp"
#include "plugin/loader.hpp"
#include "support/run_process.hpp"
#include "util/errors.hpp"

namespace kiln {
namespace {

const std::filesystem::path kMlp = test::plugin_dir() / "libkiln_mlp.so";
const std::filesystem::path kStub = test::test_plugin_dir() / "libkiln_stub_ok.so";

// The one-line refusal of `file`, or "" when it is accepted.
std::string refusal(const std::filesystem::path& file) {
  try {
    check_elf_shared_object(file, file.string() + " (test)");
  } catch (const InputError& e) {
    return e.what();
  }
  return {};
}

void expect_one_line_naming(const std::string& line, const std::filesystem::path& file) {
  EXPECT_EQ(line.rfind(file.string() + " (test): ", 0), 0u) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
}

TEST(ElfCheck, AcceptsTheBuiltPlugins) {
  for (const auto& dir : {test::plugin_dir(), test::test_plugin_dir()})
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().extension() == ".so") {
        EXPECT_EQ(elf_problem(entry.path()), "") << entry.path();
      }
}

// Every length of interest, and a sweep: each cut is refused, naming the
// file, saying it is truncated (or empty) and what to do.
TEST(ElfCheck, RefusesARealPluginCutAtAnyLength) {
  for (const auto& plugin : {kMlp, kStub}) {
    const std::string bytes = test::read_file(plugin);
    const size_t size = bytes.size();
    ASSERT_GT(size, 65536u * (plugin == kMlp)) << plugin;
    std::set<size_t> lengths{0, 1, 3, 4, 5, 63, 64, 65, 120, 568, 4095, 4096, 4097, size / 2, size - 64, size - 1};
    if (size > 65536) lengths.insert({65535, 65536, 65537});
    for (size_t n = 0; n < size; n += 997) lengths.insert(n);
    test::TempDir dir("kiln-elf");
    const auto cut = dir / "libcut.so";
    for (size_t n : lengths) {
      test::write_file(cut, bytes.substr(0, n));
      const std::string line = refusal(cut);
      ASSERT_FALSE(line.empty()) << plugin << " cut to " << n << " bytes was accepted";
      expect_one_line_naming(line, cut);
      EXPECT_TRUE(line.find("the file is truncated") != std::string::npos ||
                  (n == 0 && line.find("the file is empty") != std::string::npos))
          << n << ": " << line;
      EXPECT_NE(line.find("copy the plugin again"), std::string::npos) << n << ": " << line;
    }
  }
}

TEST(ElfCheck, NamesTheSegmentThatEndsPastTheEndOfTheFile) {
  const std::string bytes = test::read_file(kMlp);
  test::TempDir dir("kiln-elf");
  for (size_t n : {size_t{4096}, size_t{65536}}) {
    test::write_file(dir / "libcut.so", bytes.substr(0, n));
    const std::string line = refusal(dir / "libcut.so");
    EXPECT_NE(line.find("(PT_LOAD) ends at byte "), std::string::npos) << line;
    EXPECT_NE(line.find("but the file has " + std::to_string(n) + " bytes"), std::string::npos) << line;
  }
}

// The loader runs the check before dlopen: without it, these cuts were a
// SIGBUS that ended this test program.
TEST(ElfCheck, TheLoaderRefusesACutPluginWithoutMappingIt) {
  const std::string bytes = test::read_file(kMlp);
  test::TempDir dir("kiln-elf");
  for (size_t n : {size_t{4096}, size_t{65536}, bytes.size() / 2}) {
    const auto cut = dir / ("libcut" + std::to_string(n) + ".so");
    test::write_file(cut, bytes.substr(0, n));
    Loader loader;
    try {
      loader.inspect(cut);
      ADD_FAILURE() << "a plugin cut to " << n << " bytes was loaded";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(cut.string() + " (inspect): the file is truncated"), std::string::npos)
          << e.what();
    }
  }
}

// A copy of the stub plugin with its bytes edited.
std::string patched(const std::function<void(std::string&)>& edit) {
  std::string bytes = test::read_file(kStub);
  edit(bytes);
  return bytes;
}

template <typename T>
T get(const std::string& b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof v);
  return v;
}
template <typename T>
void put(std::string& b, size_t at, T v) {
  std::memcpy(&b[at], &v, sizeof v);
}

Elf64_Ehdr header(const std::string& b) { return get<Elf64_Ehdr>(b, 0); }
size_t phdr_at(const std::string& b, size_t i) { return header(b).e_phoff + i * sizeof(Elf64_Phdr); }
// The index of the `k`th PT_LOAD program header.
size_t load(const std::string& b, int k) {
  for (size_t i = 0; i < header(b).e_phnum; ++i)
    if (get<Elf64_Phdr>(b, phdr_at(b, i)).p_type == PT_LOAD && k-- == 0) return i;
  ADD_FAILURE() << "no such PT_LOAD";
  return 0;
}

struct Damage {
  const char* name;
  std::function<void(std::string&)> edit;
  const char* expected;
};

TEST(ElfCheck, RefusesWhatDlopenCouldNotMapOrShouldNotLoad) {
  const std::vector<Damage> damages{
      {"no magic", [](std::string& b) { b[1] = 'X'; }, "not a shared object (no ELF header)"},
      {"32-bit", [](std::string& b) { b[EI_CLASS] = ELFCLASS32; }, "is a 32-bit ELF file, but this kiln is 64-bit; build the plugin for this machine"},
      {"bad class", [](std::string& b) { b[EI_CLASS] = 7; }, "invalid ELF class (7)"},
      {"big-endian", [](std::string& b) { b[EI_DATA] = ELFDATA2MSB; }, "is a big-endian ELF file, but this machine is little-endian"},
      {"version", [](std::string& b) { put<uint32_t>(b, offsetof(Elf64_Ehdr, e_version), 2); }, "unknown ELF version (2)"},
      {"other machine",
       [](std::string& b) {
         put<uint16_t>(b, offsetof(Elf64_Ehdr, e_machine), header(b).e_machine == EM_AARCH64 ? EM_X86_64 : EM_AARCH64);
       },
       "was built for "},
      {"executable", [](std::string& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_type), ET_EXEC); }, "is an executable (ELF type ET_EXEC), not a shared object; build the plugin as a shared library"},
      {"object file", [](std::string& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_type), ET_REL); }, "is an object file (ELF type ET_REL)"},
      {"core dump", [](std::string& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_type), ET_CORE); }, "is a core dump"},
      {"phentsize", [](std::string& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_phentsize), 32); }, "program headers of 32 bytes, not 56"},
      {"no program headers", [](std::string& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_phnum), 0); }, "has no program headers"},
      {"program headers past the end",
       [](std::string& b) { put<uint64_t>(b, offsetof(Elf64_Ehdr, e_phoff), b.size() - 8); },
       "the file is truncated: the program header table ends at byte "},
      {"program headers at an overflowing offset",
       [](std::string& b) { put<uint64_t>(b, offsetof(Elf64_Ehdr, e_phoff), ~uint64_t{0} - 8); }, "impossible offset"},
      {"segment past the end",
       [](std::string& b) { put<uint64_t>(b, phdr_at(b, load(b, 1)) + offsetof(Elf64_Phdr, p_offset), b.size()); },
       "the file is truncated: segment 1 (PT_LOAD) ends at byte "},
      {"segment at an overflowing offset",
       [](std::string& b) { put<uint64_t>(b, phdr_at(b, load(b, 1)) + offsetof(Elf64_Phdr, p_offset), ~uint64_t{0} - 100); },
       "segment 1 (PT_LOAD) has an impossible file range"},
      {"segment larger in the file than in memory",
       [](std::string& b) {
         const size_t at = phdr_at(b, load(b, 0));
         put<uint64_t>(b, at + offsetof(Elf64_Phdr, p_memsz), get<uint64_t>(b, at + offsetof(Elf64_Phdr, p_filesz)) - 1);
       },
       "holds more bytes in the file"},
      {"segments overlapping",
       [](std::string& b) {
         const size_t first = phdr_at(b, load(b, 0)), second = phdr_at(b, load(b, 1));
         put<uint64_t>(b, second + offsetof(Elf64_Phdr, p_vaddr), get<uint64_t>(b, first + offsetof(Elf64_Phdr, p_vaddr)) + 8);
       },
       "segments 0 and 1 (PT_LOAD) overlap or are out of order"},
      {"segments out of order",
       [](std::string& b) {
         const size_t first = phdr_at(b, load(b, 0)), second = phdr_at(b, load(b, 1));
         const auto a = get<Elf64_Phdr>(b, first), c = get<Elf64_Phdr>(b, second);
         put(b, first, c);
         put(b, second, a);
       },
       "overlap or are out of order"},
      {"no loadable segment",
       [](std::string& b) {
         for (size_t i = 0; i < header(b).e_phnum; ++i)
           if (get<uint32_t>(b, phdr_at(b, i)) == PT_LOAD) put<uint32_t>(b, phdr_at(b, i), PT_NULL);
       },
       "has no loadable segment"},
      {"dynamic section outside the segments",
       [](std::string& b) {
         for (size_t i = 0; i < header(b).e_phnum; ++i)
           if (get<uint32_t>(b, phdr_at(b, i)) == PT_DYNAMIC)
             put<uint64_t>(b, phdr_at(b, i) + offsetof(Elf64_Phdr, p_vaddr), uint64_t{1} << 40);
       },
       "(PT_DYNAMIC) at 0x10000000000 lies outside every loadable segment"},
      {"section headers past the end",
       [](std::string& b) { put<uint64_t>(b, offsetof(Elf64_Ehdr, e_shoff), b.size() - 64); },
       "the file is truncated: the section header table ends at byte "},
      {"section headers at an overflowing offset",
       [](std::string& b) { put<uint64_t>(b, offsetof(Elf64_Ehdr, e_shoff), ~uint64_t{0} - 64); }, "section headers at an impossible offset"},
      {"shentsize", [](std::string& b) { put<uint16_t>(b, offsetof(Elf64_Ehdr, e_shentsize), 40); }, "section headers of 40 bytes, not 64"},
  };
  test::TempDir dir("kiln-elf");
  const auto file = dir / "libdamaged.so";
  ASSERT_EQ(refusal(kStub), "");
  for (const Damage& d : damages) {
    test::write_file(file, patched(d.edit));
    const std::string line = refusal(file);
    ASSERT_FALSE(line.empty()) << d.name << " was accepted";
    expect_one_line_naming(line, file);
    EXPECT_NE(line.find(d.expected), std::string::npos) << d.name << ": " << line;
  }
}

TEST(ElfCheck, RefusesWhatIsNotARegularFileOrCannotBeRead) {
  test::TempDir dir("kiln-elf");
  EXPECT_NE(elf_problem(dir.path()).find("not a regular file"), std::string::npos) << elf_problem(dir.path());
  EXPECT_NE(elf_problem(dir / "nope.so").find("cannot open the plugin file"), std::string::npos);
}

}  // namespace
}  // namespace kiln
