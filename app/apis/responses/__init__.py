"""OpenAI Responses (`POST /v1/responses`)."""
