import pytest
from bank.interest import compound, monthly_payment, months_to_target


def test_compound_yearly():
    assert compound(1000, 0.1, 2, periods_per_year=1) == pytest.approx(1210.0)


def test_compound_monthly():
    assert compound(100, 0.12, 1) == pytest.approx(100 * 1.01**12)


def test_compound_zero_years():
    assert compound(100, 0.05, 0) == 100


def test_compound_bad_periods():
    with pytest.raises(ValueError):
        compound(100, 0.05, 1, periods_per_year=0)


def test_months_to_target_deposits_only():
    assert months_to_target(0, 100, 0.0, 1000) == 10


def test_months_to_target_with_interest():
    assert months_to_target(1000, 0, 0.12, 1030) == 3


def test_months_to_target_already_there():
    assert months_to_target(500, 10, 0.0, 500) == 0


def test_months_to_target_unreachable():
    with pytest.raises(ValueError):
        months_to_target(0, 0, 0.05, 10)


def test_monthly_payment_without_interest():
    assert monthly_payment(1200, 0.0, 12) == pytest.approx(100)


def test_monthly_payment_with_interest():
    assert monthly_payment(1000, 0.12, 12) == pytest.approx(88.8488, abs=1e-3)


def test_monthly_payment_bad_months():
    with pytest.raises(ValueError):
        monthly_payment(1000, 0.1, 0)
