import pytest

from verifiers.qa import exact_match, normalize_answer, token_f1


@pytest.mark.parametrize(
    "prediction, gold, expected",
    [
        ("Paris", "paris", 1.0),
        ("The Eiffel Tower.", "Eiffel Tower", 1.0),
        ("  eiffel   tower ", "Eiffel Tower", 1.0),
        ("NYC", ["New York City", "NYC"], 1.0),  # any alias
        ("London", ["Paris", "City of Light"], 0.0),
        ("", "Paris", 0.0),  # empty answers never match
        ("   ", "Paris", 0.0),
        ("Ｐａｒｉｓ", "Paris", 1.0),  # fullwidth look-alikes fold under NFKC
        ("Paris " * 200, "Paris", 0.0),  # enormous output is refused, not searched
        ("Paris", "", None),  # no usable gold: unscorable, never a silent 0
        ("Paris", ["", "the"], None),
    ],
)
def test_exact_match(prediction, gold, expected):
    assert exact_match(prediction, gold) == expected


def test_token_f1_hand_computed():
    # pred tokens: [barack, obama]; gold: [barack, hussein, obama] -> P=1, R=2/3, F1=0.8
    assert token_f1("Barack Obama", "Barack Hussein Obama") == pytest.approx(0.8)
    assert token_f1("Obama", ["Barack Obama", "Obama"]) == pytest.approx(1.0)
    assert token_f1("the", "Paris") == 0.0
    assert token_f1("x", "") is None


def test_normalization_matches_squad():
    assert normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert normalize_answer("an apple a day") == "apple day"
