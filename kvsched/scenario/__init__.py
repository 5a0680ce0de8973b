"""Scheduler scenarios (../shared/reference/SCENARIO_FORMAT.md): read and
checked (:mod:`.schema`), built (:mod:`.build`), run with a scripted model
(:mod:`.fake_model`) by the step loop (:mod:`.run`, ``kvsched replay``)."""

from kvsched.scenario.build import check_requests, make_request
from kvsched.scenario.fake_model import FakeModel, next_token
from kvsched.scenario.run import record_ids, replay
from kvsched.scenario.schema import (
    DEFAULT_TOKEN,
    REQUEST_KEYS,
    ReplayResult,
    Scenario,
    load_scenario,
    parse_scenario,
)

__all__ = ["DEFAULT_TOKEN", "REQUEST_KEYS", "FakeModel", "ReplayResult", "Scenario", "check_requests",
           "load_scenario", "make_request", "next_token", "parse_scenario", "record_ids", "replay"]
