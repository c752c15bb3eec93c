"""The HTTP edge: routes, dependencies, auth, request bodies, error rendering, OpenAPI."""
