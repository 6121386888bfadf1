// kiln_exported's reader (plugins/exported/pt2_archive.cpp) and the binding
// of each program it reads (graph_program.cpp: every node resolved to a
// dispatcher operator and an argument plan): the bytes of a .pt2, the zip,
// its JSON programs in the export schema and its weights. The contract:
// either a Pt2Error (one line naming the archive) or programs that bind or
// are refused with one; no other exception, no crash, no read outside a
// record. Needs LibTorch 2.x (tests/fuzz/run.sh with KILN_FUZZ_TORCH_PREFIX).
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "graph_program.hpp"
#include "pt2_archive.hpp"

namespace {

void one_line(const kiln_exported::Pt2Error& e) {
  const std::string what = e.what();
  if (what.empty() || what.find('\n') != std::string::npos) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::map<std::string, kiln_exported::Pt2Program> programs;
  try {
    programs = kiln_exported::read_pt2_bytes(bytes, "fuzz.pt2", "2.99.0");
  } catch (const kiln_exported::Pt2Error& e) {
    one_line(e);
    return 0;
  }
  for (const auto& [name, program] : programs) {
    std::map<std::string, at::Tensor> state;
    for (const auto& [fqn, weight] : program.weights) state[fqn] = weight.value;
    try {
      // As kiln_exported binds them: every program reads the training
      // program's non-persistent buffers; this one's own serve here.
      kiln_exported::GraphProgram bound(*program.program, "fuzz.pt2", name, state, program.constants,
                                        program.constants);
    } catch (const kiln_exported::Pt2Error& e) {
      one_line(e);
    }
  }
  return 0;
}
