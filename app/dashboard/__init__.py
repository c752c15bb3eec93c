"""The `/dashboard` page: static HTML, CSS and vanilla JS shipped as package data (§10)."""
