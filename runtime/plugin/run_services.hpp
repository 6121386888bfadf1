// What the host's service table reaches on the run's side: metrics, stop
// requests and the process group's shape. The trainer implements it; plugins
// see it only through kiln_host.
#pragma once

#include <cstdint>
#include <string>

namespace at {
class Tensor;
}

namespace kiln {

class RunServices {
 public:
  virtual ~RunServices() = default;
  virtual void record_metric(const std::string& plugin_id, const char* name, double value, double weight,
                             uint32_t flags) = 0;
  // A one-element tensor, read back only at log points (main thread).
  virtual void record_metric_tensor(const std::string& plugin_id, const char* name, const at::Tensor& value,
                                    double weight, uint32_t flags) = 0;
  virtual bool metric(const char* name, double* out) const = 0;
  virtual void request_stop(const std::string& plugin_id, const char* reason) = 0;
  virtual int32_t rank() const = 0;
  virtual int32_t world_size() const = 0;
  // kiln_host.collect: "" or why `rows` are refused (the run also fails the
  // step with it). `main_thread`: whether the caller is on the run's main
  // thread.
  virtual std::string collect(const std::string& plugin_id, bool main_thread, const char* name,
                              const at::Tensor& rows) {
    (void)plugin_id, (void)main_thread, (void)name, (void)rows;
    return "collecting rows is not available here";
  }
  // kiln_host.run_file_write: "" or why the file is refused. Where no run
  // directory is written (kiln inspect), the file is accepted and dropped.
  virtual std::string write_run_file(const std::string& plugin_id, const std::string& name, std::string bytes) {
    (void)plugin_id, (void)name, (void)bytes;
    return "";
  }
};

}  // namespace kiln
