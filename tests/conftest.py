"""Shared test configuration: hypothesis profiles.

``ci`` (used when CI is set) is derandomised so a red build is reproducible.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, derandomize=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))



@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """In CI a skipped test is a failure: nothing that needs a server or the model may skip.

    Doctest examples whose lines are all marked ``+SKIP`` are exempt.
    """
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and "+SKIP" not in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (not allowed): {report.longrepr}"
