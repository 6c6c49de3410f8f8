"""The node-side health checker, shipped to every node as one zipapp (``gpuforge-node.pyz``).

It imports only the standard library, PyYAML, :mod:`gpuforge.errors`, the validators' parsers and
pure checks (:mod:`gpuforge.validate`), and itself: nodes have no pip and no network at run time.
docs/health.md describes the tiers, the record and the configuration.
"""
