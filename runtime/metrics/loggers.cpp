#include "metrics/loggers.hpp"

#include <sstream>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "config/manifest.hpp"
#include "config/logger_registry.hpp"

namespace kiln {

class Loggers::Part : public Stateful {
 public:
  explicit Part(Loggers& loggers) : loggers_(loggers) {}
  void save(CheckpointSnapshot& snapshot) const override {
    for (const auto& [name, state] : loggers_.states()) snapshot.add("logger/" + name, state);
  }
  void load(const CheckpointFile& file) override {
    std::map<std::string, std::string> states;
    for (const auto& logger : loggers_.loggers_) {
      const std::string name = logger->name();
      if (file.has("logger/" + name)) states[name] = std::string(file.section("logger/" + name));
    }
    // An older kiln's: metrics.csv's text, and one line per other logger.
    if (file.has("metrics/csv")) states.emplace("csv", std::string(file.section("metrics/csv")));
    if (file.has("metrics/loggers")) {
      std::istringstream in{std::string(file.section("metrics/loggers"))};
      for (std::string line; std::getline(in, line);) {
        const size_t space = line.find(' ');
        if (space != std::string::npos) states.emplace(line.substr(0, space), line.substr(space + 1));
      }
    }
    loggers_.restore(std::move(states));
  }

 private:
  Loggers& loggers_;
};

Loggers::Loggers(const LoggingConfig& config, const std::filesystem::path& run_dir,
                 const std::vector<HParam>* hparams, bool evaluates_the_fit)
    : part_(std::make_unique<Part>(*this)) {
  const LoggerContext context{config, run_dir, hparams, evaluates_the_fit};
  for (const auto& name : config.loggers) {
    const LoggerEntry* entry = nullptr;
    for (const LoggerEntry& e : logger_registry())
      if (name == e.name) entry = &e;
    if (!entry) throw std::invalid_argument("unknown logger '" + name + "'");  // the manifest refuses it first
    loggers_.push_back(entry->make(context));
  }
}

Loggers::~Loggers() = default;
Loggers::Loggers(Loggers&& other) noexcept
    : loggers_(std::move(other.loggers_)),
      part_(std::make_unique<Part>(*this)),
      restored_(std::move(other.restored_)),
      may_open_(other.may_open_),
      open_(other.open_) {}
Loggers& Loggers::operator=(Loggers&& other) noexcept {
  loggers_ = std::move(other.loggers_);
  restored_ = std::move(other.restored_);
  may_open_ = other.may_open_;
  open_ = other.open_;
  return *this;
}

Stateful& Loggers::checkpoint_part() { return *part_; }

void Loggers::restore(std::map<std::string, std::string> states) { restored_ = std::move(states); }

void Loggers::open() { may_open_ = true; }

void Loggers::open_files() {
  for (auto& logger : loggers_) {
    const auto it = restored_.find(logger->name());
    logger->open(it == restored_.end() ? std::string() : it->second);
  }
  open_ = true;
}

void Loggers::log(const LogRow& row) {
  if (!may_open_) return;
  if (!open_) open_files();
  for (auto& logger : loggers_) logger->log(row);
}

void Loggers::flush() {
  for (auto& logger : loggers_) logger->flush();
}

void Loggers::finish(const RunEnd& end) {
  // A run that logged no row once its directory was open (a resume that
  // finds nothing left to run) still ends what its loggers record: without
  // this an MLflow run resumed that way stayed RUNNING after exit 0.
  if (!open_ && may_open_) {
    try {
      open_files();
    } catch (const std::exception& e) {
      spdlog::warn("the loggers could not open to record the run's end: {}", e.what());
    }
  }
  if (!open_) return;
  for (auto& logger : loggers_) {
    try {
      logger->finish(end);
    } catch (const std::exception& e) {
      spdlog::warn("the {} logger could not record the run's end: {}", logger->name(), e.what());
    }
  }
}

void check_loggers(const LoggingConfig& config, const std::filesystem::path& run_dir) {
  const LoggerContext context{config, run_dir, nullptr};
  for (const auto& name : config.loggers)
    for (const LoggerEntry& e : logger_registry())
      if (name == e.name && e.check) e.check(context);
}

std::map<std::string, std::string> Loggers::states() {
  if (!open_) return restored_;
  std::map<std::string, std::string> out;
  for (auto& logger : loggers_) out[logger->name()] = logger->state();
  return out;
}

}  // namespace kiln
