"""Shared pytest setup: the helpers (policy_checks, fake_gpu) are imported from this folder."""
