"""Task modules of the peers that `hack/bench.py compare` runs beside Lading (installed by the `bench` extra)."""
