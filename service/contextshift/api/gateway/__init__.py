"""The gateway: provider-compatible endpoints on the HTTP port that fit each request's messages into
its model's window (ShiftContext), forward it to a configured upstream, relay the answer as it
comes and close the generation's audit (FinishGeneration). docs/gateway.md describes it.

- `upstreams`: where requests go, from the settings only (never from a request), and the keys.
- `formats`: each endpoint's body read once (model, messages or input, system or instructions,
  tools, the answer's reserve), the blocks the shift gets, the upstream body spliced from the
  caller's own bytes, and errors in the provider's shape.
- `relay`: the pooled HTTP clients, the headers that go each way, the usage found in a JSON answer
  or an event stream as it passes.
- `http1`: the HTTP/1.1 client for http:// upstreams (an asyncio protocol per kept-alive
  connection; https:// upstreams go through httpx).
- `routes`: the Starlette routes, each call through the call gate (`service.gate.Gate`).
"""
