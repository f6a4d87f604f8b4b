"""Constrained movie recommendation: the MovieLens set-up of Balakrishnan et al. (2018), s.5.

Movies are the contexts, described by ``d = 10`` genre indicators; the most active users are
the arms; the reward of showing movie ``m`` to user ``u`` is ``u``'s rating of ``m`` divided
by 5 (the paper's rewards lie in ``[0, 1]``). Each user gets an imputed age band (12-17,
18-24, 25-34, 35-44, 45-54, 55-64, 65+) drawn from US population shares, and a ``7 x 10``
``{0, 1}`` behaviour-constraint matrix says which genres may be recommended to which band
(1 = allowed); a movie is forbidden for a user if *any* of its genres is (the paper's "most
restricted sense"). The sparse rating matrix of the top users and movies is completed by
user-based collaborative filtering and rounded to 0.5.

MovieLens may not be redistributed: ``load_movielens`` reads a directory the user
downloaded (ml-20m as in the paper, ml-latest-small, ml-100k), and
``synthetic_movielens`` makes a seeded stand-in with the same schema and realistic
marginals for tests and the default study.

Choices where the paper is silent:

* **The ten genres.** The paper lists nine (Action, Adventure, Comedy, Drama, Fantasy,
  Horror, Romance, Sci-Fi, Thriller) for ``d = 10``; the tenth is Crime, the most frequent
  remaining genre among popular movies. Movies with none of the ten genres (a zero context)
  are left out before the top movies are chosen.
* **The constraint matrix** (``DEFAULT_CONSTRAINTS``) is not given in the paper. Ours
  follows its examples (no violence for the young, no horror for the old): 12-17 may not be
  shown Crime, Horror, Romance or Thriller; 55-64 no Horror; 65+ no Action, Crime, Horror,
  Sci-Fi or Thriller; the other bands are unconstrained.
* **Age shares** (``AGE_SHARES``): the 2010 US Census (table QT-P1) five-year groups,
  the 10-14 and 15-19 groups split by single years of age; population aged 12 and over.
* **Collaborative filtering** (``complete_ratings``): mean-centred (Pearson) user
  similarity over co-rated movies, shrunk by ``n / (n + 10)`` for ``n`` co-rated movies
  (Herlocker et al. 1999 significance weighting), the ``neighbours`` most similar users who
  rated the movie (positive similarity only), prediction
  ``mean_u + sum_v s_uv (r_vm - mean_v) / sum_v |s_uv|`` (Schafer et al. 2007), the user's
  mean when no neighbour rated the movie; clipped to ``[0.5, 5]`` and rounded to 0.5.
  Observed ratings are kept.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from .bcts_problem import BCTSProblem

__all__ = [
    "AGE_BANDS",
    "AGE_SHARES",
    "DEFAULT_CONSTRAINTS",
    "GENRE_SHARES",
    "MOVIE_GENRES",
    "RATING_SHARES",
    "MovieLensData",
    "complete_ratings",
    "load_movielens",
    "movie_recommendation",
    "synthetic_movielens",
]

#: the d = 10 genre indicators of a movie's context, in order
MOVIE_GENRES = ("Action", "Adventure", "Comedy", "Crime", "Drama", "Fantasy", "Horror", "Romance", "Sci-Fi", "Thriller")
#: marketing age bands (Jobber & Ellis-Chadwick 2012), the rows of the constraint matrix
AGE_BANDS = ("12-17", "18-24", "25-34", "35-44", "45-54", "55-64", "65+")
#: population shares of the bands, US 2010 Census (millions: 25.63, 30.40, 41.06, 41.07, 45.01, 36.48, 40.27)
AGE_SHARES = (0.0986, 0.1170, 0.1580, 0.1580, 0.1732, 0.1404, 0.1549)

#: 1 = the band may be shown the genre (rows AGE_BANDS, columns MOVIE_GENRES)
DEFAULT_CONSTRAINTS = (
    #  Act Adv Com Cri Dra Fan Hor Rom SF  Thr
    (1, 1, 1, 0, 1, 1, 0, 0, 1, 0),  # 12-17: no crime, horror, romance, thrillers
    (1, 1, 1, 1, 1, 1, 1, 1, 1, 1),  # 18-24
    (1, 1, 1, 1, 1, 1, 1, 1, 1, 1),  # 25-34
    (1, 1, 1, 1, 1, 1, 1, 1, 1, 1),  # 35-44
    (1, 1, 1, 1, 1, 1, 1, 1, 1, 1),  # 45-54
    (1, 1, 1, 1, 1, 1, 0, 1, 1, 1),  # 55-64: no horror
    (0, 1, 1, 0, 1, 1, 0, 1, 0, 0),  # 65+: no action, crime, horror, sci-fi, thrillers
)

#: share of movies carrying each genre in the synthetic data: our estimate for the ~1,000
#: most-rated movies of ml-20m (popular movies are more often Action, Adventure, Sci-Fi and
#: Thriller, less often Drama, than the whole catalogue)
GENRE_SHARES = {"Action": 0.28, "Adventure": 0.22, "Comedy": 0.36, "Crime": 0.18, "Drama": 0.42, "Fantasy": 0.10,
                "Horror": 0.08, "Romance": 0.18, "Sci-Fi": 0.15, "Thriller": 0.27}
#: rating levels and their shares in ml-20m (counts 239,125 ... 2,898,660 of 20,000,263 ratings)
RATING_LEVELS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0)
RATING_SHARES = (0.0120, 0.0340, 0.0140, 0.0715, 0.0442, 0.2146, 0.1100, 0.2781, 0.0767, 0.1449)

_ML100K_GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary",
                  "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller",
                  "War", "Western")


@dataclass
class MovieLensData:
    """Ratings and movies in the MovieLens ``ratings.csv`` / ``movies.csv`` schema.

    Attributes:
        ratings: columns ``userId``, ``movieId``, ``rating`` (0.5 to 5) and, for the synthetic
            data and ml-100k, ``timestamp`` (not used).
        movies: columns ``movieId``, ``title``, ``genres`` (``"Action|Sci-Fi"``).
        source: where the data came from (a path, or ``"synthetic(seed=...)"``).
    """

    ratings: pd.DataFrame
    movies: pd.DataFrame
    source: str = ""
    info: dict = field(default_factory=dict)


def load_movielens(path: str | os.PathLike) -> MovieLensData:
    """Read a MovieLens directory that you downloaded from grouplens.org.

    Recognises ``ratings.csv`` + ``movies.csv`` (ml-20m, ml-25m, ml-latest, ml-latest-small)
    and ``u.data`` + ``u.item`` (ml-100k). MovieLens may not be redistributed, so bayes_safe
    never downloads it.

    Raises:
        FileNotFoundError: naming the missing files when the directory has neither layout.
    """
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"path: {str(root)!r} is not a directory; expected an unpacked MovieLens download "
                                f"(e.g. ml-20m/ with ratings.csv and movies.csv)")
    if (root / "u.data").is_file() and (root / "u.item").is_file() and not (root / "ratings.csv").exists():
        ratings = pd.read_csv(root / "u.data", sep="\t", header=None, names=["userId", "movieId", "rating", "timestamp"])
        items = pd.read_csv(root / "u.item", sep="|", header=None, encoding="latin-1",
                            names=["movieId", "title", "release", "video", "url", *_ML100K_GENRES])
        flags = items[list(_ML100K_GENRES)].to_numpy().astype(bool)
        genres = ["|".join(g for g, f in zip(_ML100K_GENRES, row) if f and g != "unknown") or "(no genres listed)"
                  for row in flags]
        movies = pd.DataFrame({"movieId": items["movieId"], "title": items["title"], "genres": genres})
    else:
        missing = [f for f in ("ratings.csv", "movies.csv") if not (root / f).is_file()]
        if missing:
            raise FileNotFoundError(
                f"path: {str(root)!r} has no {' or '.join(missing)}; expected a MovieLens directory with ratings.csv "
                f"and movies.csv (ml-20m, ml-latest-small) or u.data and u.item (ml-100k)"
            )
        # ml-20m has 20 million rows: read only the three columns used, ids as int32 (~240 MB)
        ratings = pd.read_csv(root / "ratings.csv", usecols=["userId", "movieId", "rating"],
                              dtype={"userId": np.int32, "movieId": np.int32, "rating": np.float64})
        movies = pd.read_csv(root / "movies.csv", dtype={"movieId": np.int64, "title": str, "genres": str})
    for name, frame, cols in (("ratings", ratings, ("userId", "movieId", "rating")), ("movies", movies, ("movieId", "genres"))):
        lost = [c for c in cols if c not in frame.columns]
        if lost:
            raise ValueError(f"{name}: the file in {str(root)!r} lacks the column(s) {lost}")
    return MovieLensData(ratings=ratings, movies=movies, source=str(root))


def _generator(seed: int, name: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64([int(seed), zlib.crc32(name.encode())]))


def synthetic_movielens(num_users: int = 400, num_movies: int = 1500, seed: int = 0,
                        density: float = 0.12) -> MovieLensData:
    """A seeded stand-in for MovieLens with its schema and realistic marginals.

    * genres: each of the ten genres independently with ``GENRE_SHARES`` (redrawn until
      a movie has at least one); 1% of movies get genres outside the ten (Documentary,
      Animation|Children), which the problem builder leaves out, as with real data;
    * who rated what: user activity and movie popularity log-normal (sigma 1), movie ``m``
      rated by ``u`` with probability ``1 - exp(-lambda a_u p_m)``, ``lambda`` set for an
      overall ``density``; heavy users and popular movies therefore form a dense core, as in
      the top-100 x top-1000 block of ml-20m;
    * ratings: a latent score (user bias, movie bias rising with popularity, user taste per
      genre, noise) mapped by quantiles onto ``RATING_SHARES``, so the rating
      distribution is that of ml-20m exactly.
    """
    U, M = int(num_users), int(num_movies)
    if U < 2 or M < 2:
        raise ValueError(f"num_users, num_movies: expected at least 2 each, got {num_users!r}, {num_movies!r}")
    if not 0 < float(density) <= 1:
        raise ValueError(f"density: expected a value in (0, 1], got {density!r}")
    rng = _generator(seed, "synthetic-movielens")
    shares = np.array([GENRE_SHARES[g] for g in MOVIE_GENRES])
    genres = rng.random((M, len(MOVIE_GENRES))) < shares
    empty = ~genres.any(1)
    while empty.any():
        genres[empty] = rng.random((int(empty.sum()), len(MOVIE_GENRES))) < shares
        empty = ~genres.any(1)
    other = rng.random(M) < 0.01
    labels = ["|".join(g for g, f in zip(MOVIE_GENRES, row) if f) for row in genres]
    extra = np.array(["Documentary", "Animation|Children"])[rng.integers(0, 2, M)]
    labels = [str(e) if o else lab for lab, e, o in zip(labels, extra, other)]
    genres[other] = False

    activity = rng.lognormal(0.0, 1.0, U)
    popularity = rng.lognormal(0.0, 1.0, M)
    rate = np.outer(activity, popularity)
    lo, hi = 1e-8, 1e4
    for _ in range(60):  # bisection for lambda: mean rating probability = density
        lam = np.sqrt(lo * hi)
        if (1 - np.exp(-lam * rate)).mean() < density:
            lo = lam
        else:
            hi = lam
    observed = rng.random((U, M)) < 1 - np.exp(-lam * rate)
    observed[np.arange(U), rng.integers(0, M, U)] = True  # every user rated something

    user_bias = rng.normal(0.0, 0.45, U)
    movie_bias = rng.normal(0.0, 0.4, M) + 0.15 * np.log(popularity)
    taste = rng.normal(0.0, 0.5, (U, len(MOVIE_GENRES)))
    n_genres = np.maximum(genres.sum(1), 1)
    score = user_bias[:, None] + movie_bias[None, :] + (taste @ genres.T) / np.sqrt(n_genres)[None, :]
    score = score + rng.normal(0.0, 0.6, (U, M))
    u_idx, m_idx = np.nonzero(observed)
    s = score[u_idx, m_idx]
    order = np.argsort(s, kind="stable")
    cuts = np.round(np.cumsum(RATING_SHARES) / sum(RATING_SHARES) * len(s)).astype(np.int64)
    level = np.searchsorted(cuts, np.arange(len(s)), side="right")
    rating = np.empty(len(s))
    rating[order] = np.asarray(RATING_LEVELS)[np.minimum(level, len(RATING_LEVELS) - 1)]
    ratings = pd.DataFrame({"userId": u_idx + 1, "movieId": m_idx + 1, "rating": rating,
                            "timestamp": 1_100_000_000 + rng.integers(0, 300_000_000, len(s))})
    movies = pd.DataFrame({"movieId": np.arange(1, M + 1),
                           "title": [f"Synthetic movie {i + 1} ({1950 + int(y)})" for i, y in enumerate(rng.integers(0, 65, M))],
                           "genres": labels})
    return MovieLensData(ratings=ratings, movies=movies, source=f"synthetic(seed={seed}, users={U}, movies={M})")


def complete_ratings(ratings: np.ndarray, neighbours: int = 30, shrinkage: float = 10.0) -> np.ndarray:
    """Fill the missing (NaN) entries of a ``[users, movies]`` rating matrix by user-based CF.

    See the module docstring for the method. Returns a matrix with the observed ratings
    unchanged and the others predicted, clipped to ``[0.5, 5]`` and rounded to 0.5.
    """
    R = np.asarray(ratings, dtype=np.float64)
    if R.ndim != 2:
        raise ValueError(f"ratings: expected a [users, movies] matrix, got shape {list(R.shape)}")
    if int(neighbours) < 1:
        raise ValueError(f"neighbours: expected a positive int, got {neighbours!r}")
    seen = ~np.isnan(R)
    counts = seen.sum(1)
    global_mean = float(np.nanmean(R)) if seen.any() else 3.0
    mean = np.where(counts > 0, np.nansum(R, 1) / np.maximum(counts, 1), global_mean)
    Z = np.where(seen, R - mean[:, None], 0.0)
    S = seen.astype(np.float64)
    num = Z @ Z.T
    sq = (Z * Z) @ S.T  # sq[u, v] = sum over movies both rated of z_u^2
    den = np.sqrt(sq * sq.T)
    n_co = S @ S.T
    sim = np.divide(num, den, out=np.zeros_like(num), where=den > 0) * n_co / (n_co + float(shrinkage))
    np.fill_diagonal(sim, 0.0)
    k = int(neighbours)
    out = R.copy()
    for m in range(R.shape[1]):
        missing = ~seen[:, m]
        if not missing.any():
            continue
        raters = np.nonzero(seen[:, m])[0]
        pred = mean[missing].copy()
        if raters.size:
            W = np.where(sim[np.ix_(missing, raters)] > 0, sim[np.ix_(missing, raters)], 0.0)
            if raters.size > k:  # keep the k most similar raters of each user
                cut = np.partition(W, -k, axis=1)[:, -k][:, None]
                W = np.where(W >= cut, W, 0.0)
            total = W.sum(1)
            dev = W @ Z[raters, m]
            pred = np.where(total > 0, mean[missing] + dev / np.where(total > 0, total, 1.0), pred)
        out[missing, m] = np.clip(np.round(pred * 2.0) / 2.0, 0.5, 5.0)
    return out


def _check_constraints(constraints) -> np.ndarray:
    C = np.asarray(DEFAULT_CONSTRAINTS if constraints is None else constraints)
    shape = (len(AGE_BANDS), len(MOVIE_GENRES))
    if C.shape != shape:
        raise ValueError(f"constraints: expected a {shape[0]} x {shape[1]} matrix (age bands {', '.join(AGE_BANDS)} x "
                         f"genres {', '.join(MOVIE_GENRES)}), got shape {list(C.shape)}")
    if not np.isin(C, (0, 1)).all():
        raise ValueError("constraints: expected entries in {0, 1} (1 = the band may be shown the genre)")
    return C.astype(bool)


def _genre_matrix(genre_strings) -> np.ndarray:
    return np.array([[g in set(str(s).split("|")) for g in MOVIE_GENRES] for s in genre_strings], dtype=bool)


def movie_recommendation(data: MovieLensData | str | os.PathLike | None = None, *, num_users: int = 100,
                         num_movies: int = 1000, teaching_size: int = 200, constraints=None, neighbours: int = 30,
                         seed: int = 0, device: torch.device | str | None = None) -> BCTSProblem:
    """The paper's MovieLens problem: contexts = movies, arms = the most active users.

    Args:
        data: a ``MovieLensData``, a MovieLens directory, or ``None`` for
            ``synthetic_movielens`` with ``seed``.
        num_users: arms ``K``: the users with the most ratings (paper: 100).
        num_movies: the movies with the most ratings among those with one of the ten genres
            (paper: 1,000); ``teaching_size`` of them teach in each fold.
        teaching_size: movies per teaching fold (paper: 200).
        constraints: ``7 x 10`` ``{0, 1}`` matrix, rows ``AGE_BANDS``, columns
            ``MOVIE_GENRES``, 1 = allowed (default ``DEFAULT_CONSTRAINTS``).
        neighbours: neighbourhood size of the collaborative filtering.
        seed: seeds the age imputation (and the synthetic data when ``data`` is None).
        device: where the problem's tables live (default the CPU; built there, then moved).

    Returns:
        A ``BCTSProblem`` with ``contexts [movies, 10]``,
        ``rewards [movies, users]`` (rating / 5) and ``allowed [movies, users]``.
    """
    C = _check_constraints(constraints)
    if data is None:
        data = synthetic_movielens(seed=seed)
    elif isinstance(data, (str, os.PathLike)):
        data = load_movielens(data)
    elif not isinstance(data, MovieLensData):
        raise TypeError(f"data: expected MovieLensData, a MovieLens directory or None, got {type(data).__name__}")
    if int(num_users) < 2 or int(num_movies) < 2:
        raise ValueError(f"num_users, num_movies: expected at least 2 each, got {num_users!r}, {num_movies!r}")
    ratings = data.ratings[["userId", "movieId", "rating"]]
    movies = data.movies.drop_duplicates("movieId").set_index("movieId")
    users = ratings["userId"].value_counts(sort=True).index[: int(num_users)]
    has_genre = _genre_matrix(movies["genres"]).any(1)
    eligible = movies.index[has_genre]
    per_movie = ratings.loc[ratings["movieId"].isin(eligible), "movieId"].value_counts(sort=True)
    chosen = per_movie.index[: int(num_movies)]
    if len(users) < 2 or len(chosen) <= int(teaching_size):
        raise ValueError(f"data: only {len(users)} users and {len(chosen)} movies with one of the genres "
                         f"{MOVIE_GENRES}; need at least 2 users and more than teaching_size={teaching_size} movies")
    block = ratings[ratings["userId"].isin(users) & ratings["movieId"].isin(chosen)]
    block = block.groupby(["userId", "movieId"], sort=False)["rating"].mean()
    matrix = block.unstack("movieId").reindex(index=users, columns=chosen).to_numpy(dtype=np.float64)
    observed_density = float((~np.isnan(matrix)).mean())
    completed = complete_ratings(matrix, neighbours=neighbours)

    bands = _generator(seed, "age-bands").choice(len(AGE_BANDS), size=len(users), p=np.asarray(AGE_SHARES) / sum(AGE_SHARES))
    G = _genre_matrix(movies.loc[chosen, "genres"])  # [M, 10]
    forbidden = ~C[bands]  # [U, 10]
    allowed = (G.astype(np.int64) @ forbidden.T.astype(np.int64)) == 0  # [M, U]
    levels, counts = np.unique(completed, return_counts=True)
    info = {
        "source": data.source,
        "users": len(users), "movies": len(chosen),
        "observed_density": observed_density,
        "genre_shares": dict(zip(MOVIE_GENRES, G.mean(0).round(4).tolist())),
        "completed_rating_shares": {f"{lv:g}": round(c / completed.size, 4) for lv, c in zip(levels, counts)},
        "age_band_counts": {b: int((bands == i).sum()) for i, b in enumerate(AGE_BANDS)},
        "allowed_share": float(allowed.mean()),
        "constraints": C.astype(int).tolist(),
        "user_ids": [int(u) for u in users],
    }
    return BCTSProblem(
        name="movie-recommendation",
        contexts=torch.as_tensor(G, dtype=torch.float64, device="cpu"),
        rewards=torch.as_tensor(completed.T / 5.0, dtype=torch.float64, device="cpu"),
        allowed=torch.as_tensor(allowed, device="cpu"),
        device=device,
        feature_names=list(MOVIE_GENRES),
        arm_names=[f"user {int(u)} ({AGE_BANDS[b]})" for u, b in zip(users, bands)],
        teaching_size=int(teaching_size),
        info=info,
    )
