"""
The pool's mirror in PostgreSQL and the signing secrets its workers project.

The spec is written into `pools` (`applying.apply_inference_pool`: what admission and the workers
read) once per generation, and batches waiting for it are woken; once per loop the mirrors of
endpoints deleted while the operator was down are swept from the pool's namespace; on every step
the signing secret of every endpoint is made available in the namespace (`mirroring.for_namespace`)
and handed to the rendering config.
"""

from __future__ import annotations

import dataclasses

from lading import applying
from lading.models import specs
from lading_operator import mirroring, rendering, runtime


class Mirror:
    """What one pool's loop has mirrored: the generation written into `pools`, whether its namespace
    was swept."""

    def __init__(self, rt: runtime.Runtime, namespace: str) -> None:
        self.rt = rt
        self.namespace = namespace
        self.mirrored: int | None = None
        self.swept = False

    async def step(self, pool: specs.InferencePool, *, generation: int | None) -> rendering.OperatorConfig:
        """Mirror the spec when its generation changed; returns the rendering config with every
        endpoint's signing secret available in the pool's namespace."""
        if self.mirrored != generation:
            async with self.rt.db.acquire() as conn:
                await applying.apply_inference_pool(conn, pool)
            self.mirrored = generation
            self.rt.something_appeared()
        if not self.swept:  # once per loop: mirrors of endpoints deleted while the operator was down
            await mirroring.sweep(self.rt, self.namespace)
            self.swept = True
        # Every endpoint's signing secret: its own namespace's by reference, the others' mirrored here first.
        return dataclasses.replace(
            self.rt.settings.render, endpoint_secrets=await mirroring.for_namespace(self.rt, self.namespace)
        )
