"""Day-2 health on the controller: the collector, its decisions, fleet status (and remediation).

The node side (the checks, the record a node sends) is :mod:`gpuforge.node`; docs/health.md
describes the loop.
"""
