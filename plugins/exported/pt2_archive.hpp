// Reading a `.pt2` package (torch.export.pt2_archive's package_pt2, which
// python/kiln_export.py writes): a zip of stored records, each program's
// graph as JSON in the schema whose C++ types ship with LibTorch 2.x
// (torch/csrc/utils/generated_serialization_types.h), and each program's
// weights as raw bytes described by data/weights/<program>_weights_config.json.
//
// Every problem is an Pt2Error with one line that names the archive and what
// is wrong with it; the plugin turns it into a refusal (exit 2).
#pragma once

#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/Tensor.h>

namespace torch::_export {
class ExportedProgram;
}

namespace kiln_exported {

// One line, whatever the archive holds: names and targets come from its
// JSON and its zip directory, and a control character among them is shown
// escaped (\n, \x01), never written to the terminal.
class Pt2Error : public std::runtime_error {
 public:
  explicit Pt2Error(const std::string& message) : std::runtime_error(printable(message)) {}

 private:
  static std::string printable(const std::string& text) {
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (const char c : text) {
      const auto u = static_cast<unsigned char>(c);
      if (c == '\n') out += "\\n";
      else if (u < 0x20 || u == 0x7f) out += std::string("\\x") + hex[u >> 4] + hex[u & 15];
      else out += c;
    }
    return out;
  }
};

struct ProgramWeight {
  at::Tensor value;
  bool is_param = false;
  bool requires_grad = true;  // false: frozen in the module that was exported
};

struct Pt2Program {
  std::shared_ptr<const torch::_export::ExportedProgram> program;
  // By state_dict name ("fc1.weight"), the program's own copies.
  std::map<std::string, ProgramWeight> weights;
  // Tensors the program made while it was traced (torch.tensor(...) in a
  // forward), by the name its signature gives them: not state, not trained.
  std::map<std::string, at::Tensor> constants;
  // What python/kiln_export.py records of the program's interface
  // (extra/kiln.json): the batch's name for each user input, in order, and
  // a name for each user output ("loss", "logits"; "output" for a lone
  // tensor). Empty for an archive written without it.
  std::vector<std::string> input_names, output_names;
  // The module had activation checkpointing enabled when it was exported.
  bool had_checkpointing = false;
};

// The programs of an archive, by name ("train", "eval"). `torch_version` is
// the host's LibTorch ("2.15.0"): a program written by a newer torch is
// refused, as its operators and schema may be newer than this LibTorch's.
std::map<std::string, Pt2Program> read_pt2(const std::string& path, const std::string& torch_version);

// The same from bytes in memory (what the fuzz target feeds).
std::map<std::string, Pt2Program> read_pt2_bytes(const std::string& bytes, const std::string& name,
                                                 const std::string& torch_version);

}  // namespace kiln_exported
