"""
Model providers: the seam between a claimed job and whatever extracts it.

    base.py      the Provider protocol and the Outcome every provider returns
    builtin.py   a deterministic, offline rule-based invoice extractor (demo/test default)

A provider never retries by itself and never touches the database: the executor
records its Outcome under the job's fence and the retry policy decides what follows.
"""
