"""The gRPC surface: ContextShiftService's methods as gRPC handlers (`services`), every unary call
through the service's call gate (`interceptor`), reflection, and the benchmark's echo service."""
