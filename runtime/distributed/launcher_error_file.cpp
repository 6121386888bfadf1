#include "distributed/launcher_error_file.hpp"

#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "util/json_string.hpp"

namespace kiln {

void write_launcher_error_file(const std::string& line, bool cause) noexcept {
  try {
    const char* path = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (path == nullptr || *path == '\0') return;
    // {"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}:
    // the agent shows "message" as the cause and the call stack as its traceback.
    const std::string text = "{\"message\": {\"message\": " + json_string("kiln: " + line) +
                             ", \"extraInfo\": {\"py_callstack\": " + json_string(line) + ", \"timestamp\": \"" +
                             std::to_string(static_cast<long long>(std::time(nullptr)) + (cause ? 0 : 1)) +
                             "\"}}}\n";
    if (std::FILE* f = std::fopen(path, "w")) {
      std::fwrite(text.data(), 1, text.size(), f);
      std::fclose(f);
    }
  } catch (...) {
    // The report on stderr stands.
  }
}

}  // namespace kiln
