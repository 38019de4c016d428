"""The optional ``costs:`` block of a providers-config entry: the operator's hourly prices.

Shape::

    costs:
      currency: USD                          # a label for people; default USD
      onDemand: {t3.micro: 0.0104, default: 0.0104}   # price per instance-hour by machine type
      spot: {t3.micro: 0.0035}               # the same for spec.placement.capacity: Spot
      budgetPerHour: 2.50                    # optional: the ProxyOperatorCostOverBudget alert's line

A machine type a table does not list costs its ``default`` entry (also the price of a Proxy
that names no machine type: the provider's default type); a Spot instance whose type ``spot``
does not list falls back to ``onDemand``.  No price API is asked: the figures are what the
operator writes, so the estimate (``proxy_operator_estimated_cost_per_hour``,
:mod:`app.pools.budget`) is as good as the table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from app.config.validation import Reader
from app.resources import CAPACITY_SPOT as SPOT

DEFAULT_KEY = "default"


@dataclass(frozen=True)
class CostTable:
    """Hourly prices of one provider's instances.

    Attributes:
        currency: what the prices are in (a label only).
        on_demand: machine type (or ``default``) -> price per instance-hour.
        spot: the same for interruptible (Spot) instances.
        budget_per_hour: the most the provider's instances should cost per hour (exported as
            ``proxy_operator_cost_budget_per_hour``; the alert ``ProxyOperatorCostOverBudget``
            compares the estimate with it), or ``None``.
    """

    currency: str = "USD"
    on_demand: dict[str, float] = field(default_factory=dict)
    spot: dict[str, float] = field(default_factory=dict)
    budget_per_hour: float | None = None

    def price(self, machine_type: str | None, capacity: str) -> float:
        """Return the hourly price of one instance of ``machine_type`` (``None``: the default type).

        Args:
            machine_type: ``spec.placement.machineType`` or ``None``.
            capacity: ``"OnDemand"`` or ``"Spot"``.
        Returns:
            the price; 0.0 when neither the type nor ``default`` is listed.
        """
        key = machine_type or DEFAULT_KEY
        if capacity == SPOT:
            for table_key in (key, DEFAULT_KEY):
                if table_key in self.spot:
                    return self.spot[table_key]
        for table_key in (key, DEFAULT_KEY):
            if table_key in self.on_demand:
                return self.on_demand[table_key]
        return 0.0


def _is_price(value: object) -> bool:
    """Whether ``value`` is a finite number >= 0 (YAML's ``.nan`` and ``.inf`` are floats, not prices)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
            and value >= 0)


def _prices(block: Reader, key: str) -> dict[str, float]:
    raw = block.raw(key, {})
    if not isinstance(raw, dict):
        raise block.error(key, f"must be a mapping of machine type to price per hour, got {type(raw).__name__}")
    out: dict[str, float] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not name:
            raise block.error(key, f"{name!r} is not a machine type")
        if not _is_price(value):
            raise block.error(f"{key}.{name}", f"must be a price per hour (a finite number >= 0), got {value!r}")
        out[name] = float(value)
    return out


def parse(block: Reader) -> CostTable | None:
    """Parse the ``costs`` block; ``None`` when the entry has none.

    Raises:
        app.config.validation.ConfigError: a price that is not a finite number >= 0 (NaN and infinity included), a table
            that is not a mapping, an unknown key, naming the field (``costs.onDemand.t3.micro``).
    """
    if not block.data:
        return None
    currency = block.str("currency", "USD") or "USD"
    budget = block.raw("budgetPerHour")
    if budget is not None and not _is_price(budget):
        raise block.error("budgetPerHour", f"must be a price per hour (a finite number >= 0), got {budget!r}")
    table = CostTable(currency=currency, on_demand=_prices(block, "onDemand"), spot=_prices(block, "spot"),
                      budget_per_hour=None if budget is None else float(budget))
    block.done()
    return table
