// MLflow's tracking REST API (/api/2.0/mlflow/), the calls the "mlflow"
// logger makes, over libcurl. Credentials come from MLflow's own
// environment variables (MLFLOW_TRACKING_TOKEN: a bearer token;
// MLFLOW_TRACKING_USERNAME/PASSWORD: basic auth; MLFLOW_TRACKING_INSECURE_TLS);
// they are read here and nowhere else, and never appear in a message.
// Not thread-safe: one client per thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

namespace kiln {

// Why a request failed, in the classes the logger acts on.
class MlflowError : public std::runtime_error {
 public:
  enum class Kind {
    unreachable,  // no answer: connection refused, DNS, timeout, TLS (retry later)
    login,        // 401/403: the credentials are refused or lack a permission
    refused,      // another 4xx: this request is wrong; sending it again will not help
    server,       // 5xx or an answer that is not MLflow's (retry later)
  };
  MlflowError(Kind kind, long http_status, const std::string& message)
      : std::runtime_error(message), kind_(kind), http_status_(http_status) {}
  Kind kind() const { return kind_; }
  long http_status() const { return http_status_; }
  bool worth_retrying() const { return kind_ == Kind::unreachable || kind_ == Kind::server; }

 private:
  Kind kind_;
  long http_status_;
};

class MlflowClient {
 public:
  // `tracking_uri`: http(s)://host[:port][/prefix]. `timeout_s`: the most one
  // request may take, connection included.
  MlflowClient(std::string tracking_uri, double timeout_s);
  ~MlflowClient();
  MlflowClient(const MlflowClient&) = delete;
  MlflowClient& operator=(const MlflowClient&) = delete;

  const std::string& tracking_uri() const { return uri_; }
  // The experiment's id; created when absent.
  std::string experiment_id(const std::string& name);
  // A new run; its id.
  std::string create_run(const std::string& experiment_id, const std::string& run_name,
                         const std::map<std::string, std::string>& tags, int64_t start_time_ms);
  // Throws MlflowError (refused) when the server has no such run.
  void check_run(const std::string& run_id);
  // POST runs/log-batch with `body` (a JSON object holding run_id and the
  // metrics/params/tags arrays, within MLflow's limits).
  void log_batch(const std::string& body);
  // status: "RUNNING", "FINISHED", "FAILED", "KILLED"; end_time_ms 0: none.
  void update_run(const std::string& run_id, const std::string& status, int64_t end_time_ms);

 private:
  // The response body of a 2xx; MlflowError otherwise.
  std::string call(const std::string& method, const std::string& endpoint, const std::string& body);
  std::string uri_;
  long timeout_ms_;
  void* curl_;  // CURL*, kept for its connection cache
};

}  // namespace kiln
