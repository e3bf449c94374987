"""
Model providers: the seam between a claimed job and whatever extracts it.

    base.py               the Provider protocol and the Outcome every provider returns
    noop.py               a fixed result at once, for dispatch benchmarks
    openai_compatible.py  chat completions with structured output (vLLM, any compatible server)
    prompting.py          the prompt: instructions, and the document as delimited data
    factory.py            the provider a pool's row asks for (`builtin`, the demo extractor, is
                          loaded by name from `lading_demo`, outside the core)

A provider never retries by itself and never touches the database: the executor
records its Outcome under the job's fence and the retry policy decides what follows.
"""
