"""Per-domain replication constraints (Kachuee & Lee 2022, eq. 1-2 and appendix A.1).

The replication rate of a policy ``Pi_theta`` with respect to the production policy
``Pi_0`` at a context ``x`` is (eq. 1)

```text
R_theta(x) = 1 - |Pi_theta(.|x) - Pi_0(.|x)|_1 / 2          in [0, 1]
```

(one minus the total-variation distance: the probability that the two policies, both
sampled, can be coupled to the same action). A constraint set gives each domain ``k`` a
range ``c_min_k <= R_theta(x) <= c_max_k`` that every context of that domain should meet
(eq. 2).

A constraint set is *data*: a list of rules, applied in order, each with a description, a
domain (a name, or ``"*"`` for every domain) and any of ``c_min`` / ``c_max``; a later rule
overrides an earlier one for the bounds it sets. The paper's benchmarks are JSON files in
``bayes_safe/offline/benchmarks/`` (see ``available_benchmarks``):

```json
{"name": "critical", "description": "...",
 "constraints": [
   {"description": "default for every domain", "domain": "*", "c_min": 0.75},
   {"description": "business critical", "domain": "shopping", "c_min": 0.9}]}
```
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

__all__ = ["BENCHMARK_DIR", "ReplicationConstraints", "available_benchmarks", "load_benchmark", "replication_rate"]

#: where the benchmark JSON files live
BENCHMARK_DIR = Path(__file__).resolve().parent / "benchmarks"


def replication_rate(probs: torch.Tensor, logging_probs: torch.Tensor) -> torch.Tensor:
    """Eq. (1): ``R(x) = 1 - |Pi_theta(.|x) - Pi_0(.|x)|_1 / 2``.

    Args:
        probs: ``[..., N, A]`` target-policy probabilities.
        logging_probs: ``[N, A]`` (or broadcastable) production-policy probabilities.

    Returns:
        ``[..., N]`` replication rates (differentiable in ``probs``).
    """
    if probs.shape[-1] != logging_probs.shape[-1]:
        raise ValueError(f"probs: last dimension {probs.shape[-1]} differs from logging_probs' {logging_probs.shape[-1]}")
    return 1.0 - 0.5 * (probs - logging_probs).abs().sum(-1)


def _bound(rule: Mapping, key: str, where: str) -> float | None:
    if key not in rule or rule[key] is None:
        return None
    try:
        v = float(rule[key])
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key} must be a number in [0, 1], got {rule[key]!r}") from None
    if not (math.isfinite(v) and 0.0 <= v <= 1.0):
        raise ValueError(f"{where}: {key} must be a number in [0, 1], got {rule[key]!r}")
    return v


@dataclasses.dataclass(frozen=True, eq=False)
class ReplicationConstraints:
    """Per-domain ranges ``c_min_k <= R_theta(x) <= c_max_k`` (eq. 2).

    Attributes:
        domain_names: the ``M`` domains, in the order of the data's domain codes.
        c_min, c_max: ``[M]`` float64 bounds; an unconstrained side is 0 (resp. 1).
        name, description: of the constraint set.
        rules: the rules it was built from (for reports).
    """

    domain_names: tuple[str, ...]
    c_min: torch.Tensor
    c_max: torch.Tensor
    name: str = ""
    description: str = ""
    rules: tuple = ()

    def __post_init__(self):
        m = len(self.domain_names)
        for attr in ("c_min", "c_max"):
            t = getattr(self, attr)
            if tuple(t.shape) != (m,):
                raise ValueError(f"{attr}: expected shape [{m}] (one per domain), got {list(t.shape)}")
            if not bool(((t >= 0) & (t <= 1)).all()):
                raise ValueError(f"{attr}: expected values in [0, 1], got {t.tolist()}")
        bad = (self.c_min > self.c_max).nonzero().reshape(-1).tolist()
        if bad:
            detail = ", ".join(f"{self.domain_names[i]}: c_min={float(self.c_min[i])} > c_max={float(self.c_max[i])}"
                               for i in bad)
            raise ValueError(f"constraints {self.name!r}: c_min > c_max for {detail}")

    @classmethod
    def uniform(cls, domain_names: Sequence[str], c_min: float = 0.0, c_max: float = 1.0) -> ReplicationConstraints:
        """The same range for every domain."""
        return cls.from_rules([{"description": "every domain", "domain": "*", "c_min": c_min, "c_max": c_max}],
                              domain_names, name="uniform")

    @classmethod
    def from_rules(cls, rules: Sequence[Mapping], domain_names: Sequence[str], name: str = "",
                   description: str = "") -> ReplicationConstraints:
        """Apply ``rules`` (see the module docstring) in order to ``domain_names``.

        Raises ValueError naming the rule for an unknown domain, a bound outside ``[0, 1]``, or
        ``c_min > c_max`` (within a rule, or for a domain after all rules).
        """
        names = tuple(str(d) for d in domain_names)
        if not names:
            raise ValueError("domain_names: expected at least one domain")
        if isinstance(rules, (str, bytes)) or not isinstance(rules, Sequence):
            raise TypeError(f"rules: expected a list of dicts, got {type(rules).__name__}")
        index = {d: i for i, d in enumerate(names)}
        lo = torch.zeros(len(names), dtype=torch.float64)
        hi = torch.ones(len(names), dtype=torch.float64)
        for j, rule in enumerate(rules):
            where = f"constraints {name!r} rule {j}" + (f" ({rule.get('description')!r})" if isinstance(rule, Mapping) and rule.get("description") else "")
            if not isinstance(rule, Mapping):
                raise TypeError(f"{where}: expected a dict, got {type(rule).__name__}")
            unknown = set(rule) - {"description", "domain", "domains", "c_min", "c_max"}
            if unknown:
                raise ValueError(f"{where}: unknown keys {sorted(unknown)}; expected description, domain(s), c_min, c_max")
            doms = rule.get("domains", rule.get("domain"))
            if doms is None:
                raise ValueError(f"{where}: needs a 'domain' (a name or '*')")
            doms = [doms] if isinstance(doms, str) else list(doms)
            targets = []
            for d in doms:
                if d == "*":
                    targets.extend(range(len(names)))
                elif str(d) in index:
                    targets.append(index[str(d)])
                else:
                    raise ValueError(f"{where}: unknown domain {d!r}; the data has domains {list(names)}")
            cmin, cmax = _bound(rule, "c_min", where), _bound(rule, "c_max", where)
            if cmin is None and cmax is None:
                raise ValueError(f"{where}: sets neither c_min nor c_max")
            if cmin is not None and cmax is not None and cmin > cmax:
                raise ValueError(f"{where}: c_min={cmin} > c_max={cmax}")
            idx = torch.tensor(targets, dtype=torch.int64)
            if cmin is not None:
                lo[idx] = cmin
            if cmax is not None:
                hi[idx] = cmax
        return cls(names, lo, hi, name=name, description=description, rules=tuple(dict(r) for r in rules))

    @classmethod
    def from_benchmark(cls, benchmark: str | Path | Mapping, domain_names: Sequence[str]) -> ReplicationConstraints:
        """A benchmark by name (``"global"``, ``"critical"``, ``"explore"``, ``"obd-..."``), JSON path, or dict."""
        spec = benchmark if isinstance(benchmark, Mapping) else load_benchmark(benchmark)
        if "constraints" not in spec:
            raise ValueError(f"benchmark: expected a dict with a 'constraints' list, got keys {sorted(spec)}")
        return cls.from_rules(spec["constraints"], domain_names, name=str(spec.get("name", "")),
                              description=str(spec.get("description", "")))

    # ------------------------------------------------------------------ evaluation
    @property
    def n_domains(self) -> int:
        return len(self.domain_names)

    def constrained(self) -> torch.Tensor:
        """``[M]`` bool: domains with a non-trivial range (``c_min > 0`` or ``c_max < 1``)."""
        return (self.c_min > 0) | (self.c_max < 1)

    def check_domains(self, domain_names: Sequence[str], what: str = "data") -> None:
        if tuple(domain_names) != self.domain_names:
            raise ValueError(f"constraints {self.name!r}: built for domains {list(self.domain_names)[:8]}..., "
                             f"but the {what} has domains {list(domain_names)[:8]}...; build the constraints "
                             "from the data's domain_names")

    def hinges(self, rate: torch.Tensor, domains: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-sample violation amounts ``max(0, c_min_k - R)`` and ``max(0, R - c_max_k)`` (eq. 4).

        Args:
            rate: ``[..., N]`` replication rates.
            domains: ``[N]`` domain codes.

        Returns:
            Two ``[..., N]`` tensors in ``rate``'s dtype (``torch.relu``: the gradient is exactly
            zero for a sample that does not violate, which the meta-gradient relies on).
        """
        lo, hi = self._bounds(rate.dtype)
        return torch.relu(lo[domains] - rate), torch.relu(rate - hi[domains])

    def _bounds(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``c_min, c_max`` in ``dtype`` (converted once per dtype: training asks every step)."""
        cache = self.__dict__.setdefault("_bounds_cache", {})
        if dtype not in cache:
            cache[dtype] = (self.c_min.to(dtype), self.c_max.to(dtype))
        return cache[dtype]

    def violated(self, rate: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
        """``[..., N]`` bool: ``R(x) < c_min_k`` or ``R(x) > c_max_k``."""
        below, above = self.hinges(rate.detach(), domains)
        return (below > 0) | (above > 0)

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "constraints": [dict(r) for r in self.rules],
                "c_min": dict(zip(self.domain_names, self.c_min.tolist())),
                "c_max": dict(zip(self.domain_names, self.c_max.tolist()))}


def available_benchmarks() -> list[str]:
    """Names of the shipped benchmark files."""
    return sorted(p.stem for p in BENCHMARK_DIR.glob("*.json"))


def load_benchmark(benchmark: str | Path) -> dict:
    """Read a benchmark JSON: a shipped name (see ``available_benchmarks``) or a file path."""
    path = Path(benchmark)
    if not path.suffix:
        path = BENCHMARK_DIR / f"{benchmark}.json"
        if not path.exists():
            raise ValueError(f"benchmark: unknown name {str(benchmark)!r}; expected one of {available_benchmarks()} "
                             "or a path to a JSON file")
    elif not path.exists():
        raise FileNotFoundError(f"benchmark: no such file {str(path)!r}")
    try:
        spec = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"benchmark: {str(path)!r} is not valid JSON ({exc})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("constraints"), list):
        raise ValueError(f"benchmark: {str(path)!r} must hold a JSON object with a 'constraints' list")  # noqa: TRY004
    return spec
