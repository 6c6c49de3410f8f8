"""Files derived from an expanded cluster: Ansible inventory, Slurm node and topology files."""

from __future__ import annotations
