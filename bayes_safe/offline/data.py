"""Logged bandit data: load, validate, split (Kachuee & Lee 2022, s.3.1).

A logged data set holds, for each of ``N`` rounds of a production (logging) policy
``Pi_0``: the context ``x`` (``[N, d]``), the logged action ``a`` (``[N]``, an integer in
``[0, A)``), the observed reward ``r`` (``[N]``), the logging propensity ``Pi_0(a|x)``
(``[N]``, in ``(0, 1]``), the domain ``k`` (``[N]``, an integer in ``[0, M)``, named by
``domain_names``), and optionally the full logging distribution ``Pi_0(.|x)``
(``[N, A]``, needed for the replication rate of eq. 1) and a mask of the actions available
in each round (``[N, A]`` bool; e.g. the items of a campaign).

Load from a pandas frame, CSV or Parquet with named columns:

```python
data = LoggedData.from_dataframe(
    df, context_columns=["f0", "f1"], action_column="action", reward_column="reward",
    propensity_column="pscore", domain_column="domain",
    logging_prob_columns=["pi0_0", "pi0_1", "pi0_2"])
```

Every check names the failing rows (by the frame's index labels), so a bad export can be
found and fixed: propensities outside ``(0, 1]``, missing values, actions outside
``[0, A)`` or not available in their round, logging distributions that do not sum to one or
disagree with the logged propensity, declared domains without samples.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = ["LoggedData", "LoggedDataError"]

#: how far a row of the logging distribution may be from summing to one, and from the logged propensity
PROB_TOL = 1e-4


class LoggedDataError(ValueError):
    """Invalid logged data. ``rows`` maps each problem to the failing row labels (all of them)."""

    def __init__(self, message: str, rows: dict[str, list] | None = None):
        super().__init__(message)
        self.rows = rows or {}


def _fmt_rows(labels: Sequence, limit: int = 10) -> str:
    shown = ", ".join(str(x) for x in list(labels)[:limit])
    more = f", ... ({len(labels)} rows in all)" if len(labels) > limit else ""
    return f"[{shown}{more}]"


def _raise_problems(problems: dict[str, list]) -> None:
    problems = {k: v for k, v in problems.items() if len(v)}
    if problems:
        lines = [f"  - {what}: rows {_fmt_rows(rows)}" for what, rows in problems.items()]
        raise LoggedDataError("logged data failed validation:\n" + "\n".join(lines), problems)


@dataclasses.dataclass(frozen=True, eq=False)
class LoggedData:
    """A validated logged bandit data set (construct with ``from_dataframe`` or ``from_tensors``).

    Attributes:
        contexts: ``[N, d]`` float32 context vectors ``x``.
        actions: ``[N]`` int64 logged actions ``a`` in ``[0, n_actions)``.
        rewards: ``[N]`` float32 observed rewards ``r``.
        propensities: ``[N]`` float64 ``Pi_0(a|x)`` of the logged action, in ``(0, 1]``.
        domains: ``[N]`` int64 domain index ``k`` in ``[0, M)``.
        domain_names: ``M`` names; ``domain_names[k]`` names domain ``k``.
        n_actions: ``A``.
        logging_probs: ``[N, A]`` float32 ``Pi_0(.|x)`` or None (then the replication rate,
            eq. 1, and constrained training are unavailable).
        action_mask: ``[N, A]`` bool, True where an action was available, or None (all available).
        expected_rewards: ``[N, A]`` float32 true mean rewards (synthetic data only) or None.
        row_labels: ``N`` labels of the source rows (the frame's index), for error messages.
    """

    contexts: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    propensities: torch.Tensor
    domains: torch.Tensor
    domain_names: tuple[str, ...]
    n_actions: int
    logging_probs: torch.Tensor | None = None
    action_mask: torch.Tensor | None = None
    expected_rewards: torch.Tensor | None = None
    row_labels: np.ndarray | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_tensors(
        cls,
        contexts,
        actions,
        rewards,
        propensities,
        domains,
        *,
        domain_names: Sequence[str] | None = None,
        n_actions: int | None = None,
        logging_probs=None,
        action_mask=None,
        expected_rewards=None,
        row_labels=None,
    ) -> LoggedData:
        """Build and validate from arrays (shapes as in the class docstring).

        ``n_actions`` defaults to the width of ``logging_probs`` / ``action_mask``, else to
        ``max(actions) + 1``; ``domain_names`` defaults to ``"0" .. str(M - 1)``.
        """
        x = contexts if torch.is_tensor(contexts) else torch.from_numpy(np.array(contexts, dtype=np.float32))
        x = x.to(torch.float32)
        if x.dim() == 1:
            x = x[:, None]
        if x.dim() != 2:
            raise ValueError(f"contexts: expected shape [N, d], got {list(x.shape)}")
        n = x.shape[0]
        if n == 0:
            raise ValueError("contexts: expected at least one row, got 0")

        def vec(v, name, dtype):
            t = v.reshape(-1) if torch.is_tensor(v) else torch.from_numpy(np.array(v, dtype=np.float64)).reshape(-1)
            if t.shape[0] != n:
                raise ValueError(f"{name}: expected {n} entries (one per context row), got {t.shape[0]}")
            return t.to(dtype)

        a_raw = vec(actions, "actions", torch.float64)
        r = vec(rewards, "rewards", torch.float64)
        p = vec(propensities, "propensities", torch.float64)
        k_raw = vec(domains, "domains", torch.float64)
        labels = np.arange(n) if row_labels is None else np.asarray(row_labels)

        def mat(v, name, dtype):
            if v is None:
                return None
            t = v if torch.is_tensor(v) else torch.from_numpy(np.array(v))
            if t.dim() != 2 or t.shape[0] != n:
                raise ValueError(f"{name}: expected shape [{n}, A], got {list(t.shape)}")
            return t.to(dtype)

        pi0 = mat(logging_probs, "logging_probs", torch.float64)
        mask = mat(action_mask, "action_mask", torch.bool)
        mu = mat(expected_rewards, "expected_rewards", torch.float32)
        widths = {t.shape[1] for t in (pi0, mask, mu) if t is not None}
        if len(widths) > 1:
            raise ValueError(f"logging_probs / action_mask / expected_rewards: widths differ ({sorted(widths)})")
        width = next(iter(widths)) if widths else None
        if n_actions is None:
            if width is not None:
                n_actions = width
            else:
                finite = a_raw[torch.isfinite(a_raw)]
                n_actions = int(finite.max()) + 1 if finite.numel() else 1
        n_actions = int(n_actions)
        if n_actions < 1:
            raise ValueError(f"n_actions: expected >= 1, got {n_actions}")
        if width is not None and width != n_actions:
            raise ValueError(f"n_actions: {n_actions} disagrees with the width {width} of "
                             "logging_probs / action_mask / expected_rewards")

        problems: dict[str, list] = {}
        bad_x = ~torch.isfinite(x).all(1)
        problems["context has a missing or non-finite value"] = labels[bad_x.numpy()].tolist()
        for t, what in ((a_raw, "action"), (r, "reward"), (p, "propensity"), (k_raw, "domain")):
            problems[f"{what} is missing or non-finite"] = labels[(~torch.isfinite(t)).numpy()].tolist()
        fin_a = torch.isfinite(a_raw)
        bad_a = fin_a & ((a_raw != a_raw.round()) | (a_raw < 0) | (a_raw >= n_actions))
        problems[f"action is not an integer in [0, {n_actions})"] = labels[bad_a.numpy()].tolist()
        fin_p = torch.isfinite(p)
        bad_p = fin_p & ((p <= 0) | (p > 1))
        problems["propensity Pi_0(a|x) is not in (0, 1]"] = labels[bad_p.numpy()].tolist()
        fin_k = torch.isfinite(k_raw)
        bad_k = fin_k & ((k_raw != k_raw.round()) | (k_raw < 0))
        problems["domain is not a non-negative integer code"] = labels[bad_k.numpy()].tolist()
        _raise_problems(problems)

        a = a_raw.to(torch.int64)
        k = k_raw.to(torch.int64)
        if domain_names is None:
            m = int(k.max()) + 1
            domain_names = tuple(str(i) for i in range(m))
        domain_names = tuple(str(d) for d in domain_names)
        if len(set(domain_names)) != len(domain_names):
            raise ValueError(f"domain_names: expected distinct names, got {list(domain_names)}")
        m = len(domain_names)
        out_of_range = k >= m
        if out_of_range.any():
            _raise_problems({f"domain code is not in [0, {m}) (domain_names has {m} names)": labels[out_of_range.numpy()].tolist()})
        counts = torch.bincount(k, minlength=m)
        empty = [domain_names[i] for i in range(m) if counts[i] == 0]
        if empty:
            raise LoggedDataError(
                f"domains: {len(empty)} declared domain(s) have no samples: {empty}; drop them from "
                "domain_names or add their rows", {"domain with no samples": empty})

        if mask is not None:
            rows = torch.arange(n)
            unavailable = ~mask[rows, a]
            problems["logged action is not available in its round (action_mask is False)"] = labels[unavailable.numpy()].tolist()
            none = ~mask.any(1)
            problems["no action is available (action_mask row all False)"] = labels[none.numpy()].tolist()
        if pi0 is not None:
            rows = torch.arange(n)
            finite = torch.isfinite(pi0).all(1)
            problems["logging_probs has a missing or non-finite value"] = labels[(~finite).numpy()].tolist()
            neg = finite & ((pi0 < 0) | (pi0 > 1)).any(1)
            problems["logging_probs has an entry outside [0, 1]"] = labels[neg.numpy()].tolist()
            sums = pi0.sum(1)
            off = finite & ((sums - 1).abs() > PROB_TOL)
            problems[f"logging_probs row does not sum to 1 (tolerance {PROB_TOL})"] = labels[off.numpy()].tolist()
            disagree = finite & ((pi0[rows, a] - p).abs() > PROB_TOL)
            problems["logging_probs[a] differs from the logged propensity"] = labels[disagree.numpy()].tolist()
            if mask is not None:
                leak = finite & ((pi0 > 0) & ~mask).any(1)
                problems["logging_probs puts mass on an unavailable action"] = labels[leak.numpy()].tolist()
        if mu is not None and not bool(torch.isfinite(mu).all()):
            problems["expected_rewards has a non-finite value"] = labels[(~torch.isfinite(mu).all(1)).numpy()].tolist()
        _raise_problems(problems)

        return cls(
            contexts=x.contiguous(),
            actions=a,
            rewards=r.to(torch.float32),
            propensities=p,
            domains=k,
            domain_names=domain_names,
            n_actions=n_actions,
            logging_probs=None if pi0 is None else pi0.to(torch.float32).contiguous(),
            action_mask=mask,
            expected_rewards=mu,
            row_labels=labels,
        )

    @classmethod
    def from_dataframe(
        cls,
        df,
        *,
        context_columns: Sequence[str],
        action_column: str = "action",
        reward_column: str = "reward",
        propensity_column: str = "propensity",
        domain_column: str = "domain",
        logging_prob_columns: Sequence[str] | None = None,
        action_mask_columns: Sequence[str] | None = None,
        domains: Sequence[str] | None = None,
        n_actions: int | None = None,
    ) -> LoggedData:
        """Build from a pandas ``DataFrame`` with named columns (one row per logged round).

        Args:
            df: the frame; its index labels name rows in error messages.
            context_columns: the ``d`` numeric columns of ``x``.
            action_column: integer action codes in ``[0, A)``.
            reward_column, propensity_column: ``r`` and ``Pi_0(a|x)``.
            domain_column: domain of each row (any hashable values; see ``domains``).
            logging_prob_columns: ``A`` columns with ``Pi_0(a'|x)`` for every action ``a'``
                (column ``j`` is action ``j``); optional.
            action_mask_columns: ``A`` boolean/0-1 columns, available actions; optional.
            domains: the domain names in index order. Default: the sorted distinct values of
                ``domain_column``. A value not in ``domains`` and a declared domain without
                rows are errors.
            n_actions: ``A``; default from the probability/mask columns, else max action + 1.
        """
        import pandas as pd

        if not isinstance(df, pd.DataFrame):
            raise TypeError(f"df: expected a pandas DataFrame, got {type(df).__name__}")
        if isinstance(context_columns, str):
            raise TypeError(f"context_columns: expected a list of column names, got the string {context_columns!r}")
        wanted = {"context_columns": list(context_columns), "action_column": [action_column],
                  "reward_column": [reward_column], "propensity_column": [propensity_column],
                  "domain_column": [domain_column], "logging_prob_columns": list(logging_prob_columns or []),
                  "action_mask_columns": list(action_mask_columns or [])}
        if not wanted["context_columns"]:
            raise ValueError("context_columns: expected at least one column name, got none")
        available = [str(c) for c in df.columns]
        repeated = sorted({str(c) for c in df.columns[df.columns.duplicated()]} & {str(c) for v in wanted.values() for c in v})
        if repeated:
            raise ValueError(f"df: column(s) {repeated[:10]} appear more than once; expected one column per name "
                             "(rename or drop the copies)")
        for arg, cols in wanted.items():
            missing = [c for c in cols if c not in df.columns]
            if missing:
                shown = available[:20] + (["..."] if len(available) > 20 else [])
                raise KeyError(f"{arg}: column(s) {missing} not in the data; available columns: {shown}")
        labels = df.index.to_numpy()

        def numeric(cols, arg):
            try:
                return df[cols].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
            except (TypeError, ValueError) as exc:  # pragma: no cover - pandas coerces
                raise TypeError(f"{arg}: expected numeric columns") from exc

        non_numeric = [c for c in wanted["context_columns"]
                       if not (pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]))]
        if non_numeric:
            raise TypeError(f"context_columns: columns {non_numeric[:10]} are not numeric; encode them first "
                            "(e.g. pandas.get_dummies)")
        x = numeric(wanted["context_columns"], "context_columns")
        a = numeric([action_column], "action_column")[:, 0]
        r = numeric([reward_column], "reward_column")[:, 0]
        p = numeric([propensity_column], "propensity_column")[:, 0]
        dom = df[domain_column]
        missing_dom = dom.isna().to_numpy()
        if missing_dom.any():
            _raise_problems({"domain is missing": labels[missing_dom].tolist()})
        values = dom.astype(str).to_numpy()
        if domains is None:
            names = sorted(set(values.tolist()))
        else:
            names = [str(d) for d in domains]
            unknown = ~np.isin(values, names)
            if unknown.any():
                _raise_problems({f"domain value not in domains={names[:10]}": labels[unknown].tolist()})
        code = {name: i for i, name in enumerate(names)}
        k = np.array([code[v] for v in values], dtype=np.float64)
        pi0 = numeric(wanted["logging_prob_columns"], "logging_prob_columns") if logging_prob_columns else None
        mask = None
        if action_mask_columns:
            raw = numeric(wanted["action_mask_columns"], "action_mask_columns")
            bad = ~np.isin(raw, [0.0, 1.0]).all(1)
            if bad.any():
                _raise_problems({"action_mask columns must be 0/1 or boolean": labels[bad].tolist()})
            mask = raw.astype(bool)
        return cls.from_tensors(x, a, r, p, k, domain_names=names, n_actions=n_actions, logging_probs=pi0,
                                action_mask=mask, row_labels=labels)

    @classmethod
    def from_csv(cls, path, **columns) -> LoggedData:
        """Read a CSV file (``pandas.read_csv``) and call ``from_dataframe`` with ``columns``."""
        import pandas as pd

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"path: no such file {str(path)!r}")
        return cls.from_dataframe(pd.read_csv(path), **columns)

    @classmethod
    def from_parquet(cls, path, **columns) -> LoggedData:
        """Read a Parquet file (``pandas.read_parquet``; needs pyarrow or fastparquet) and call ``from_dataframe``."""
        import pandas as pd

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"path: no such file {str(path)!r}")
        try:
            df = pd.read_parquet(path)
        except ImportError as exc:
            raise ImportError("from_parquet needs a Parquet engine: install pyarrow (or fastparquet), "
                              "or convert the file to CSV and use LoggedData.from_csv") from exc
        return cls.from_dataframe(df, **columns)

    # ------------------------------------------------------------------ views
    def __len__(self) -> int:
        return int(self.actions.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.contexts.shape[1])

    @property
    def n_domains(self) -> int:
        return len(self.domain_names)

    def domain_counts(self) -> torch.Tensor:
        """``[M]`` number of rows of each domain."""
        return torch.bincount(self.domains, minlength=self.n_domains)

    def domain_prior(self) -> torch.Tensor:
        """``[M]`` ``p(k)``, the share of rows in each domain (eq. 6)."""
        c = self.domain_counts().to(torch.float64)
        return c / c.sum()

    def require_logging_probs(self, why: str = "the replication rate (eq. 1)") -> torch.Tensor:
        if self.logging_probs is None:
            raise ValueError(f"logged data: {why} needs the full logging distribution Pi_0(.|x); "
                             "pass logging_prob_columns= (or logging_probs=) when loading")
        return self.logging_probs

    def subset(self, index) -> LoggedData:
        """Rows ``index`` (a 1-d integer tensor/array or a boolean mask), same domains and actions."""
        idx = torch.as_tensor(np.asarray(index) if not torch.is_tensor(index) else index)
        if idx.dtype == torch.bool:
            idx = idx.nonzero().reshape(-1)
        idx = idx.to(torch.int64)

        def take(t):
            return None if t is None else t[idx]

        return dataclasses.replace(
            self, contexts=self.contexts[idx], actions=self.actions[idx], rewards=self.rewards[idx],
            propensities=self.propensities[idx], domains=self.domains[idx], logging_probs=take(self.logging_probs),
            action_mask=take(self.action_mask), expected_rewards=take(self.expected_rewards),
            row_labels=None if self.row_labels is None else self.row_labels[idx.numpy()])

    def split(self, fractions: Sequence[float] = (0.85, 0.10, 0.05), seed: int = 0,
              names: Sequence[str] | None = None) -> dict[str, LoggedData]:
        """Random split stratified by domain (the paper's 85/10/5, s.4.1).

        Each domain's rows are shuffled (``torch.Generator`` seeded with ``seed``) and cut in
        the given fractions (rounded down, the remainder going to the first part), so every
        part keeps the domain mix and a domain of ``n`` rows has at least ``floor(n * f)`` in
        each part. ``names`` defaults to train/valid/test (three parts), train/test (two).
        Returns ``{name: LoggedData}``.
        """
        fr = [float(f) for f in fractions]
        if names is None:
            names = {2: ("train", "test"), 3: ("train", "valid", "test")}.get(len(fr), tuple(f"part{i}" for i in range(len(fr))))
        if len(fr) != len(names):
            raise ValueError(f"fractions: expected {len(names)} values (one per name in {list(names)}), got {fr}")
        if any(not (math.isfinite(f) and f > 0) for f in fr) or abs(sum(fr) - 1) > 1e-9:
            raise ValueError(f"fractions: expected positive values summing to 1, got {fr}")
        g = torch.Generator().manual_seed(int(seed))
        parts: list[list[torch.Tensor]] = [[] for _ in fr]
        for k in range(self.n_domains):
            rows = (self.domains == k).nonzero().reshape(-1)
            rows = rows[torch.randperm(rows.numel(), generator=g)]
            sizes = [math.floor(rows.numel() * f) for f in fr]
            sizes[0] += rows.numel() - sum(sizes)
            for i, chunk in enumerate(torch.split(rows, sizes)):
                parts[i].append(chunk)
        out = {}
        for name, chunks in zip(names, parts):
            idx = torch.sort(torch.cat(chunks)).values
            if idx.numel() == 0:
                raise ValueError(f"fractions: part {name!r} would be empty ({len(self)} rows, fractions {fr})")
            out[name] = self.subset(idx)
        return out

    def to_dataframe(self):
        """A pandas frame with columns ``x0..``, ``action``, ``reward``, ``propensity``, ``domain``
        and ``pi0_0..`` / ``mask_0..`` when present (the inverse of ``from_dataframe``)."""
        import pandas as pd

        cols = {f"x{j}": self.contexts[:, j].numpy() for j in range(self.n_features)}
        cols.update(action=self.actions.numpy(), reward=self.rewards.numpy(), propensity=self.propensities.numpy(),
                    domain=np.asarray(self.domain_names, dtype=object)[self.domains.numpy()])
        if self.logging_probs is not None:
            cols.update({f"pi0_{j}": self.logging_probs[:, j].numpy() for j in range(self.n_actions)})
        if self.action_mask is not None:
            cols.update({f"mask_{j}": self.action_mask[:, j].numpy() for j in range(self.n_actions)})
        return pd.DataFrame(cols, index=self.row_labels)

    def column_spec(self) -> dict:
        """The ``from_dataframe`` keyword arguments that read ``to_dataframe`` back."""
        spec = {"context_columns": [f"x{j}" for j in range(self.n_features)], "action_column": "action",
                "reward_column": "reward", "propensity_column": "propensity", "domain_column": "domain",
                "domains": list(self.domain_names), "n_actions": self.n_actions}
        if self.logging_probs is not None:
            spec["logging_prob_columns"] = [f"pi0_{j}" for j in range(self.n_actions)]
        if self.action_mask is not None:
            spec["action_mask_columns"] = [f"mask_{j}" for j in range(self.n_actions)]
        return spec

    @staticmethod
    def concat(parts: Sequence[LoggedData]) -> LoggedData:
        """Stack data sets that share ``n_actions``, features and domain names."""
        parts = list(parts)
        if not parts:
            raise ValueError("parts: expected at least one LoggedData")
        first = parts[0]
        for i, p in enumerate(parts[1:], 1):
            if p.n_actions != first.n_actions or p.n_features != first.n_features or p.domain_names != first.domain_names:
                raise ValueError(f"parts[{i}]: n_actions, n_features and domain_names must match parts[0]")

        def cat(attr):
            vals = [getattr(p, attr) for p in parts]
            if any(v is None for v in vals):
                return None
            return torch.cat(vals)

        labels = np.concatenate([p.row_labels if p.row_labels is not None else np.arange(len(p)) for p in parts])
        return dataclasses.replace(first, contexts=cat("contexts"), actions=cat("actions"), rewards=cat("rewards"),
                                   propensities=cat("propensities"), domains=cat("domains"),
                                   logging_probs=cat("logging_probs"), action_mask=cat("action_mask"),
                                   expected_rewards=cat("expected_rewards"), row_labels=labels)
