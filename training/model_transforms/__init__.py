"""The model-transform registry: what happens to the model between building it and
parallelizing it (LoRA adapters, freezing, low-precision layers; torchtitan's "model converters").

One file per transform: ``<name>.py`` defines

- ``apply(model, options)``: change the freshly built model (on CPU, before FSDP); return the
  model to use (or None: changed in place);
- optionally ``check(options)``: judge the options before any worker starts, raising
  ``spec_schema.FieldError(<option>, <value>, <what is allowed>)``.

A job lists its transforms in order, each with its options (training/config_sections.py:
``TransformConfig``)::

    [[model.transforms]]
    name = "<file name>"
    options = { ... }

The job config imports this package and the named files to check them, so a transform file
imports only the standard library at module level (torch inside ``apply``). ``lora.py`` ships
(low-rank adapters; tests/training/test_lora.py, test_lora_peft.py).
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Iterable, Mapping

from spec_schema import FieldError


def transform_names() -> tuple[str, ...]:
    """The registered transforms: this folder's modules, by name."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


def _module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def check_transform(name: str, options: Mapping[str, Any]) -> None:
    """``name`` is registered and its options pass its own check (FieldError relative to the
    transform's table: ``name`` or ``options.<key>``)."""
    names = transform_names()
    if name not in names:
        raise FieldError("name", name, f"is not a model transform (known: {', '.join(names) or 'none yet'}; "
                                       "each is a file in training/model_transforms/)")
    check = getattr(_module(name), "check", None)
    if check is not None:
        try:
            check(dict(options))
        except FieldError as err:
            raise FieldError(f"options.{err.field}", err.value, err.allowed) from None


def apply_transforms(model: Any, transforms: Iterable[Any]) -> Any:
    """``model`` after each of the job's transforms (``model.transforms``), in order."""
    for transform in transforms:
        changed = _module(transform.name).apply(model, dict(transform.options))
        model = model if changed is None else changed
    return model
