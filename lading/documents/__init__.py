"""
Documents given by reference: the JSON-lines manifests of large batches (`manifests`) and the
fetching and verification of the documents they list (`fetching`). See docs/large-batches.md.
"""
