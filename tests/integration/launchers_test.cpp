// kiln under the real launchers. The real torchrun (torch.distributed.run of the checking
// Python's torch: the wheel's 2.x, or Debian's python3-torch 1.13), not its
// variables set by hand: torchrun's agent serves the store on MASTER_PORT and
// says so (TORCHELASTIC_USE_AGENT_STORE), which kiln's ranks then join as
// clients under the agent's prefix for the attempt. Two workers train to
// `kiln fit -n 2`'s weights bitwise, with the static and the c10d
// rendezvous; two agents on loopback (two "nodes") train to one node's
// result within docs/distributed.md's tolerance; a failing worker's one
// line reaches torchrun's summary through TORCHELASTIC_ERROR_FILE.
#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include <ATen/ATen.h>

#include "checkpoint_sections.hpp"
#include "ckpt/tensor_sections.hpp"
#include "common.hpp"
#include "loopback_port.hpp"
#include "parameters_within.hpp"
#include "slurm_cluster.hpp"

namespace kiln::test {
namespace {

constexpr auto kTimeout = std::chrono::seconds(600);

#define KILN_REQUIRE_TORCHRUN()                                                                            \
  do {                                                                                                     \
    KILN_REQUIRE_CHECK_PYTHON();                                                                           \
    if (run_process({check_python().string(), "-c", "import torch.distributed.run"}).exit_code != 0)       \
      GTEST_SKIP() << "the checking Python's torch has no torch.distributed.run (torchrun): not run";    \
  } while (0)

// A small deterministic run that checkpoints at its end.
std::filesystem::path small_manifest(const TempDir& dir, const std::string& extra = "") {
  return write_run_manifest(dir, {.name = "launched",
                                  .run = "seed = 3\nthreads = 1\n",
                                  .trainer = trainer_keys(2, 32, "data_workers = 0\n"),
                                  .extra = "\n[checkpoint]\n" + extra});
}

// torchrun with `args` before --no_python kiln `kiln_args` (underscored
// options: torch 1.13 has no dashed ones). --redirects 1 --tee 1: Debian's
// torch 1.13 on Python 3.11 reads the default "0" (and "3") as no setting
// at all and fails before it starts a worker (its Std.from_str iterates an
// IntFlag, which 3.11 yields only single-bit members of); stdout is then
// written to `cwd`/torchrun-logs and to the console, stderr to the console.
ProcessResult torchrun(const std::vector<std::string>& args, const std::vector<std::string>& kiln_args,
                       const std::filesystem::path& cwd) {
  std::vector<std::string> argv{check_python().string(), "-m", "torch.distributed.run", "--redirects", "1",
                                "--tee", "1", "--log_dir", (cwd / "torchrun-logs").string()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back("--no_python");
  argv.push_back(kiln_exe().string());
  argv.insert(argv.end(), kiln_args.begin(), kiln_args.end());
  return run_process(argv, {.cwd = cwd, .timeout = kTimeout});
}

// A recorder run of 2 ranks, 64 samples, 4 a batch, whose steps sleep
// `step_ms` (so that a launcher can act mid-run), committing as
// `checkpoint` says; each rank dumps its final parameters to params.<rank>.
std::filesystem::path slow_run(const TempDir& at, int step_ms, int epochs, const std::string& checkpoint,
                               const std::string& callback = "") {
  return recorder_manifest(at,
                           "features = 4\nstep_ms = " + std::to_string(step_ms) + "\ndump_params = \"" +
                               (at / "params").string() + "\"\n",
                           "size = 64\nfeatures = 4\n", callback,
                           "max_epochs = " + std::to_string(epochs) +
                               "\nbatch_size = 4\n[optimizer]\nname = \"sgd\"\nlr = 0.1\n[checkpoint]\n" + checkpoint +
                               "[logging]\nloggers = [\"csv\"]\n");
}

// Both runs ended with the same parameters on each rank and the same
// metrics.csv (but for its timings), bit for bit.
void expect_the_same_run(const TempDir& a, const TempDir& b) {
  for (const char* rank : {"params.0", "params.1"}) {
    ASSERT_TRUE(std::filesystem::exists(a / rank)) << rank;
    EXPECT_EQ(read_file(a / rank), read_file(b / rank)) << rank;
  }
  EXPECT_EQ(rows_without_timings(a / "run" / "metrics.csv"), rows_without_timings(b / "run" / "metrics.csv"));
}

std::filesystem::path last(const TempDir& dir) { return dir / "run" / "checkpoints" / "last.ckpt"; }

TEST(Torchrun, TwoWorkersTrainAsKilnsOwnTwoProcessesBitwiseWithTheStaticAndTheC10dRendezvous) {
  KILN_REQUIRE_TORCHRUN();
  TempDir own, static_rdzv, c10d_rdzv;
  const ProcessResult mine = kiln({"fit", small_manifest(own).string(), "-n", "2"}, {.timeout = kTimeout});
  ASSERT_EQ(mine.exit_code, 0) << mine.output;
  const ProcessResult a = torchrun({"--nproc_per_node", "2", "--master_port", std::to_string(loopback_port())},
                                   {"fit", small_manifest(static_rdzv).string()}, static_rdzv.path());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_NE(a.output.find("joined the process group (torchrun launch"), std::string::npos) << a.output;
  EXPECT_TRUE(sections(last(own), "param/") == sections(last(static_rdzv), "param/"));
  const ProcessResult b = torchrun({"--nnodes", "1", "--nproc_per_node", "2", "--rdzv_backend", "c10d",
                                    "--rdzv_endpoint", "127.0.0.1:" + std::to_string(loopback_port())},
                                   {"fit", small_manifest(c10d_rdzv).string()}, c10d_rdzv.path());
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_TRUE(sections(last(own), "param/") == sections(last(c10d_rdzv), "param/"));
}

// Two agents, --nnodes 2, one worker each, on loopback: the gradients cross
// "nodes" over Gloo. The result is one node's two processes' (whose
// gradients meet in shared memory) within docs/distributed.md's 1e-5.
TEST(Torchrun, TwoNodesOnLoopbackTrainAsOneNode) {
  KILN_REQUIRE_TORCHRUN();
  TempDir one, two;
  const ProcessResult mine = kiln({"fit", small_manifest(one).string(), "-n", "2"}, {.timeout = kTimeout});
  ASSERT_EQ(mine.exit_code, 0) << mine.output;
  const std::string manifest = small_manifest(two).string();
  const std::string port = std::to_string(loopback_port());
  std::vector<ProcessResult> nodes(2);
  auto agent = [&](int node) {
    nodes[node] = torchrun({"--nnodes", "2", "--node_rank", std::to_string(node), "--nproc_per_node", "1",
                            "--master_addr", "127.0.0.1", "--master_port", port},
                           {"fit", manifest}, two.path());
  };
  std::thread second([&] { agent(1); });
  agent(0);
  second.join();
  ASSERT_EQ(nodes[0].exit_code, 0) << nodes[0].output;
  ASSERT_EQ(nodes[1].exit_code, 0) << nodes[1].output;
  EXPECT_GT(expect_parameters_within(last(one), last(two), 1e-5), 0);
}

// A worker that fails: its one line is in torchrun's summary (read from the
// error file kiln writes), and torchrun fails.
TEST(Torchrun, AFailingWorkersLineIsInTorchrunsSummary) {
  KILN_REQUIRE_TORCHRUN();
  TempDir dir;
  const auto manifest = recorder_manifest(dir, "fail_at = [\"training_step\"]\nfail_on_rank = 1", "", "",
                                          "batch_size = 4\nmax_epochs = 1\n");
  const ProcessResult r = torchrun({"--nproc_per_node", "2", "--master_port", std::to_string(loopback_port())},
                                   {"fit", manifest.string()}, dir.path());
  EXPECT_NE(r.exit_code, 0) << r.output;
  const auto summary = r.output.find("Root Cause");
  ASSERT_NE(summary, std::string::npos) << r.output;
  const std::string cause = r.output.substr(summary);
  EXPECT_NE(cause.find("rank      : 1"), std::string::npos) << cause;
  EXPECT_NE(cause.find("plugin 'test.recorder_model' [model] failed in training_step on rank 1"),
            std::string::npos)
      << cause;
}


// torchrun --max_restarts: rank 0 dies of SIGKILL at step 10 (once), the
// agent restarts both workers (attempt 1, a fresh prefix in its store), and
// `--resume auto` continues from the newest commit: the weights are the
// uninterrupted run's, bit for bit.
TEST(Torchrun, MaxRestartsHealsAKilledRankToTheUninterruptedWeights) {
  KILN_REQUIRE_TORCHRUN();
  TempDir straight, healed;
  auto manifest = [](const TempDir& dir, const std::string& callback) {
    return slow_run(dir, 0, 2, "every_n_steps = 4\nevery_n_epochs = 0\n", callback);
  };
  const std::vector<std::string> agent{"--nproc_per_node", "2", "--max_restarts", "2", "--monitor_interval", "0.2"};
  auto with_port = [&] {
    std::vector<std::string> args = agent;
    args.insert(args.end(), {"--master_port", std::to_string(loopback_port())});
    return args;
  };
  const ProcessResult a =
      torchrun(with_port(), {"fit", manifest(straight, "").string(), "--resume", "auto"}, straight.path());
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const ProcessResult b = torchrun(
      with_port(),
      {"fit", manifest(healed, "crash_at_step = 10\ncrash_marker = \"" + (healed / "crashed").string() + "\"").string(),
       "--resume", "auto"},
      healed.path());
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_TRUE(std::filesystem::exists(healed / "crashed")) << b.output;
  EXPECT_NE(b.output.find("resum"), std::string::npos) << b.output;
  expect_the_same_run(straight, healed);
}

// Kubeflow's Trainer v2 runs torchrun with its options in PET_* variables
// (PET_NPROC_PER_NODE, PET_MASTER_PORT, ...), which torchrun reads as its
// defaults: kiln sees torchrun's variables, the same run.
TEST(Torchrun, PetVariablesAsKubeflowSetsThemTrainAsTheOptions) {
  KILN_REQUIRE_TORCHRUN();
  TempDir own, pet;
  const ProcessResult mine = kiln({"fit", small_manifest(own).string(), "-n", "2"}, {.timeout = kTimeout});
  ASSERT_EQ(mine.exit_code, 0) << mine.output;
  std::vector<std::string> argv{check_python().string(), "-m", "torch.distributed.run", "--redirects", "1",
                                "--tee", "1", "--log_dir", (pet / "torchrun-logs").string(), "--no_python",
                                kiln_exe().string(), "fit", small_manifest(pet).string()};
  const ProcessResult r = run_process(
      argv, {.cwd = pet.path(),
             .env = {{"PET_NNODES", "1"}, {"PET_NPROC_PER_NODE", "2"}, {"PET_NODE_RANK", "0"},
                     {"PET_MASTER_ADDR", "127.0.0.1"}, {"PET_MASTER_PORT", std::to_string(loopback_port())}},
             .timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("joined the process group (torchrun launch"), std::string::npos) << r.output;
  EXPECT_TRUE(sections(last(own), "param/") == sections(last(pet), "param/"));
}


// Open MPI's mpirun starts the two workers (kiln reads OMPI_COMM_WORLD_*,
// MASTER_ADDR and MASTER_PORT exported with -x): kiln's own two processes'
// weights, bitwise.
TEST(OpenMpi, MpirunTwoProcessesTrainAsKilnsOwnTwoBitwise) {
  const std::filesystem::path mpirun = "/usr/bin/mpirun";
  if (!std::filesystem::exists(mpirun)) GTEST_SKIP() << "no mpirun (Debian's openmpi-bin, which ./go test installs)";
  TempDir own, mpi;
  const ProcessResult mine = kiln({"fit", small_manifest(own).string(), "-n", "2"}, {.timeout = kTimeout});
  ASSERT_EQ(mine.exit_code, 0) << mine.output;
  const ProcessResult r = run_process(
      {mpirun.string(), "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "MASTER_ADDR=127.0.0.1", "-x",
       "MASTER_PORT=" + std::to_string(loopback_port()), kiln_exe().string(), "fit", small_manifest(mpi).string()},
      {.cwd = mpi.path(), .timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("joined the process group (openmpi launch"), std::string::npos) << r.output;
  EXPECT_TRUE(sections(last(own), "param/") == sections(last(mpi), "param/"));
}


// README.md's torchrun line, as typed there (torch 2.x's dashed options),
// with its kiln and manifest: it trains. (The port comes from
// PET_MASTER_PORT, torchrun's default for --master-port, so that parallel
// tests do not meet on 29500.)
TEST(Torchrun, TheReadmesLineTrains) {
  KILN_REQUIRE_TORCHRUN();
  if (run_process({check_python().string(), "-c", "import sys, torch; sys.exit(int(torch.__version__.split('.')[0]) < 2)"})
          .exit_code != 0)
    GTEST_SKIP() << "the README's line is for torch 2.x's torchrun (Debian's 1.13 has no dashed options)";
  const std::string readme = read_file(source_dir() / "README.md");
  const auto at = readme.find("\ntorchrun ");
  ASSERT_NE(at, std::string::npos) << "README.md has no torchrun line";
  const std::string line = readme.substr(at + 1, readme.find('\n', at + 1) - at - 1);
  TempDir dir;
  std::vector<std::string> argv{check_python().string(), "-m", "torch.distributed.run"};
  std::istringstream words(line.substr(0, line.find('#')));
  std::string word;
  words >> word;  // torchrun
  while (words >> word)
    argv.push_back(word == "build/bin/kiln" ? kiln_exe().string()
                   : word == "run.toml"     ? small_manifest(dir).string()
                                            : word);
  const ProcessResult r = run_process(
      argv, {.cwd = dir.path(), .env = {{"PET_MASTER_PORT", std::to_string(loopback_port())}}, .timeout = kTimeout});
  ASSERT_EQ(r.exit_code, 0) << line << "\n" << r.output;
  EXPECT_TRUE(std::filesystem::exists(last(dir))) << r.output;
}

// --- SLURM: a real one-node cluster (slurm_cluster.hpp) -------------------------------

#define KILN_REQUIRE_SLURM(dir, cluster)                                                       \
  if (const std::string why = SlurmCluster::unavailable(); !why.empty())                       \
    GTEST_SKIP() << "no SLURM cluster here: " << why;                                          \
  SlurmCluster cluster(dir);                                                                   \
  if (!cluster.up())                                                                           \
  GTEST_SKIP() << "the SLURM cluster did not come up within 60 s: " << cluster.first_error()

// srun -n 2: two tasks of one job step, gradients over shared memory, kiln's
// own two processes' weights bitwise.
TEST(Slurm, SrunTwoTasksTrainAsKilnsOwnTwoBitwise) {
  TempDir dir, own, job;
  KILN_REQUIRE_SLURM(dir, cluster);
  const ProcessResult mine = kiln({"fit", small_manifest(own).string(), "-n", "2"}, {.timeout = kTimeout});
  ASSERT_EQ(mine.exit_code, 0) << mine.output;
  const ProcessResult r =
      cluster.command({"/usr/bin/srun", "-n", "2", kiln_exe().string(), "fit", small_manifest(job).string()}, job.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("joined the process group (slurm launch; gradients over shared memory"), std::string::npos)
      << r.output;
  EXPECT_TRUE(sections(last(own), "param/") == sections(last(job), "param/"));
}

// The newest committed step in `checkpoints`, or -1.
int64_t newest_commit(const std::filesystem::path& checkpoints) {
  int64_t newest = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints, ec)) {
    const std::string name = entry.path().filename().string();
    const auto at = name.find("-step=");
    if (name.rfind("epoch=", 0) == 0 && at != std::string::npos && name.size() > 5 &&
        name.compare(name.size() - 5, 5, ".ckpt") == 0)
      newest = std::max<int64_t>(newest, std::stoll(name.substr(at + 6)));
  }
  return newest;
}

// sbatch --requeue running `srun kiln fit --resume auto`, requeued by
// `scontrol requeue` mid-run: Slurm sends SIGTERM, kiln commits at the step
// and exits 75, the job runs again (Slurm delays a requeued job's start by
// default; the test starts it at once) and resumes from that commit. Its
// weights and metrics.csv are an uninterrupted job's, bitwise.
TEST(Slurm, ARequeuedJobResumesToTheUninterruptedRunBitwise) {
  KILN_ONLY_IN_VARIANT("debian");
  TempDir dir, straight, requeued;
  KILN_REQUIRE_SLURM(dir, cluster);
  auto manifest = [](const TempDir& at) { return slow_run(at, 60, 5, "every_n_steps = 4\nevery_n_epochs = 0\n"); };
  auto script = [&](const TempDir& at) {
    const auto file = at / "job.sh";
    write_file(file, "#!/bin/sh\n#SBATCH --requeue\n#SBATCH -n 2\n#SBATCH --open-mode=append\n#SBATCH -o " + (at / "job-%j.out").string() +
                         "\nsrun " + kiln_exe().string() + " fit " + manifest(at).string() + " --resume auto\n");
    return file.string();
  };
  const ProcessResult whole = cluster.command(
      {"/usr/bin/srun", "-n", "2", kiln_exe().string(), "fit", manifest(straight).string(), "--resume", "auto"},
      straight.path());
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  const ProcessResult submitted = cluster.command({"/usr/bin/sbatch", "--parsable", script(requeued)}, requeued.path());
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string id = submitted.output.substr(0, submitted.output.find_first_of(";\n"));
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (newest_commit(requeued / "run" / "checkpoints") < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(newest_commit(requeued / "run" / "checkpoints"), 8) << cluster.logs();
  const ProcessResult requeue = cluster.command({"/usr/bin/scontrol", "requeue", id});
  ASSERT_EQ(requeue.exit_code, 0) << requeue.output;
  const std::string state = cluster.await_end(id, deadline);
  const std::string out = read_file(requeued / ("job-" + id + ".out"));
  ASSERT_EQ(state, "COMPLETED") << out;
  EXPECT_NE(out.find("Exited with exit code 75"), std::string::npos) << out;
  EXPECT_NE(out.find("resum"), std::string::npos) << out;
  expect_the_same_run(straight, requeued);
}


// The time limit, as examples/slurm/kiln.sbatch meets it (its resource lines
// for a GPU node replaced by two tasks here): --signal=USR1@100 with a two
// minute limit sends SIGUSR1 about 20 s in (10 s in, a rank of a loaded
// machine was now and then still loading its libraries, before any code of
// kiln's could block the signal, and its default action killed it); the run
// trains for about 32 s. With preempt_signal = "SIGUSR1"
// kiln commits at the step and exits 75 on both ranks, the script requeues
// the job, and it continues after (as often as the limit comes) to the
// uninterrupted run's weights and metrics, bitwise.
TEST(Slurm, TheTimeLimitsSignalCommitsRequeuesAndContinuesBitwise) {
  KILN_ONLY_IN_VARIANT("debian");
  TempDir dir, straight, limited;
  KILN_REQUIRE_SLURM(dir, cluster);
  auto manifest = [](const TempDir& at) {
    return slow_run(at, 250, 16, "every_n_steps = 8\nevery_n_epochs = 0\npreempt_signal = \"SIGUSR1\"\n");
  };
  const ProcessResult whole = cluster.command(
      {"/usr/bin/srun", "-n", "2", kiln_exe().string(), "fit", manifest(straight).string(), "--resume", "auto"},
      straight.path());
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  std::string script = read_file(source_dir() / "examples" / "slurm" / "kiln.sbatch"), kept;
  std::istringstream lines(script);
  for (std::string line; std::getline(lines, line);)
    if (line.find("--gpus-per-task") == std::string::npos && line.find("--cpus-per-task") == std::string::npos &&
        line.find("--ntasks-per-node") == std::string::npos)
      kept += line + "\n";
  write_file(limited / "kiln.sbatch", kept);
  const ProcessResult submitted = run_process(
      {"/usr/bin/sbatch", "--parsable", "-n", "2", "--time=2", "--signal=USR1@100",
       "--output=" + (limited / "job-%j.out").string(), (limited / "kiln.sbatch").string(), manifest(limited).string()},
      {.cwd = limited.path(), .env = {{"SLURM_CONF", cluster.env().at("SLURM_CONF")}, {"KILN", kiln_exe().string()}},
       .timeout = kTimeout});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.output;
  const std::string id = submitted.output.substr(0, submitted.output.find_first_of(";\n"));
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  const std::string state = cluster.await_end(id, deadline);
  const std::string out = read_file(limited / ("job-" + id + ".out"));
  ASSERT_EQ(state, "COMPLETED") << out << "\n--- the cluster's logs:\n" << cluster.logs();
  EXPECT_NE(out.find("preempted by SIGUSR1"), std::string::npos) << out;
  expect_the_same_run(straight, limited);
}

}  // namespace
}  // namespace kiln::test
