"""``dpda simulate --write-configs``: every field of the declarations is written, each from what
the rehearsal resolved by its name, and the files load as the daemons read them."""

from __future__ import annotations

import tomllib

import pytest

from dpda.cli.main import build_parser
from dpda.cli.rehearsed import deployment_of, source_text, target_text
from dpda.cli.simulate import terms_from_args
from dpda.errors import ConfigError
from dpda.policy import PrivacyPolicy, TargetPrivacyPolicy
from dpda.service.config import SourceDataset, TargetJob


def _args(*flags: str):
    argv = ["simulate", "--source-file", "S.csv", "--target-file", "T.csv", "--label-column",
            "label", *flags]  # fmt: skip
    return build_parser().parse_args(argv)


def _written(*flags: str, seed: int | None = 4) -> tuple[dict, dict]:
    args = _args(*flags)
    terms = terms_from_args(args, "source", 1e-4)
    source, target = deployment_of(args, terms, "raw", "zscore", seed, 6)
    return tomllib.loads(source_text(source)), tomllib.loads(target_text(target))


def test_every_declared_field_is_written() -> None:
    src, tgt = _written("--refine", "0.2", "--keep", "dpda", "--classifier", "logistic")
    job = tgt["job"]
    # TOML has no null: a field is left out only when its value is None (no id column here;
    # the job writes its predictions in its own folder)
    assert set(TargetJob.model_fields) - set(job) == {"predictions", "id_column"}
    assert (job["refine"], job["keep"], job["classifier"]) == (0.2, "dpda", "logistic")
    assert job["scaling"] == "zscore" and job["release"] == "prototypes"  # resolved, not None
    (ds,) = src["datasets"]
    assert set(PrivacyPolicy.model_fields) - {"max_session_epsilon"} <= set(ds["policy"])
    assert set(SourceDataset.model_fields) - set(ds) == {"id_column"}
    assert set(TargetPrivacyPolicy.model_fields) - {"delta", "row_clip"} <= set(tgt["privacy"])


def test_the_seed_is_written_as_insecure_on_both_sides_only_when_given() -> None:
    src, tgt = _written()
    assert src["seed"] == tgt["seed"] == 4 and src["insecure_testing"] is tgt["insecure_testing"]
    src, tgt = _written(seed=None)
    assert "seed" not in src and "seed" not in tgt


def test_the_targets_dp_disclosures_are_written_from_its_flags() -> None:
    _, tgt = _written("--projection", "target-pca", "--target-epsilon", "2", "--target-row-clip",
                      "30")  # fmt: skip
    assert tgt["privacy"]["disclosures"] == "dp" and tgt["privacy"]["epsilon"] == 2.0
    assert tgt["privacy"]["row_clip"] == 30.0
    _, tgt = _written("--projection", "target-pca")  # the rehearsal used its statistics exact
    assert tgt["privacy"]["disclosures"] == "exact"


def test_what_cannot_be_written_is_refused_naming_the_flag() -> None:
    args = _args("--method", "all")
    terms = terms_from_args(args, "source", 1e-4)
    with pytest.raises(ConfigError, match="--method all"):
        deployment_of(args, terms, "raw", "zscore", None, 6)
