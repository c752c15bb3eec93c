"""Anthropic Messages (`POST /v1/messages`)."""
