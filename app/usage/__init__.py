"""usage."""
