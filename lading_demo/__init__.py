"""
Sample documents for demos, tests and benchmarks.

    generator.py   seeded synthetic OCR invoices (Turkish, English, German) with ground truth
    adversarial.py documents in seven languages and four layouts, each with its correct answer
                   and the single-field corruptions a validation policy must send to review

The committed sample set under `examples/` is written from here by `hack/make_samples.py`.
Nothing in the product's request path imports this package.
"""
