"""Phased rollout: plan phases and gates, keep the record, run one phase at a time."""
