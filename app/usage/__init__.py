"""Usage: records and their queue, recording an exchange, stores, summary-call counts, metrics."""
