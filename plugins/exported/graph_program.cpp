#include "graph_program.hpp"

#include <unordered_map>
#include <variant>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/utils/generated_serialization_types.h>

#include "kiln/config.hpp"
#include "pt2_archive.hpp"
#include "scalar_types.hpp"

namespace kiln_exported {

namespace ser = torch::_export;

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    out += (i ? ", " : "") + (shape[i] < 0 ? std::string("batch") : std::to_string(shape[i]));
  return out + "]";
}

std::string shape_text(at::IntArrayRef shape) { return shape_text(shape.vec()); }

// Where one argument of a call comes from.
struct ArgPlan {
  enum class Kind {
    constant,        // `value`
    slot,            // a graph value (`slot`)
    tensors,         // a Tensor[] of graph values
    optional_tensors,// a Tensor?[] (-1: None)
    ints,            // an int[] / SymInt[]: `ints`, where `slots` is -1, else the graph value
    device,          // a device: the inputs' (a program exported on the CPU runs where its inputs are)
  };
  Kind kind = Kind::constant;
  c10::IValue value;
  int slot = -1;
  std::vector<int> slots;
  std::vector<int64_t> ints;
};

// Where one result of a call goes.
struct OutPlan {
  int slot = -1;           // -1: dropped
  std::vector<int> slots;  // a Tensor[] result, unpacked
  bool unpack = false;
};

struct Step {
  enum class Kind { op, getitem, sym_size, int_arith } kind = Kind::op;
  std::string node;  // for messages
  std::optional<c10::OperatorHandle> op;
  std::vector<ArgPlan> args;
  std::vector<OutPlan> outs;
  char arith = 0;  // int_arith: + - * / (floor) %
};

}  // namespace

struct GraphProgram::Impl {
  std::string where;  // "'model.pt2', program 'train'"
  int slot_count = 0;
  std::unordered_map<std::string, int> slots;
  std::vector<std::pair<int, at::Tensor>> bound;  // parameters and buffers
  // Lifted constants: on the CPU as read, moved once to where the inputs are.
  std::vector<std::pair<int, at::Tensor>> constants;
  mutable std::vector<std::pair<int, at::Tensor>> constants_on_device;
  std::vector<int> input_slots;
  std::vector<std::string> input_names;
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<int> output_slots;
  std::vector<std::pair<int, at::Tensor>> buffer_writes;  // BUFFER_MUTATION outputs
  std::vector<Step> steps;
  std::map<std::string, int> operators;

  int slot_of(const std::string& name) {
    auto [it, added] = slots.emplace(name, slot_count);
    if (added) ++slot_count;
    return it->second;
  }
  int existing_slot(const std::string& name, const std::string& node) const {
    const auto it = slots.find(name);
    if (it == slots.end())
      throw Pt2Error(where + ": node '" + node + "' reads '" + name + "', which no earlier node produces");
    return it->second;
  }

  [[noreturn]] void refuse(const std::string& node, const std::string& target, const std::string& why) const {
    throw Pt2Error(where + ": node '" + node + "' (" + target + ") " + why);
  }

  ArgPlan plan(const ser::Argument& a, const std::string& node, const std::string& target) {
    using T = ser::Argument::Tag;
    ArgPlan p;
    switch (a.tag()) {
      case T::AS_NONE: return p;
      case T::AS_TENSOR:
        p.kind = ArgPlan::Kind::slot;
        p.slot = existing_slot(a.get_as_tensor().get_name(), node);
        return p;
      case T::AS_TENSORS:
        p.kind = ArgPlan::Kind::tensors;
        for (const auto& t : a.get_as_tensors()) p.slots.push_back(existing_slot(t.get_name(), node));
        return p;
      case T::AS_OPTIONAL_TENSORS:
        p.kind = ArgPlan::Kind::optional_tensors;
        for (const auto& t : a.get_as_optional_tensors())
          p.slots.push_back(t.tag() == ser::OptionalTensorArgument::Tag::AS_TENSOR
                                ? existing_slot(t.get_as_tensor().get_name(), node)
                                : -1);
        return p;
      case T::AS_OPTIONAL_TENSOR:
        if (a.get_as_optional_tensor().tag() == ser::OptionalTensorArgument::Tag::AS_NONE) return p;
        p.kind = ArgPlan::Kind::slot;
        p.slot = existing_slot(a.get_as_optional_tensor().get_as_tensor().get_name(), node);
        return p;
      case T::AS_INT: p.value = a.get_as_int(); return p;
      case T::AS_INTS: p.value = a.get_as_ints(); return p;
      case T::AS_FLOAT: p.value = a.get_as_float().get(); return p;
      case T::AS_FLOATS: {
        std::vector<double> v;
        for (const auto& f : a.get_as_floats()) v.push_back(f.get());
        p.value = v;
        return p;
      }
      case T::AS_BOOL: p.value = a.get_as_bool(); return p;
      case T::AS_BOOLS: {
        c10::List<bool> v;
        for (const bool b : a.get_as_bools()) v.push_back(b);
        p.value = v;
        return p;
      }
      case T::AS_STRING: p.value = a.get_as_string(); return p;
      case T::AS_STRINGS: {
        c10::List<std::string> v;
        for (const auto& text : a.get_as_strings()) v.push_back(text);
        p.value = v;
        return p;
      }
      case T::AS_SCALAR_TYPE: {
        const auto t = to_scalar_type(a.get_as_scalar_type());
        if (!t) refuse(node, target, "takes a dtype this LibTorch does not have");
        p.value = *t;
        return p;
      }
      case T::AS_LAYOUT: {
        const auto l = to_layout(a.get_as_layout());
        if (!l) refuse(node, target, "takes a layout kiln does not run");
        p.value = *l;
        return p;
      }
      case T::AS_MEMORY_FORMAT: {
        const auto m = to_memory_format(a.get_as_memory_format());
        if (!m) refuse(node, target, "takes a memory format kiln does not know");
        p.value = *m;
        return p;
      }
      case T::AS_DEVICE: p.kind = ArgPlan::Kind::device; return p;
      case T::AS_SYM_INT:
        if (a.get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_INT) {
          p.value = a.get_as_sym_int().get_as_int();
        } else {
          p.kind = ArgPlan::Kind::slot;
          p.slot = existing_slot(a.get_as_sym_int().get_as_name(), node);
        }
        return p;
      case T::AS_SYM_INTS:
        p.kind = ArgPlan::Kind::ints;
        for (const auto& s : a.get_as_sym_ints()) {
          const bool named = s.tag() == ser::SymIntArgument::Tag::AS_NAME;
          p.slots.push_back(named ? existing_slot(s.get_as_name(), node) : -1);
          p.ints.push_back(named ? 0 : s.get_as_int());
        }
        return p;
      case T::AS_SYM_BOOL:
        if (a.get_as_sym_bool().tag() == ser::SymBoolArgument::Tag::AS_BOOL) {
          p.value = a.get_as_sym_bool().get_as_bool();
        } else {
          p.kind = ArgPlan::Kind::slot;
          p.slot = existing_slot(a.get_as_sym_bool().get_as_name(), node);
        }
        return p;
      case T::AS_SYM_FLOAT:
        if (a.get_as_sym_float().tag() == ser::SymFloatArgument::Tag::AS_FLOAT) {
          p.value = a.get_as_sym_float().get_as_float().get();
        } else {
          p.kind = ArgPlan::Kind::slot;
          p.slot = existing_slot(a.get_as_sym_float().get_as_name(), node);
        }
        return p;
      case T::AS_GRAPH: refuse(node, target, "takes a subgraph: higher-order operators (cond, map, scan, ...) are not run");
      case T::AS_CUSTOM_OBJ: refuse(node, target, "takes a custom object (a TorchBind class), which kiln does not run");
      default: refuse(node, target, "takes an argument of a kind kiln does not run");
    }
  }

  OutPlan out_plan(const ser::Argument& a) {
    using T = ser::Argument::Tag;
    OutPlan o;
    switch (a.tag()) {
      case T::AS_TENSOR: o.slot = slot_of(a.get_as_tensor().get_name()); break;
      case T::AS_SYM_INT:
        if (a.get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_NAME) o.slot = slot_of(a.get_as_sym_int().get_as_name());
        break;
      case T::AS_SYM_BOOL:
        if (a.get_as_sym_bool().tag() == ser::SymBoolArgument::Tag::AS_NAME) o.slot = slot_of(a.get_as_sym_bool().get_as_name());
        break;
      case T::AS_SYM_FLOAT:
        if (a.get_as_sym_float().tag() == ser::SymFloatArgument::Tag::AS_NAME) o.slot = slot_of(a.get_as_sym_float().get_as_name());
        break;
      case T::AS_TENSORS:
        o.unpack = true;
        for (const auto& t : a.get_as_tensors()) o.slots.push_back(slot_of(t.get_name()));
        break;
      case T::AS_OPTIONAL_TENSORS:
        o.unpack = true;
        for (const auto& t : a.get_as_optional_tensors())
          o.slots.push_back(t.tag() == ser::OptionalTensorArgument::Tag::AS_TENSOR ? slot_of(t.get_as_tensor().get_name()) : -1);
        break;
      default: break;  // None, or a value nothing reads
    }
    return o;
  }

  void add_node(const ser::Node& n) {
    const std::string& target = n.get_target();
    const std::string node = n.get_name().value_or(target);
    Step step;
    step.node = node;
    constexpr const char* ops_prefix = "torch.ops.";
    if (target == "_operator.getitem") {
      step.kind = Step::Kind::getitem;
    } else if (target == "torch.ops.aten.sym_size.int") {
      step.kind = Step::Kind::sym_size;
    } else if (target.rfind("_operator.", 0) == 0) {
      static const std::map<std::string, char> arith{{"_operator.add", '+'}, {"_operator.sub", '-'},
                                                     {"_operator.mul", '*'}, {"_operator.floordiv", '/'},
                                                     {"_operator.mod", '%'}};
      const auto it = arith.find(target);
      if (it == arith.end()) refuse(node, target, "is a Python operator kiln does not run");
      step.kind = Step::Kind::int_arith;
      step.arith = it->second;
    } else if (target.rfind("torch.ops.higher_order.", 0) == 0) {
      refuse(node, target, "is a higher-order operator (control flow captured as a subgraph), which kiln does not run");
    } else if (target.rfind(ops_prefix, 0) == 0) {
      // torch.ops.<namespace>.<name>.<overload>
      const std::string rest = target.substr(std::string(ops_prefix).size());
      const size_t a = rest.find('.'), b = rest.rfind('.');
      if (a == std::string::npos || b == a) refuse(node, target, "names no operator overload");
      const std::string name = rest.substr(0, a) + "::" + rest.substr(a + 1, b - a - 1);
      const std::string overload = rest.substr(b + 1) == "default" ? "" : rest.substr(b + 1);
      step.op = c10::Dispatcher::singleton().findSchema({name, overload});
      if (!step.op)
        refuse(node, target,
               "calls " + name + (overload.empty() ? "" : "." + overload) +
                   ", which this LibTorch does not have; export with the torch whose LibTorch kiln is built against");
      ++operators[name + (overload.empty() ? "" : "." + overload)];
    } else {
      refuse(node, target, "is not an ATen operator; kiln runs programs of ATen operators only");
    }

    if (step.kind == Step::Kind::op) {
      const c10::FunctionSchema& schema = step.op->schema();
      std::map<std::string, const ser::Argument*> given;
      for (const auto& in : n.get_inputs()) given[in.get_name()] = &in.get_arg();
      for (const auto& arg : schema.arguments()) {
        const auto it = given.find(arg.name());
        if (it != given.end()) {
          step.args.push_back(plan(*it->second, node, target));
          // A number where the operator takes a Tensor (add_.Tensor(x, 1)):
          // Python wraps it as a 0-dim "wrapped number" tensor, which type
          // promotion treats as a scalar; so does this.
          ArgPlan& p = step.args.back();
          if (p.kind == ArgPlan::Kind::constant && arg.type()->kind() == c10::TypeKind::TensorType &&
              (p.value.isInt() || p.value.isDouble() || p.value.isBool())) {
            at::Tensor wrapped = at::scalar_tensor(p.value.toScalar(), at::TensorOptions().dtype(
                p.value.isInt() ? at::kLong : p.value.isDouble() ? at::kDouble : at::kBool));
            wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
            p.value = wrapped;
          }
        } else if (arg.default_value()) {
          ArgPlan p;
          p.value = *arg.default_value();
          step.args.push_back(p);
        } else {
          refuse(node, target, "lacks its argument '" + arg.name() + "', which has no default");
        }
        given.erase(arg.name());
      }
      if (!given.empty()) refuse(node, target, "passes '" + given.begin()->first + "', which the operator does not take");
    } else {
      for (const auto& in : n.get_inputs()) step.args.push_back(plan(in.get_arg(), node, target));
      if (step.args.size() != 2) refuse(node, target, "takes " + std::to_string(step.args.size()) + " arguments, not 2");
    }
    for (const auto& out : n.get_outputs()) step.outs.push_back(out_plan(out));
    steps.push_back(std::move(step));
  }
};

GraphProgram::GraphProgram(const ser::ExportedProgram& program, const std::string& archive, const std::string& name,
                           const std::map<std::string, at::Tensor>& state,
                           const std::map<std::string, at::Tensor>& constants)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = "'" + archive + "', program '" + name + "'";
  // The schema's unions read from JSON keep their first tag when the key is
  // one this LibTorch does not know (a newer torch's, or damage): reading
  // one then is that, not a bug of kiln's.
  try {
    bind(program, state, constants);
  } catch (const std::bad_variant_access&) {
    throw Pt2Error(impl_->where +
                   ": it holds a node, input or output of a kind this LibTorch's export schema does not know "
                   "(written by a newer torch, or damaged)");
  }
}

void GraphProgram::bind(const ser::ExportedProgram& program, const std::map<std::string, at::Tensor>& state,
                        const std::map<std::string, at::Tensor>& constants) {
  Impl& m = *impl_;
  const ser::GraphModule& gm = program.get_graph_module();
  const ser::Graph& graph = gm.get_graph();
  const auto& specs = gm.get_signature().get_input_specs();
  const auto& inputs = graph.get_inputs();
  if (specs.size() != inputs.size())
    throw Pt2Error(m.where + ": its signature names " + std::to_string(specs.size()) + " inputs, its graph takes " +
                   std::to_string(inputs.size()));
  auto bind = [&](const std::string& arg, const std::string& fqn, const char* kind) {
    const auto it = state.find(fqn);
    if (it == state.end()) throw Pt2Error(m.where + ": " + kind + " '" + fqn + "' is not among the archive's weights");
    m.bound.emplace_back(m.slot_of(arg), it->second);
  };
  using IS = ser::InputSpec::Tag;
  for (const auto& spec : specs) {
    switch (spec.tag()) {
      case IS::PARAMETER:
        bind(spec.get_parameter().get_arg().get_name(), spec.get_parameter().get_parameter_name(), "parameter");
        break;
      case IS::BUFFER:
        bind(spec.get_buffer().get_arg().get_name(), spec.get_buffer().get_buffer_name(), "buffer");
        break;
      case IS::USER_INPUT: {
        const ser::Argument& a = spec.get_user_input().get_arg();
        if (a.tag() != ser::Argument::Tag::AS_TENSOR)
          throw Pt2Error(m.where + ": an input that is not a tensor; kiln passes the batch's tensors only");
        const std::string& input = a.get_as_tensor().get_name();
        m.input_slots.push_back(m.slot_of(input));
        m.input_names.push_back(input);
        const auto meta = graph.get_tensor_values().find(input);
        std::vector<int64_t> shape;
        if (meta != graph.get_tensor_values().end()) {
          const auto& sizes = meta->second.get_sizes();
          for (size_t d = 0; d < sizes.size(); ++d) {
            if (sizes[d].tag() == ser::SymInt::Tag::AS_INT) {
              shape.push_back(sizes[d].get_as_int());
            } else if (d == 0) {
              shape.push_back(-1);
            } else {
              throw Pt2Error(m.where + ": dimension " + std::to_string(d) + " of input '" + input + "' is dynamic (" +
                             sizes[d].get_as_expr().get_expr_str() +
                             "); kiln batches along the first dimension only: export the others static");
            }
          }
        }
        m.input_shapes.push_back(shape);
        break;
      }
      case IS::TENSOR_CONSTANT: {
        const auto& c = spec.get_tensor_constant();
        const auto it = constants.find(c.get_tensor_constant_name());
        if (it == constants.end())
          throw Pt2Error(m.where + ": tensor constant '" + c.get_tensor_constant_name() + "' is not in the archive");
        m.constants.emplace_back(m.slot_of(c.get_arg().get_name()), it->second);
        break;
      }
      default:
        throw Pt2Error(m.where + ": an input of a kind kiln does not run (a custom object, a token or a constant input)");
    }
  }
  for (const auto& node : graph.get_nodes()) m.add_node(node);
  const auto& outputs = gm.get_signature().get_output_specs();
  using OS = ser::OutputSpec::Tag;
  for (const auto& spec : outputs) {
    switch (spec.tag()) {
      case OS::USER_OUTPUT: {
        const ser::Argument& a = spec.get_user_output().get_arg();
        if (a.tag() != ser::Argument::Tag::AS_TENSOR)
          throw Pt2Error(m.where + ": an output that is not a tensor; kiln takes tensors (logits, or a loss)");
        m.output_slots.push_back(m.existing_slot(a.get_as_tensor().get_name(), "output"));
        break;
      }
      case OS::BUFFER_MUTATION: {
        const auto& b = spec.get_buffer_mutation();
        const auto it = state.find(b.get_buffer_name());
        if (it == state.end()) throw Pt2Error(m.where + ": it updates buffer '" + b.get_buffer_name() + "', which it does not have");
        m.buffer_writes.emplace_back(m.existing_slot(b.get_arg().get_name(), "output"), it->second);
        break;
      }
      default:
        throw Pt2Error(m.where + ": an output of a kind kiln does not run (a gradient, a mutated input or parameter, a token)");
    }
  }
}

GraphProgram::~GraphProgram() = default;
GraphProgram::GraphProgram(GraphProgram&&) noexcept = default;
GraphProgram& GraphProgram::operator=(GraphProgram&&) noexcept = default;

const std::vector<std::vector<int64_t>>& GraphProgram::input_shapes() const { return impl_->input_shapes; }
const std::map<std::string, int>& GraphProgram::operators() const { return impl_->operators; }
size_t GraphProgram::node_count() const { return impl_->steps.size(); }

void GraphProgram::check_inputs(const std::vector<at::Tensor>& inputs, bool any_batch_size) const {
  const Impl& m = *impl_;
  if (inputs.size() != m.input_slots.size())
    throw kiln::InvalidInput(m.where + " takes " + std::to_string(m.input_slots.size()) + " inputs, given " +
                             std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& want = m.input_shapes[i];
    const at::IntArrayRef got = inputs[i].sizes();
    bool same = want.empty() || got.size() == want.size();
    for (size_t d = 0; same && d < want.size(); ++d)
      same = want[d] < 0 || want[d] == got[d] || (d == 0 && any_batch_size);
    if (!same)
      throw kiln::InvalidInput(m.where + " takes input '" + m.input_names[i] + "' of shape " + shape_text(want) +
                               ", the data module's batch has " + shape_text(got) +
                               ": export the model with an example batch of the data's shape");
  }
}

std::vector<at::Tensor> GraphProgram::run(const std::vector<at::Tensor>& inputs) const {
  const Impl& m = *impl_;
  check_inputs(inputs, false);
  std::vector<c10::IValue> values(m.slot_count);
  for (const auto& [slot, tensor] : m.bound) values[slot] = tensor;
  for (size_t i = 0; i < inputs.size(); ++i) values[m.input_slots[i]] = inputs[i];
  const c10::Device device = inputs.empty() ? c10::Device(c10::kCPU) : inputs[0].device();
  if (!m.constants.empty() && (m.constants_on_device.empty() || m.constants_on_device[0].second.device() != device)) {
    m.constants_on_device.clear();
    for (const auto& [slot, t] : m.constants) m.constants_on_device.emplace_back(slot, t.to(device));
  }
  for (const auto& [slot, t] : m.constants_on_device) values[slot] = t;
  torch::jit::Stack stack;
  for (const Step& step : m.steps) {
    stack.clear();
    for (const ArgPlan& a : step.args) {
      switch (a.kind) {
        case ArgPlan::Kind::constant: stack.push_back(a.value); break;
        case ArgPlan::Kind::slot: stack.push_back(values[a.slot]); break;
        case ArgPlan::Kind::device: stack.emplace_back(device); break;
        case ArgPlan::Kind::tensors: {
          c10::List<at::Tensor> list;
          list.reserve(a.slots.size());
          for (int s : a.slots) list.push_back(values[s].toTensor());
          stack.emplace_back(std::move(list));
          break;
        }
        case ArgPlan::Kind::optional_tensors: {
          c10::List<std::optional<at::Tensor>> list;
          for (int s : a.slots) list.push_back(s < 0 ? std::nullopt : std::optional<at::Tensor>(values[s].toTensor()));
          stack.emplace_back(std::move(list));
          break;
        }
        case ArgPlan::Kind::ints: {
          std::vector<int64_t> v = a.ints;
          for (size_t i = 0; i < v.size(); ++i)
            if (a.slots[i] >= 0) v[i] = values[a.slots[i]].toInt();
          stack.emplace_back(std::move(v));
          break;
        }
      }
    }
    switch (step.kind) {
      case Step::Kind::op: step.op->callBoxed(&stack); break;
      case Step::Kind::getitem: {
        const c10::IValue list = stack[0];
        const int64_t i = stack[1].toInt();
        stack.clear();
        stack.push_back(list.isTensorList() ? c10::IValue(list.toTensorList().get(i)) : list.toListRef().at(i));
        break;
      }
      case Step::Kind::sym_size: {
        const int64_t d = stack[1].toInt();
        const at::Tensor t = stack[0].toTensor();
        stack.clear();
        stack.emplace_back(t.size(d));
        break;
      }
      case Step::Kind::int_arith: {
        const int64_t x = stack[0].toInt(), y = stack[1].toInt();
        int64_t r = 0;
        switch (step.arith) {
          case '+': r = x + y; break;
          case '-': r = x - y; break;
          case '*': r = x * y; break;
          case '/': r = y == 0 ? 0 : (x / y - ((x % y != 0) && ((x < 0) != (y < 0)))); break;
          case '%': r = y == 0 ? 0 : ((x % y) + y) % y; break;
        }
        stack.clear();
        stack.emplace_back(r);
        break;
      }
    }
    const size_t n = std::min(stack.size(), step.outs.size());
    for (size_t i = 0; i < n; ++i) {
      const OutPlan& o = step.outs[i];
      if (o.unpack) {
        const auto list = stack[i].toListRef();
        for (size_t k = 0; k < o.slots.size() && k < list.size(); ++k)
          if (o.slots[k] >= 0) values[o.slots[k]] = list[k];
      } else if (o.slot >= 0) {
        values[o.slot] = std::move(stack[i]);
      }
    }
  }
  for (const auto& [slot, buffer] : m.buffer_writes) {
    at::NoGradGuard no_grad;
    buffer.copy_(values[slot].toTensor());
  }
  std::vector<at::Tensor> out;
  out.reserve(m.output_slots.size());
  for (int slot : m.output_slots) out.push_back(values[slot].toTensor());
  return out;
}

}  // namespace kiln_exported
