"""Typed identifiers, so a job id is never passed where a fence is expected."""

import uuid
from typing import NewType

JobId = NewType("JobId", int)
BatchId = NewType("BatchId", int)
Fence = NewType("Fence", int)
WorkerId = NewType("WorkerId", str)
TenantName = NewType("TenantName", str)
PoolName = NewType("PoolName", str)
DeliveryId = NewType("DeliveryId", uuid.UUID)
"""A delivery's id: the `webhook-id` of every attempt of it (lading/delivery)."""
