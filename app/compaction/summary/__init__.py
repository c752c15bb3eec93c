"""summary."""
