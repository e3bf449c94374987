"""An attempt can only finish in one of the four finishing states."""

from __future__ import annotations

import pytest

from lading import errors
from lading.ids import Fence, JobId
from lading.jobs import states, transitions
from lading.jobs.states import JobState


@pytest.mark.parametrize("target", list(JobState))
def test_a_finish_is_constructible_exactly_for_the_finishing_states(target: JobState) -> None:
    if target in transitions.FINISHING:
        assert states.is_legal(JobState.RUNNING, target)
        assert transitions.Finish(JobId(1), Fence(1), target, "ok").to is target
    else:
        with pytest.raises(errors.IllegalTransition):
            transitions.Finish(JobId(1), Fence(1), target, "ok")
