// One run directory, one run (docs/guarantees.md, "The run directory").
//
// The run that writes into `run.dir` holds an exclusive flock(2) on the
// directory itself, from as early as it can until it ends: the kernel drops
// it when the process dies, however it dies, so a SIGKILLed run never leaves
// a stale lock. The directory's own inode is locked — no lock file — so
// taking it writes nothing: a run refused later for bad input still leaves
// every file (and the directory's mtime) as it was. The holder's pid, for the
// refusal, is read from /proc/locks.
//
// Who holds it: a single process; with kiln's own workers, the supervisor
// (its workers never take it, so they cannot refuse each other); under an
// external launcher (torchrun, SLURM), global rank 0. A directory that does
// not exist yet is locked by rank 0 when it creates it (just before the first
// write), so a refused run has created nothing.
//
// The lock is advisory and local: it keeps kiln runs apart, not other
// programs. On a filesystem that cannot flock a directory (NFS: Linux
// emulates flock there with POSIX locks, which need a file open for writing)
// kiln says so in one warning and goes on unlocked (docs/training.md).
#pragma once

#include <filesystem>

namespace kiln {

// Takes the lock of `dir` for the rest of this process, if `dir` exists.
// Returns whether this process now holds it (false: `dir` does not exist
// yet, or cannot be locked there). Throws InputError naming the directory
// and the holder's pid when another process holds it.
bool lock_existing_run_dir(const std::filesystem::path& dir);

// Creates `dir` (and its parents) and takes its lock, unless this process, or
// the kiln supervisor that launched it, holds it already. Throws InputError
// as lock_existing_run_dir.
void create_and_lock_run_dir(const std::filesystem::path& dir);

// The variable a supervisor that holds the lock sets for its workers.
inline constexpr const char* kRunDirLockedVariable = "KILN_RUN_DIR_LOCKED";

// The pid holding an exclusive flock on `path` (per /proc/locks), or 0 when
// none is visible from here. For the refusal's line, and for tests.
int run_dir_lock_holder(const std::filesystem::path& path);

}  // namespace kiln
