// The kiln_host table handed to each plugin instance, and host-side helpers
// for the error objects that cross the ABI.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "kiln/abi.h"
#include "plugin/run_services.hpp"
#include "common/batch.hpp"

namespace kiln {

// One table per plugin instance, so that log lines and stop requests name
// the plugin that made them. Must outlive the instance (until destroy returns).
class PluginHost {
 public:
  // `sees_ranks` is false for data modules: they are told rank 0 of 1.
  PluginHost(std::string plugin_id, RunServices* run, bool sees_ranks = true);
  PluginHost(const PluginHost&) = delete;
  PluginHost& operator=(const PluginHost&) = delete;

  const kiln_host* table() const { return &table_; }
  const std::string& plugin_id() const { return plugin_id_; }
  RunServices* run() const { return run_; }
  bool sees_ranks() const { return sees_ranks_; }
  // The thread that created this table: the run's main thread (abi.h's
  // [main-thread] services are checked against it in debug builds).
  bool on_main_thread() const { return std::this_thread::get_id() == main_thread_; }

 private:
  std::string plugin_id_;
  RunServices* run_;
  bool sees_ranks_;
  std::thread::id main_thread_ = std::this_thread::get_id();
  kiln_host table_{};
};

// Creates an error as kiln_host.error_new does (for host-side failures that
// travel the same path as plugin errors).
kiln_error* make_error(const std::string& message, kiln_error_code code = KILN_ERROR_UNKNOWN);
// Returns the message of an error the host now owns (and its code, when
// `code` is given), and frees it. NULL gives "".
std::string take_error(kiln_error* error, kiln_error_code* code = nullptr);


}  // namespace kiln
