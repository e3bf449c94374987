"""What a pool reads instead of a GET (`runtime.Runtime.owned`): the newest body of each owned object."""

from __future__ import annotations

from typing import Any

from lading_operator import runtime, settings


def _body(version: str, image: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "w", "resourceVersion": version}, "spec": {"image": image}}


def test_an_older_event_does_not_replace_a_newer_body_and_forget_drops_it() -> None:
    config = settings.OperatorSettings(database_url="postgresql://x/y")
    rt = runtime.Runtime(settings=config, db=None, api=None, cluster=None)  # type: ignore[arg-type]
    rt.remember("deployments", _body("10", "ours:2"))  # what our apply returned
    rt.remember("deployments", _body("9", "ours:1"))  # the watch event of an earlier change, late
    assert rt.owned[("deployments", "ns", "w")]["spec"]["image"] == "ours:2"
    rt.remember("deployments", _body("11", "edited:1"))
    assert rt.owned[("deployments", "ns", "w")]["spec"]["image"] == "edited:1"
    rt.remember("deployments", _body("opaque", "other:1"))  # not an integer: taken as it comes
    assert rt.owned[("deployments", "ns", "w")]["spec"]["image"] == "other:1"
    rt.forget("deployments", "ns", "w")
    assert ("deployments", "ns", "w") not in rt.owned
