"""The Ray weight sender's delivery (`transport.ray.RaySender`) against a stand-in for Ray's
calls: an actor found dead on delivery (its node removed between a rollout and the publish) is
named in `dead`, one that does not answer within the deadline (stopped) in `silent`, for the pool
to replace, and the live ones still get the version."""
from __future__ import annotations

import types

import ray.exceptions
import torch

from hindsight.transport.base import Ack
from hindsight.transport.ray import RaySender


class _Call:
    def __init__(self, fn, *args):
        self.fn, self.args = fn, args


class _Actor:
    def __init__(self, dead: bool = False, silent: bool = False):
        self.dead, self.silent, self.got = dead, silent, []
        self.receive = types.SimpleNamespace(remote=lambda ref: _Call(self._receive, ref))

    def _receive(self, payload):
        if self.dead:
            raise ray.exceptions.ActorUnavailableError("node gone", None)
        self.got.append(payload.version)
        return Ack(payload.version)


def _ray(waited: list | None = None):
    def wait(calls, num_returns, timeout=None):
        """A stopped actor's call is not done within the deadline; the others are."""
        if waited is not None:
            waited.append(timeout)
        quiet = [c for c in calls if c.fn.__self__.silent]
        return [c for c in calls if c not in quiet], quiet

    return types.SimpleNamespace(put=lambda x: x, get=lambda call, timeout=None: call.fn(*call.args), wait=wait,
                                 exceptions=ray.exceptions)


def test_a_dead_actor_is_named_and_the_live_ones_get_the_version():
    actors = {"rollout-0": _Actor(), "rollout-1": _Actor(dead=True), "rollout-2": _Actor()}
    sender = RaySender(_ray(), actors)
    sent = sender.publish(3, torch.nn.Linear(2, 2))
    assert sender.dead == ["rollout-1"]
    assert actors["rollout-0"].got == [3] and actors["rollout-2"].got == [3]
    assert sent["publish/resent_full"] == 0.0
    actors.pop("rollout-1")  # the pool replaced it
    sender.publish(4, torch.nn.Linear(2, 2))
    assert sender.dead == [] and actors["rollout-0"].got == [3, 4]


def test_an_actor_that_does_not_answer_in_time_is_named_silent_and_not_waited_on():
    actors = {"rollout-0": _Actor(), "rollout-1": _Actor(silent=True)}
    waited = []
    sender = RaySender(_ray(waited), actors, deadline_s=4.0)
    sent = sender.publish(1, torch.nn.Linear(2, 2))
    assert sender.silent == ["rollout-1"] and sender.dead == [] and waited == [4.0]
    assert actors["rollout-0"].got == [1] and actors["rollout-1"].got == []
    assert sent["publish/resent_full"] == 0.0  # not counted as behind: it is replaced, and the new one syncs
