"""
The steps of one InferencePool reconcile, one module per concern, run in this order by
`pools.Reconciler.reconcile`:

    mirror    the spec into `pools` (what admission and the workers read), once per generation;
              the sweep of stale signing-secret mirrors, once per loop
    owned     the objects the pool owns (vLLM Deployment and Service, worker Deployment, KEDA
              objects): rendered and server-side applied when missing, changed or drifted; what is no
              longer rendered pruned; and their removal for a pool that is refused
    scaling   signals from PostgreSQL and the provider's headroom through `lading_operator.scaling.
              decide`; the decision written to the Deployments' replicas
    status    the pool's status and its Ready, Degraded and Paused conditions, from what the other
              steps saw (pure)

Each step owns its own piece of the loop's memory (what was mirrored, the scaler's window); the
reconciler only passes results from one step to the next.
"""
