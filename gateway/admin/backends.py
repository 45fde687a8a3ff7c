"""Backend actions of the admin API: pre-warming a scale-to-zero backend ahead of traffic.

The floor a pre-warm sets lives in the cold-start manager of the gateway process that
answers the call; a schedule in the configuration (`scaling.schedule`) reaches every replica.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.admin.models import BackendWarmed, WarmOrder
from gateway.errors import BadRequest, GatewayError
from gateway.settings import Scaling
from warmpool.manager import ColdStartManager


class BackendNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "backend_not_found"


class BackendNotScalable(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "backend_not_scalable"


@dataclass(frozen=True)
class Prewarmer:
    managers: Mapping[str, ColdStartManager | None]  # by backend; None: a static backend
    scaling: Mapping[str, Scaling]

    def __call__(self, name: str, order: WarmOrder) -> BackendWarmed:
        if name not in self.managers:
            raise BackendNotFound(f"No backend named '{name}'.")
        manager, scaling = self.managers[name], self.scaling[name]
        if manager is None:
            raise BackendNotScalable(
                f"The backend '{name}' has a fixed address (kind: http); only process and "
                "kubernetes backends start replicas."
            )
        if order.replicas > scaling.max_replicas:
            raise BadRequest(
                f"'{name}' has at most {scaling.max_replicas} replicas (scaling.max_replicas).",
                param="replicas",
            )
        hold_s = order.hold_s if order.hold_s is not None else scaling.idle_s
        decision = manager.prewarm(order.replicas, hold_s)
        state = manager.snapshot()
        return BackendWarmed(
            backend=name,
            replicas=order.replicas,
            hold_s=hold_s,
            until=round(time.time() + hold_s, 3),
            ready=state.ready,
            target=decision.target,
            reason=decision.reason,
            failure=state.failure,
        )
