"""The file pair of a saved state, and the encoder / decoder contexts the codecs write through.

A state named ``NAME`` is two files written side by side:

* ``NAME.json``: ``{"format": "bayes_safe.state", "version": 1, "kind": ..., "object": node,
  "tensors": {key: {"dtype", "shape"}}, "tensor_file": "NAME.safetensors", "sha256": ...}``.
  ``node`` describes the object (its type, its configuration as plain JSON, and the names of
  its tensors as ``{"tensor": key}``);
* ``NAME.safetensors``: exactly the tensors declared in the JSON (``safetensors`` holds raw
  numbers and a header, nothing executable). ``sha256`` ties it to the JSON file it was written
  with.

Reading checks everything before any object is built, and every problem is a ``StateError``
(a ``ValueError``) naming the file and what was expected.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch

FORMAT = "bayes_safe.state"
VERSION = 1
KINDS = ("model", "models", "policy", "policy-config")

_DTYPES = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


class StateError(ValueError):
    """A saved state that cannot be read: the message names the file and what was expected."""


def state_paths(path) -> tuple[Path, Path]:
    """``(NAME.json, NAME.safetensors)`` for ``path`` given as ``NAME``, ``NAME.json`` or ``NAME.safetensors``."""
    path = Path(path)
    if path.suffix in (".json", ".safetensors"):
        path = path.with_suffix("")
    return path.with_name(path.name + ".json"), path.with_name(path.name + ".safetensors")


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"cannot save tensors of dtype {dtype}; expected one of {sorted(_DTYPES)}") from None


def dtype_from_name(name, where: str) -> torch.dtype:
    if name not in _DTYPES:
        raise StateError(f"{where}: unknown dtype {name!r}; expected one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def _clean_json(value):
    """Plain JSON: non-finite floats become ``None`` (only informational fields hold them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean_json(v) for v in value]
    return value


class Encoder:
    """Collects the tensors of an object graph; shared objects are written once (``{"ref": n}``)."""

    def __init__(self, *, max_observations: int | None = None):
        self.tensors: dict[str, torch.Tensor] = {}
        self.max_observations = max_observations
        self._memo: dict[int, int] = {}
        self._alive: list = []  # keep encoded objects alive so their ids stay unique

    def tensor(self, t, hint: str) -> dict:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{hint}: expected a tensor, got {type(t).__name__}")
        key = f"{len(self.tensors):03d}.{hint}"
        dtype_name(t.dtype)
        self.tensors[key] = t.detach().cpu().contiguous().clone()
        return {"tensor": key}

    def optional(self, t, hint: str):
        return None if t is None else self.tensor(t, hint)

    def shared(self, obj, build) -> dict:
        """``build()`` the node of ``obj`` the first time, ``{"ref": n}`` afterwards."""
        if id(obj) in self._memo:
            return {"ref": self._memo[id(obj)]}
        index = len(self._memo)
        self._memo[id(obj)] = index
        self._alive.append(obj)
        node = build()
        node["id"] = index
        return node


class Decoder:
    """Reads tensors by reference with shape / dtype / finiteness checks; every failure names the file."""

    def __init__(self, path: Path, tensors: dict[str, torch.Tensor], *, allow_imports: bool = False, resolve=None):
        self.path = path
        self.tensors = tensors
        self.allow_imports = allow_imports
        self.resolve = resolve  # resolves {"saved_as": ...} model references (policy configuration files)
        self.used: set[str] = set()
        self.objects: dict[int, object] = {}

    def fail(self, message: str):
        raise StateError(f"{self.path}: {message}")

    def field(self, node: dict, name: str, types, where: str):
        if not isinstance(node, dict) or name not in node:
            self.fail(f"{where}: missing field {name!r}")
        value = node[name]
        if types is not None and (not isinstance(value, types) or (isinstance(value, bool) and bool not in _tuple(types))):
            self.fail(f"{where}: field {name!r} has the wrong type ({type(value).__name__})")
        return value

    def int_field(self, node, name, where, minimum: int | None = 0, allow_none: bool = False):
        value = node.get(name) if isinstance(node, dict) else None
        if value is None and allow_none and isinstance(node, dict) and name in node:
            return None
        value = self.field(node, name, int, where)
        if minimum is not None and value < minimum:
            self.fail(f"{where}: field {name!r} must be >= {minimum}, got {value}")
        return value

    def float_field(self, node, name, where, allow_none: bool = False):
        if allow_none and isinstance(node, dict) and node.get(name, 0) is None:
            return None
        value = self.field(node, name, (int, float), where)
        if not math.isfinite(float(value)):
            self.fail(f"{where}: field {name!r} must be a finite number, got {value!r}")
        return float(value)

    def shape_field(self, node, name, where) -> tuple[int, ...]:
        value = self.field(node, name, list, where)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
            self.fail(f"{where}: field {name!r} must be a list of positive ints, got {value!r}")
        return tuple(value)

    def tensor(self, ref, where: str, *, shape=None, dtype=None, finite: bool = False, optional: bool = False):
        if ref is None and optional:
            return None
        if not isinstance(ref, dict) or not isinstance(ref.get("tensor"), str):
            self.fail(f"{where}: expected a tensor reference {{'tensor': name}}, got {ref!r}")
        key = ref["tensor"]
        if key not in self.tensors:
            self.fail(f"{where}: tensor {key!r} is missing from the tensor file")
        t = self.tensors[key]
        self.used.add(key)
        if dtype is not None:
            allowed = dtype if isinstance(dtype, tuple) else (dtype,)
            if t.dtype not in allowed:
                self.fail(f"{where}: tensor {key!r} has dtype {t.dtype}, expected {' or '.join(map(str, allowed))}")
        if shape is not None and tuple(t.shape) != tuple(shape):
            self.fail(f"{where}: tensor {key!r} has shape {list(t.shape)}, expected {list(shape)}")
        if finite and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            self.fail(f"{where}: tensor {key!r} holds non-finite values (NaN or inf)")
        return t

    def shared(self, node, decode):
        """Decode ``node`` (remembering it under its ``id``) or return the object a ``{"ref": n}`` names."""
        if isinstance(node, dict) and "ref" in node:
            ref = node["ref"]
            if ref not in self.objects:
                self.fail(f"reference {ref!r} to an object that is not defined before it")
            return self.objects[ref]
        obj = decode(node)
        if isinstance(node, dict) and "id" in node:
            if not isinstance(node["id"], int) or node["id"] in self.objects:
                self.fail(f"object id {node['id']!r} is not a new int")
            self.objects[node["id"]] = obj
        return obj


def _tuple(types):
    return types if isinstance(types, tuple) else (types,)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_pair(path, kind: str, node: dict, tensors: dict[str, torch.Tensor], extra: dict | None = None) -> Path:
    """Write ``NAME.safetensors`` then ``NAME.json`` (each atomically); return the JSON path."""
    from safetensors.torch import save_file

    from .. import __version__
    from ..io import atomic_write, atomic_write_text

    json_path, tensor_path = state_paths(path)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(tensor_path, lambda tmp: save_file(tensors, str(tmp), metadata={"format": FORMAT}))
    header = {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "bayes_safe_version": __version__,
        "tensor_file": tensor_path.name,
        "sha256": _sha256(tensor_path),
        "tensors": {k: {"dtype": dtype_name(t.dtype), "shape": list(t.shape)} for k, t in tensors.items()},
        **(extra or {}),
        "object": node,
    }
    text = json.dumps(_clean_json(header), indent=1, allow_nan=False) + "\n"
    atomic_write_text(json_path, text)
    return json_path


def _no_constant(name):
    raise ValueError(f"non-finite number {name} (the format writes none)")


def read_header(path) -> tuple[Path, dict]:
    """The checked JSON header of a state (no tensors read)."""
    json_path, _ = state_paths(path)
    if not json_path.is_file():
        raise StateError(f"{json_path}: no such state file (a saved state is NAME.json with NAME.safetensors)")
    try:
        header = json.loads(json_path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise StateError(f"{json_path}: not valid JSON ({exc}); expected a bayes_safe state file") from None
    except RecursionError:  # json's decoder recurses per level: 100,000 nested brackets exhaust the stack
        raise StateError(f"{json_path}: not a bayes_safe state file (JSON nested too deep)") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        got = header.get("format") if isinstance(header, dict) else type(header).__name__
        raise StateError(f"{json_path}: not a bayes_safe state file (format {got!r}, expected {FORMAT!r})")
    version = header.get("version")
    if version != VERSION:
        raise StateError(f"{json_path}: state format version {version!r} is not supported by this bayes_safe "
                         f"(which reads version {VERSION})")
    if header.get("kind") not in KINDS:
        raise StateError(f"{json_path}: unknown kind {header.get('kind')!r}; expected one of {list(KINDS)}")
    declared = header.get("tensors")
    if not isinstance(declared, dict) or not all(
        isinstance(v, dict) and isinstance(v.get("dtype"), str) and isinstance(v.get("shape"), list)
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in v["shape"])
        for v in declared.values()
    ):
        raise StateError(f"{json_path}: field 'tensors' must map names to {{'dtype', 'shape'}}")
    if not isinstance(header.get("object"), dict):
        raise StateError(f"{json_path}: field 'object' must describe the saved object")
    return json_path, header


def read_tensors(json_path: Path, header: dict) -> dict[str, torch.Tensor]:
    """The tensors of a state, checked against the JSON header (names, dtypes, shapes, checksum)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    name = header.get("tensor_file")
    if not isinstance(name, str) or name != os.path.basename(name) or not name.endswith(".safetensors"):
        raise StateError(f"{json_path}: field 'tensor_file' must name a .safetensors file beside it, got {name!r}")
    tensor_path = json_path.with_name(name)
    if not tensor_path.is_file():
        raise StateError(f"{tensor_path}: missing; {json_path.name} expects its tensors there")
    if header.get("sha256") != _sha256(tensor_path):
        raise StateError(f"{tensor_path}: its checksum differs from the one recorded in {json_path.name} "
                         "(truncated, modified, or not written with that file)")
    try:
        tensors = load_file(str(tensor_path))
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise StateError(f"{tensor_path}: not a readable safetensors file ({exc})") from None
    declared = header["tensors"]
    missing, extra = sorted(set(declared) - set(tensors)), sorted(set(tensors) - set(declared))
    if missing or extra:
        raise StateError(f"{tensor_path}: tensors differ from those declared in {json_path.name} "
                         f"(missing {missing[:5]}, unexpected {extra[:5]})")
    for key, spec in declared.items():
        t = tensors[key]
        dtype = dtype_from_name(spec["dtype"], str(json_path))
        if t.dtype != dtype or list(t.shape) != spec["shape"]:
            raise StateError(f"{tensor_path}: tensor {key!r} is {t.dtype} {list(t.shape)}, expected "
                             f"{dtype} {spec['shape']} as declared in {json_path.name}")
    return tensors
