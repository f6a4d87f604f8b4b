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
        violation: ``[T, R]`` bool: the played action breaks at least one of the problem's
            declared ``Constraint`` s in expectation (the paper's instance-level violation
            ``E[c | a_t] < (1 - alpha) E[c | b_t]`` for ``Constraint.from_alpha``; all False when
            the problem declares none). The baseline's plays are judged too (see
            ``constraint_violation``).
        constraint_violation: ``[T, R, C]`` bool, one column per declared constraint in
            declaration order (``constraint_labels()`` names them): the played action's true
            means break that constraint (``Constraint.satisfied`` of ``expected`` against
            ``baseline_expected``). A play of the baseline action is judged like any other
            under an absolute constraint; under a relative one it meets its own bound by
            definition (the papers' rule, Daulton et al. 2019 s.3.1), so it never counts. A
            chance constraint (``confidence`` set) is counted against the true mean like any
            other. ``violation`` is its ``any`` over constraints. Traces written before this
            field existed read back with it ``None`` (``[T, R, 1]`` from ``violation`` when
            they declare one constraint).
        attrs: run information. For a ``Problem``: ``regret_available`` (False when the
            problem gives no expected outcomes: ``expected``, ``baseline_expected``,
            ``optimal_reward`` and ``regret`` are then NaN and ``violation`` is unknown, all
            False) and ``constraints`` (the declarations, ``Constraint.to_dict()`` each). A
            run that recorded a subset of the fields (``simulate(..., record=...)``) adds
            ``recorded`` (the names) and ``shape`` (``[T, R]``).

        fallback: ``[T, R]`` bool: the policy allowed no action and played its fallback
            (``Policy.last_fallback``; TS-ASC's ``fallback="safest"`` or ``"baseline"``). None
            when the policy cannot fall back (TS-ASC on the paper's path, plain TS, CLUCB,
            whose conservative play of the baseline is its rule, not a fallback).
        fallback_by: ``[T, R, G]`` bool, one column per guard of the policy
            (``attrs["fallback_constraints"]``, ``fallback_labels()``): the fallback plays whose
            played action the policy's own verdict at that step did not judge to meet that
            guard (the guards that bound; every fallback names at least one). None with
            ``fallback``.

        chance_claims: the calibration record of a policy with chance constraints (TS-ASC's
            ``Constraint(..., confidence=q)``; ``bayes_safe.diagnostics.chance_calibration`` reads
            it), else None. A dict: ``labels`` and ``confidence`` (one per chance constraint,
            ``G``), ``claimed [T, R, G]`` (the posterior probability the policy gave the played
            action), ``met [T, R, G]`` bool (the played action's true means meet the
            constraint), ``allowed [T, R]`` bool (the played action was allowed, not a
            fallback), ``edges`` (the reliability bins' inner edges of claimed probability), and
            per step, summed over replications, ``count``, ``met_count`` and ``claimed_sum``
            ``[T, G, 2, B]`` (every candidate action, not allowed / allowed, by bin).
            ``truth_available`` is False when the problem gave no means. Kept in memory only
            (not written by ``to_netcdf``).

        learned_at: ``[T, R, M]`` int32, for a run with ``simulate(..., delays=...)`` (issue 45):
            the step at which metric ``m``'s outcome of the decision at step ``t`` was delivered
            to the policy (``t + lag``; ``t`` for a metric without delay), -1 when it was still
            pending at the end of the run (never learned). Recorded whatever ``record`` asks;
            None for a run without delays. ``pending()`` counts the -1s; ``attrs`` then hold
            ``delays`` (each delayed metric's lag, as text), ``delivery`` (how the policy was
            told: ``"step"``, ``"whole"`` or ``"models"``) and ``pending_at_end`` (per metric).
            ``observed``, ``regret`` and the violations stay those of the decision at step
            ``t`` (the outcome is realised then, whenever it is learned).

    Who caused the violations: ``baseline_played`` marks the plays of the baseline action;
    ``bayes_safe.metrics.violation_breakdown`` gives, per constraint, the violation rate, the
    share of violating plays that were baseline plays and the baseline's own rate.

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
    constraint_violation: torch.Tensor | None = None
    fallback: torch.Tensor | None = None
    fallback_by: torch.Tensor | None = None
    chance_claims: dict | None = None
    learned_at: torch.Tensor | None = None

    def __repr__(self) -> str:
        T, R = self.shape
        recorded = ", ".join(self.recorded)
        return (f"Trace(horizon={T}, replications={R}, metric_names={list(self.metric_names)}, alpha={self.alpha}, "
                f"recorded=[{recorded}], policy={self.attrs.get('policy', '?')!r}, "
                f"problem={self.attrs.get('problem', '?')!r})")

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
    def baseline_played(self) -> torch.Tensor | None:
        """``[T, R]`` bool: the play was the baseline's action (None when ``actions`` or
        ``baseline`` was not recorded)."""
        if self.actions is None or self.baseline is None:
            return None
        return self.actions == self.baseline

    def pending(self) -> torch.Tensor | None:
        """``[R, M]`` long: per replication and metric, the outcomes still pending at the end of the
        run (never learned: ``learned_at == -1``); None for a run without delays."""
        if self.learned_at is None:
            return None
        return (self.learned_at < 0).sum(0)

    def constraints(self) -> list:
        """The problem's declared constraints (``bayes_safe.envs.Constraint``), in declaration
        order: the columns of ``constraint_violation`` (empty when the trace has none)."""
        from .envs.problem import Constraint

        return [Constraint.from_dict(c) for c in self.attrs.get("constraints", ()) or ()]

    def constraint_labels(self) -> list[str]:
        """One distinct label per column of ``constraint_violation``: ``Constraint.describe()``
        (``"adverse_event <= 0.05"``), suffixed ``#j`` when two declarations read the same; the
        column index (``"constraint0"``) when the trace holds no declarations."""
        described = [c.describe() for c in self.constraints()]
        count = self.constraint_violation.shape[-1] if self.constraint_violation is not None else len(described)
        if len(described) != count:
            return [f"constraint{j}" for j in range(count)]
        return [f"{d} #{j}" if described.count(d) > 1 else d for j, d in enumerate(described)]

    def fallback_constraints(self) -> list:
        """The policy's guards (``bayes_safe.envs.Constraint``) that ``fallback_by``'s columns
        refer to (``attrs["fallback_constraints"]``; empty when the policy cannot fall back)."""
        from .envs.problem import Constraint

        return [Constraint.from_dict(c) for c in self.attrs.get("fallback_constraints", ()) or ()]

    def fallback_labels(self) -> list[str]:
        """One distinct label per column of ``fallback_by`` (as ``constraint_labels``)."""
        described = [c.describe() for c in self.fallback_constraints()]
        count = self.fallback_by.shape[-1] if self.fallback_by is not None else len(described)
        if len(described) != count:
            return [f"guard{j}" for j in range(count)]
        return [f"{d} #{j}" if described.count(d) > 1 else d for j, d in enumerate(described)]

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
        for f in (*_FALLBACK_FIELDS, "learned_at"):
            part[f] = None if getattr(self, f) is None else getattr(self, f)[:, sl]
        if "pending_at_end" in attrs and self.learned_at is not None:
            attrs["pending_at_end"] = {n: int((self.learned_at[:, sl, m] < 0).sum())
                                       for m, n in enumerate(self.metric_names)}
        if self.chance_claims is not None:  # the per-replication tensors; the summed bins are dropped
            part["chance_claims"] = {k: (v[:, sl] if k in ("claimed", "met", "allowed") else v)
                                     for k, v in self.chance_claims.items()
                                     if k not in ("count", "met_count", "claimed_sum")}
        return Trace(**part, metric_names=list(self.metric_names), alpha=self.alpha, seeds=self.seeds[sl], attrs=attrs)

    def _constraint_column(self, label: str) -> str:
        """``violation_<label>`` with the label's spaces and symbols made column-safe."""
        safe = label.replace("<=", "le").replace(">=", "ge").replace(" x baseline", "_x_baseline")
        safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in safe)
        return "violation_" + "_".join(filter(None, safe.split("_")))

    def to_dataframe(self) -> pd.DataFrame:
        """Long format: one row per (step, replication); the recorded fields only.

        ``constraint_violation`` gives one bool column per constraint, ``violation_<label>``
        (``violation_adverse_event_le_0.05`` for ``adverse_event <= 0.05``; see
        ``constraint_labels``)."""
        T, R = self.shape
        data = {"step": np.repeat(np.arange(T), R), "replication": np.tile(np.arange(R), T)}
        for f, column in (("actions", "action"), ("baseline", "baseline"), ("regret", "regret"),
                          ("violation", "violation")):
            if getattr(self, f) is not None:
                data[column] = getattr(self, f).reshape(-1).numpy()
        if self.constraint_violation is not None:
            for j, label in enumerate(self.constraint_labels()):
                data[self._constraint_column(label)] = self.constraint_violation[..., j].reshape(-1).numpy()
        if self.fallback is not None:  # fallback, fallback_<label> per guard (fallback_adverse_event_le_0.05)
            data["fallback"] = self.fallback.reshape(-1).numpy()
            for j, label in enumerate(self.fallback_labels()):
                data["fallback_" + self._constraint_column(label)[len("violation_"):]] = (
                    self.fallback_by[..., j].reshape(-1).numpy())
        for m, name in enumerate(self.metric_names):
            for f, column in (("expected", "expected"), ("baseline_expected", "baseline"), ("observed", "observed"),
                              ("learned_at", "learned_at")):
                if getattr(self, f) is not None:
                    data[f"{column}_{name}"] = getattr(self, f)[..., m].reshape(-1).numpy()
        return pd.DataFrame(data)

    def to_xarray(self):
        """An ``xarray.Dataset`` with dimensions ``step``, ``replication``, ``metric`` and, when
        the trace has per-constraint violations, ``constraint`` (labelled by ``constraint_labels``)."""
        import xarray as xr

        dims2, dims3 = ("step", "replication"), ("step", "replication", "metric")
        variables = {}
        coords = {"step": np.arange(self.horizon), "replication": np.arange(self.replications),
                  "metric": list(self.metric_names), "seed": ("replication", np.asarray(self.seeds, dtype=np.int64))}
        for f in self.recorded:
            value = getattr(self, f).numpy()
            if f == "constraint_violation":
                if value.shape[-1] == 0:  # no declared constraints: nothing to store (read back empty)
                    continue
                variables[f] = (("step", "replication", "constraint"), value.astype(np.int8))
                coords["constraint"] = self.constraint_labels()
                continue
            variables[_VARIABLES.get(f, f)] = (dims3 if value.ndim == 3 else dims2,
                                              value.astype(np.int8) if f == "violation" else value)
        if self.fallback is not None:
            variables["fallback"] = (dims2, self.fallback.numpy().astype(np.int8))
            if self.fallback_by is not None and self.fallback_by.shape[-1] > 0:
                variables["fallback_by"] = (("step", "replication", "guard"), self.fallback_by.numpy().astype(np.int8))
                coords["guard"] = self.fallback_labels()
        if self.learned_at is not None:
            variables["learned_at"] = (dims3, self.learned_at.numpy())
        ds = xr.Dataset(variables, coords=coords)
        for k, v in self.attrs.items():
            if isinstance(v, bool):  # netCDF attributes have no bool: 0/1 (read back as bool)
                ds.attrs[k] = int(v)
            elif isinstance(v, (int, float, str)):
                ds.attrs[k] = v
            elif k == "constraints":  # the problem's Constraint declarations, as JSON
                ds.attrs["constraints_json"] = json.dumps(list(v))
            elif k == "fallback_constraints":  # the policy's guards (fallback_by's columns)
                ds.attrs["fallback_constraints_json"] = json.dumps(list(v))
            elif k in _JSON_ATTRS:  # the delays' record (dicts)
                ds.attrs[k + "_json"] = json.dumps(v)
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
        dtypes = {"actions": torch.long, "baseline": torch.long, "violation": torch.bool,
                  "constraint_violation": torch.bool}
        fields = {f: torch.as_tensor(ds[_VARIABLES.get(f, f)].values).to(dtypes.get(f, torch.float64))
                  if _VARIABLES.get(f, f) in ds else None for f in FIELDS}
        attrs = _read_attrs(ds.attrs)
        declared = len(attrs.get("constraints", ()) or ())
        # none declared (nothing stored), or a file written before the field existed: with one
        # declared constraint its column is ``violation`` itself; with several it is unknown
        if fields["constraint_violation"] is None and fields["violation"] is not None and declared <= 1:
            fields["constraint_violation"] = fields["violation"][..., None].clone()[..., :declared]
        if any(fields[f] is None for f in FIELDS if f != "constraint_violation"):  # some fields only (record=)
            attrs.setdefault("recorded", [f for f in FIELDS if fields[f] is not None])
            attrs.setdefault("shape", [int(ds.sizes["step"]), int(ds.sizes["replication"])])
        if "fallback" in ds:
            fields["fallback"] = torch.as_tensor(ds["fallback"].values).to(torch.bool)
            guards = len(attrs.get("fallback_constraints", ()) or ())
            fields["fallback_by"] = (torch.as_tensor(ds["fallback_by"].values).to(torch.bool) if "fallback_by" in ds
                                     else torch.zeros(*fields["fallback"].shape, guards, dtype=torch.bool))
        if "learned_at" in ds:
            fields["learned_at"] = torch.as_tensor(ds["learned_at"].values).to(torch.int32)
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
        elif k == "fallback_constraints_json":
            out["fallback_constraints"] = json.loads(v)
        elif k.endswith("_json") and k[: -len("_json")] in _JSON_ATTRS:
            out[k[: -len("_json")]] = json.loads(v)
        elif k in _BOOL_ATTRS:
            out[k] = bool(v)
        else:
            out[k] = v
    return out


#: dict attributes written as JSON (``<name>_json``): the delays' record (issue 45)
_JSON_ATTRS = ("delays", "pending_at_end")

#: attributes written as 0/1 that read back as bool
_BOOL_ATTRS = ("regret_available",)

#: the trace's fields, in order
FIELDS = ("actions", "baseline", "expected", "baseline_expected", "observed", "optimal_reward", "regret", "violation",
          "constraint_violation")

#: the fallback record (issue 39): recorded whenever the policy can fall back, whatever ``record=`` asks
_FALLBACK_FIELDS = ("fallback", "fallback_by")

#: NetCDF variable names that differ from the field names
_VARIABLES = {"actions": "action"}
