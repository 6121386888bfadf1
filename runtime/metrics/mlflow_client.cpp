#include "metrics/mlflow_client.hpp"

#include <cstdlib>
#include <mutex>

#include <curl/curl.h>
#include <nlohmann/json.hpp>

namespace kiln {

namespace {

using json = nlohmann::json;

// libcurl's process-wide set-up, once, before the first handle (its
// curl_global_init is not thread-safe on its own).
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t append_body(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool env_true(const char* name) {
  const std::string v = env(name);
  return v == "true" || v == "True" || v == "TRUE" || v == "1";
}

// MLflow's error body: {"error_code": "...", "message": "..."}.
std::string server_message(const std::string& body) {
  try {
    const json j = json::parse(body);
    std::string out = j.value("error_code", "");
    const std::string message = j.value("message", "");
    if (!message.empty()) out += (out.empty() ? "" : ": ") + message;
    if (!out.empty()) return out;
  } catch (const std::exception&) {
  }
  std::string text = body.substr(0, 200);
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

}  // namespace

MlflowClient::MlflowClient(std::string tracking_uri, double timeout_s)
    : uri_(std::move(tracking_uri)), timeout_ms_(static_cast<long>(timeout_s * 1000)) {
  while (!uri_.empty() && uri_.back() == '/') uri_.pop_back();
  init_curl_once();
  curl_ = curl_easy_init();
  if (!curl_) throw std::runtime_error("libcurl could not make a handle");
}

MlflowClient::~MlflowClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

std::string MlflowClient::call(const std::string& method, const std::string& endpoint, const std::string& body) {
  CURL* c = static_cast<CURL*>(curl_);
  curl_easy_reset(c);
  const std::string url = uri_ + "/api/2.0/mlflow/" + endpoint;
  std::string response;
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // a background thread: no SIGALRM for timeouts
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms_);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms_);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &append_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &response);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_USERAGENT, "kiln");
  struct curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  // Credentials: MLflow's own variables, read at each request, never shown.
  const std::string token = env("MLFLOW_TRACKING_TOKEN");
  const std::string user = env("MLFLOW_TRACKING_USERNAME");
  std::string auth_header;
  if (!token.empty()) {
    auth_header = "Authorization: Bearer " + token;
    headers = curl_slist_append(headers, auth_header.c_str());
  }
  const std::string password = env("MLFLOW_TRACKING_PASSWORD");
  if (token.empty() && !user.empty()) {
    curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
    curl_easy_setopt(c, CURLOPT_USERNAME, user.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, password.c_str());
  }
  if (env_true("MLFLOW_TRACKING_INSECURE_TLS")) {
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (const std::string ca = env("MLFLOW_TRACKING_SERVER_CERT_PATH"); !ca.empty())
    curl_easy_setopt(c, CURLOPT_CAINFO, ca.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  if (method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  }
  const CURLcode code = curl_easy_perform(c);
  curl_slist_free_all(headers);
  if (code != CURLE_OK) {
    const std::string what = error[0] ? error : curl_easy_strerror(code);
    throw MlflowError(MlflowError::Kind::unreachable, 0, "no answer from " + uri_ + ": " + what);
  }
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 200 && status < 300) return response;
  const std::string message = "HTTP " + std::to_string(status) + " from " + endpoint + ": " + server_message(response);
  if (status == 401 || status == 403) throw MlflowError(MlflowError::Kind::login, status, message);
  if (status >= 400 && status < 500) throw MlflowError(MlflowError::Kind::refused, status, message);
  throw MlflowError(MlflowError::Kind::server, status, message);
}

std::string MlflowClient::experiment_id(const std::string& name) {
  CURL* c = static_cast<CURL*>(curl_);
  char* escaped = curl_easy_escape(c, name.c_str(), static_cast<int>(name.size()));
  const std::string query = escaped ? escaped : name;
  curl_free(escaped);
  try {
    const json j = json::parse(call("GET", "experiments/get-by-name?experiment_name=" + query, ""));
    return j.at("experiment").at("experiment_id").get<std::string>();
  } catch (const MlflowError& e) {
    if (e.kind() != MlflowError::Kind::refused || e.http_status() != 404) throw;
  } catch (const json::exception& e) {
    throw MlflowError(MlflowError::Kind::server, 200, std::string("experiments/get-by-name: not MLflow's answer: ") + e.what());
  }
  try {
    const json j = json::parse(call("POST", "experiments/create", json{{"name", name}}.dump()));
    return j.at("experiment_id").get<std::string>();
  } catch (const json::exception& e) {
    throw MlflowError(MlflowError::Kind::server, 200, std::string("experiments/create: not MLflow's answer: ") + e.what());
  }
}

std::string MlflowClient::create_run(const std::string& experiment_id, const std::string& run_name,
                                     const std::map<std::string, std::string>& tags, int64_t start_time_ms) {
  json body{{"experiment_id", experiment_id}, {"run_name", run_name}, {"start_time", start_time_ms}};
  json tag_list = json::array();
  for (const auto& [k, v] : tags) tag_list.push_back({{"key", k}, {"value", v}});
  body["tags"] = tag_list;
  try {
    const json j = json::parse(call("POST", "runs/create", body.dump()));
    return j.at("run").at("info").at("run_id").get<std::string>();
  } catch (const json::exception& e) {
    throw MlflowError(MlflowError::Kind::server, 200, std::string("runs/create: not MLflow's answer: ") + e.what());
  }
}

void MlflowClient::check_run(const std::string& run_id) { call("GET", "runs/get?run_id=" + run_id, ""); }

void MlflowClient::log_batch(const std::string& body) { call("POST", "runs/log-batch", body); }

void MlflowClient::update_run(const std::string& run_id, const std::string& status, int64_t end_time_ms) {
  json body{{"run_id", run_id}, {"status", status}};
  if (end_time_ms > 0) body["end_time"] = end_time_ms;
  call("POST", "runs/update", body.dump());
}

}  // namespace kiln
