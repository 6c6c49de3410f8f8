"""Predictive maintenance: rank the nodes likely to fail next from their telemetry and history.

* :mod:`~gpuforge.predict.telemetry`: the versioned JSON Lines telemetry format (reader and writer);
* :mod:`~gpuforge.predict.sources`: where telemetry comes from (the history store, Prometheus);
* :mod:`~gpuforge.predict.signals`: per-series features (window rates, Theil-Sen slopes);
* :mod:`~gpuforge.predict.score`: fleet scoring (peers, hard limits, recurrences, facility);
* :mod:`~gpuforge.predict.act`: draining the top nodes through admission, and the scorecard;
* :mod:`~gpuforge.predict.generate`: synthetic fleet telemetry with known failure times.

docs/predictive.md describes the format, the signals and the measured precision.
"""
