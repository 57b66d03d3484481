import pytest

from verifiers.math_equiv import numeric_match, parse_number
from verifiers.protocol import extract_answers, is_well_formed


@pytest.mark.parametrize(
    "prediction, gold, expected",
    [
        ("42", "42", 1.0),
        (" 42 ", "42", 1.0),
        ("42.0", "42", 1.0),
        ("18,026", "18026", 1.0),
        ("1.8026e4", "18026", 1.0),
        ("84/2", "42", 0.0),  # a division restated, not a result (issue 21)
        ("21/2", "10.5", 1.0),
        ("\uff14\uff12", "42", 1.0),  # fullwidth look-alike digits
        ("\u221242", "-42", 1.0),  # unicode minus
        ("43", "42", 0.0),
        ("42x", "42", 0.0),
        ("", "42", 0.0),
        ("nan", "42", 0.0),
        ("9" * 100, "42", 0.0),  # enormous output is not parsed
        ("42", "not a number", None),  # unscorable gold is None, never a silent 0
    ],
)
def test_numeric_match(prediction, gold, expected):
    assert numeric_match(prediction, gold) == expected


def test_relative_tolerance():
    assert numeric_match("1000.0005", "1000", rel_tol=1e-6, exact_integers=False) == 1.0
    assert numeric_match("1000.0005", "1000", rel_tol=1e-6) == 0.0  # an integer gold is exact
    assert numeric_match("1000.5000005", "1000.5", rel_tol=1e-6) == 1.0
    assert numeric_match("1000.01", "1000", rel_tol=1e-6, exact_integers=False) == 0.0
    assert parse_number("1/0") is None


def test_protocol_parsing():
    assert extract_answers("<answer>1</answer> and <answer> 2 </answer>") == ["1", "2"]
    assert is_well_formed(["<code>print(1)</code>", "<answer>1</answer>"], ("code",))
    assert is_well_formed(["<answer>1</answer>"], ("code",))
    assert not is_well_formed(["<answer>1</answer><answer>2</answer>"], ("code",))
    assert not is_well_formed(["<code>print(1)</code><answer>1</answer>"], ("code",))
    assert not is_well_formed(["<code>x</code>", "<code>y</code>"], ("code",))
    assert not is_well_formed([], ("code",))


@pytest.mark.parametrize("text", ["1e9999999", "3/1e9999999", "1e-9999999", "1/2/3", "1/0"])
def test_parse_number_refuses_huge_exponents_and_odd_fractions(text):
    assert parse_number(text) is None
