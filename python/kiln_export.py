"""Exports a PyTorch model for kiln to train, with no Python in the run.

    import kiln_export
    kiln_export.export(model, example_input, "model.pt2")

writes one .pt2 (torch.export.pt2_archive's package format) holding:

- "train": the module's forward in training mode, and "eval": in evaluation
  mode (Dropout and BatchNorm differ between them), both by torch.export;
- a dynamic first (batch) dimension, so that the last, shorter batch and any
  batch size run; every other dimension is the example's;
- the module's parameters and buffers under their state_dict names, which
  kiln trains and exports under the same names (load_state_dict reads them).

kiln's `kiln_exported` model plugin reads it:

    [model]
    path = "kiln_exported"
    program = "model.pt2"

A model whose forward computes its own loss, forward(input, target) -> a
scalar, is exported with example_target= and trained with loss = "output".

What kiln cannot train is refused with one line (KilnExportError): control
flow that depends on the data (torch.export cannot capture it), higher-order
operators (torch.cond, torch.map, ...). The only dependency is torch (2.x).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch

__all__ = ["export", "KilnExportError"]


class KilnExportError(Exception):
    """What kiln cannot train, in one line."""


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _export_mode(model: torch.nn.Module, examples: tuple, training: bool):
    model.train(training)
    batch = torch.export.Dim("batch", min=1)
    # An example batch of one would make export specialise the batch to 1:
    # two rows at least, as every dimension it sees at size 1 is taken static.
    examples = tuple(e if e.shape[0] >= 2 else torch.cat([e, e])[:2] for e in examples)
    try:
        program = torch.export.export(
            model, examples, dynamic_shapes=tuple({0: batch} for _ in examples), strict=False
        )
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
    for node in program.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
            raise KilnExportError(
                f"node '{node.name}' calls the higher-order operator {node.target.name()} "
                "(torch.cond, torch.map, ...), which kiln does not run"
            )
    return program


def export(model: torch.nn.Module, example_input: torch.Tensor, path: str, example_target=None) -> str:
    """Writes model's training and evaluation programs and its weights to path (a .pt2).

    example_target: for a forward(input, target) that returns the loss (kiln's loss = "output")."""
    examples = (example_input,) if example_target is None else (example_input, example_target)
    if not all(isinstance(e, torch.Tensor) for e in examples):
        raise KilnExportError("example_input (and example_target) must be tensors: a batch as the data module hands it")
    was_training = model.training
    try:
        programs = {
            "train": _export_mode(model, examples, True),
            "eval": _export_mode(model, examples, False),
        }
    finally:
        model.train(was_training)
    from torch.export.pt2_archive._package import package_pt2

    package_pt2(path, exported_programs=programs)
    return path


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Export a model for kiln: python kiln_export.py my_model.py MyModel --shape 3,32,32 -o model.pt2"
    )
    parser.add_argument("file", help="the Python file that defines the model")
    parser.add_argument("name", help="the nn.Module class (built with no arguments) or a function returning the model")
    parser.add_argument("--shape", required=True, help="one sample's shape, without the batch: 784 or 3,32,32")
    parser.add_argument("--seed", type=int, default=0, help="torch.manual_seed before the model is built")
    parser.add_argument("-o", "--output", default="model.pt2")
    args = parser.parse_args(argv)
    spec = importlib.util.spec_from_file_location("kiln_user_model", args.file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(args.seed)
    model = getattr(module, args.name)()
    shape = [int(s) for s in args.shape.split(",")]
    try:
        export(model, torch.randn(2, *shape), args.output)
    except KilnExportError as error:
        print(f"kiln_export: {error}", file=sys.stderr)
        return 2
    print(f"kiln_export: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
