"""HTTP routes: thin handlers that parse, call one service, and return."""
