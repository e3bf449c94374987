"""
kopf's entry points, one module per kind: only the decorators and the translation between kopf's
arguments and the reconcile code of the kind (`lading_operator.batches`, `pools`, `quotas`,
`endpoints`). `app.build_registry` registers all of them on one registry.

Keeping the decorators apart means every handler the operator answers to is readable in one place,
and the reconcile code can be driven without kopf (tests do).
"""
