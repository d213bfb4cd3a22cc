"""Budget and deadline syntax: units, percentages, and a clear BudgetError for everything else."""
from __future__ import annotations

import pytest

from edgetrain.compiler.scheduling.budget import Anchors, Budget, check_feasible, parse_budget, parse_deadline
from edgetrain.compiler.errors import BudgetError, EdgetrainError


def _anchors(fixed: int, activations: int, smallest: int = 1) -> Anchors:
    return Anchors(fixed_bytes=fixed, activation_peak_bytes=activations, min_feasible_bytes=smallest, store_all=None,
                   store_all_peak_bytes=fixed + activations)


@pytest.mark.parametrize("text, nbytes", [
    ("2MB", 2_000_000),
    ("2mb", 2_000_000),
    ("512KiB", 524_288),
    ("512 KiB", 524_288),
    ("1.5GB", 1_500_000_000),
    ("3MiB", 3 * 2**20),
    ("1GiB", 2**30),
    ("64kB", 64_000),
    ("300000", 300_000),
    ("300000B", 300_000),
    ("  4096 ", 4096),
    (".5KB", 500),
])
def test_absolute_sizes(text, nbytes):
    b = parse_budget(text)
    assert b.nbytes == nbytes and isinstance(b.nbytes, int)
    assert b.percent is None
    # An absolute budget ignores what the model needs.
    assert b.resolve(_anchors(10**9, 10**9)) == nbytes


def test_percent_is_of_store_all_peak():
    b = parse_budget("40%")
    assert b == Budget(text="40%", percent=40.0)
    assert b.nbytes is None
    assert b.resolve(_anchors(1000, 10_000)) == 4400
    assert parse_budget("100%").resolve(_anchors(1000, 10_000)) == 11_000  # exactly plain backprop's peak
    assert parse_budget("100%").resolve(_anchors(3, 2_898_197)) == 2_898_200
    assert parse_budget("0%").resolve(_anchors(1000, 10_000)) == 0
    assert parse_budget("12.5%").resolve(_anchors(0, 800)) == 100
    assert parse_budget(" 150% ").percent == 150.0


def test_a_percentage_below_the_smallest_feasible_budget_names_it_in_bytes_and_percent():
    a = _anchors(1000, 9000, smallest=7071)  # store-all 10000 B: the smallest is 70.71%
    check_feasible(parse_budget("71%"), 7100, a)  # feasible: no error
    with pytest.raises(BudgetError) as e:
        check_feasible(parse_budget("70%"), parse_budget("70%").resolve(a), a)
    msg = str(e.value)
    assert "budget 70% = 7000 B" in msg and "7071 B" in msg and "70.7% of plain backprop's peak" in msg
    assert "--budget 70.8% or more" in msg and "at least 7071B" in msg and "--budget min" in msg
    assert parse_budget("70.8%").resolve(a) >= a.min_feasible_bytes  # the suggestion is feasible
    with pytest.raises(BudgetError, match=r"budget 5000 = 5000 B \(50.0% of plain backprop's peak\)"):
        check_feasible(parse_budget("5000"), 5000, a)


@pytest.mark.parametrize("text", ["min", "MIN", " min "])
def test_min_is_the_smallest_feasible_budget(text):
    b = parse_budget(text)
    assert b.smallest and b.nbytes is None and b.percent is None and b.text == "min"
    assert b.resolve(_anchors(1000, 10_000, smallest=3456)) == 3456


@pytest.mark.parametrize("text", [
    "", "   ", "abc", "MB", "2XB", "2 M B", "-5MB", "1e3", "1,000", "2MB2", "0", "0KB", "0.1", "%", "abc%",
    "-5%", "1001%", "nan%", "inf%", "inf", "2 %%",
])
def test_garbage_budgets_raise_a_budget_error(text):
    with pytest.raises(BudgetError) as e:
        parse_budget(text)
    assert "budget" in str(e.value)
    assert isinstance(e.value, EdgetrainError)  # the CLI prints these without a stack trace


def test_budget_error_shows_the_accepted_forms():
    with pytest.raises(BudgetError, match=r"2MB.*512KiB.*80%"):
        parse_budget("two megabytes")


@pytest.mark.parametrize("text, expect", [
    (None, None),
    ("1.2", 1.2 * 3.0),
    ("1", 3.0),
    (" 2 ", 6.0),
    ("0.5s", 0.5),
    ("2S", 2.0),
    ("20ms", 0.02),
    ("1500ms", 1.5),
])
def test_deadlines(text, expect):
    got = parse_deadline(text, store_all_time_s=3.0)
    assert got == pytest.approx(expect) if expect is not None else got is None


@pytest.mark.parametrize("text", ["abc", "", "s", "ms", "fast", "0.5", "0", "-2", "-1s", "0s", "0ms", "nan", "inf",
                                  "nans", "1.2x"])
def test_garbage_deadlines_raise_a_budget_error(text):
    with pytest.raises(BudgetError, match="deadline"):
        parse_deadline(text, store_all_time_s=3.0)
