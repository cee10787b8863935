"""Helpers for testing stepscope and code built on it (hostile job folders)."""
