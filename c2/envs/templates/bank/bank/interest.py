"""Interest arithmetic."""


def compound(principal: float, annual_rate: float, years: int, periods_per_year: int = 12) -> float:
    """Value after `years` with interest compounded `periods_per_year` times a year."""
    if periods_per_year < 1:
        raise ValueError("periods_per_year must be at least 1")
    rate = annual_rate / periods_per_year
    return principal * (1 + rate) ** (years * periods_per_year)


def months_to_target(
    balance: float, monthly_deposit: float, annual_rate: float, target: float
) -> int:
    """Months until balance reaches target (interest first, then the deposit, each month)."""
    if balance >= target:
        return 0
    if monthly_deposit <= 0 and (annual_rate <= 0 or balance <= 0):
        raise ValueError("the target can never be reached")
    months = 0
    while balance < target:
        balance += balance * annual_rate / 12
        balance += monthly_deposit
        months += 1
    return months


def monthly_payment(loan: float, annual_rate: float, months: int) -> float:
    """Fixed payment that repays `loan` over `months` (annuity formula)."""
    if months <= 0:
        raise ValueError("months must be positive")
    if annual_rate == 0:
        return loan / months
    r = annual_rate / 12
    return loan * r / (1 - (1 + r) ** -months)
