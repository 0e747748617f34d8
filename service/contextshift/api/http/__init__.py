"""The HTTP/JSON surface: the routes onto the RPCs (`routes`), the app serving them through the
service's call gate (`app`), JSON bodies and error statuses (`messages`), the OpenAPI document the
bodies are checked against (`openapi`, from `api.rules`), uvicorn with a header timeout
(`serving`), and the preview page (`static/`)."""
