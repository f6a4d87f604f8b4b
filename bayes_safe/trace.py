"""The record of a simulation: per step and replication, what was played and what it was worth."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

__all__ = ["Trace"]


@dataclass
class Trace:
    """Per-step, per-replication record of a run (``T`` steps, ``R`` replications, ``M`` metrics).

    Attributes:
        actions, baseline: ``[T, R]`` long: the action played and the baseline's action.
        expected: ``[T, R, M]`` expected metrics of the played action (metric 0 = reward).
        baseline_expected: ``[T, R, M]`` expected metrics of the baseline action.
        observed: ``[T, R, M]`` observed (noisy) metrics.
        optimal_reward: ``[T, R]`` expected reward of the best feasible action.
        regret: ``[T, R]`` pseudo-regret ``optimal_reward - expected[..., 0]``.
        violation: ``[T, R]`` bool, the instance-level violation
            ``E[c | a_t] < (1 - alpha) E[c | b_t]`` for any constraint metric (all False when
            the problem has none); for a ``bayes_safe.envs.Problem``, the chosen action breaks
            one of the problem's declared ``Constraint`` s in expectation.
        attrs: run information. For a ``Problem``: ``regret_available`` (False when the
            problem gives no expected outcomes: ``expected``, ``baseline_expected``,
            ``optimal_reward`` and ``regret`` are then NaN and ``violation`` is unknown, all
            False) and ``constraints`` (the declarations, ``Constraint.to_dict()`` each). A
            run that recorded a subset of the fields (``simulate(..., record=...)``) adds
            ``recorded`` (the names) and ``shape`` (``[T, R]``).

    A field that was not recorded is ``None`` (``recorded`` lists the others); the methods
    below skip it.
    """

    actions: torch.Tensor | None
    baseline: torch.Tensor | None
    expected: torch.Tensor | None
    baseline_expected: torch.Tensor | None
    observed: torch.Tensor | None
    optimal_reward: torch.Tensor | None
    regret: torch.Tensor | None
    violation: torch.Tensor | None
    metric_names: list[str]
    alpha: float | None = None
    seeds: list[int] = field(default_factory=list)
    attrs: dict = field(default_factory=dict)

    @property
    def regret_available(self) -> bool:
        """False when the problem gave no expected outcomes (regret and violations unknown)."""
        return bool(self.attrs.get("regret_available", True))

    @property
    def recorded(self) -> list[str]:
        """The names of the fields this trace holds (all of ``FIELDS`` unless ``simulate`` was
        given a ``record`` subset)."""
        return [f for f in FIELDS if getattr(self, f) is not None]

    @property
    def shape(self) -> tuple[int, int]:
        """``(T, R)``: steps and replications."""
        for f in FIELDS:
            value = getattr(self, f)
            if value is not None:
                return int(value.shape[0]), int(value.shape[1])
        T, R = self.attrs.get("shape", (0, 0))
        return int(T), int(R)

    @property
    def horizon(self) -> int:
        return self.shape[0]

    @property
    def replications(self) -> int:
        return self.shape[1]

    def replication(self, r: int) -> Trace:
        """The trace of replication ``r`` alone (a ``[T, 1]`` trace)."""
        sl = slice(r, r + 1)
        part = {f: None if getattr(self, f) is None else getattr(self, f)[:, sl] for f in FIELDS}
        attrs = dict(self.attrs)
        if "shape" in attrs:
            attrs["shape"] = [self.horizon, 1]
        return Trace(**part, metric_names=list(self.metric_names), alpha=self.alpha, seeds=self.seeds[sl], attrs=attrs)

    def to_dataframe(self) -> pd.DataFrame:
        """Long format: one row per (step, replication); the recorded fields only."""
        T, R = self.shape
        data = {"step": np.repeat(np.arange(T), R), "replication": np.tile(np.arange(R), T)}
        for f, column in (("actions", "action"), ("baseline", "baseline"), ("regret", "regret"),
                          ("violation", "violation")):
            if getattr(self, f) is not None:
                data[column] = getattr(self, f).reshape(-1).numpy()
        for m, name in enumerate(self.metric_names):
            for f, column in (("expected", "expected"), ("baseline_expected", "baseline"), ("observed", "observed")):
                if getattr(self, f) is not None:
                    data[f"{column}_{name}"] = getattr(self, f)[..., m].reshape(-1).numpy()
        return pd.DataFrame(data)

    def to_xarray(self):
        """An ``xarray.Dataset`` with dimensions ``step``, ``replication`` and ``metric``."""
        import xarray as xr

        dims2, dims3 = ("step", "replication"), ("step", "replication", "metric")
        variables = {}
        for f in self.recorded:
            value = getattr(self, f).numpy()
            variables[_VARIABLES.get(f, f)] = (dims3 if value.ndim == 3 else dims2,
                                              value.astype(np.int8) if f == "violation" else value)
        ds = xr.Dataset(
            variables,
            coords={"step": np.arange(self.horizon), "replication": np.arange(self.replications),
                    "metric": list(self.metric_names), "seed": ("replication", np.asarray(self.seeds, dtype=np.int64))},
        )
        for k, v in self.attrs.items():
            if isinstance(v, bool):  # netCDF attributes have no bool: 0/1 (read back as bool)
                ds.attrs[k] = int(v)
            elif isinstance(v, (int, float, str)):
                ds.attrs[k] = v
            elif k == "constraints":  # the problem's Constraint declarations, as JSON
                ds.attrs["constraints_json"] = json.dumps(list(v))
        if self.alpha is not None:
            ds.attrs["alpha"] = float(self.alpha)
        return ds

    def to_netcdf(self, path) -> None:
        """Write the trace as NetCDF-4 (h5netcdf engine), atomically: all of it or nothing.

        The file is built in memory and written under a temporary name beside ``path``, then
        renamed onto it, after checking the free space (``bayes_safe.io.check_free_space``). A
        full disk raises ``OSError`` and leaves ``path`` as it was: h5py never writes to the disk
        itself (a failed HDF5 write crashes the interpreter when the file is closed).
        """
        from .io import atomic_write, atomic_write_bytes, check_free_space

        ds = self.to_xarray()
        try:
            data = ds.to_netcdf(engine="h5netcdf")  # the file, in memory
        except (ValueError, TypeError, NotImplementedError):  # an xarray that writes h5netcdf to files only
            check_free_space(Path(path).parent, int(ds.nbytes) + 65536, what=Path(path).name)
            atomic_write(path, lambda tmp: ds.to_netcdf(tmp, engine="h5netcdf"))
        else:
            atomic_write_bytes(path, data)

    @classmethod
    def from_netcdf(cls, path) -> Trace:
        import xarray as xr

        with xr.open_dataset(path, engine="h5netcdf") as ds:
            ds = ds.load()
        dtypes = {"actions": torch.long, "baseline": torch.long, "violation": torch.bool}
        fields = {f: torch.as_tensor(ds[_VARIABLES.get(f, f)].values).to(dtypes.get(f, torch.float64))
                  if _VARIABLES.get(f, f) in ds else None for f in FIELDS}
        attrs = _read_attrs(ds.attrs)
        if any(v is None for v in fields.values()):  # a trace of some fields only (simulate's record=)
            attrs.setdefault("recorded", [f for f in FIELDS if fields[f] is not None])
            attrs.setdefault("shape", [int(ds.sizes["step"]), int(ds.sizes["replication"])])
        return cls(**fields, metric_names=[str(m) for m in ds["metric"].values], alpha=ds.attrs.get("alpha"),
                   seeds=[int(s) for s in ds["seed"].values], attrs=attrs)


def _read_attrs(attrs) -> dict:
    """The trace's ``attrs`` from NetCDF attributes (the inverse of ``to_xarray``'s encoding)."""
    out = {}
    for k, v in attrs.items():
        if k == "alpha":
            continue
        if k == "constraints_json":
            out["constraints"] = json.loads(v)
        elif k in _BOOL_ATTRS:
            out[k] = bool(v)
        else:
            out[k] = v
    return out


#: attributes written as 0/1 that read back as bool
_BOOL_ATTRS = ("regret_available",)

#: the trace's fields, in order
FIELDS = ("actions", "baseline", "expected", "baseline_expected", "observed", "optimal_reward", "regret", "violation")

#: NetCDF variable names that differ from the field names
_VARIABLES = {"actions": "action"}
