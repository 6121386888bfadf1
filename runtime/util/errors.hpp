// Error types that decide how the host exits.
#pragma once

#include <initializer_list>
#include <stdexcept>
#include <string>

namespace kiln {

// Bad input from the user: a manifest, a plugin file, a checkpoint, a flag.
// The message is one line naming the file (and where possible line:col) and
// what to do. The CLI prints it and exits with kExitBadInput; nothing on disk
// has been touched when it is thrown.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective or rendezvous step failed: from this rank's view, another
// rank died, hung or disagreed. Reported as KILN_FAILURE_PEER_FAILED, so the
// supervisor names the rank that failed first rather than this one.
class PeerFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The one line a person reads: an error text without the C++ backtrace that
// c10::Error::what() appends ("Exception raised from ...", "frame #N: ..."),
// its lines joined. The full text is for --log-level debug only.
inline std::string one_line(std::string text) {
  for (const char* marker : {"Exception raised from ", "\nframe #"}) {
    const size_t at = text.find(marker);
    if (at != std::string::npos) text.erase(at);
  }
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\r') continue;
    if (c == '\n') {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      if (!out.empty() && out.back() != ';' && out.back() != ':') out += ';';
      out += ' ';
      continue;
    }
    out += c;
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out;
}

// A signal (SIGINT, SIGTERM) arrived while this rank waited in a collective
// or at the rendezvous: the wait is abandoned so that cleanup runs now, not
// after the collective's timeout. Reported as KILN_FAILURE_INTERRUPTED.
class Interrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Exit codes of the `kiln` executable (documented in docs/guarantees.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;    // training failed (a hook, the host)
inline constexpr int kExitBadInput = 2;   // refused before anything ran
inline constexpr int kExitPreempted = 75;     // preempted; a checkpoint was committed (EX_TEMPFAIL: retry)
inline constexpr int kExitInterrupted = 130;  // SIGINT/SIGTERM

}  // namespace kiln
