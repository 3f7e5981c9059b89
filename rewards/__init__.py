"""Reward functions and dataset transforms, named by import path in configs (run from the repo root)."""
