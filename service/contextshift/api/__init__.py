"""The gRPC surface: servicer, proto <-> library conversion, errors, interceptors, server, config.

Start it with `contextshift serve`; call it with `contextshift.Client`.
"""
