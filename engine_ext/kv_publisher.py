"""vLLM's ZeroMQ KV-event publisher with CURVE (``engine_ext.curve``).

vLLM makes its publisher in ``Scheduler.__init__`` from ``EventPublisherFactory``'s
``"zmq"`` entry and has no socket options for keys, so an engine whose telemetry has keys
replaces that entry, in its own EngineCore process only, with this subclass: the same
publisher (same frames, endpoint rule and thread), its PUB socket a CURVE client of the
router before it binds or connects.
"""

from __future__ import annotations

import functools
from typing import Any

import zmq
from vllm.distributed.kv_events import EventPublisherFactory, ZmqEventPublisher

from engine_ext.curve import EngineCurve


class CurveZmqEventPublisher(ZmqEventPublisher):
    def __init__(self, *args: Any, curve: EngineCurve, **kwargs: Any) -> None:
        self._curve = curve
        super().__init__(*args, **kwargs)

    def _socket_setup(self) -> None:
        if self._pub is None:  # vLLM's own setup, with the keys set first
            pub = self._ctx.socket(zmq.PUB)
            pub.set_hwm(self._hwm)
            self._curve.apply(pub)
            assert self._endpoint is not None
            if self._is_bind_endpoint(self._endpoint):
                self._endpoint = self._bind(pub, self._endpoint)
            else:
                pub.connect(self._endpoint)
            self._pub = pub
        super()._socket_setup()  # the replay socket, if any (unused by hetserve)


def use_curve(curve: EngineCurve) -> None:
    """Make this process's ``"zmq"`` KV-event publishers CURVE clients with ``curve``."""
    EventPublisherFactory._registry["zmq"] = functools.partial(  # private: vLLM has no hook
        CurveZmqEventPublisher, curve=curve)
