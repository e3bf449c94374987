"""
Demo code, outside the product path: sample documents and the offline extractor that reads them.

    generator.py   seeded synthetic OCR invoices (Turkish, English, German) with ground truth
    adversarial.py documents in seven languages and four layouts, each with its correct answer
                   and the single-field corruptions a validation policy must send to review
    corpus.py      the validation calibration corpus (adversarial documents, the quickstart set)
    builtin.py     `provider: builtin`: a deterministic, rule-based reader of what the generator
                   writes, for `lading run`, the quickstart, benchmarks and tests; no model at all

The committed sample set under `examples/` is written from here by `hack/make_samples.py`.
The core never imports this package: `lading.providers.factory` loads `builtin` by name when a
pool asks for it, and an image without this package refuses such a pool.
"""
