// A failed worker's error where its launcher reads it: torchrun (and any
// TorchElastic agent) sets TORCHELASTIC_ERROR_FILE for each worker and, when
// the worker fails, prints that file's message in its summary as the
// failure's cause (otherwise "<N/A>"). The file is the JSON that PyTorch's
// own workers write (torch.distributed.elastic's ErrorHandler).
#pragma once

#include <string>

namespace kiln {

// Writes `line` (kiln's one-line error) to TORCHELASTIC_ERROR_FILE when the
// variable names a file; does nothing otherwise. Never throws: a failure to
// write it must not hide the failure being reported.
//
// `cause`: this rank's failure is the run's cause, not the echo of a peer's
// (a collective that lost its peer, an interruption by the agent). The
// agent names the failure with the earliest timestamp as the root cause,
// in whole seconds, the lower rank first on a tie; an echo, which comes
// after its cause, is stamped a second later, so that the summary names the
// rank that failed first rather than rank 0.
void write_launcher_error_file(const std::string& line, bool cause) noexcept;

}  // namespace kiln
