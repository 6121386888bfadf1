#include "train/session.hpp"

#include <signal.h>

#include <chrono>
#include <thread>

#include <spdlog/spdlog.h>

#include "util/errors.hpp"

namespace kiln {

Session::Session(std::vector<std::unique_ptr<PluginInstance>> callbacks, std::unique_ptr<PluginInstance> data,
                 std::unique_ptr<PluginInstance> model, int32_t rank)
    : callbacks_(std::move(callbacks)), data_(std::move(data)), model_(std::move(model)), rank_(rank) {}

std::vector<PluginInstance*> Session::creation_order() {
  std::vector<PluginInstance*> order;
  for (auto& c : callbacks_) order.push_back(c.get());
  order.push_back(data_.get());
  order.push_back(model_.get());
  return order;
}

std::vector<PluginInstance*> Session::cleanup_order() {
  std::vector<PluginInstance*> order;
  for (auto& c : callbacks_) order.push_back(c.get());
  order.push_back(model_.get());
  order.push_back(data_.get());
  return order;
}

// SIGINT only: the supervisor never sends it on its own, so it is always the
// user's Ctrl-C. A SIGTERM may be the supervisor stopping the survivors of a
// failed rank, whose own failure is then rightly a peer's.
std::string Session::interrupting_signal() const {
  if (!interruption_) return "";
  auto sigint = [this] {
    const std::string by = interruption_();
    return by == "SIGINT" ? by : std::string();
  };
  std::string by = sigint();
  // The signal reached this process too (the supervisor sends it to every
  // rank at once) but its watcher thread has not taken it yet: a moment.
  sigset_t pending;
  for (int i = 0; by.empty() && i < 100 && ::sigpending(&pending) == 0 && sigismember(&pending, SIGINT) == 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    by = sigint();
  }
  return by;
}

Failure Session::classify(std::exception_ptr error) const {
  Failure f;
  f.rank = rank_;
  const std::string on_rank = " on rank " + std::to_string(rank_);
  try {
    std::rethrow_exception(error);
  } catch (const HookError& e) {
    f.reason = KILN_FAILURE_PLUGIN_ERROR;
    // The plugin says the user's input is wrong (its config, a data file),
    // found before anything ran: bad input, exit 2 (abi.h, error codes).
    f.bad_input = e.code() == KILN_ERROR_INVALID_ARGUMENT && (e.hook() == "create" || e.hook() == "setup" || e.hook() == "check_batch");
    f.plugin_id = e.plugin_id();
    f.hook = e.hook();
    f.message = e.message();
    f.report = "plugin '" + e.plugin_id() + "' [" + e.slot() + "] failed in " + e.hook() + on_rank + ": " +
               e.message();
  } catch (const InputError& e) {
    f.reason = KILN_FAILURE_HOST_ERROR;
    f.bad_input = true;
    f.message = e.what();
    f.report = e.what();
  } catch (const Interrupted& e) {
    f.reason = KILN_FAILURE_INTERRUPTED;
    f.message = e.what();
    f.report = std::string(e.what()) + on_rank;
  } catch (const PeerFailure& e) {
    f.reason = KILN_FAILURE_PEER_FAILED;
    f.message = e.what();
    f.report = std::string("kiln failed") + on_rank + ": " + e.what();
    if (const std::string by = interrupting_signal(); !by.empty()) {
      f.reason = KILN_FAILURE_INTERRUPTED;
      f.message = "interrupted by " + by;
      f.report = f.message + on_rank + " (" + e.what() + ")";
    }
  } catch (const RunAborted& e) {
    f.reason = e.reason();
    f.message = e.what();
    f.report = std::string(e.what()) + on_rank;
  } catch (const std::exception& e) {
    // A Gloo transport error that escaped the collective wrappers (e.g. from
    // inside the autograd engine) still means a peer went away.
    spdlog::debug("{}", e.what());  // with its backtrace, if it has one
    const std::string text = one_line(e.what());
    const bool transport = text.find("gloo/transport") != std::string::npos;
    f.reason = transport ? KILN_FAILURE_PEER_FAILED : KILN_FAILURE_HOST_ERROR;
    f.message = text;
    f.report = std::string("kiln failed") + on_rank + ": " + text;
    if (const std::string by = transport ? interrupting_signal() : ""; !by.empty()) {
      f.reason = KILN_FAILURE_INTERRUPTED;
      f.message = "interrupted by " + by;
      f.report = f.message + on_rank + " (" + text + ")";
    }
  } catch (...) {
    f.message = "unknown exception";
    f.report = "kiln failed" + on_rank + ": unknown exception";
  }
  return f;
}

void Session::cleanup(kiln_stage stage, const Failure& failure) {
  kiln_exception_info info{};
  info.struct_size = sizeof(info);
  info.reason = failure.reason;
  info.message = failure.message.c_str();
  info.plugin_id = failure.plugin_id.empty() ? nullptr : failure.plugin_id.c_str();
  info.hook = failure.hook.empty() ? nullptr : failure.hook.c_str();
  info.rank = failure.rank;

  // Each call is isolated: a failing on_exception or teardown is logged and
  // the next plugin still gets its call.
  auto isolated = [](PluginInstance* p, const char* what, const std::function<void()>& call) {
    try {
      call();
    } catch (const std::exception& e) {
      spdlog::error("during cleanup ({} of '{}'): {}", what, p->id(), e.what());
    }
  };
  for (PluginInstance* p : cleanup_order())
    isolated(p, "on_exception", [&] { p->on_exception(info); });
  for (PluginInstance* p : cleanup_order())
    isolated(p, "teardown", [&] { p->teardown(stage, /*failed=*/true); });
  for (PluginInstance* p : cleanup_order()) p->destroy();
}

std::optional<Failure> Session::run(kiln_stage stage, bool prepare_data, const std::function<void()>& after_prepare,
                                    const std::function<void()>& body) {
  try {
    for (PluginInstance* p : creation_order()) p->create();
    if (prepare_data && data_->plugin().data_hooks().prepare_data)
      data_->check(data_->plugin().data_hooks().prepare_data(data_->instance()), "prepare_data");
    if (after_prepare) after_prepare();
    for (PluginInstance* p : creation_order()) p->setup(stage);
    body();
    for (PluginInstance* p : cleanup_order()) p->teardown(stage, /*failed=*/false);
    for (PluginInstance* p : cleanup_order()) p->destroy();
    return std::nullopt;
  } catch (...) {
    Failure failure = classify(std::current_exception());
    cleanup(stage, failure);
    return failure;
  }
}

}  // namespace kiln
