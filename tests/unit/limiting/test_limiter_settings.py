"""`LimiterSettings.from_environment`: the scaled minute of tests and the standby permits switch."""

import pytest

from lading import limiting


def test_standby_permits_are_off_unless_the_environment_turns_them_on() -> None:
    assert limiting.LimiterSettings.from_environment({}).standby_s == 0.0
    assert limiting.LimiterSettings.from_environment({limiting.STANDBY_ENV: "0.25"}).standby_s == 0.25
    scaled = limiting.LimiterSettings.from_environment({limiting.STANDBY_ENV: "0.1", limiting.MINUTE_ENV: "6"})
    assert (scaled.standby_s, scaled.minute_s, scaled.window_s) == (0.1, 6.0, 7.0)


@pytest.mark.parametrize("value", ["-1", "0.9", "soon"])
def test_a_standby_age_the_window_cannot_cover_is_refused(value: str) -> None:
    # A standby permit's request is counted up to standby_s before it arrives: the window's extra
    # second must cover that and the request's own way to the provider.
    with pytest.raises(ValueError, match=limiting.STANDBY_ENV):
        limiting.LimiterSettings.from_environment({limiting.STANDBY_ENV: value})
