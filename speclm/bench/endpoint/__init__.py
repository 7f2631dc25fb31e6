"""Endpoint: the bench's prompts against running OpenAI-compatible servers (bench.py)."""
