import pytest
from bank.account import OVERDRAFT_LIMIT, WITHDRAW_FEE, Account, InsufficientFunds


def test_open_and_deposit():
    acc = Account("ann", 10.0)
    acc.deposit(5.5)
    assert acc.balance == pytest.approx(15.5)
    assert acc.history == [5.5]


def test_negative_opening_balance():
    with pytest.raises(ValueError):
        Account("ann", -1)


def test_deposit_must_be_positive():
    with pytest.raises(ValueError):
        Account("ann").deposit(0)


def test_withdraw_charges_fee():
    acc = Account("ann", 100.0)
    acc.withdraw(20.0)
    assert acc.balance == pytest.approx(80.0 - WITHDRAW_FEE)
    assert acc.history == [-(20.0 + WITHDRAW_FEE)]


def test_withdraw_down_to_overdraft_limit():
    acc = Account("ann", 10.0)
    acc.withdraw(10.0 + OVERDRAFT_LIMIT - WITHDRAW_FEE)
    assert acc.balance == pytest.approx(-OVERDRAFT_LIMIT)


def test_withdraw_beyond_limit_fails_and_keeps_balance():
    acc = Account("ann", 10.0)
    with pytest.raises(InsufficientFunds):
        acc.withdraw(10.0 + OVERDRAFT_LIMIT)
    assert acc.balance == 10.0
    assert acc.history == []


def test_withdraw_must_be_positive():
    with pytest.raises(ValueError):
        Account("ann", 10.0).withdraw(-5)


def test_transfer_moves_money():
    a, b = Account("a", 50.0), Account("b")
    a.transfer(b, 20.0)
    assert a.balance == pytest.approx(30.0 - WITHDRAW_FEE)
    assert b.balance == pytest.approx(20.0)


def test_failed_transfer_changes_nothing():
    a, b = Account("a", 5.0), Account("b", 1.0)
    with pytest.raises(InsufficientFunds):
        a.transfer(b, 5.0 + OVERDRAFT_LIMIT + 1)
    assert (a.balance, b.balance) == (5.0, 1.0)


def test_largest_deposit():
    acc = Account("ann", 100.0)
    assert acc.largest_deposit() == 0.0
    acc.deposit(5)
    acc.deposit(12)
    acc.withdraw(1)
    assert acc.largest_deposit() == 12
