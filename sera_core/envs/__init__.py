"""Benchmark environments: TextCraft-Synth (``textcraft``)."""
