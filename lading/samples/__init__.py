"""
Sample documents for demos, tests and benchmarks.

    generator.py   seeded synthetic OCR invoices (Turkish, English, German) with ground truth

The committed sample set under `examples/` is written from here by `hack/make_samples.py`.
Nothing in the product's request path imports this package.
"""
