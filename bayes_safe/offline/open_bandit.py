"""The Open Bandit Dataset sample (Saito et al. 2021), read from the ``obp`` wheel.

The ``obp==0.4.1`` wheel on PyPI ships a 10,000-round sample of each logged campaign
(``all``: 80 items, ``men``: 34, ``women``: 46) under two behaviour policies of the ZOZOTOWN
fashion site: ``random`` (uniform over the campaign's items) and ``bts`` (Bernoulli
Thompson sampling). Each row is one impression: the item shown (``item_id``), its slot
(``position`` 1-3), a click, the behaviour policy's propensity of that item at that slot,
four hashed categorical user features and the user-item affinities.

This module downloads the wheel with ``pip download obp==0.4.1 --no-deps`` into a cache
directory (``$BAYES_SAFE_DATA/obp`` if ``BAYES_SAFE_DATA`` is set, else
``~/.cache/bayes_safe/obp``) and reads the CSVs straight from the wheel (a zip file). obp is
never installed (its version pins break this environment) and the data never enters the
repository:

```bash
python -m bayes_safe.offline.open_bandit --fetch     # once; `make test` does it
```

As logged bandit data (``load_open_bandit``):

* **domains** = the campaigns; **action** = the item index within its campaign, in one action
  space of 80 with a mask of the campaign's items (item ``j`` of ``men`` and item ``j`` of
  ``all`` share an index but not a meaning; the campaign is in the context);
* **context** = one-hot campaign (3), one-hot position (3), one-hot user features (the
  categories seen in either behaviour's logs of the loaded campaigns, so ``random`` and
  ``bts`` contexts share one layout), the 80 affinity columns (zero beyond the campaign's
  items);
* **reward** = click; **propensity** = ``propensity_score``;
* **logging_probs**: known for ``random`` (uniform over the campaign's items, which is what
  its propensities say), unknown for ``bts`` (its propensities change over the log: they were
  simulated from the Thompson posterior of the day), so ``bts`` logs serve evaluation of
  the value (IPS, SNIPS, DM, DR), not constrained training.
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .data import LoggedData

__all__ = [
    "BEHAVIORS",
    "CAMPAIGNS",
    "N_ITEMS",
    "OBP_VERSION",
    "cache_dir",
    "fetch",
    "load_open_bandit",
    "main",
    "read_campaign",
    "wheel_path",
]

OBP_VERSION = "0.4.1"
CAMPAIGNS = ("all", "men", "women")
BEHAVIORS = ("random", "bts")
N_ITEMS = {"all": 80, "men": 34, "women": 46}
N_POSITIONS = 3
FETCH_HINT = "python -m bayes_safe.offline.open_bandit --fetch"


def cache_dir(path: str | os.PathLike | None = None) -> Path:
    """Where the wheel is kept: ``path``, else ``$BAYES_SAFE_DATA/obp``, else ``~/.cache/bayes_safe/obp``."""
    if path is not None:
        return Path(path).expanduser()
    root = os.environ.get("BAYES_SAFE_DATA")
    if root:
        return Path(root).expanduser() / "obp"
    return Path.home() / ".cache" / "bayes_safe" / "obp"


def _find_wheel(directory: Path) -> Path | None:
    found = sorted(directory.glob(f"obp-{OBP_VERSION}-*.whl"))
    return found[0] if found else None


def wheel_path(directory: str | os.PathLike | None = None) -> Path:
    """The cached wheel; FileNotFoundError saying how to fetch it if it is missing."""
    d = cache_dir(directory)
    wheel = _find_wheel(d) if d.exists() else None
    if wheel is None:
        raise FileNotFoundError(
            f"Open Bandit Dataset: the obp=={OBP_VERSION} wheel is not in {str(d)!r}. Fetch it with\n"
            f"    {FETCH_HINT}\n"
            "(or `make test`, which fetches it first; set BAYES_SAFE_DATA to use another directory)")
    return wheel


def fetch(directory: str | os.PathLike | None = None, force: bool = False, quiet: bool = True) -> Path:
    """Download the obp wheel into the cache (a no-op when present unless ``force``); return its path.

    Runs ``python -m pip download obp==0.4.1 --no-deps --only-binary=:all: -d DIR`` with the
    running interpreter; nothing is installed.
    """
    d = cache_dir(directory)
    if not force:
        wheel = _find_wheel(d) if d.exists() else None
        if wheel is not None and zipfile.is_zipfile(wheel):
            return wheel
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"obp=={OBP_VERSION}", "--no-deps", "--only-binary=:all:",
           "-d", str(d)]
    if quiet:
        cmd.append("--quiet")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"fetch: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stderr.strip()[-2000:]}")
    wheel = wheel_path(d)
    if not zipfile.is_zipfile(wheel):
        raise RuntimeError(f"fetch: {str(wheel)!r} is not a valid wheel (zip); delete it and fetch again")
    return wheel


def read_campaign(behavior: str = "random", campaign: str = "all", directory=None):
    """The raw CSV of one log as a pandas frame (index = the CSV's row number)."""
    import pandas as pd

    if behavior not in BEHAVIORS:
        raise ValueError(f"behavior: expected one of {list(BEHAVIORS)}, got {behavior!r}")
    if campaign not in CAMPAIGNS:
        raise ValueError(f"campaign: expected one of {list(CAMPAIGNS)}, got {campaign!r}")
    wheel = wheel_path(directory)
    member = f"obp/dataset/obd/{behavior}/{campaign}/{campaign}.csv"
    with zipfile.ZipFile(wheel) as z:
        try:
            raw = z.read(member)
        except KeyError:
            raise FileNotFoundError(f"{str(wheel)!r} has no {member!r}; is it the obp=={OBP_VERSION} wheel?") from None
    return pd.read_csv(io.BytesIO(raw), index_col=0)


@functools.lru_cache(maxsize=8)
def _user_vocab(campaigns: tuple, wheel: str) -> tuple:
    """Sorted categories of each user feature over both behaviours' logs of ``campaigns``, so the
    context layout of ``random`` and ``bts`` data is the same."""
    directory = Path(wheel).parent
    cats = [set() for _ in range(4)]
    for b in BEHAVIORS:
        for c in campaigns:
            df = read_campaign(b, c, directory)
            for j in range(4):
                cats[j].update(df[f"user_feature_{j}"].astype(str).unique().tolist())
    return tuple(tuple(sorted(x)) for x in cats)


def load_open_bandit(behavior: str = "random", campaigns: Sequence[str] = CAMPAIGNS, directory=None) -> LoggedData:
    """The logs of ``behavior`` for ``campaigns`` as one ``LoggedData`` (module docstring).

    Returns ``N = 10,000 * len(campaigns)`` rows, ``A = 80`` actions with an action mask,
    domains named by campaign, ``logging_probs`` for ``behavior="random"`` only.
    """
    import pandas as pd

    campaigns = list(campaigns)
    if not campaigns:
        raise ValueError("campaigns: expected at least one of " + str(list(CAMPAIGNS)))
    bad = [c for c in campaigns if c not in CAMPAIGNS]
    if bad:
        raise ValueError(f"campaigns: unknown {bad}; expected some of {list(CAMPAIGNS)}")
    frames = []
    for c in campaigns:
        df = read_campaign(behavior, c, directory)
        df.index = [f"{behavior}/{c}/{i}" for i in df.index]
        df["campaign"] = c
        frames.append(df)
    df = pd.concat(frames, axis=0, sort=False)
    n_actions = max(N_ITEMS[c] for c in campaigns)
    n = len(df)
    parts = [pd.get_dummies(df["campaign"]).reindex(columns=campaigns, fill_value=0).to_numpy(np.float32),
             np.eye(N_POSITIONS, dtype=np.float32)[df["position"].to_numpy() - 1]]
    vocab = _user_vocab(tuple(campaigns), str(wheel_path(directory)))
    for j in range(4):
        values = df[f"user_feature_{j}"].astype(str)
        parts.append(np.stack([(values == cat).to_numpy(np.float32) for cat in vocab[j]], axis=1))
    aff = np.zeros((n, n_actions), dtype=np.float32)
    for j in range(n_actions):
        col = f"user-item_affinity_{j}"
        if col in df:
            aff[:, j] = df[col].fillna(0.0).to_numpy(np.float32)
    parts.append(aff)
    x = np.concatenate(parts, axis=1)
    n_items = df["campaign"].map(N_ITEMS).to_numpy()
    mask = np.arange(n_actions)[None, :] < n_items[:, None]
    pi0 = mask / n_items[:, None] if behavior == "random" else None
    domain = df["campaign"].map({c: i for i, c in enumerate(campaigns)}).to_numpy()
    return LoggedData.from_tensors(x, df["item_id"].to_numpy(), df["click"].to_numpy(),
                                   df["propensity_score"].to_numpy(), domain, domain_names=campaigns,
                                   n_actions=n_actions, logging_probs=pi0, action_mask=mask,
                                   row_labels=df.index.to_numpy())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Fetch or inspect the Open Bandit Dataset sample (obp wheel).")
    parser.add_argument("--fetch", action="store_true", help=f"download obp=={OBP_VERSION} (no-op if cached)")
    parser.add_argument("--force", action="store_true", help="download again even if cached")
    parser.add_argument("--cache-dir", default=None, help="default: $BAYES_SAFE_DATA/obp or ~/.cache/bayes_safe/obp")
    parser.add_argument("--summary", action="store_true", help="print rows, clicks and propensities per log")
    args = parser.parse_args(argv)
    if not (args.fetch or args.summary):
        parser.print_help()
        return 2
    if args.fetch:
        wheel = fetch(args.cache_dir, force=args.force)
        print(f"open bandit: {wheel}")
    if args.summary:
        for b in BEHAVIORS:
            for c in CAMPAIGNS:
                df = read_campaign(b, c, args.cache_dir)
                print(f"{b:6s} {c:5s} rows={len(df):6d} ctr={df['click'].mean():.4f} "
                      f"pscore=[{df['propensity_score'].min():.3g}, {df['propensity_score'].max():.3g}]")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
