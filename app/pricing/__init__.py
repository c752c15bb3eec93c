"""Money: the price table (`config/prices.toml`), the cost of each usage record and the
baseline it is compared with (DESIGN.md §9). Pure: imports neither FastAPI nor httpx."""
