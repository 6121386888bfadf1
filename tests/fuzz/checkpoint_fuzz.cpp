// The checkpoint reader. The contract (ckpt/checkpoint_file.hpp): check()
// names a problem or none; read() gives a validated file or throws
// CheckpointError; nothing allocates more than the file's size justifies
// (run.sh sets -malloc_limit_mb far below what a lying header could ask for)
// and nothing in the file is executed.
#include <cstdint>
#include <string>

#include "ckpt/checkpoint_file.hpp"
#include "fuzz_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string file = kiln_fuzz::input_file(".ckpt", data, size);
  const auto problem = kiln::CheckpointFile::check(file);
  try {
    const kiln::CheckpointFile checkpoint = kiln::CheckpointFile::read(file);
    // A file check() calls valid must read, and one it refuses must not.
    if (problem) __builtin_trap();
    for (const auto& name : checkpoint.names()) {
      const std::string_view bytes = checkpoint.section(name);
      volatile uint8_t sink = 0;
      for (char c : bytes) sink ^= static_cast<uint8_t>(c);
      (void)sink;
    }
  } catch (const kiln::CheckpointError&) {
    if (!problem) __builtin_trap();
  }
  return 0;
}
