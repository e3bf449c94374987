"""
The Kubernetes operator (kopf): reconciles ExtractionBatch, InferencePool, TenantQuota and
DeliveryEndpoint objects into the data plane through the core's applying functions
(`lading.applying`), and reports status back.

Handlers stay thin: admission, quota checks and acceptance live in the core and are the
same code `lading run` uses. This package holds only the Kubernetes adapter.
"""
