"""An account with fees, an overdraft limit and a history of movements."""

WITHDRAW_FEE = 1.0
OVERDRAFT_LIMIT = 0.0


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, owner: str, balance: float = 0.0) -> None:
        if balance < 0:
            raise ValueError("opening balance must be non-negative")
        self.owner = owner
        self.balance = balance
        self.history: list[float] = []

    def deposit(self, amount: float) -> None:
        if amount <= 0:
            raise ValueError(f"deposit must be positive, got {amount}")
        self.balance += amount
        self.history.append(amount)

    def withdraw(self, amount: float) -> None:
        """Take amount plus WITHDRAW_FEE; the balance may not go below -OVERDRAFT_LIMIT."""
        if amount <= 0:
            raise ValueError(f"withdrawal must be positive, got {amount}")
        cost = amount + WITHDRAW_FEE
        if self.balance - cost < -OVERDRAFT_LIMIT:
            raise InsufficientFunds(f"{self.owner} cannot pay {cost}")
        self.balance -= cost
        self.history.append(-cost)

    def transfer(self, other: "Account", amount: float) -> None:
        self.withdraw(amount)
        other.deposit(amount)

    def largest_deposit(self) -> float:
        deposits = [m for m in self.history if m > 0]
        return max(deposits) if deposits else 0.0
