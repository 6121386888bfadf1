// The lifecycle of one run's plugins, exactly as docs/hooks.md states it:
//
//   create (callbacks, data module, model) -> prepare_data -> setup (same
//   order) -> body -> teardown(failed=0) (callbacks, model, data) -> destroy
//
// and on any failure after the first create:
//   on_exception on every created plugin, once (callbacks, model, data);
//   teardown(failed=1) on every plugin whose setup was entered, once;
//   destroy on every created plugin.
// A failure inside that cleanup is logged and never stops the rest; the first
// failure is the one reported.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/abi.h"
#include "plugin/plugin_instance.hpp"

namespace kiln {

// Thrown by the host to end a run for a reason that is not a plugin's error
// (a signal, a peer rank's failure).
class RunAborted : public std::runtime_error {
 public:
  RunAborted(kiln_failure_reason reason, const std::string& message)
      : std::runtime_error(message), reason_(reason) {}
  kiln_failure_reason reason() const { return reason_; }

 private:
  kiln_failure_reason reason_;
};

// The first failure of a run.
struct Failure {
  kiln_failure_reason reason = KILN_FAILURE_HOST_ERROR;
  std::string report;     // the one line printed: names plugin, hook, rank and message
  std::string message;    // the cause alone
  std::string plugin_id;  // empty for host failures
  std::string hook;
  int32_t rank = 0;
  bool bad_input = false;  // an unusable input met mid-run (a checkpoint): exit 2
};

class Session {
 public:
  Session(std::vector<std::unique_ptr<PluginInstance>> callbacks, std::unique_ptr<PluginInstance> data,
          std::unique_ptr<PluginInstance> model, int32_t rank);

  // Runs the whole lifecycle around `body`. `prepare_data` says whether this
  // process calls the data module's prepare_data (local rank 0 only);
  // `after_prepare` runs next on every rank (the barrier). Returns the first
  // failure, or nothing when every hook succeeded. Never throws.
  std::optional<Failure> run(kiln_stage stage, bool prepare_data, const std::function<void()>& after_prepare,
                             const std::function<void()>& body);

  // The signal interrupting this process ("" when none): a rank whose run
  // fails because a peer left while it is itself being interrupted by SIGINT
  // (its peer acted on the same Ctrl-C first) reports an interruption, not a
  // peer failure (docs/checkpoints.md, "Preemption").
  void interrupted_by(std::function<std::string()> interruption) { interruption_ = std::move(interruption); }

  PluginInstance& model() { return *model_; }
  PluginInstance& data() { return *data_; }
  const std::vector<std::unique_ptr<PluginInstance>>& callbacks() const { return callbacks_; }

 private:
  Failure classify(std::exception_ptr error) const;
  std::string interrupting_signal() const;
  void cleanup(kiln_stage stage, const Failure& failure);
  // Creation order; cleanup order (callbacks, model, data module).
  std::vector<PluginInstance*> creation_order();
  std::vector<PluginInstance*> cleanup_order();

  std::vector<std::unique_ptr<PluginInstance>> callbacks_;
  std::unique_ptr<PluginInstance> data_;
  std::unique_ptr<PluginInstance> model_;
  int32_t rank_;
  std::function<std::string()> interruption_;
};

}  // namespace kiln
