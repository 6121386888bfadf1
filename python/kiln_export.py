"""Exports a PyTorch model for kiln to train, with no Python in the run.

    import kiln_export
    kiln_export.export(model, example_input, "model.pt2")
    kiln_export.export(hf_model, tokenizer(texts, return_tensors="pt", padding=True), "model.pt2")

writes one .pt2 (torch.export.pt2_archive's package format) holding:

- "train": the module's forward in training mode, and "eval": in evaluation
  mode (Dropout and BatchNorm differ between them), both by torch.export;
  with an example batch that has "labels", also "predict": evaluation mode
  without them (what `kiln predict` runs);
- a dynamic first (batch) dimension, so that the last, shorter batch and any
  batch size run; every other dimension is the example's;
- the module's parameters and buffers under their state_dict names, which
  kiln trains and exports under the same names (load_state_dict reads them);
  a parameter with requires_grad False stays frozen in kiln;
- extra/kiln.json: the batch's name for each program input (a tensor example
  is the batch's "input", an example target its "target", a dict example's
  keys their own names) and a name for each output (a ModelOutput's or a
  dict's keys: "loss", "logits"; "output" for a lone tensor).

kiln's `kiln_exported` model plugin reads it:

    [model]
    path = "kiln_exported"
    program = "model.pt2"

A model whose forward computes its own loss, forward(input, target) -> a
scalar, is exported with example_target= and trained with loss = "output";
a Hugging Face model given "labels" returns its loss, which kiln trains from.

What kiln cannot train is refused with one line (KilnExportError): control
flow that depends on the data (torch.export cannot capture it), higher-order
operators other than grad-mode and autocast regions (torch.cond, torch.map,
...). Activation checkpointing enabled on the model is dropped by
torch.export; the exporter says so, and kiln recomputes what
`[model] activation_checkpointing` names instead. The only dependency is
torch (2.x).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import warnings

import torch

__all__ = ["export", "KilnExportError"]


class KilnExportError(Exception):
    """What kiln cannot train, in one line."""


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


# The higher-order operators kiln runs: a region under another grad mode or
# autocast state (torch.no_grad(), torch.autocast(enabled=False)).
_REGIONS = ("wrap_with_set_grad_enabled", "wrap_with_autocast")


def _two_rows(e: torch.Tensor) -> torch.Tensor:
    # An example batch of one would make export specialise the batch to 1:
    # two rows at least, as every dimension it sees at size 1 is taken static.
    return e if e.shape[0] >= 2 else torch.cat([e, e])[:2]


def _export_mode(model: torch.nn.Module, examples, training: bool):
    """examples: a tuple of positional tensors, or a dict of named ones."""
    model.train(training)
    batch = torch.export.Dim("batch", min=1)
    named = isinstance(examples, dict)
    if named:
        args, kwargs = (), {k: _two_rows(v) for k, v in examples.items()}
        dynamic = {k: {0: batch} for k in kwargs}
    else:
        args, kwargs = tuple(_two_rows(e) for e in examples), None
        dynamic = tuple({0: batch} for _ in args)
    try:
        program = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic, strict=False)
    except Exception as error:  # torch's own errors are long: the first line names the cause
        name = type(error).__name__
        if "DataDependent" in name or "data-dependent" in str(error) or "GuardOnDataDependent" in str(error):
            raise KilnExportError(
                "the forward has control flow that depends on the data (an if or a loop on a tensor's "
                f"values), which torch.export cannot capture: {_one_line(error)}"
            ) from None
        if "Constraint" in name or "specializ" in str(error).lower():
            raise KilnExportError(
                "the batch dimension cannot be dynamic (the forward fixes it, e.g. a reshape to the example's "
                f"batch size): {_one_line(error)}"
            ) from None
        raise KilnExportError(f"torch.export failed ({'train' if training else 'eval'} mode): {_one_line(error)}") from None
    def check(graph):
        for node in graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
                if node.target.name() not in _REGIONS:
                    raise KilnExportError(
                        f"node '{node.name}' calls the higher-order operator {node.target.name()} "
                        "(torch.cond, torch.map, ...), which kiln does not run"
                    )
            if node.op == "get_attr" and isinstance(getattr(program.graph_module, node.target, None), torch.fx.GraphModule):
                check(getattr(program.graph_module, node.target).graph)

    check(program.graph)
    return program


def _input_names(program, named: bool) -> list:
    """The batch's name for each user input, in the program's order."""
    from torch.utils import _pytree as pytree

    count = len(program.graph_signature.user_inputs)
    args, kwargs = pytree.tree_unflatten(list(range(count)), program.call_spec.in_spec)
    names = [None] * count
    for position, index in enumerate(args):
        names[index] = ("input", "target")[position] if position < 2 else f"input{position}"
    for key, index in (kwargs or {}).items():
        names[index] = key
    return names


def _output_names(spec, prefix="") -> list:
    """A name for each leaf of the output's tree: a ModelOutput's or dict's keys
    ("loss", "logits"), a tuple's positions, "output" for a lone tensor."""
    if spec.is_leaf():
        return [prefix or "output"]
    context = spec.context
    if isinstance(context, (list, tuple)) and len(context) == spec.num_children and all(isinstance(k, str) for k in context):
        keys = list(context)
    elif hasattr(spec.type, "_fields"):
        keys = list(spec.type._fields)
    else:
        keys = [str(i) for i in range(spec.num_children)]
    out = []
    children = spec.children() if hasattr(spec, "children") else spec.children_specs
    for key, child in zip(keys, children):
        out += _output_names(child, f"{prefix}.{key}" if prefix else key)
    return out


def _checkpointing_enabled(model: torch.nn.Module) -> bool:
    # transformers marks each checkpointed layer (GradientCheckpointingLayer)
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def export(model: torch.nn.Module, example_input, path: str, example_target=None) -> str:
    """Writes model's training and evaluation programs and its weights to path (a .pt2).

    example_input: a tensor (the batch's "input"), or a dict of tensors as a
    tokenizer returns it (input_ids, attention_mask, labels, pixel_values, ...),
    each program input then bound to the batch's tensor of that name.
    example_target: for a forward(input, target) that returns the loss (kiln's loss = "output")."""
    if isinstance(example_input, dict) or hasattr(example_input, "keys"):
        examples = {k: example_input[k] for k in example_input.keys()}
        if example_target is not None:
            raise KilnExportError("with a dict example batch, pass the target as one of its tensors (\"labels\")")
        if not examples or not all(isinstance(v, torch.Tensor) for v in examples.values()):
            raise KilnExportError("the example batch must be a dict of tensors, as a tokenizer returns it")
    else:
        examples = (example_input,) if example_target is None else (example_input, example_target)
        if not all(isinstance(e, torch.Tensor) for e in examples):
            raise KilnExportError("example_input (and example_target) must be tensors: a batch as the data module hands it")
    checkpointing = _checkpointing_enabled(model)
    if checkpointing:
        warnings.warn(
            "kiln_export: the model has activation checkpointing enabled, which torch.export drops (the program "
            "keeps every activation); ask kiln for it instead: [model] activation_checkpointing = [\"<layers>.*\"]",
            stacklevel=2,
        )
    was_training = model.training
    try:
        programs = {
            "train": _export_mode(model, examples, True),
            "eval": _export_mode(model, examples, False),
        }
        # What `kiln predict` runs: no labels there.
        if isinstance(examples, dict) and "labels" in examples and len(examples) > 1:
            programs["predict"] = _export_mode(model, {k: v for k, v in examples.items() if k != "labels"}, False)
    finally:
        model.train(was_training)
    interface = {
        "kiln_export": 1,
        "checkpointing": checkpointing,
        "programs": {
            name: {
                "inputs": _input_names(program, isinstance(examples, dict)),
                "outputs": _output_names(program.call_spec.out_spec),
            }
            for name, program in programs.items()
        },
    }
    from torch.export.pt2_archive._package import package_pt2

    package_pt2(path, exported_programs=programs, extra_files={"kiln.json": json.dumps(interface)})
    return path


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Export a model for kiln: python kiln_export.py my_model.py MyModel --shape 3,32,32 -o model.pt2"
    )
    parser.add_argument("file", help="the Python file that defines the model")
    parser.add_argument("name", help="the nn.Module class (built with no arguments) or a function returning the model")
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument("--shape", help="one sample's shape, without the batch: 784 or 3,32,32")
    shape.add_argument(
        "--batch",
        help="a .safetensors file of named arrays (input_ids, attention_mask, labels): its first rows are the "
        "example batch, each program input bound to the array of its name",
    )
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed before the model is built")
    parser.add_argument("-o", "--output", default="model.pt2")
    args = parser.parse_args(argv)
    spec = importlib.util.spec_from_file_location("kiln_user_model", args.file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(args.seed)
    model = getattr(module, args.name)()
    if args.batch:
        from safetensors.torch import load_file

        example = {k: v[:2] for k, v in load_file(args.batch).items()}
    else:
        example = torch.randn(2, *[int(s) for s in args.shape.split(",")])
    try:
        export(model, example, args.output)
    except KilnExportError as error:
        print(f"kiln_export: {error}", file=sys.stderr)
        return 2
    print(f"kiln_export: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
