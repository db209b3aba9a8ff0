"""How the CLI writes costs (docs/cli.md: dollars with six decimals, always the same way)."""

from terret.cli._format import money


def test_a_cost_is_dollars_with_six_decimals_from_the_float_s_shortest_form() -> None:
    assert money(0.000123) == "$0.000123"
    assert money(None) == "$0.000000"
    assert money(0.1 + 0.2) == "$0.300000"
    # A budget's largest amount (12 digits before the point): not $123456789012.990005.
    assert money(123456789012.99) == "$123456789012.990000"
