"""The development suite: source/target pairs that ship offline, to choose and check the job's
label-free defaults on data other than the benchmarks'.

Each pair is made here, from scikit-learn's bundled tables, scikit-learn's and skada's
generators, or shapes of our own; nothing is fetched from the network. Every domain holds at
most ``MAX_ROWS`` rows, so the whole suite runs in minutes on two cores. A pair is a pure
function of its name and ``seed`` (the split and the shift are drawn from it).

- ``wine``, ``breast-cancer``, ``iris``: scikit-learn's tables, raw columns of mixed scales,
  split at random in two; the target's columns are rescaled, shifted and its classes reweighted
  (a covariate and label shift of the kind two sites' instruments make);
- ``classification``: ``make_classification`` (20 columns, 4 classes), the target rotated and
  shifted;
- ``skada-covariate``: skada's ``make_shifted_datasets`` (two moons-like blobs, covariate
  shift), 2 columns;
- ``text``: sparse word counts of two topics, rows scaled to term frequencies in [0, 1]
  (≈ 2,000 rows a domain); the target's vocabulary drifts (some words' rates change);
- ``images``: 20 classes × 36 rows of 1,024 non-negative "pixels" (row norms ≈ 14); the target
  is the same templates under another gain, offset and a blur.

``SEVERAL`` holds families of three sources and one target (``text-sources``,
``image-sources``, ``near-sources``), to choose and check a job over several sources on data
other than Office-Caltech's; ``near-sources`` is a small target that one source nearly
matches (the shape of Office-Caltech's DSLR and webcam targets).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpda.data.loaders import Domain

MAX_ROWS = 2000  # per domain


def _split_shift(
    x: np.ndarray, y: np.ndarray, rng: np.random.Generator, name: str
) -> tuple[Domain, Domain]:
    """Half the rows for each side; the target's columns rescaled by a factor in [0.6, 1.6] and
    shifted by up to half a column's spread, and one class of the target thinned to half."""
    idx = rng.permutation(x.shape[0])
    s, t = idx[: x.shape[0] // 2], idx[x.shape[0] // 2 :]
    q = int(y.max()) + 1
    thin = int(rng.integers(q))
    keep = (y[t] != thin) | (rng.random(t.size) < 0.5)
    t = t[keep]
    std = x.std(axis=0) + 1e-12
    gain = rng.uniform(0.6, 1.6, size=x.shape[1])
    shift = rng.uniform(-0.5, 0.5, size=x.shape[1]) * std
    xt = x[t] * gain + shift
    return (
        Domain(f"{name}:source", x[s].astype(float), y[s].astype(np.int64), q),
        Domain(f"{name}:target", xt.astype(float), y[t].astype(np.int64), q),
    )


def _sklearn_table(loader: Callable[..., object], name: str) -> Callable[[int], tuple]:
    def make(seed: int) -> tuple[Domain, Domain]:
        data: Any = loader()
        x, y = np.asarray(data.data, dtype=np.float64), np.asarray(data.target)
        return _split_shift(x, y, np.random.default_rng([seed, 31]), name)

    return make


def classification(seed: int) -> tuple[Domain, Domain]:
    """``make_classification`` (1,200 rows a domain, 20 columns, 4 classes); the target rotated
    in 5 random planes by 0.5 rad and shifted by one unit along a random direction."""
    from sklearn.datasets import make_classification

    rng = np.random.default_rng([seed, 37])
    x, y = make_classification(
        n_samples=2400, n_features=20, n_informative=10, n_redundant=4, n_classes=4,
        n_clusters_per_class=1, class_sep=1.5, random_state=int(rng.integers(2**31)),
    )  # fmt: skip
    s, t = np.arange(1200), np.arange(1200, 2400)
    q, _ = np.linalg.qr(rng.normal(size=(20, 20)))
    rot = np.eye(20)
    for i in range(5):
        a, b = q[:, 2 * i], q[:, 2 * i + 1]
        c, sn = np.cos(0.5) - 1.0, np.sin(0.5)
        rot = rot + c * (np.outer(a, a) + np.outer(b, b)) + sn * (np.outer(b, a) - np.outer(a, b))
    direction = rng.normal(size=20)
    xt = x[t] @ rot.T + direction / np.linalg.norm(direction)
    return (
        Domain("classification:source", x[s], y[s].astype(np.int64), 4),
        Domain("classification:target", xt, y[t].astype(np.int64), 4),
    )


def skada_covariate(seed: int) -> tuple[Domain, Domain]:
    """skada's ``make_shifted_datasets`` under covariate shift (2 columns, 2 classes)."""
    import warnings

    from skada.datasets import make_shifted_datasets

    with warnings.catch_warnings():  # skada's own call to its deprecated return_X_y
        warnings.simplefilter("ignore", DeprecationWarning)
        x, y, sample_domain = make_shifted_datasets(
            n_samples_source=200, n_samples_target=200, shift="covariate_shift", noise=0.3,
            label="binary", random_state=seed,
        )  # fmt: skip
    src, tgt = sample_domain > 0, sample_domain < 0
    return (
        Domain("skada-covariate:source", x[src], y[src].astype(np.int64), 2),
        Domain("skada-covariate:target", x[tgt], y[tgt].astype(np.int64), 2),
    )


def _topics(rng: np.random.Generator, words: int, strength: float) -> np.ndarray:
    """Two topics' word rates: a shared background plus each topic's 40 own words."""
    background = rng.gamma(0.3, 0.05, size=words)
    topics = np.vstack([background.copy(), background.copy()])
    for c in range(2):
        own = rng.choice(words, size=40, replace=False)
        topics[c, own] += rng.gamma(1.0, strength, size=40)
    return topics


def _drift(rng: np.random.Generator, words: int) -> np.ndarray:
    """A fifth of the vocabulary's rates, each times a factor in [0.3, 3]."""
    drift = np.ones(words)
    moved = rng.choice(words, size=words // 5, replace=False)
    drift[moved] = np.exp(rng.uniform(np.log(0.3), np.log(3.0), size=moved.size))
    return drift


def _documents(
    rng: np.random.Generator, n: int, share: float, rates: np.ndarray, lengths: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` documents, topic 1 with probability ``share``: term frequencies and topics."""
    y = (rng.random(n) < share).astype(np.int64)
    length = rng.integers(*lengths, size=n)[:, None]
    counts = rng.poisson(rates[y] * length / rates.sum(axis=1, keepdims=True)[y] * 3.0)
    x = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    return x.astype(float), y


def text(seed: int, n: int = 2000, words: int = 500) -> tuple[Domain, Domain]:
    """Two topics of word counts (Poisson rates from a shared background plus each topic's own
    words), each row divided by its total: term frequencies in [0, 1], most of them 0. In the
    target a fifth of the vocabulary changes rate by a factor in [0.3, 3] and the topics'
    shares are 35/65 instead of 50/50."""
    rng = np.random.default_rng([seed, 41])
    topics = _topics(rng, words, 0.02)
    drift = _drift(rng, words)
    xs, ys = _documents(rng, n, 0.5, topics, (20, 80))
    xt, yt = _documents(rng, n, 0.65, topics * drift, (20, 80))
    return Domain("text:source", xs, ys, 2), Domain("text:target", xt, yt, 2)


def _templates(rng: np.random.Generator, q: int, side: int) -> np.ndarray:
    """``q`` smooth random templates of ``side²`` pixels, each of norm 1."""
    base = rng.random((q, side, side))
    for _ in range(3):  # smooth each template
        base = (base + np.roll(base, 1, axis=1) + np.roll(base, 1, axis=2)) / 3.0
    templates = base.reshape(q, side * side)
    return np.asarray(templates / np.linalg.norm(templates, axis=1, keepdims=True))


def _pictures(
    rng: np.random.Generator,
    templates: np.ndarray,
    per_class: int,
    look: tuple[float, float, bool, int],
    scale: float = 12.0,
    noise: float = 0.25,
) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` rows of each template under ``look`` = (gain, offset, a 3-pixel
    horizontal blur, a vertical shift in pixels), each row's gain in [0.8, 1.2] × gain, pixel
    noise ``noise``, clipped at 0."""
    gain, offset, blur, shift = look
    q, k = templates.shape
    side = int(round(np.sqrt(k)))
    y = np.repeat(np.arange(q), per_class)
    g = rng.uniform(0.8, 1.2, size=(y.size, 1)) * gain
    x = templates[y] * scale * g + rng.normal(0.0, noise, size=(y.size, k))
    if blur or shift:
        img = x.reshape(-1, side, side)
        if blur:
            img = (img + np.roll(img, 1, axis=2) + np.roll(img, -1, axis=2)) / 3.0
        x = np.roll(img, shift, axis=1).reshape(-1, k)
    return np.maximum(x + offset, 0.0), y.astype(np.int64)


def images(seed: int, q: int = 20, per_class: int = 36, side: int = 32) -> tuple[Domain, Domain]:
    """``q`` classes × ``per_class`` rows of ``side²`` non-negative pixels: each class a smooth
    random template, each row its template under a random gain plus pixel noise (row norms
    ≈ 14). The target: gain × 0.8, an offset of 0.1 and a 3-pixel horizontal blur."""
    rng = np.random.default_rng([seed, 43])
    templates = _templates(rng, q, side)
    xs, ys = _pictures(rng, templates, per_class, (1.0, 0.0, False, 0))
    xt, yt = _pictures(rng, templates, per_class, (0.8, 0.1, True, 0))
    return Domain("images:source", xs, ys, q), Domain("images:target", xt, yt, q)


def text_sources(seed: int, n: int = 1500, words: int = 400) -> tuple[dict[str, Domain], Domain]:
    """Three sources of short documents of two weakly separated topics (8–30 words each),
    each source with a vocabulary drift of its own and topic shares 50/50, 40/60 and 60/40;
    the target with another drift and shares 35/65."""
    rng = np.random.default_rng([seed, 141])
    topics = _topics(rng, words, 0.006)
    sources = {}
    for name, share in (("s1", 0.5), ("s2", 0.4), ("s3", 0.6)):
        x, y = _documents(rng, n, share, topics * _drift(rng, words), (8, 30))
        sources[name] = Domain(f"text-sources:{name}", x, y, 2)
    x, y = _documents(rng, n, 0.65, topics * _drift(rng, words), (8, 30))
    return sources, Domain("text-sources:target", x, y, 2)


def _picture_family(
    family: str,
    rng: np.random.Generator,
    templates: np.ndarray,
    looks: dict[str, tuple[float, float, bool, int]],
    per_class: tuple[int, int],
) -> tuple[dict[str, Domain], Domain]:
    """A several-source family of pictures of ``templates``: each source under its look
    (``looks``, the target's under ``"target"``), ``per_class`` = (a source's rows a class, the
    target's), scale 9 and pixel noise 0.4; drawn source by source, then the target."""
    q = templates.shape[0]
    sources = {}
    for name, look in looks.items():
        if name != "target":
            x, y = _pictures(rng, templates, per_class[0], look, scale=9.0, noise=0.4)
            sources[name] = Domain(f"{family}:{name}", x, y, q)
    x, y = _pictures(rng, templates, per_class[1], looks["target"], scale=9.0, noise=0.4)
    return sources, Domain(f"{family}:target", x, y, q)


def image_sources(
    seed: int, q: int = 20, per_class: int = 36, side: int = 16
) -> tuple[dict[str, Domain], Domain]:
    """Three sources of ``q`` classes × ``per_class`` noisy ``side²``-pixel pictures of the same
    templates, each under a look of its own (gain, offset, blur, a one-row shift); the target
    under another (gain 0.8, offset 0.1, blurred and shifted)."""
    rng = np.random.default_rng([seed, 143])
    templates = _templates(rng, q, side)
    looks = {
        "s1": (1.0, 0.0, False, 0),
        "s2": (1.1, 0.05, False, 1),
        "s3": (0.9, 0.0, True, 0),
        "target": (0.8, 0.1, True, 1),
    }
    return _picture_family("image-sources", rng, templates, looks, (per_class, per_class))


def near_sources(
    seed: int, q: int = 10, per_class: int = 36, target_per_class: int = 15, side: int = 16
) -> tuple[dict[str, Domain], Domain]:
    """Three sources of ``q`` classes × ``per_class`` noisy pictures of the same templates, and
    a small target (``target_per_class`` rows a class) whose look one source nearly shares
    (gain 0.85 against 0.8, the same offset, blur and shift); the other two sources' looks are
    further off (brighter and sharp; shifted the other way)."""
    rng = np.random.default_rng([seed, 145])
    templates = _templates(rng, q, side)
    looks = {
        "s1": (0.85, 0.1, True, 1),
        "s2": (1.2, 0.0, False, 0),
        "s3": (1.0, 0.05, False, -1),
        "target": (0.8, 0.1, True, 1),
    }
    return _picture_family("near-sources", rng, templates, looks, (per_class, target_per_class))


def _wine(seed: int) -> tuple[Domain, Domain]:
    from sklearn.datasets import load_wine

    return _sklearn_table(load_wine, "wine")(seed)


def _breast_cancer(seed: int) -> tuple[Domain, Domain]:
    from sklearn.datasets import load_breast_cancer

    return _sklearn_table(load_breast_cancer, "breast-cancer")(seed)


def _iris(seed: int) -> tuple[Domain, Domain]:
    from sklearn.datasets import load_iris

    return _sklearn_table(load_iris, "iris")(seed)


PAIRS: dict[str, Callable[[int], tuple[Domain, Domain]]] = {
    "wine": _wine,
    "breast-cancer": _breast_cancer,
    "iris": _iris,
    "classification": classification,
    "skada-covariate": skada_covariate,
    "text": text,
    "images": images,
}

# the per-row representation each pair is run under: what a user would pick from the shape
REPRESENTATION = {name: "raw" for name in PAIRS}

# several sources for one target (a job over several sources refuses DP standardization, so
# each family runs under the per-row representation its shape suggests)
SEVERAL: dict[str, Callable[[int], tuple[dict[str, Domain], Domain]]] = {
    "text-sources": text_sources,
    "image-sources": image_sources,
    "near-sources": near_sources,
}
SEVERAL_REPRESENTATION = {"text-sources": "sqrt", "image-sources": "l2", "near-sources": "l2"}


def pair(name: str, seed: int = 0) -> tuple[Domain, Domain]:
    """The (source, target) of the suite's pair ``name``; an unknown name is refused, naming
    the suite's pairs."""
    from dpda.errors import ConfigError

    if name not in PAIRS:
        raise ConfigError(f"unknown development pair {name!r} (choose from {', '.join(PAIRS)})")
    return PAIRS[name](seed)


def write_csv(domain: Domain, path: str | Path) -> Path:
    """``domain`` as a CSV ``dpda simulate --source-file/--target-file`` reads: a header of
    ``f0 … f{k-1}`` and ``label``, one row per record."""
    path = Path(path)
    k = domain.x.shape[1]
    header = ",".join([*(f"f{j}" for j in range(k)), "label"])
    y = domain.labels()
    with path.open("w") as f:
        f.write(header + "\n")
        for row, label in zip(domain.x, y, strict=True):
            f.write(",".join(repr(float(v)) for v in row) + f",{int(label)}\n")
    return path
