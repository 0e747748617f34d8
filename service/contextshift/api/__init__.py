"""The service: contextshift.v1.ContextShiftService over gRPC and HTTP/JSON, both over one
transport-neutral service layer.

- `service/`: the service's methods (`servicer`), the call gate every call of either surface goes
  through (`calls`: calls in flight, API keys, errors as google.rpc.Status, the log line and the
  metrics), and what the methods are made of: requests read into library calls (`shifts`,
  `requests`, `blocks`, `counting`, `listings`), replies (`plans`), the store as a shift reads it
  (`store_view`, `read_cache`), audits and model configurations.
- `grpc/`: the methods as gRPC handlers, the gate as an interceptor, reflection, the benchmark's
  echo service. `http/`: the routes, JSON bodies and errors, the OpenAPI document, uvicorn, the
  preview page.
- `rules.py`: the request fields' rules, which the service checks and the OpenAPI document states;
  `auth.py`, `tls.py`, `metrics.py`, `logs.py`, `config.py` (settings); `server.py`: processes,
  start and stop.

Start it with `contextshift serve`; call it with `contextshift.Client`.
"""
