// Error types that decide how the host exits.
#pragma once

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

// Exit codes of the `kiln` executable (documented in docs/guarantees.md).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;    // training failed (a hook, the host)
inline constexpr int kExitBadInput = 2;   // refused before anything ran
inline constexpr int kExitPreempted = 75;     // preempted; a checkpoint was committed (EX_TEMPFAIL: retry)
inline constexpr int kExitInterrupted = 130;  // SIGINT/SIGTERM

}  // namespace kiln
