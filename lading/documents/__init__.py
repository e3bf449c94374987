"""
Documents given by reference: the JSON-lines manifests of large batches (`manifest_lines`:
streaming, validation, spooling) and the fetching and verification of the documents they list
(`fetching`). See docs/large-batches.md. Not the YAML manifests `lading run` applies
(`lading.models.manifests`).
"""
