"""Test helpers shared by the suites (factories, subprocess runners)."""
