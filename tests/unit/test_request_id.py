"""A release's identity: one type prints and parses the ids both parties' ledgers key on."""

from __future__ import annotations

import pytest

from dpda.protocol import RequestId


@pytest.mark.parametrize(
    ("rid", "text"),
    [
        (RequestId.batch("9f3a", 0), "9f3a/0"),
        (RequestId.batch("9f3a", 12), "9f3a/12"),
        (RequestId.pate("9f3a", 4), "9f3a/pate/4"),
        (RequestId.reweight("9f3a", 40), "9f3a/reweight/40"),
    ],
)
def test_each_kind_prints_the_ledgers_form_and_parses_back(rid: RequestId, text: str) -> None:
    assert str(rid) == text
    assert RequestId.parse(text) == rid


@pytest.mark.parametrize(
    "text",
    ["", "9f3a", "9f3a/", "/3", "9f3a/x", "9f3a/pate/x", "9f3a/other/3", "a/b/pate/3", "-1"],
)
def test_what_names_no_release_parses_to_none(text: str) -> None:
    assert RequestId.parse(text) is None


def test_a_reweighting_id_is_told_from_a_batch_by_its_kind_not_its_text() -> None:
    # a session whose id happens to read "reweight" is still a batch's session
    assert RequestId.parse("reweight/3") == RequestId.batch("reweight", 3)
    assert RequestId.parse("s/reweight/3") == RequestId.reweight("s", 3)
