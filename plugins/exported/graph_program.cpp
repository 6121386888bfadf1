#include "graph_program.hpp"

#include <fnmatch.h>

#include <set>
#include <unordered_map>
#include <variant>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
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
  // enter_grad / enter_autocast begin a wrapped region (a higher-order
  // operator's subgraph, inlined between them), leave ends the innermost.
  enum class Kind { op, getitem, sym_size, int_arith, enter_grad, enter_autocast, leave } kind = Kind::op;
  std::string node;  // for messages
  std::optional<c10::OperatorHandle> op;
  std::vector<ArgPlan> args;
  std::vector<OutPlan> outs;
  char arith = 0;  // int_arith: + - * / (floor) %
  // aten::_assert_tensor_metadata: the dtypes export traced, which autocast
  // (bf16-mixed) changes by design; skipped while autocast is on.
  bool traced_dtype_check = false;
  bool enabled = false;                       // enter_*: the region's grad mode or autocast
  std::optional<at::ScalarType> autocast_dtype;  // enter_autocast: the dtype it casts to, when given
};

// The grad mode and autocast state that wrapped regions set, restored as
// each region ends, and all of it when a run ends, an error included.
class RegionModes {
 public:
  explicit RegionModes(c10::DeviceType device) : device_(device) {}
  RegionModes(const RegionModes&) = delete;
  RegionModes& operator=(const RegionModes&) = delete;
  ~RegionModes() {
    while (!saved_.empty()) leave();
  }
  void enter_grad(bool enabled) {
    saved_.push_back({false, c10::GradMode::is_enabled(), false, at::kFloat});
    c10::GradMode::set_enabled(enabled);
  }
  // Autocast as torch.autocast(device_type, dtype, enabled) sets it, for the
  // device the program runs on (it runs where its inputs are, as its
  // device arguments do).
  void enter_autocast(bool enabled, std::optional<at::ScalarType> dtype) {
    saved_.push_back({true, false, at::autocast::is_autocast_enabled(device_),
                      at::autocast::get_autocast_dtype(device_)});
    at::autocast::set_autocast_enabled(device_, enabled);
    if (enabled && dtype) at::autocast::set_autocast_dtype(device_, *dtype);
  }
  void leave() {
    if (saved_.empty()) return;
    const Saved s = saved_.back();
    saved_.pop_back();
    if (s.autocast) {
      at::autocast::set_autocast_enabled(device_, s.autocast_enabled);
      at::autocast::set_autocast_dtype(device_, s.dtype);
    } else {
      c10::GradMode::set_enabled(s.grad);
    }
  }

 private:
  struct Saved {
    bool autocast;
    bool grad;
    bool autocast_enabled;
    at::ScalarType dtype;
  };
  c10::DeviceType device_;
  std::vector<Saved> saved_;
};

}  // namespace

namespace {

// The module a node belongs to that activation checkpointing recomputes:
// the outermost entry of its nn_module_stack ("key,fqn,class;...") whose
// module name matches a pattern; "" when none does.
// Each module name in a node's nn_module_stack ("key,fqn,class;..."), outermost first.
std::vector<std::string> stack_modules(const ser::Node& node) {
  std::vector<std::string> out;
  const auto& meta = node.get_metadata();
  const auto it = meta.find("nn_module_stack");
  if (it == meta.end()) return out;
  const std::string& stack = it->second;
  for (size_t begin = 0; begin <= stack.size();) {
    size_t end = stack.find(';', begin);
    if (end == std::string::npos) end = stack.size();
    const std::string entry = stack.substr(begin, end - begin);
    const size_t a = entry.find(','), b = a == std::string::npos ? a : entry.find(',', a + 1);
    if (b != std::string::npos && b > a + 1) out.push_back(entry.substr(a + 1, b - a - 1));
    begin = end + 1;
  }
  return out;
}

std::string recomputed_module(const ser::Node& node, const Recompute& recompute) {
  for (const std::string& fqn : stack_modules(node))
    for (const auto& pattern : recompute.modules)
      if (::fnmatch(pattern.c_str(), fqn.c_str(), 0) == 0) return fqn;
  return "";
}

}  // namespace

struct GraphProgram::Impl {
  std::string where;  // "'model.pt2', program 'train'"
  int slot_count = 0;
  // By name within a graph's scope: "" for the program's own graph,
  // "<node>/" for the subgraph a higher-order node wraps (whose names repeat
  // the outer graph's).
  std::unordered_map<std::string, int> slots;
  std::string scope;
  std::vector<std::pair<int, at::Tensor>> bound;  // parameters and buffers
  // Tensors the runtime does not place (non-persistent buffers), moved in
  // place to where the inputs are at the first run there.
  std::vector<at::Tensor> follow_inputs;
  bool has_regions = false;
  // Lifted constants: on the CPU as read, moved once to where the inputs are.
  std::vector<std::pair<int, at::Tensor>> constants;
  mutable std::vector<std::pair<int, at::Tensor>> constants_on_device;
  std::vector<int> input_slots;
  std::vector<std::string> input_names;
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<std::optional<at::ScalarType>> input_dtypes;
  std::vector<int> output_slots;
  std::vector<std::pair<int, at::Tensor>> buffer_writes;  // BUFFER_MUTATION outputs
  std::vector<Step> steps;
  std::map<std::string, int> operators;

  // Activation checkpointing: runs of steps from the nodes of one matching
  // module, run without keeping their activations and run again in
  // backward. A segment reads `reads` from before it and leaves `outs` for
  // what follows.
  struct Segment {
    size_t begin = 0, end = 0;  // steps
    std::vector<int> reads, outs;
  };
  std::vector<Segment> segments;
  std::vector<int> segment_at;  // by step: the segment that begins there, or -1
  size_t recomputed_nodes = 0;
  std::vector<std::string> module_names;  // in the order first seen
  // By step: the values whose last reader it is, dropped after it so that a
  // run holds no activation longer than autograd does.
  std::vector<std::vector<int>> release_after;

  // `mixed`: the run is under autocast (bf16-mixed), whatever a region sets.
  void exec(const Step& step, std::vector<c10::IValue>& values, const c10::Device& device,
            std::optional<RegionModes>& regions, torch::jit::Stack& stack, bool mixed) const;
  // Runs a segment through the Checkpoint function (autograd records the
  // segment as one node that recomputes it in backward).
  void checkpointed(const Segment& seg, std::vector<c10::IValue>& values, const c10::Device& device) const;
  // The steps [begin, end) on `values`, each value dropped after its last reader.
  void run_steps(size_t begin, size_t end, std::vector<c10::IValue>& values, const c10::Device& device,
                 bool mixed) const {
    std::optional<RegionModes> regions;
    if (has_regions) regions.emplace(device.type());
    torch::jit::Stack stack;
    for (size_t i = begin; i < end; ++i) {
      exec(steps[i], values, device, regions, stack, mixed);
      release(i, values);
    }
  }
  struct SegmentRun;
  struct Checkpoint;

  // After the graph is bound: when each value is last read, and the
  // checkpointed segments with what crosses their borders.
  void plan_lifetimes(const std::vector<std::pair<size_t, std::string>>& owners) {
    const size_t n = steps.size();
    std::vector<long> last(static_cast<size_t>(slot_count), -1);
    std::vector<int> touched;
    for (size_t i = 0; i < n; ++i) {
      touched.clear();
      reads_of(steps[i], touched);
      for (int s : touched) last[static_cast<size_t>(s)] = static_cast<long>(i);
    }
    std::set<int> kept(output_slots.begin(), output_slots.end());
    for (const auto& [slot, buffer] : buffer_writes) kept.insert(slot);
    release_after.assign(n, {});
    for (size_t s = 0; s < last.size(); ++s)
      if (last[s] >= 0 && !kept.count(static_cast<int>(s))) release_after[static_cast<size_t>(last[s])].push_back(static_cast<int>(s));
    segment_at.assign(n, -1);
    for (size_t k = 0; k < owners.size();) {
      size_t j = k + 1;
      const std::string& module = owners[k].second;
      if (module.empty()) {
        k = j;
        continue;
      }
      while (j < owners.size() && owners[j].second == module) ++j;
      Segment seg;
      seg.begin = owners[k].first;
      seg.end = j < owners.size() ? owners[j].first : n;
      std::set<int> written, read;
      for (size_t i = seg.begin; i < seg.end; ++i) {
        touched.clear();
        writes_of(steps[i], touched);
        written.insert(touched.begin(), touched.end());
      }
      for (size_t i = seg.begin; i < seg.end; ++i) {
        touched.clear();
        reads_of(steps[i], touched);
        for (int s : touched)
          if (!written.count(s) && read.insert(s).second) seg.reads.push_back(s);
      }
      for (int s : written)
        if (kept.count(s) || last[static_cast<size_t>(s)] >= static_cast<long>(seg.end)) seg.outs.push_back(s);
      if (seg.end > seg.begin && !seg.outs.empty()) {
        segment_at[seg.begin] = static_cast<int>(segments.size());
        segments.push_back(std::move(seg));
        recomputed_nodes += j - k;
      }
      k = j;
    }
  }
  void release(size_t step, std::vector<c10::IValue>& values) const {
    for (int slot : release_after[step]) values[slot] = c10::IValue();
  }
  // The slots a step reads and writes.
  static void reads_of(const Step& step, std::vector<int>& out) {
    for (const ArgPlan& a : step.args) {
      if (a.kind == ArgPlan::Kind::slot && a.slot >= 0) out.push_back(a.slot);
      for (int s : a.slots)
        if (s >= 0) out.push_back(s);
    }
  }
  static void writes_of(const Step& step, std::vector<int>& out) {
    for (const OutPlan& o : step.outs) {
      if (o.slot >= 0) out.push_back(o.slot);
      for (int s : o.slots)
        if (s >= 0) out.push_back(s);
    }
  }

  int slot_of(const std::string& name) {
    auto [it, added] = slots.emplace(scope + name, slot_count);
    if (added) ++slot_count;
    return it->second;
  }
  int existing_slot(const std::string& name, const std::string& node) const {
    const auto it = slots.find(scope + name);
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
    } else if (target == "torch.ops.higher_order.wrap_with_set_grad_enabled" ||
               target == "torch.ops.higher_order.wrap_with_autocast") {
      return add_region(n, node, target);
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
      step.traced_dtype_check = name == "aten::_assert_tensor_metadata";
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

  // torch.no_grad() / torch.set_grad_enabled and torch.autocast regions,
  // which export records as a higher-order node over a subgraph: the
  // subgraph's nodes inlined between a step that sets the mode and one that
  // restores it, its inputs the node's operands, its outputs the node's.
  void add_region(const ser::Node& n, const std::string& node, const std::string& target) {
    using T = ser::Argument::Tag;
    const auto& in = n.get_inputs();
    size_t g = 0;
    while (g < in.size() && in[g].get_arg().tag() != T::AS_GRAPH) ++g;
    if (g == in.size()) refuse(node, target, "wraps no subgraph");
    Step enter;
    enter.node = node;
    const auto flag = [&](size_t i) {
      if (i >= g || in[i].get_arg().tag() != T::AS_BOOL) refuse(node, target, "has no mode to set");
      return in[i].get_arg().get_as_bool();
    };
    if (target == "torch.ops.higher_order.wrap_with_set_grad_enabled") {
      enter.kind = Step::Kind::enter_grad;
      enter.enabled = flag(0);
    } else {
      // (device_type, dtype, enabled, cache_enabled, subgraph, *operands)
      enter.kind = Step::Kind::enter_autocast;
      enter.enabled = flag(2);
      if (in[1].get_arg().tag() == T::AS_SCALAR_TYPE) {
        enter.autocast_dtype = to_scalar_type(in[1].get_arg().get_as_scalar_type());
        if (!enter.autocast_dtype) refuse(node, target, "autocasts to a dtype this LibTorch does not have");
      }
    }
    std::vector<int> operands;
    for (size_t i = g + 1; i < in.size(); ++i) {
      const ser::Argument& a = in[i].get_arg();
      if (a.tag() == T::AS_TENSOR) {
        operands.push_back(existing_slot(a.get_as_tensor().get_name(), node));
      } else if (a.tag() == T::AS_SYM_INT && a.get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_NAME) {
        operands.push_back(existing_slot(a.get_as_sym_int().get_as_name(), node));
      } else {
        refuse(node, target, "passes its subgraph an operand that is not a tensor or a size");
      }
    }
    const ser::Graph& sub = *in[g].get_arg().get_as_graph().get_graph();
    if (sub.get_inputs().size() != operands.size())
      refuse(node, target, "passes " + std::to_string(operands.size()) + " operands to a subgraph of " +
                               std::to_string(sub.get_inputs().size()) + " inputs");
    const std::string outer = scope;
    scope = outer + node + "/";
    for (size_t i = 0; i < operands.size(); ++i) slots[scope + value_name(sub.get_inputs()[i], node, target)] = operands[i];
    has_regions = true;
    steps.push_back(std::move(enter));
    for (const auto& inner : sub.get_nodes()) add_node(inner);
    std::vector<int> results;
    for (const auto& out : sub.get_outputs()) {
      if (out.tag() == T::AS_TENSORS) {
        for (const auto& t : out.get_as_tensors()) results.push_back(existing_slot(t.get_name(), node));
      } else {
        results.push_back(existing_slot(value_name(out, node, target), node));
      }
    }
    Step leave;
    leave.kind = Step::Kind::leave;
    leave.node = node;
    steps.push_back(std::move(leave));
    scope = outer;
    // The node's results are the subgraph's values, under the outer names.
    std::vector<std::string> names;
    for (const auto& out : n.get_outputs()) {
      if (out.tag() == T::AS_TENSORS) {
        for (const auto& t : out.get_as_tensors()) names.push_back(t.get_name());
      } else if (out.tag() != T::AS_NONE) {
        names.push_back(value_name(out, node, target));
      }
    }
    if (names.size() > results.size())
      refuse(node, target, "names " + std::to_string(names.size()) + " results of a subgraph that returns " +
                               std::to_string(results.size()));
    for (size_t i = 0; i < names.size(); ++i) slots[scope + names[i]] = results[i];
  }

  // The name of a tensor or size a subgraph takes or returns.
  std::string value_name(const ser::Argument& a, const std::string& node, const std::string& target) const {
    using T = ser::Argument::Tag;
    if (a.tag() == T::AS_TENSOR) return a.get_as_tensor().get_name();
    if (a.tag() == T::AS_SYM_INT && a.get_as_sym_int().tag() == ser::SymIntArgument::Tag::AS_NAME)
      return a.get_as_sym_int().get_as_name();
    refuse(node, target, "has a subgraph value that is not a tensor or a size");
  }
};

GraphProgram::GraphProgram(const ser::ExportedProgram& program, const std::string& archive, const std::string& name,
                           const std::map<std::string, at::Tensor>& state,
                           const std::map<std::string, at::Tensor>& constants,
                           const std::map<std::string, at::Tensor>& unplaced, const Recompute& recompute)
    : impl_(std::make_unique<Impl>()) {
  impl_->where = "'" + archive + "', program '" + name + "'";
  // The schema's unions read from JSON keep their first tag when the key is
  // one this LibTorch does not know (a newer torch's, or damage): reading
  // one then is that, not a bug of kiln's.
  try {
    bind(program, state, constants, unplaced, recompute);
  } catch (const std::bad_variant_access&) {
    throw Pt2Error(impl_->where +
                   ": it holds a node, input or output of a kind this LibTorch's export schema does not know "
                   "(written by a newer torch, or damaged)");
  }
}

void GraphProgram::bind(const ser::ExportedProgram& program, const std::map<std::string, at::Tensor>& state,
                        const std::map<std::string, at::Tensor>& constants,
                        const std::map<std::string, at::Tensor>& unplaced, const Recompute& recompute) {
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
    if (it != state.end()) return m.bound.emplace_back(m.slot_of(arg), it->second), void();
    // A buffer registered with persistent=False: among the archive's constants.
    const auto other = unplaced.find(fqn);
    if (other == unplaced.end())
      throw Pt2Error(m.where + ": " + kind + " '" + fqn + "' is not among the archive's weights or constants");
    m.bound.emplace_back(m.slot_of(arg), other->second);
    m.follow_inputs.push_back(other->second);
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
        m.input_dtypes.push_back(meta == graph.get_tensor_values().end()
                                     ? std::nullopt
                                     : to_scalar_type(meta->second.get_dtype()));
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
  // Each top-level node's steps, and the module it belongs to when that
  // module is to be recomputed (its region's inlined steps go with it).
  std::vector<std::pair<size_t, std::string>> owners;  // (first step, module) per node
  std::set<std::string> seen;
  for (const auto& node : graph.get_nodes()) {
    for (const std::string& fqn : stack_modules(node))
      if (seen.insert(fqn).second) m.module_names.push_back(fqn);
    owners.emplace_back(m.steps.size(), recompute.modules.empty() ? std::string() : recomputed_module(node, recompute));
    m.add_node(node);
  }
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
        const auto held = state.find(b.get_buffer_name());
        const auto other = unplaced.find(b.get_buffer_name());
        if (held == state.end() && other == unplaced.end())
          throw Pt2Error(m.where + ": it updates buffer '" + b.get_buffer_name() + "', which it does not have");
        m.buffer_writes.emplace_back(m.existing_slot(b.get_arg().get_name(), "output"),
                                     held != state.end() ? held->second : other->second);
        break;
      }
      default:
        throw Pt2Error(m.where + ": an output of a kind kiln does not run (a gradient, a mutated input or parameter, a token)");
    }
  }
  m.plan_lifetimes(owners);
}

GraphProgram::~GraphProgram() = default;
GraphProgram::GraphProgram(GraphProgram&&) noexcept = default;
GraphProgram& GraphProgram::operator=(GraphProgram&&) noexcept = default;

const std::vector<std::vector<int64_t>>& GraphProgram::input_shapes() const { return impl_->input_shapes; }
const std::vector<std::string>& GraphProgram::input_names() const { return impl_->input_names; }
size_t GraphProgram::output_count() const { return impl_->output_slots.size(); }
size_t GraphProgram::recomputed_nodes() const { return impl_->recomputed_nodes; }
const std::vector<std::string>& GraphProgram::module_names() const { return impl_->module_names; }
const std::vector<std::optional<at::ScalarType>>& GraphProgram::input_dtypes() const { return impl_->input_dtypes; }
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

// What a checkpointed segment keeps for its backward: the values it read
// that are not the autograd function's inputs (buffers, constants, sizes),
// the random number generators' states and the autocast state it ran
// under, so that the recomputation draws the same dropout masks and casts
// the same way.
struct GraphProgram::Impl::SegmentRun : torch::CustomClassHolder {
  const Impl* m = nullptr;
  const Segment* seg = nullptr;
  c10::Device device{c10::kCPU};
  std::vector<c10::IValue> reads;    // by seg->reads; None where an input of the function
  std::vector<size_t> input_reads;   // each function input's position in seg->reads
  std::vector<size_t> tensor_outs;   // each function output's position in seg->outs
  at::Tensor cpu_rng, device_rng;
  bool autocast = false;
  at::ScalarType autocast_dtype = at::kFloat;
};

namespace {

at::Tensor rng_state(at::Generator g) {
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}
void set_rng_state(at::Generator g, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_state(state);
}

}  // namespace

struct GraphProgram::Impl::Checkpoint : torch::autograd::Function<GraphProgram::Impl::Checkpoint> {
  using variable_list = torch::autograd::variable_list;

  // Runs without gradients (the function's forward): the segment's
  // activations are dropped as it goes, as an eval step's would be.
  // `inputs` as a TensorList: the form autograd's custom functions take
  // their inputs in (a std::vector is passed through as a non-tensor).
  static variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList inputs,
                               c10::intrusive_ptr<SegmentRun> run, std::vector<c10::IValue>* values) {
    const Segment& seg = *run->seg;
    run->m->run_steps(seg.begin, seg.end, *values, run->device, run->autocast);
    variable_list out;
    std::vector<at::Tensor> integral;
    for (size_t k = 0; k < seg.outs.size(); ++k) {
      const c10::IValue& v = (*values)[seg.outs[k]];
      if (!v.isTensor()) continue;
      at::Tensor t = v.toTensor();
      // A view or an input handed on would tie the function's output to
      // another tensor's history: a copy of its own instead.
      bool aliased = t.is_view();
      for (const auto& in : inputs) aliased = aliased || t.is_same(in);
      if (aliased) t = t.clone();
      (*values)[seg.outs[k]] = t;
      run->tensor_outs.push_back(k);
      out.push_back(t);
      if (!c10::isFloatingType(t.scalar_type()) && !c10::isComplexType(t.scalar_type())) integral.push_back(t);
    }
    if (!integral.empty()) ctx->mark_non_differentiable(integral);
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["run"] = c10::IValue::make_capsule(run);
    return out;
  }

  // The segment again, with gradients, from its saved inputs, under the
  // generator and autocast state of its forward; then its gradients.
  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list grads) {
    const auto run = c10::static_intrusive_pointer_cast<SegmentRun>(ctx->saved_data["run"].toCapsule());
    const Impl& m = *run->m;
    const Segment& seg = *run->seg;
    const variable_list saved = ctx->get_saved_variables();
    std::vector<c10::IValue> values(static_cast<size_t>(m.slot_count));
    for (size_t k = 0; k < seg.reads.size(); ++k)
      if (!run->reads[k].isNone()) values[seg.reads[k]] = run->reads[k];
    variable_list detached;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor d = saved[i].detach();
      d.requires_grad_(saved[i].requires_grad());
      values[seg.reads[run->input_reads[i]]] = d;
      detached.push_back(d);
    }
    {
      at::Generator cpu = at::detail::getDefaultCPUGenerator();
      const at::Tensor cpu_now = rng_state(cpu);
      std::optional<at::Generator> device_gen;
      at::Tensor device_now;
      if (run->device_rng.defined()) {
        device_gen = at::globalContext().defaultGenerator(run->device);
        device_now = rng_state(*device_gen);
        set_rng_state(*device_gen, run->device_rng);
      }
      set_rng_state(cpu, run->cpu_rng);
      at::AutoGradMode grad(true);
      RegionModes modes(run->device.type());
      modes.enter_autocast(run->autocast, run->autocast_dtype);
      try {
        m.run_steps(seg.begin, seg.end, values, run->device, run->autocast);
      } catch (...) {
        set_rng_state(cpu, cpu_now);
        if (device_gen) set_rng_state(*device_gen, device_now);
        throw;
      }
      set_rng_state(cpu, cpu_now);
      if (device_gen) set_rng_state(*device_gen, device_now);
    }
    variable_list outs, outs_grads;
    for (size_t j = 0; j < run->tensor_outs.size() && j < grads.size(); ++j) {
      const at::Tensor t = values[seg.outs[run->tensor_outs[j]]].toTensor();
      if (grads[j].defined() && t.requires_grad()) {
        outs.push_back(t);
        outs_grads.push_back(grads[j]);
      }
    }
    // One gradient for each of forward's arguments: the inputs', then none
    // for the run and the values.
    variable_list result(saved.size() + 2);
    variable_list wanted;
    std::vector<size_t> at_input;
    for (size_t i = 0; i < detached.size(); ++i)
      if (detached[i].requires_grad()) {
        wanted.push_back(detached[i]);
        at_input.push_back(i);
      }
    if (outs.empty() || wanted.empty()) return result;
    const variable_list g = torch::autograd::grad(outs, wanted, outs_grads, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < g.size(); ++i) result[at_input[i]] = g[i];
    return result;
  }
};

void GraphProgram::Impl::checkpointed(const Segment& seg, std::vector<c10::IValue>& values,
                                      const c10::Device& device) const {
  auto run = c10::make_intrusive<SegmentRun>();
  run->m = this;
  run->seg = &seg;
  run->device = device;
  run->reads.resize(seg.reads.size());
  torch::autograd::variable_list inputs;
  for (size_t k = 0; k < seg.reads.size(); ++k) {
    const c10::IValue& v = values[seg.reads[k]];
    if (v.isTensor() && v.toTensor().requires_grad()) {
      inputs.push_back(v.toTensor());
      run->input_reads.push_back(k);
    } else {
      run->reads[k] = v;
    }
  }
  run->cpu_rng = rng_state(at::detail::getDefaultCPUGenerator());
  if (device.type() != c10::kCPU) run->device_rng = rng_state(at::globalContext().defaultGenerator(device));
  run->autocast = at::autocast::is_autocast_enabled(device.type());
  run->autocast_dtype = at::autocast::get_autocast_dtype(device.type());
  const torch::autograd::variable_list out = Checkpoint::apply(at::TensorList(inputs), run, &values);
  for (size_t j = 0; j < out.size(); ++j) values[seg.outs[run->tensor_outs[j]]] = out[j];
}

// One step of the program on `values` (Impl::exec).
void GraphProgram::Impl::exec(const Step& step, std::vector<c10::IValue>& values, const c10::Device& device,
                              std::optional<RegionModes>& regions, torch::jit::Stack& stack, bool mixed) const {
  switch (step.kind) {
    case Step::Kind::enter_grad: regions->enter_grad(step.enabled); return;
    case Step::Kind::enter_autocast: regions->enter_autocast(step.enabled, step.autocast_dtype); return;
    case Step::Kind::leave: regions->leave(); return;
    default: break;
  }
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
    case Step::Kind::op:
      if (step.traced_dtype_check && mixed) {
        stack.clear();
        return;
      }
      step.op->callBoxed(&stack);
      break;
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
    default: break;
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
  // Non-persistent buffers follow the module's floating-point dtype too,
  // as module.to(torch.bfloat16) casts them (kiln's bf16-true casts the
  // parameters and buffers it holds, not these): a rotary embedding's
  // inv_freq in float32 would turn a bfloat16 attention into float32.
  std::optional<at::ScalarType> floating;  // set only for a bfloat16 or float16 module
  for (const auto& [slot, tensor] : m.bound)
    if (at::isFloatingType(tensor.scalar_type())) {
      if (tensor.scalar_type() == at::kBFloat16 || tensor.scalar_type() == at::kHalf) floating = tensor.scalar_type();
      break;
    }
  for (const at::Tensor& t : m.follow_inputs) {
    const bool recast = floating && at::isFloatingType(t.scalar_type()) && t.scalar_type() != *floating;
    if (t.device() != device || recast) {
      at::NoGradGuard no_grad;
      at::Tensor shared = t;  // the same tensor every program of the module binds
      shared.set_data(t.to(device, recast ? *floating : t.scalar_type()));
    }
  }
  std::optional<RegionModes> regions;
  if (m.has_regions) regions.emplace(device.type());
  torch::jit::Stack stack;
  // Checkpointed segments only where backward will follow.
  const bool recompute = !m.segments.empty() && c10::GradMode::is_enabled();
  const bool mixed = at::autocast::is_autocast_enabled(device.type());
  for (size_t i = 0; i < m.steps.size();) {
    if (recompute && m.segment_at[i] >= 0) {
      const Impl::Segment& seg = m.segments[static_cast<size_t>(m.segment_at[i])];
      m.checkpointed(seg, values, device);
      i = seg.end;
      continue;
    }
    m.exec(m.steps[i], values, device, regions, stack, mixed);
    m.release(i, values);
    ++i;
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
